"""Client mode, notebook side: the API through the head (``init("nbcluster://HOST:PORT")``).

Every call is one ``ClientProxy/Call`` RPC to the head, relayed to the proxy driver. Calls
retry while the head is unreachable, up to ``head_grace_period_s``; then they raise
:class:`HeadUnavailableError` in the cell (the kernel keeps running). Long ``get``/``wait``
calls are made of short polls, so a link that drops for a few seconds only delays them.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import os
import threading
import time
from typing import Any

import cloudpickle
import grpc

from nbcluster import exceptions as exc
from nbcluster._runtime.protocol.rpc import auth_metadata, make_sync_channel, pb, pb_grpc
from nbcluster._runtime.runtime_env import driver as runtime_env_driver
from nbcluster._runtime.runtime_env import spec as runtime_env_spec
from nbcluster._runtime.runtime_env.options import FrozenRuntimeEnv

CLIENT_OWNER = "client-proxy"
POLL_S = 1.0


class ProxyClient:
    """Stands where a CoreClient would: ``ObjectRef``s count themselves here."""

    mode = "client"

    def __init__(self, head_address: str, token: str, grace_s: float) -> None:
        self.head_address = head_address
        self.address = CLIENT_OWNER
        self.token = token
        self.grace_s = grace_s
        self.session = os.urandom(16)
        self.channel = make_sync_channel(head_address, token, max_message_bytes=512 * 2**20)
        self.stub = pb_grpc.ClientProxyStub(self.channel)
        self.md = auth_metadata(token)
        self.closed = False
        self.counts: dict[bytes, int] = {}
        self.lock = threading.Lock()
        self.to_release: list[bytes] = []
        self.dropped: collections.deque[bytes] = collections.deque()
        self.info: Any = None
        self.cluster = None
        self.submit_context = None
        self.namespace = ""
        self.current_task_id = b""
        self.config: Any = None  # set by init(): runtime_env uploads read its temp_dir

    def running_task(self) -> None:
        """A Ray-client driver runs no task."""
        return None

    # -- transport ---------------------------------------------------------------------------
    def call(self, op: str, args: Any = None) -> Any:
        """One operation on the proxy, retried through short outages."""
        payload = cloudpickle.dumps(args) if args is not None else b""
        self._flush_releases(op)
        deadline = time.monotonic() + self.grace_s
        delay = 0.05
        while True:
            try:
                reply = self.stub.Call(
                    pb.ClientRequest(session=self.session, op=op, payload=payload),
                    metadata=self.md,
                    timeout=max(30.0, POLL_S * 5),
                )
                break
            except grpc.RpcError as err:
                code = err.code()  # type: ignore[attr-defined]
                if (
                    code == grpc.StatusCode.UNAUTHENTICATED
                    or code == grpc.StatusCode.PERMISSION_DENIED
                ):
                    from nbcluster._runtime.protocol.errors import Peer, to_exception

                    raise to_exception(err, Peer.HEAD, op) from None  # type: ignore[arg-type]
                if code not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                    raise exc.NbclusterSystemError(
                        f"client call {op} failed: {code.name}: {err.details()}"
                    ) from None  # type: ignore[attr-defined]
                if time.monotonic() > deadline:
                    raise exc.HeadUnavailableError(
                        f"the cluster head at {self.head_address} has been unreachable for "
                        f"{self.grace_s:.0f}s ({code.name}); the kernel keeps running — call "
                        "nbcluster.init() again when the cluster is back"
                    ) from None
                time.sleep(delay)
                delay = min(delay * 2, 1.0)
        value = cloudpickle.loads(reply.payload)
        if reply.is_error:
            raise value
        return value

    def _flush_releases(self, op: str) -> None:
        if op in ("release", "connect"):
            return
        self._settle_drops()
        with self.lock:
            ids, self.to_release = self.to_release, []
        if ids:
            with contextlib.suppress(Exception):  # best effort
                self.call("release", ids)

    # -- what ObjectRef needs ---------------------------------------------------------------------
    def add_local_ref(self, object_id: bytes, owner: str, borrowed: bool) -> None:
        with self.lock:
            self.counts[object_id] = self.counts.get(object_id, 0) + 1

    def remove_local_ref(self, object_id: bytes) -> None:
        # Called from __del__: no lock (the collector may run while this thread holds it).
        self.dropped.append(object_id)

    def _settle_drops(self) -> None:
        with self.lock:
            while self.dropped:
                oid = self.dropped.popleft()
                n = self.counts.get(oid, 0) - 1
                if n > 0:
                    self.counts[oid] = n
                else:
                    self.counts.pop(oid, None)
                    self.to_release.append(oid)

    # -- API -------------------------------------------------------------------------------------
    def connect(self) -> dict[str, Any]:
        return self.call("connect", {})

    def put(self, value: Any) -> Any:
        return self.call("put", value)

    def get(self, refs: list[Any], timeout: float | None) -> list[Any]:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            remaining = (
                POLL_S if deadline is None else min(POLL_S, max(0.0, deadline - time.monotonic()))
            )
            ready = self.call("wait", (refs, len(refs), remaining))
            if len(ready) == len(refs):
                return self.call("get", (refs, None))
            if deadline is not None and time.monotonic() >= deadline:
                raise exc.GetTimeoutError(
                    f"get() timed out after {timeout}s: {len(refs) - len(ready)} of {len(refs)} object(s) "
                    "are not ready. The tasks keep running; call get() again later, or cancel() them."
                )

    def wait(self, refs: list[Any], num_returns: int, timeout: float | None) -> list[bytes]:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            remaining = (
                POLL_S if deadline is None else min(POLL_S, max(0.0, deadline - time.monotonic()))
            )
            ready = self.call("wait", (refs, num_returns, remaining))
            if len(ready) >= num_returns or (deadline is not None and time.monotonic() >= deadline):
                return ready

    def submit_task(
        self, function: Any, opts: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        return self.call("task", (cloudpickle.dumps(function), self._in_env(opts), args, kwargs))

    def create_actor(
        self, cls: type, opts: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        return self.call("actor_create", (cloudpickle.dumps(cls), self._in_env(opts), args, kwargs))

    def _in_env(self, opts: Any) -> Any:
        """``opts`` with the environment the call runs in: ``init()``'s, inherited by the
        call's own, resolved here (a local ``working_dir`` is uploaded from this machine, not
        looked up on the proxy's). The proxy's own environment is empty, so it adds nothing."""
        env_json = runtime_env_driver.for_submit(self, opts.runtime_env)
        if not env_json:
            return opts
        env = FrozenRuntimeEnv(runtime_env_spec.from_json(env_json))
        return dataclasses.replace(opts, runtime_env=env)

    def actor_call(
        self,
        handle: Any,
        method: str,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        n: int,
        call_options: dict[str, Any] | None = None,
    ) -> Any:
        payload = (handle._actor_id, handle._meta, method, args, kwargs, n, call_options or {})
        return self.call("actor_call", payload)

    def stop(self) -> None:
        if self.closed:
            return
        with contextlib.suppress(Exception):  # the proxy drops idle sessions anyway
            self.call("disconnect", {})
        self.closed = True
        self.channel.close()


def is_client(client: Any) -> bool:
    """True for a client-mode connection."""
    return isinstance(client, ProxyClient)


async def _unused() -> None:  # pragma: no cover - keeps asyncio import for type checkers
    await asyncio.sleep(0)
