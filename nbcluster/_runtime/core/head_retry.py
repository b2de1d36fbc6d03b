"""Calls to the head that retry while it is unreachable, up to the grace period."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import grpc

from nbcluster._runtime.protocol.errors import RpcFailure, RpcUnavailable
from nbcluster._runtime.protocol.rpc import pb

if TYPE_CHECKING:
    from nbcluster._runtime.core.ports import HeadRetryHost

__all__ = ["HeadRetry", "HeadSilentError"]


class HeadSilentError(RpcUnavailable):
    """The head kept the connection open but answered nothing for the grace period (a
    stopped or hung process: no connection reset, so calls would wait for their own long
    timeouts). ``UNAVAILABLE``, and never retried: the grace period is already spent."""

    def __init__(self, silent_s: float) -> None:
        super().__init__(
            grpc.StatusCode.UNAVAILABLE, f"the head has not answered for {silent_s:.0f}s"
        )


class HeadRetry:
    """Calls to the head that retry while it is unreachable, up to the grace period.

    A head restart (or a short network cut) is then invisible to callers; once a call has
    failed for ``head_grace_period_s`` (counted from its first failure) the last error
    surfaces (as ``HeadUnavailableError`` once translated).

    A head that is stopped rather than gone (SIGSTOP, a hung process) resets nothing:
    calls would wait for their own timeouts (up to ten minutes for a long poll). A call
    waiting while the head has answered nothing (no call, no probe) for half the grace
    period probes it (one shared probe at a time); once the head has been silent for the
    grace period since the call began, the call fails with :class:`HeadSilentError`. A long
    poll on a head that answers probes waits as long as it asks to.
    """

    def __init__(self, client: HeadRetryHost) -> None:
        self._client = client
        self._answered = 0.0  # when the head last answered anything (monotonic)
        self._probe: asyncio.Task[None] | None = None

    def __getattr__(self, name: str) -> Callable[..., Any]:
        client = self._client

        async def call(*args: Any, **kwargs: Any) -> Any:
            # From the first failure: a long poll may have waited longer than the grace
            # period before the head went away.
            deadline: float | None = None
            delay = 0.05
            while True:
                method = getattr(client.channels.stub(client.head_address, "head"), name)
                try:
                    return await self._watched(method(*args, **kwargs))
                except RpcFailure as err:
                    if deadline is None:
                        deadline = time.monotonic() + client.config.head_grace_period_s
                    if (
                        not isinstance(err, RpcUnavailable)
                        or isinstance(err, HeadSilentError)
                        or client.closed
                        or time.monotonic() > deadline
                    ):
                        raise
                await asyncio.sleep(delay)
                delay = min(delay * 2, 1.0)

        self.__dict__[name] = call
        return call

    async def _watched(self, rpc: Awaitable[Any]) -> Any:
        """``await rpc``, failing it once the head has been silent for the grace period."""
        grace = self._client.config.head_grace_period_s
        started = time.monotonic()
        task = asyncio.ensure_future(rpc)
        check = max(0.05, min(grace / 4, 5.0))
        try:
            while True:
                done, _ = await asyncio.wait({task}, timeout=check)
                if done:
                    result = task.result()
                    self._answered = time.monotonic()
                    return result
                silent = time.monotonic() - max(self._answered, started)
                if silent >= grace:
                    raise HeadSilentError(silent)
                if silent >= grace / 2 and (self._probe is None or self._probe.done()):
                    self._probe = asyncio.ensure_future(self._ping(grace))
        finally:
            if not task.done():
                task.cancel()

    async def _ping(self, timeout: float) -> None:
        """Ask the head something cheap; note when it answers."""
        client = self._client
        try:
            await client.channels.stub(client.head_address, "head").GetClusterInfo(
                pb.Empty(), timeout=timeout
            )
        except RpcFailure:
            return
        self._answered = time.monotonic()
