"""The core client: the part of the runtime that lives in every driver and worker.

It owns the objects its process creates (``ownership.py``), submits tasks straight to
leased workers (``submitter.py``), and answers other processes' questions about its
objects (the ``CoreWorker`` service, ``service.py``). Its asyncio loop runs on one background thread;
user threads call the synchronous methods here, which hand work to the loop.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import contextvars
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, TypeVar

from nbcluster._runtime import exceptions as exc
from nbcluster._runtime import proc
from nbcluster._runtime.config import Config
from nbcluster._runtime.core import generators
from nbcluster._runtime.core.dormancy import Dormancy
from nbcluster._runtime.core.head_retry import HeadRetry
from nbcluster._runtime.core.output import print_task_output
from nbcluster._runtime.core.ownership import (
    PENDING,
    READY,
    CallbackWaiter,
    Entry,
    OwnershipTable,
    Release,
    Waiter,
)
from nbcluster._runtime.core.releases import Releases
from nbcluster._runtime.core.service import CoreWorkerService
from nbcluster._runtime.core.store_writer import write_to_local_store
from nbcluster._runtime.loops import new_event_loop
from nbcluster._runtime.objects import store as objstore
from nbcluster._runtime.protocol.errors import (
    Peer,
    RpcDeadlineExceeded,
    RpcFailure,
    RpcUnavailable,
    to_exception,
)
from nbcluster._runtime.protocol.rpc import AuthedStub, Channels, bind, make_server, pb, pb_grpc
from nbcluster._runtime.serialization import SerializedValue, deserialize

log = logging.getLogger(__name__)
T = TypeVar("T")


class CoreClient:
    """Ownership, submission and object access for one process (driver or worker)."""

    def __init__(
        self,
        *,
        mode: str,
        config: Config,
        token: str,
        head_address: str,
        node_address: str,
        job_id: bytes,
        worker_id: bytes | None = None,
        namespace: str = "",
        host: str = "127.0.0.1",
    ) -> None:
        self.mode = mode
        self.config = config
        self.token = token
        self.head_address = head_address
        self.node_address = node_address
        self.job_id = job_id
        self.worker_id = worker_id or proc.new_id()
        self.namespace = namespace
        self.host = host
        self.address = ""  # set once our CoreWorker server listens
        self.node_id = b""
        self.store_dir = ""
        self.session_dir = ""
        self.table: OwnershipTable = OwnershipTable("")
        self.loop = new_event_loop()  # uvloop when installed (_runtime/loops.py)
        self.thread: threading.Thread | None = None
        self.channels = Channels(token, config.rpc_max_message_bytes)
        self.server: Any = None
        self.dormancy: Dormancy | None = None  # a worker's gRPC sleeps while idle
        self.exported: set[bytes] = set()
        self._task_prefix = os.urandom(8)
        self._task_counter = 0
        self._counter_lock = threading.Lock()
        self._derefs: collections.deque[bytes] = collections.deque()
        self._deref_scheduled = False
        self.releases = Releases(
            self.loop, self.node, self.core, lambda: self.address, lambda: self.closed
        )
        self.closed = False
        self.current_task_id = b""  # set by the worker executor while a task runs
        self.current_pg: tuple[bytes, bool] | None = None  # (group, capture) of the running task
        self._nodes_cache: tuple[float, list[Any]] | None = None
        self._head_retry: HeadRetry | None = None
        self._pg_cache: dict[bytes, Any] = {}
        from nbcluster._runtime.core.submitter import Submitter

        self.submitter = Submitter(self)
        from nbcluster._runtime.core.actor_submitter import ActorSubmitter

        self.actor_submitter = ActorSubmitter(self)
        self.actor_handles: dict[bytes, int] = {}  # live handles of actors this process owns
        self.escaped_actors: set[bytes] = set()
        self.service: Any = None  # CoreWorker servicer (worker mode installs its own)
        # Where task output goes: handler(submit_context, task_name, LogRecord). The Jupyter
        # layer replaces both hooks to send output to the cell that submitted the task.
        self.output_handler: Callable[[Any, str, Any], None] = print_task_output
        self.submit_context: Callable[[], Any] | None = None
        # Told of every task and actor call submitted: observer(task_id, name, context)
        # (issue 13: the Jupyter layer maps tasks to the cells that submitted them).
        self.task_observer: Callable[[bytes, str, Any], None] | None = None
        # actor id -> (actor class, args, kwargs, name, namespace, lifetime) of those made here
        self.actor_creations: dict[bytes, tuple[Any, ...]] = {}
        # Called when get()/wait() is interrupted by Ctrl-C (the Jupyter layer sets it).
        self.interrupt_handler: Callable[[], None] | None = None

    # -- life cycle ------------------------------------------------------------------------
    def start(self, servicer_factory: Callable[[CoreClient], Any] | None = None) -> None:
        """Start the I/O thread, our CoreWorker server, and learn the local node."""
        _raise_fd_limit()  # every mapped store object holds a descriptor
        ready = threading.Event()
        self.thread = threading.Thread(
            target=self._run_loop, args=(ready,), name="nbcluster-io", daemon=True
        )
        self.thread.start()
        ready.wait()
        self.run(self._start_async(servicer_factory))

    def _run_loop(self, ready: threading.Event) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.call_soon(ready.set)
        self.loop.run_forever()

    async def _start_async(self, servicer_factory: Callable[[CoreClient], Any] | None) -> None:
        self.service = (servicer_factory or CoreWorkerService)(self)
        if self.mode == "worker" and self.config.worker_grpc_idle_s > 0:
            self.dormancy = Dormancy(self, self.config.worker_grpc_idle_s)
            port = self.dormancy.start_asleep(self.host)  # gRPC starts when first asked
        else:
            self.server, port = self.new_server(0)
            await self.server.start()
        self.address = f"{self.host}:{port}"
        self.table.address = self.address

    def new_server(self, port: int) -> tuple[Any, int]:
        """Our CoreWorker server, not started, bound to ``host:port`` (0: any port), and the
        port bound. A worker's shares its port (``core/dormancy.py``)."""
        server = make_server(
            self.token,
            max_message_bytes=self.config.rpc_max_message_bytes,
            reuse_port=self.mode == "worker",
        )
        pb_grpc.add_CoreWorkerServicer_to_server(self.service, server)
        generators.add_to_server(self, server)  # items of generator tasks owned here
        return server, bind(server, self.host, port)

    def run(
        self, coro: Coroutine[Any, Any, T] | Callable[[], Any], timeout: float | None = None
    ) -> T:
        """Run a coroutine, or a zero-argument callable returning an awaitable (an RPC call,
        which must be created on the loop), on the I/O loop and wait for its result."""
        if threading.current_thread() is self.thread:
            raise RuntimeError("CoreClient.run called from the I/O thread")
        if callable(coro):
            factory = coro

            async def call() -> Any:
                return await factory()

            coro = call()
        fut = contextvars.Context().run(asyncio.run_coroutine_threadsafe, coro, self.loop)
        try:
            return fut.result(timeout)
        except BaseException:
            fut.cancel()
            raise

    def call_head(
        self, what: str, call: Callable[[Any], Any], *, not_found: str | None = None
    ) -> Any:
        """``call(head stub)`` run on the I/O loop; a gRPC error is raised as nbcluster's
        exception for it (``protocol/errors.py``; ``not_found``: the ``ValueError`` text)."""
        try:
            return self.run(lambda: call(self.head()))
        except RpcFailure as err:
            raise to_exception(err, Peer.HEAD, what, not_found=not_found) from None

    def call_soon(self, fn: Callable[..., Any], *args: Any) -> None:
        """Schedule ``fn(*args)`` on the I/O loop (thread-safe), outside the caller's contextvars."""
        self.loop.call_soon_threadsafe(fn, *args, context=contextvars.Context())

    def stop(self) -> None:
        """Release everything and stop the I/O thread."""
        if self.closed:
            return
        self.closed = True
        # RPCs cut short by the shutdown fail in tasks nobody awaits any more: their errors
        # ("Task exception was never retrieved ... Channel is closed") are not the user's.
        self.loop.set_exception_handler(_quiet_after_close)
        release = self.table.drop_all()

        async def _stop() -> None:
            if self.mode != "worker" and (
                self.submitter.running() or self.actor_submitter.running()
            ):
                # What running tasks printed just before the driver exits is still on its
                # way (workers send output every FLUSH_INTERVAL_S): print it first, as Ray.
                await asyncio.sleep(EXIT_OUTPUT_GRACE_S)
            self.submitter.shutdown()
            self.actor_submitter.shutdown()
            if release:
                self.releases.queue(release)
                await self.releases.flush()
            if self.dormancy is not None:
                await self.dormancy.stop()
            if self.server is not None:
                await self.server.stop(grace=0.1)
            await self.channels.close()
            me = asyncio.current_task()
            for _ in range(3):  # cancelled tasks may start others while they unwind
                others = [t for t in asyncio.all_tasks() if t is not me]
                if not others:
                    break
                for t in others:
                    t.cancel()
                await asyncio.gather(*others, return_exceptions=True)

        with contextlib.suppress(Exception):
            self.run(_stop(), timeout=5)
        self.loop.call_soon_threadsafe(self.loop.stop)
        if self.thread is not None:
            self.thread.join(timeout=5)
        with contextlib.suppress(Exception):
            self.loop.close()

    # -- stubs -----------------------------------------------------------------------------
    def head(self) -> Any:
        """The head's stub; unary calls ride out a head restart for the grace period."""
        if self._head_retry is None:
            self._head_retry = HeadRetry(self)
        return self._head_retry

    def head_once(self) -> AuthedStub:
        """The head's stub without retries."""
        return self.channels.stub(self.head_address, "head")

    def node(self, address: str | None = None) -> AuthedStub:
        return self.channels.stub(address or self.node_address, "node")

    def core(self, address: str) -> AuthedStub:
        return self.channels.stub(address, "core")

    # -- ids -------------------------------------------------------------------------------
    def next_task_id(self) -> bytes:
        with self._counter_lock:
            self._task_counter += 1
            n = self._task_counter
        return self._task_prefix + n.to_bytes(8, "big")

    # -- references --------------------------------------------------------------------------
    def add_local_ref(self, object_id: bytes, owner: str, borrowed: bool) -> None:
        self.table.add_local_ref(object_id, owner, borrowed)

    def remove_local_ref(self, object_id: bytes) -> None:
        """A ref was dropped (often from ``__del__``, at any point of any thread).

        No lock is waited for here: the garbage collector may run this while this very
        thread holds the table's lock. The common case (a small owned object, the lock
        free) is done at once; anything else goes on a queue that the I/O loop drains, so a
        dropped ref does not wake the loop while a call is on its way.
        """
        if self.closed or self.table.try_drop_local(object_id):
            return
        self._derefs.append(object_id)
        if not self._deref_scheduled:
            self._deref_scheduled = True
            with contextlib.suppress(RuntimeError):  # loop closed at interpreter exit
                self.loop.call_soon_threadsafe(self._drain_derefs)

    def _drain_derefs(self) -> None:
        self._deref_scheduled = False
        derefs = self._derefs
        while derefs:
            release = self.table.remove_local_ref(derefs.popleft())
            if release:
                self.releases.queue(release, on_loop=True)

    def flush_derefs(self) -> None:
        """Process dropped refs now (tests and shutdown)."""
        self.run(self._flush_derefs_async())

    async def _flush_derefs_async(self) -> None:
        self._drain_derefs()

    def _queue_release(self, release: Release) -> None:
        self.releases.queue(release)

    def register_borrows(self, object_ids: Sequence[bytes]) -> Coroutine[Any, Any, None]:
        """Tell owners we hold refs to their objects (awaited before a task replies)."""
        by_owner: dict[str, list[bytes]] = {}
        with self.table.lock:
            for oid in object_ids:
                entry = self.table.entries.get(oid)
                if entry is None or entry.owned or entry.registered:
                    continue
                entry.registered = True
                by_owner.setdefault(entry.owner, []).append(oid)

        async def _send() -> None:
            calls = [
                self.core(owner).UpdateBorrows(
                    pb.BorrowRequest(object_ids=ids, borrower_address=self.address, add=True),
                    timeout=10,
                )
                for owner, ids in by_owner.items()
            ]
            await asyncio.gather(*calls, return_exceptions=True)

        return _send()

    # -- function table ------------------------------------------------------------------------
    def export(self, function_id: bytes, payload: bytes, name: str) -> None:
        """Put a pickled function or class in the head's table once per cluster."""
        if function_id in self.exported:
            return
        try:
            self.run(
                lambda: self.head().ExportFunction(
                    pb.ExportFunctionRequest(
                        function_id=function_id, payload=payload, name=name, job_id=self.job_id
                    ),
                    timeout=60,
                )
            )
        except RpcFailure as err:
            raise to_exception(err, Peer.HEAD, "ExportFunction") from None
        self.exported.add(function_id)

    # -- put -------------------------------------------------------------------------------
    def put_serialized(
        self, sv: SerializedValue, object_id: bytes | None = None
    ) -> tuple[bytes, Entry]:
        """Store a serialized value as a new owned object; return its id and entry."""
        oid = object_id or (self.next_task_id() + (0).to_bytes(4, "big"))
        if sv.contained_refs:
            self.table.mark_escaped(
                [r.binary() for r in sv.contained_refs if r.owner_address == self.address]
            )
        entry = self.table.create_owned(oid)
        if sv.total_size <= self.config.max_inline_bytes:
            entry.set_ready(data=sv.to_bytes())
        else:
            self.write_to_store(oid, sv)
            entry.set_ready(
                in_store=True,
                size=sv.total_size,
                node_id=self.node_id,
                node_address=self.node_address,
            )
        return oid, entry

    def write_to_store(self, object_id: bytes, sv: SerializedValue, owner: str = "") -> None:
        """Reserve room in the local node's store, write the object, and seal it.

        ``owner``: the address of the object's owner (a task's return belongs to the task's
        caller, not to the worker writing it); this process by default. The node frees an
        owner's objects when it dies.
        """
        write_to_local_store(
            self, object_id, sv, owner or self.address, wait_for_seal=self.mode == "worker"
        )

    # -- reading values ------------------------------------------------------------------------
    def value_of(self, object_id: bytes, entry: Entry) -> Any:
        """Deserialize a ready entry (raising the stored error, if any)."""
        if entry.exc is not None:
            raise entry.exc
        if entry.in_store:
            buf = entry.buffer
            if buf is None:
                buf = self.map_from_store(object_id, entry)
                entry.buffer = buf
            value = deserialize(buf)
        else:
            assert entry.data is not None
            value = deserialize(entry.data)
        if entry.is_error:
            raise _as_raisable(value)
        return value

    def map_from_store(self, object_id: bytes, entry: Entry) -> memoryview:
        """Map a stored object read-only (restoring it from spill first when needed)."""
        buf = objstore.read_object(self.store_dir, object_id)
        if buf is None and entry.node_id and self.node_id and entry.node_id != self.node_id:
            # Another node holds it: our node manager pulls a copy into our store.
            try:
                self.run(
                    lambda: self.node().FetchObject(
                        pb.FetchObjectRequest(
                            object_id=object_id,
                            from_address=entry.node_address,
                            size=entry.size,
                            owner_address=entry.owner,
                        ),
                        timeout=600,
                    )
                )
            except RpcFailure as err:
                if "UNAVAILABLE" in (err.details() or "") or isinstance(err, RpcUnavailable):
                    raise SourceUnavailable(entry.node_address) from None
                raise exc.ObjectLostError(
                    object_id.hex(),
                    f"could not fetch it from node {entry.node_address}: {err.details()}",
                ) from None
            buf = objstore.read_object(self.store_dir, object_id)
        if buf is None:
            try:
                reply = self.run(
                    lambda: self.node().GetObjectInfo(
                        pb.ObjectIds(object_ids=[object_id]), timeout=60
                    )
                )
            except RpcFailure as err:  # e.g. OutOfDiskError: no room to restore it from spill
                raise to_exception(err, Peer.NODE, "GetObjectInfo") from None
            if reply.found:
                buf = objstore.read_object(self.store_dir, object_id)
        if buf is None:
            raise exc.ObjectLostError(
                object_id.hex(), "the object is no longer in the node's store"
            )
        return buf

    def get_value(self, ref: Any, entry: Entry, deadline: float | None) -> Any:
        """``value_of``, riding out a node that died under the object (it is rebuilt or lost)."""
        while True:
            if entry.state != READY:  # a node death reset it while we read others: rebuilt
                self.wait_entries([entry], 1, deadline)
                if entry.state != READY:
                    raise exc.GetTimeoutError(
                        f"get() timed out while {ref.hex()} was being rebuilt"
                    )
            try:
                return self.value_of(ref._id, entry)
            except SourceUnavailable as e:
                entry = self._await_relocation(ref, entry, e.address, deadline)

    def _await_relocation(
        self, ref: Any, entry: Entry, address: str, deadline: float | None
    ) -> Entry:
        limit = time.monotonic() + self.config.node_death_timeout_s * 2 + 10
        if deadline is not None:
            limit = min(limit, deadline)
        if not entry.owned:
            # The owner knows where (or whether) it lives now: ask again after a moment.
            time.sleep(0.5)
            with self.table.lock:
                if entry.state == READY and entry.node_address == address:
                    entry.state = PENDING
                    entry.fetching = False
                    entry.buffer = None
        else:
            self.call_soon(self.submitter.ensure_node_watch, min(60.0, limit - time.monotonic()))
            # Wait until the node is declared dead and the object is rebuilt (or lost).
            while entry.state == READY and entry.exc is None and entry.node_address == address:
                if time.monotonic() > limit:
                    raise exc.ObjectLostError(
                        ref.hex(), f"the node {address} that holds it cannot be reached"
                    )
                time.sleep(0.05)
        fresh = self.ensure_tracked([ref])[0]
        self.wait_entries([fresh], 1, limit)
        if fresh.state != READY:
            raise exc.GetTimeoutError(f"get() timed out while {ref.hex()} was being rebuilt")
        return fresh

    # -- waiting -------------------------------------------------------------------------------
    def ensure_tracked(self, refs: Sequence[Any]) -> list[Entry]:
        """Entries for ``refs``; borrowed pending ones get a status request to their owner."""
        entries = []
        to_fetch = []
        with self.table.lock:
            for ref in refs:
                entry = self.table.entries.get(ref._id)
                if entry is None:  # a ref whose client was a previous session
                    entry = Entry(False, ref._owner)
                    why = "the ref belongs to a finished session"
                    if not ref._owner:  # ObjectRef(id) of an object nobody here refers to
                        why = (
                            "its owner is unknown: it was rebuilt from an id "
                            "(ObjectRef(id) / ObjectRef.from_hex) in a process holding no "
                            "ref to it; pass the ObjectRef itself, or owner_address="
                        )
                    entry.set_ready(exc=exc.ObjectLostError(ref.hex(), why))
                elif not entry.owned and entry.state == PENDING and not entry.fetching:
                    entry.fetching = True
                    to_fetch.append((ref._id, entry))
                entries.append(entry)
        for oid, entry in to_fetch:
            self.loop.call_soon_threadsafe(self._start_fetch, oid, entry)
        return entries

    def _start_fetch(self, object_id: bytes, entry: Entry) -> None:
        self.loop.create_task(self.fetch_status(object_id, entry))

    async def fetch_status(self, object_id: bytes, entry: Entry) -> None:
        """Ask the owner of a borrowed object until it is ready (or lost)."""
        owner = entry.owner
        failures = 0
        while entry.state == PENDING and not self.closed:
            try:
                reply = await self.core(owner).GetObjectStatus(
                    pb.ObjectStatusRequest(object_id=object_id, timeout=10.0), timeout=15
                )
            except RpcFailure as err:
                failures += 1
                if failures < 3 and isinstance(err, RpcDeadlineExceeded):
                    continue
                self._finish_borrowed(
                    entry,
                    exc=exc.OwnerDiedError(
                        object_id.hex(),
                        f"the owner {owner} of this object died or cannot be reached",
                    ),
                )
                return
            if reply.status == pb.ObjectStatusReply.READY:
                loc = reply.location
                self._finish_borrowed(
                    entry,
                    data=loc.data if not loc.in_store else None,
                    in_store=loc.in_store,
                    size=loc.size,
                    node_id=loc.node_id,
                    node_address=loc.node_address,
                    is_error=reply.is_error,
                )
                return
            if reply.status in (pb.ObjectStatusReply.FREED, pb.ObjectStatusReply.UNKNOWN):
                self._finish_borrowed(
                    entry,
                    exc=exc.ObjectLostError(object_id.hex(), "the owner no longer has this object"),
                )
                return

    def _finish_borrowed(self, entry: Entry, **kwargs: Any) -> None:
        with self.table.lock:
            if entry.state == READY:
                return
            entry.set_ready(**kwargs)
            entry.fetching = False
        self.table.wake(entry)
        self.submitter.object_ready(entry)

    def wait_entries(
        self,
        entries: Sequence[Entry],
        num_returns: int,
        deadline: float | None,
    ) -> None:
        """Block until ``num_returns`` of ``entries`` are ready or the deadline passes."""
        with self.table.lock:
            pending = [e for e in entries if e.state != READY]
            needed = num_returns - (len(entries) - len(pending))
            if needed <= 0:
                return
            waiter = Waiter(needed)
            for e in pending:
                if e.waiters is None:
                    e.waiters = []
                e.waiters.append(waiter)
        blocked = False
        try:
            if self.mode == "worker":
                blocked = True
                self.on_blocked(True)
            self.submitter.thread_tasks.wait_reading(pending, waiter.event, deadline)  # replies
            while not waiter.event.is_set():
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return
                # Short slices keep Ctrl-C (KeyboardInterrupt) responsive in the main thread.
                waiter.event.wait(0.1 if remaining is None else min(0.1, remaining))
        finally:
            if blocked:
                self.on_blocked(False)
            if not waiter.event.is_set():  # timed out: do not leave the waiter behind
                with self.table.lock:
                    for e in pending:
                        if e.waiters:
                            with contextlib.suppress(ValueError):
                                e.waiters.remove(waiter)

    def on_blocked(self, blocked: bool) -> None:
        """Hook: a worker gives its CPU back while it waits (overridden by the worker)."""

    def running_task(self) -> Any:
        """Hook: the task or actor call running in the caller's thread or asyncio task
        (what ``get_runtime_context()`` reads); None outside one (overridden by workers)."""
        return None

    def add_ready_callback(self, ref: Any, callback: Callable[[], None]) -> None:
        """Call ``callback()`` once ``ref`` is ready (its value or its error is here).

        It runs at once if the ref is ready already, else on the thread that makes it ready
        (this client's I/O loop), possibly under the table's lock: it must only hand off
        (set an event, ``call_soon_threadsafe``), never block or deserialize.
        """
        if not self._queue_waiter(self.ensure_tracked([ref])[0], CallbackWaiter(callback)):
            callback()

    def _queue_waiter(self, entry: Entry, waiter: Any) -> bool:
        """Add ``waiter`` to ``entry``'s; False when it is ready already. Such a waiter
        reads no actor's reply itself: the loop does (actor_submitter, "Thread reads")."""
        with self.table.lock:
            if entry.state == READY:
                return False
            if entry.waiters is None:
                entry.waiters = []
            entry.waiters.append(waiter)
        self.submitter.thread_tasks.loop_reads_soon([entry])
        return True

    async def get_async(self, ref: Any) -> Any:
        """The ref's value, awaited on the caller's event loop (``await ref``).

        No thread per await: a callback waiter on the object's entry wakes the awaiting
        loop. Deserializing a stored object may need this client's I/O loop (a fetch from
        another node), so that part runs in a thread, as does any wait on the I/O loop itself.
        """
        entry = self.ensure_tracked([ref])[0]
        loop = asyncio.get_running_loop()
        if loop is self.loop:  # never block the I/O loop on its own work
            return await asyncio.wrap_future(self.as_future(ref))
        if entry.state != READY:
            ready: asyncio.Future[None] = loop.create_future()

            def wake() -> None:
                loop.call_soon_threadsafe(_resolve_once, ready)

            waiter = CallbackWaiter(wake)
            if self._queue_waiter(entry, waiter):
                try:
                    await ready
                except BaseException:
                    with self.table.lock:
                        if entry.waiters:
                            with contextlib.suppress(ValueError):
                                entry.waiters.remove(waiter)
                    raise
        if entry.in_store and entry.exc is None and entry.buffer is None:
            return await asyncio.to_thread(self.value_of, ref._id, entry)
        return self.value_of(ref._id, entry)

    def as_future(self, ref: Any) -> concurrent.futures.Future[Any]:
        """A concurrent future resolved with the ref's value (or error)."""
        fut: concurrent.futures.Future[Any] = concurrent.futures.Future()

        def waiter() -> None:
            try:
                entry = self.ensure_tracked([ref])[0]
                self.wait_entries([entry], 1, None)
                fut.set_result(self.value_of(ref._id, entry))
            except BaseException as e:  # noqa: BLE001 - delivered through the future
                fut.set_exception(e)

        threading.Thread(target=waiter, daemon=True, name="nbcluster-future").start()
        return fut

    # -- cluster info ----------------------------------------------------------------------------
    def hostname(self) -> str:
        return socket.gethostname()

    async def alive_nodes(self, max_age: float = 1.0) -> list[Any]:
        """The live nodes (cached for ``max_age`` seconds), for SPREAD and node affinity."""
        now = time.monotonic()
        cached = self._nodes_cache
        if cached is not None and now - cached[0] < max_age:
            return cached[1]
        reply = await self.head().GetNodes(pb.GetNodesRequest(), timeout=10)
        nodes = [n for n in reply.nodes if n.alive]
        self._nodes_cache = (now, nodes)
        return nodes

    async def placement_group_info(self, pg_id: bytes) -> Any:
        """The group's record once it is CREATED (waits while it is PENDING)."""
        info = self._pg_cache.get(pg_id)
        if info is not None:
            return info
        version = 0
        while not self.closed:
            info = await self.head().WaitPlacementGroup(
                pb.PlacementGroupRequest(pg_id=pg_id, after_version=version, timeout=20.0),
                timeout=30,
            )
            version = info.version
            if info.state != pb.PlacementGroupInfo.PENDING:
                if info.state == pb.PlacementGroupInfo.CREATED:
                    self._pg_cache[pg_id] = info
                return info
        raise exc.NbclusterError("the client is closed")

    def cached_placement_group(self, pg_id: bytes) -> Any:
        """The group's record when this client knows it is CREATED, else None (no call)."""
        return self._pg_cache.get(pg_id)

    def forget_placement_group(self, pg_id: bytes) -> None:
        self._pg_cache.pop(pg_id, None)

    def remember_placement_group(self, info: Any) -> None:
        """A group the head answered as CREATED: ``ready()`` needs no wait for it."""
        if info.state == pb.PlacementGroupInfo.CREATED:
            self._pg_cache[info.pg_id] = info


#: How long a driver that exits with tasks still running waits for what they printed.
EXIT_OUTPUT_GRACE_S = 0.5


def _quiet_after_close(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    """The I/O loop's exception handler once the client is stopping: debug log only."""
    log.debug("after shutdown: %s", context.get("message"), exc_info=context.get("exception"))


class SourceUnavailable(Exception):
    """The node holding an object's only copy cannot be reached (it may have died)."""

    def __init__(self, address: str) -> None:
        super().__init__(address)
        self.address = address


def _raise_fd_limit() -> None:
    import resource

    with contextlib.suppress(ValueError, OSError):
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft < hard:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def _as_raisable(value: Any) -> BaseException:
    if isinstance(value, exc.TaskError):
        return value.as_instanceof_cause()
    if isinstance(value, BaseException):
        return value
    return exc.NbclusterSystemError(f"an error object of unexpected type {type(value).__name__}")


def _resolve_once(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)
