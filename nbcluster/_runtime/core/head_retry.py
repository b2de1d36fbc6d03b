"""Calls to the head that retry while it is unreachable, up to the grace period."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from nbcluster._runtime.protocol.errors import RpcError

if TYPE_CHECKING:
    from nbcluster._runtime.core.client import CoreClient

__all__ = ["HeadRetry"]


class HeadRetry:
    """Calls to the head that retry while it is unreachable, up to the grace period.

    A head restart (or a short network cut) is then invisible to callers; once a call has
    failed for ``head_grace_period_s`` (counted from its first failure) the last error
    surfaces (as ``HeadUnavailableError`` once translated).
    """

    def __init__(self, client: CoreClient) -> None:
        self._client = client

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
                    return await method(*args, **kwargs)
                except RpcError as err:
                    if deadline is None:
                        deadline = time.monotonic() + client.config.head_grace_period_s
                    if (
                        err.code().name != "UNAVAILABLE"
                        or client.closed
                        or time.monotonic() > deadline
                    ):
                        raise
                await asyncio.sleep(delay)
                delay = min(delay * 2, 1.0)

        self.__dict__[name] = call
        return call
