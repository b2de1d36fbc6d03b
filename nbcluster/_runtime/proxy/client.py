"""Client mode, notebook side: the API through the head (``init("nbcluster://HOST:PORT")``).

:class:`ProxyClient` implements the :class:`~nbcluster._runtime.driver.Driver` interface:
every call is one ``ClientProxy/Call`` RPC to the head, relayed to the proxy driver, which
makes the same Driver call on its own ``CoreDriver`` (the operation is the method's name). Calls
retry while the head is unreachable, up to ``head_grace_period_s``; then they raise
:class:`HeadUnavailableError` in the cell (the kernel keeps running). Long ``get``/``wait``
calls are made of short polls, so a link that drops for a few seconds only delays them.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import os
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import cloudpickle

from nbcluster._runtime import exceptions as exc
from nbcluster._runtime.config import Config
from nbcluster._runtime.driver import ActorRecord, FunctionDescriptor
from nbcluster._runtime.options import ActorOptions, TaskOptions
from nbcluster._runtime.protocol.errors import (
    Peer,
    RpcDeadlineExceeded,
    RpcFailure,
    RpcPermissionDenied,
    RpcUnauthenticated,
    RpcUnavailable,
    to_exception,
)
from nbcluster._runtime.protocol.rpc import SyncStub, make_sync_channel, pb, pb_grpc
from nbcluster._runtime.refs import ObjectRef
from nbcluster._runtime.runtime_env import driver as runtime_env_driver
from nbcluster._runtime.runtime_env import spec as runtime_env_spec
from nbcluster._runtime.runtime_env.options import FrozenRuntimeEnv

CLIENT_OWNER = "client-proxy"
POLL_S = 1.0


class ProxyClient:
    """The client-mode driver: stands where a CoreClient would (``ObjectRef``s count
    themselves here) and forwards every :class:`~nbcluster._runtime.driver.Driver` call."""

    mode = "client"

    def __init__(self, head_address: str, token: str, grace_s: float) -> None:
        self.head_address = head_address
        self.address = CLIENT_OWNER
        self.token = token
        self.grace_s = grace_s
        self.session = os.urandom(16)
        self.channel = make_sync_channel(head_address, token, max_message_bytes=512 * 2**20)
        self.stub = SyncStub(pb_grpc.ClientProxyStub(self.channel), token, head_address)
        self.closed = False
        self.counts: dict[bytes, int] = {}
        self.lock = threading.Lock()
        self.to_release: list[bytes] = []
        self.dropped: collections.deque[bytes] = collections.deque()
        self.cluster = None
        self.submit_context = None
        self.namespace = ""
        self.current_task_id = b""
        self.config: Config = Config()  # init() sets its own: runtime_env uploads read temp_dir
        self.info: Any = None  # set by init(): the ClusterInfo

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
                    timeout=max(30.0, POLL_S * 5),
                )
                break
            except RpcFailure as err:
                code = err.code()
                if isinstance(err, (RpcUnauthenticated, RpcPermissionDenied)):
                    raise to_exception(err, Peer.HEAD, op) from None
                if not isinstance(err, (RpcUnavailable, RpcDeadlineExceeded)):
                    raise exc.NbclusterSystemError(
                        f"client call {op} failed: {code.name}: {err.details()}"
                    ) from None
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

    # -- the Driver interface -------------------------------------------------------------------
    def connect(self) -> dict[str, Any]:
        """Open the session; the proxy's ``session_dir``, ``node_id`` and ``job_id``."""
        return self.call("connect", {})  # type: ignore[no-any-return]

    def shutdown(self) -> None:
        """End the session (the proxy releases what it held for this client)."""
        self.stop()

    def submit_task(
        self,
        function: FunctionDescriptor,
        opts: TaskOptions,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> Any:
        """Submit a task through the proxy, in this client's runtime environment."""
        return self.call("submit_task", (function, self._in_env(opts), args, kwargs))

    def create_actor(
        self,
        cls: FunctionDescriptor,
        opts: ActorOptions,
        methods: dict[str, Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        creation: tuple[Any, ...] | None = None,
    ) -> ActorRecord:
        """Create an actor owned by the proxy's session (``creation`` stays here, unused)."""
        payload = (cls, self._in_env(opts), methods, args, kwargs)
        return self.call("create_actor", payload)  # type: ignore[no-any-return]

    def _in_env(self, opts: Any) -> Any:
        """``opts`` with the environment the call runs in: ``init()``'s, inherited by the
        call's own, resolved here (a local ``working_dir`` is uploaded from this machine, not
        looked up on the proxy's). The proxy's own environment is empty, so it adds nothing."""
        env_json = runtime_env_driver.for_submit(self, opts.runtime_env)
        if not env_json:
            return opts
        env = FrozenRuntimeEnv(runtime_env_spec.from_json(env_json))
        return dataclasses.replace(opts, runtime_env=env)

    def call_actor(
        self,
        actor: ActorRecord,
        method: str,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        num_returns: int | str,
        backpressure: int,
        call_options: dict[str, Any],
    ) -> Any:
        """Queue an actor call through the proxy."""
        payload = (actor, method, args, kwargs, num_returns, backpressure, call_options)
        return self.call("call_actor", payload)

    def get_named_actor(self, name: str, namespace: str | None) -> ActorRecord:
        """The live actor called ``name``."""
        return self.call("get_named_actor", (name, namespace))  # type: ignore[no-any-return]

    def kill_actor(self, actor_id: bytes, no_restart: bool) -> None:
        """End an actor now."""
        self.call("kill_actor", (actor_id, no_restart))

    def add_actor_handle(self, actor_id: bytes) -> None:
        """Handles here own nothing: the proxy's session keeps the actors it made."""

    def remove_actor_handle(self, actor_id: bytes) -> None:
        """Handles here own nothing (see :meth:`add_actor_handle`)."""

    def actor_escaped(self, actor_id: bytes) -> None:
        """Handles here own nothing (see :meth:`add_actor_handle`)."""

    def put(self, value: Any) -> ObjectRef:
        """Store ``value`` through the proxy (which owns it for this session)."""
        return self.call("put", (value,))  # type: ignore[no-any-return]

    def get(self, refs: Sequence[ObjectRef], timeout: float | None) -> list[Any]:
        """The values, polled in short waits so a dropping link only delays them."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            remaining = (
                POLL_S if deadline is None else min(POLL_S, max(0.0, deadline - time.monotonic()))
            )
            ready = self.call("wait", (refs, len(refs), remaining))
            if len(ready) == len(refs):
                return self.call("get", (refs, None))  # type: ignore[no-any-return]
            if deadline is not None and time.monotonic() >= deadline:
                raise exc.GetTimeoutError(
                    f"get() timed out after {timeout}s: {len(refs) - len(ready)} of {len(refs)} object(s) "
                    "are not ready. The tasks keep running; call get() again later, or cancel() them."
                )

    def wait(
        self, refs: Sequence[ObjectRef], num_returns: int, timeout: float | None
    ) -> list[bytes]:
        """Ids of the ready refs, polled in short waits."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            remaining = (
                POLL_S if deadline is None else min(POLL_S, max(0.0, deadline - time.monotonic()))
            )
            ready: list[bytes] = self.call("wait", (refs, num_returns, remaining))
            if len(ready) >= num_returns or (deadline is not None and time.monotonic() >= deadline):
                return ready

    def wait_mixed(
        self, items: Sequence[Any], num_returns: int, timeout: float | None
    ) -> tuple[list[Any], list[Any]]:
        """Generators do not cross to a client: there is nothing to wait on here."""
        raise TypeError("ObjectRefGenerators are not available in client mode; wait on ObjectRefs")

    def cancel(self, ref: ObjectRef, force: bool) -> None:
        """Cancel the task that makes ``ref``."""
        self.call("cancel", (ref, force))

    def create_placement_group(
        self, bundles: list[dict[str, float]], strategy: str, name: str, detached: bool
    ) -> bytes:
        """Reserve ``bundles`` through the proxy."""
        payload = (bundles, strategy, name, detached)
        return self.call("create_placement_group", payload)  # type: ignore[no-any-return]

    def remove_placement_group(self, pg_id: bytes) -> None:
        """Release a group."""
        self.call("remove_placement_group", (pg_id,))

    def get_placement_group(self, name: str) -> tuple[bytes, list[dict[str, float]], str]:
        """(id, bundles, name) of the group called ``name``."""
        return self.call("get_placement_group", (name,))  # type: ignore[no-any-return]

    def placement_group_table(self, pg_id: bytes | None) -> list[dict[str, Any]]:
        """Rows of one group or of all of them."""
        return self.call("placement_group_table", (pg_id,))  # type: ignore[no-any-return]

    def placement_group_ready(self, pg_id: bytes) -> ObjectRef:
        """A ref that becomes ``True`` once the group is created."""
        return self.call("placement_group_ready", (pg_id,))  # type: ignore[no-any-return]

    def nodes(self) -> list[dict[str, Any]]:
        """Every node the cluster has known."""
        return self.call("nodes", ())  # type: ignore[no-any-return]

    def resources(self, kind: str) -> dict[str, float]:
        """Sum of the live nodes' ``"total"`` or ``"available"`` resources."""
        return self.call("resources", (kind,))  # type: ignore[no-any-return]

    def call_head(self, what: str, call: Callable[[Any], Any]) -> Any:
        """``call(head)`` over a blocking channel straight to the head (read-only queries
        such as ``nbcluster.state``'s; issue 13: widgets in client mode)."""
        channel = make_sync_channel(self.head_address, self.token)
        try:
            return call(SyncStub(pb_grpc.HeadStub(channel), self.token, self.head_address))
        except RpcFailure as err:
            raise to_exception(err, Peer.HEAD, what) from None
        finally:
            channel.close()

    def actor_state(self, actor_id: bytes) -> dict[str, Any] | None:
        """Not asked in client mode (a repr must not wait on the link): always None."""
        return None

    def stop(self) -> None:
        """Disconnect (idempotent)."""
        if self.closed:
            return
        with contextlib.suppress(Exception):  # the proxy drops idle sessions anyway
            self.call("disconnect", {})
        self.closed = True
        self.channel.close()
