"""Task submission, the shell: dependency resolution, RPCs, streams and timers.

The hot path (DESIGN §2): a task whose arguments are ready joins the queue of its
scheduling key (resource shape + strategy). Each key holds worker leases from node
managers; specs go to leased workers in batches over one persistent stream per lease and
replies come back the same way. A lease is kept for a short idle period so the next task
of the same shape skips the lease round trip.

Every decision about queues, leases, retries and cancellation is made by the pure state
machine :class:`~nbcluster._runtime.core.owner_state.OwnerState`; this module feeds it
events (from the object table, RPC replies, worker streams, timers) and carries out the
instructions it returns. Everything here runs on the I/O loop except
:meth:`Submitter.submit`, :meth:`Submitter.check_capacity` and :meth:`Submitter.cancel`,
which user threads call, and the thread I/O of ``thread_tasks.py``: a caller's thread may
write its task and read its reply itself. Every event of the state machine and every write
to a channel happens under :attr:`Submitter.lock` (shared with the actor submitter).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import contextvars
import logging
import threading
import time
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from nbcluster._runtime import exceptions as exc
from nbcluster._runtime.core import instructions as ins
from nbcluster._runtime.core.channel import StreamOpener, reply_handler
from nbcluster._runtime.core.node_watch import NodeWatch
from nbcluster._runtime.core.owner_state import MAX_LEASE_REQUESTS, OwnerState
from nbcluster._runtime.core.ownership import PENDING, READY, Entry, Release
from nbcluster._runtime.core.pending_tasks import PendingReporter
from nbcluster._runtime.core.records import FAST_TASK_S, KeyQueue, Lease, TaskRecord
from nbcluster._runtime.core.routes import resolve_route
from nbcluster._runtime.core.task_args import locality, lost_argument, pins_lineage
from nbcluster._runtime.core.thread_reads import LoopSpin
from nbcluster._runtime.core.thread_tasks import ThreadTasks, fill_spec
from nbcluster._runtime.protocol.errors import RpcFailure
from nbcluster._runtime.protocol.rpc import pb
from nbcluster._runtime.task_events import record_crashed_attempt

if TYPE_CHECKING:
    from nbcluster._runtime.core.ports import SubmitterHost

__all__ = [
    "FAST_TASK_S",
    "MAX_LEASE_REQUESTS",
    "KeyQueue",
    "Lease",
    "Submitter",
    "TaskRecord",
]

log = logging.getLogger(__name__)


class Submitter:
    """Submits this process's tasks and tracks them until their results are in."""

    def __init__(self, client: SubmitterHost) -> None:
        self.client = client
        config = client.config
        #: Held around every event of :attr:`state` and every write to a lease's channel, by
        #: the loop and by callers' threads (``thread_tasks.py``); the actor submitter shares
        #: it (one lock: a reply one handles may complete work of the other). Reentrant.
        self.lock = threading.RLock()
        self.state = OwnerState(
            max_depth=config.max_tasks_in_flight_per_worker,
            idle_timeout_s=config.lease_idle_timeout_s,
            oom_retries=config.task_oom_retries,
            local_address=lambda: client.node_address,
        )
        self._inbox: collections.deque[TaskRecord] = collections.deque()
        self._inbox_lock = threading.Lock()
        self._inbox_scheduled = False
        self._dirty: list[Lease] = []  # outboxes to write at the end of this loop turn
        self._flush_scheduled = False
        self._open: set[bytes] = set()  # tasks (not actor calls) submitted and not yet done
        self._returns_out = 0  # ReturnWorkerLease calls sent and not yet answered
        self._async_waiters: dict[int, list[asyncio.Future[None]]] = {}
        self.node_watch = NodeWatch(
            client, self.state.has_work_out, lambda: self.closed, self.node_died
        )
        self.dead_nodes = self.node_watch.dead
        self.pending_report = PendingReporter(client)  # issue 17: list_tasks sees waiting tasks
        self.streams = StreamOpener(client)  # task channels (or gRPC streams) to workers
        self.thread_tasks = ThreadTasks(self)
        #: The loop's poll for a lone fast task's reply (None: off, ``config.loop_spin``).
        self.spin: LoopSpin | None = LoopSpin() if client.config.loop_spin else None
        self.handlers: dict[type, Callable[[Any], None]] = {
            ins.Send: self._do_send,
            ins.RequestLease: self._do_request_lease,
            ins.ResolveRoute: self._do_resolve_route,
            ins.CancelLeaseRequest: self._do_cancel_request,
            ins.OpenStream: self._do_open_stream,
            ins.ReturnLease: self._do_return_lease,
            ins.ReturnGrant: self._do_return_grant,
            ins.StartIdleTimer: self._do_start_idle_timer,
            ins.StopIdleTimer: self._do_stop_idle_timer,
            ins.PumpLater: self._do_pump_later,
            ins.WarnInfeasible: self._do_warn_infeasible,
            ins.ForgetPlacementGroup: self._do_forget_placement_group,
            ins.WatchNodes: self._do_watch_nodes,
            ins.AskExitInfo: self._do_ask_exit_info,
            ins.RecordCrashedAttempt: self._do_record_crashed_attempt,
            ins.CancelRunning: self._do_cancel_running,
            ins.CancelActorCall: self._do_cancel_actor_call,
            ins.Complete: self._do_complete,
            ins.Fail: self._do_fail,
        }

    @property
    def tasks(self) -> dict[bytes, TaskRecord]:
        """Task id -> record of every task and actor call not yet done (loop thread)."""
        return self.state.tasks

    @property
    def keys(self) -> dict[tuple[Any, ...], KeyQueue]:
        """Scheduling key -> its queue and leases (loop thread)."""
        return self.state.keys

    @property
    def closed(self) -> bool:
        """True after :meth:`shutdown`."""
        return self.state.closed

    # -- from user threads ------------------------------------------------------------------
    def check_capacity(self) -> None:
        """Raise ``PendingTasksLimitExceeded`` when this process already has
        ``max_pending_tasks`` tasks submitted and not finished (thread-safe)."""
        cap = self.client.config.max_pending_tasks
        if cap > 0 and len(self._open) >= cap:
            raise exc.PendingTasksLimitExceeded(limit=cap)

    def submit(self, rec: TaskRecord) -> None:
        """Queue a task built by the caller (thread-safe, batched wake-up of the loop), or
        send it from this thread (``thread_tasks.py``)."""
        if not rec.actor:
            with self._inbox_lock:
                self._open.add(rec.task_id)
            if self.thread_tasks.send(rec):
                return
        with self._inbox_lock:
            self._inbox.append(rec)
            if self._inbox_scheduled:
                return
            self._inbox_scheduled = True
        # A fresh context: loop callbacks must not carry the submitting cell's contextvars.
        self.client.loop.call_soon_threadsafe(self._drain_inbox, context=contextvars.Context())

    def cancel(self, task_id: bytes, force: bool) -> None:
        """Cancel a task (thread-safe)."""
        self.client.loop.call_soon_threadsafe(self._cancel, task_id, force)

    # -- carrying out the state machine's instructions ------------------------------------------
    def _event(self, event: Callable[..., list[Any]], *args: Any) -> None:
        with self.lock:
            self._do(event(*args))

    def locked_do(self, out: list[Any]) -> None:
        """Carry out ``out`` under the lock (instructions a caller's thread left to the loop)."""
        with self.lock:
            self._do(out)

    def _ready(self, ready: list[TaskRecord]) -> None:
        if self.thread_tasks.leases:  # (a worker that died idle is not given work)
            self.thread_tasks.check_ends()
        self._do(self.state.ready(ready))

    def _do(self, out: list[Any]) -> None:
        handlers = self.handlers
        for instruction in out:
            handlers[type(instruction)](instruction)

    def _do_send(self, i: ins.Send) -> None:
        lease = i.lease
        for rec in i.records:
            fill_spec(rec.spec, lease)
            lease.outbox.append(rec.spec)
        self.flush(lease)

    def flush(self, lease: Lease) -> None:
        """Write the lease's outbox (once its stream is open): on a task channel with room,
        once the loop's current callback is done (tasks queued together leave in one
        frame); else from a writer task."""
        if not lease.outbox or lease.writing or lease.call is None or lease.handoff:
            return  # (a handoff flushes when it is done)
        lease.writing = True
        self._dirty.append(lease)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self.client.loop.call_soon(self._flush_dirty)

    def _flush_dirty(self) -> None:
        with self.lock:
            self._flush_scheduled = False
            dirty, self._dirty = self._dirty, []
            spin = self.spin
            fd = self._spin_for(spin, dirty[0]) if spin is not None and len(dirty) == 1 else None
            for lease in dirty:
                self._write_now(lease)
        if spin is not None and fd is not None:  # (outside the lock: callers go on meanwhile)
            spin.spin(fd)

    def _spin_for(self, spin: LoopSpin, lease: Lease) -> int | None:
        """The descriptor to poll for the reply of what goes out to ``lease`` now, when it
        is one fast task alone (``thread_reads.LoopSpin``); the task then carries
        ``poll_after``."""
        call = lease.call
        if len(lease.outbox) != 1 or len(lease.inflight) != 1 or call is None:
            return None
        spec = lease.outbox[0]
        readable = getattr(call, "thread_readable", None)
        if readable is None or not readable():
            return None
        if not spin.wanted(self.state.fn_avg.get(spec.function_id)):
            return None
        spec.poll_after = True  # its worker polls for the next task in turn
        return call.fileno()

    def _write_now(self, lease: Lease) -> None:
        lease.writing = False
        if not lease.outbox or lease.call is None or lease.handoff:
            return
        self.thread_tasks.loop_reads(lease)  # replies of what goes out now come to the loop
        drain = False
        write_nowait = getattr(lease.call, "write_nowait", None)
        if write_nowait is not None and not lease.dead:
            batch, lease.outbox = lease.outbox, []
            try:
                drain = write_nowait(pb.TaskBatch(tasks=batch))
            except ConnectionError:
                lease.outbox[:0] = batch  # the writer task meets the same end and reports it
            else:
                if not drain:
                    return
        lease.writing = True
        self.client.loop.create_task(self._writer(lease, drain))

    async def _writer(self, lease: Lease, drain: bool = False) -> None:
        try:
            if drain:
                await lease.call.drain()
            while lease.outbox and not lease.dead:
                batch, lease.outbox = lease.outbox, []
                await lease.call.write(pb.TaskBatch(tasks=batch))
        except Exception as err:  # noqa: BLE001 - the reader sees the same failure
            log.debug("write to worker failed: %r", err)
            self._event(self.state.stream_broken, lease)
        finally:
            lease.writing = False

    def _do_request_lease(self, i: ins.RequestLease) -> None:
        self.client.loop.create_task(self._lease_request(i.kq, i.request_id, i.address, i.spill))

    async def _lease_request(self, kq: KeyQueue, rid: bytes, address: str, spill: bool) -> None:
        client = self.client
        try:
            reply = await client.node(address).RequestWorkerLease(
                pb.LeaseRequest(
                    resources=kq.resources,
                    owner_address=client.address,
                    job_id=client.job_id,
                    no_spillback=not spill,
                    request_id=rid,
                    strategy=kq.strategy if isinstance(kq.strategy, str) else "DEFAULT",
                    runtime_env=kq.runtime_env,
                )
            )
        except RpcFailure as err:
            if not self.closed:
                log.warning("lease request to %s failed: %s", address, err.code().name)
            self._event(self.state.lease_request_failed, kq, rid)
            return
        self._event(self.state.lease_reply, kq, rid, address, spill, reply)

    def _do_resolve_route(self, i: ins.ResolveRoute) -> None:
        self.client.loop.create_task(self._resolve_route(i.kq, i.request_id))

    async def _resolve_route(self, kq: KeyQueue, rid: bytes) -> None:
        """Find the nodes a strategy that names them may use (SPREAD, node affinity,
        placement group); the state machine picks one."""
        try:
            addresses, spill = await resolve_route(self.client, kq)
        except exc.TaskUnschedulableError as err:
            self._event(self.state.route_unschedulable, kq, rid, err)
            return
        except RpcFailure as err:
            log.warning("could not route a lease request: %s", err.code().name)
            self._event(self.state.route_unreachable, kq, rid)
            return
        self._event(self.state.route_resolved, kq, rid, addresses, spill)

    def _do_cancel_request(self, i: ins.CancelLeaseRequest) -> None:
        self.client.loop.create_task(self._cancel_request(i.address, i.request_id))

    async def _cancel_request(self, address: str, rid: bytes) -> None:
        with contextlib.suppress(RpcFailure):
            await self.client.node(address).CancelWorkerLease(
                pb.CancelLeaseRequest(request_id=rid), timeout=5
            )

    def _do_open_stream(self, i: ins.OpenStream) -> None:
        self.client.loop.create_task(self._open_stream(i.lease))

    async def _open_stream(self, lease: Lease) -> None:
        try:
            call = await self.streams.open_lease(lease)
        except (TimeoutError, RpcFailure, OSError) as err:
            log.debug("could not open a stream to worker %s: %r", lease.worker_address, err)
            self._event(self.state.stream_open_failed, lease)
            return
        with self.lock:
            if lease.dead or lease.returned:  # given back meanwhile (shutdown, node died)
                call.cancel()
                return
            lease.call = call
            if hasattr(call, "on_replies"):  # a task channel: replies handled as they arrive
                call.on_replies(
                    reply_handler(
                        call,
                        lambda batch: self.replies_read(lease, batch),
                        lambda: self._stream_ended(lease),
                    )
                )
            else:
                self.client.loop.create_task(self._reader(lease))
            self.flush(lease)

    async def _reader(self, lease: Lease) -> None:
        """Replies read off a gRPC stream."""
        call = lease.call
        try:
            while True:
                batch = await call.read()
                if batch is None or batch is _EOF():
                    break
                self.replies_read(lease, batch)
        except (asyncio.CancelledError, Exception) as err:  # noqa: BLE001
            log.debug("stream from worker ended: %r", err)
        self._stream_ended(lease)

    def replies_read(self, lease: Lease, batch: pb.ReplyBatch) -> None:
        """Replies the loop read (or a reading thread left to it: output first)."""
        with self.lock:
            for record in batch.logs:
                self._on_log(record)
            if batch.replies:
                self._do(self.state.replies(lease, batch.replies))
            if not lease.inflight:
                self.thread_tasks.to_threads(lease)

    def _stream_ended(self, lease: Lease) -> None:
        with self.lock:
            self.thread_tasks.drop(lease)
            if not lease.returned:
                self._do(self.state.stream_broken(lease))

    def _on_log(self, record: pb.LogRecord, rec: TaskRecord | None = None) -> None:
        rec = rec if rec is not None else self.state.tasks.get(record.task_id)
        handler = self.client.output_handler
        try:
            handler(rec.context if rec is not None else None, rec.name if rec else "task", record)
        except Exception:  # noqa: BLE001 - output must never break the task stream
            log.exception("output handler failed")

    def _do_return_lease(self, i: ins.ReturnLease) -> None:
        lease = i.lease
        self.thread_tasks.drop(lease)
        if lease.call is not None:
            with contextlib.suppress(Exception):
                lease.call.cancel()
        self.client.loop.create_task(
            self._return_lease_rpc(lease.node_address, lease.lease_id, i.failed)
        )

    def _do_return_grant(self, i: ins.ReturnGrant) -> None:
        self.client.loop.create_task(self._return_lease_rpc(i.address, i.lease_id, False))

    async def _return_lease_rpc(self, address: str, lease_id: bytes, failed: bool) -> None:
        self._returns_out += 1
        try:
            with contextlib.suppress(RpcFailure):
                await self.client.node(address).ReturnWorkerLease(
                    pb.ReturnLeaseRequest(lease_id=lease_id, worker_failed=failed), timeout=10
                )
        finally:
            self._returns_out -= 1

    def release_idle_leases(self) -> None:
        """Give back every idle lease now, not at its idle timer (loop thread)."""
        self._event(self.state.release_idle)

    def holds_leases(self) -> bool:
        """True while this owner holds a worker lease, asks for one, or its node has not yet
        answered the return of one (loop thread): until then its node's resources may show
        in use."""
        return self._returns_out > 0 or any(
            kq.leases or kq.requests for kq in self.state.keys.values()
        )

    def _do_start_idle_timer(self, i: ins.StartIdleTimer) -> None:
        lease = i.lease
        if lease.idle_handle is not None:
            lease.idle_handle.cancel()
        lease.idle_handle = self.client.loop.call_later(i.delay, self._idle_expired, lease, i.gen)

    def _idle_expired(self, lease: Lease, gen: int) -> None:
        lease.idle_handle = None
        self._event(self.state.idle_expired, lease, gen)

    def _do_stop_idle_timer(self, i: ins.StopIdleTimer) -> None:
        lease = i.lease
        if lease.idle_handle is not None:
            lease.idle_handle.cancel()
            lease.idle_handle = None

    def _do_pump_later(self, i: ins.PumpLater) -> None:
        self.client.loop.call_later(i.delay, self._pump, i.kq)

    def _pump(self, kq: KeyQueue) -> None:
        self._event(self.state.pump, kq)

    def _do_warn_infeasible(self, i: ins.WarnInfeasible) -> None:
        log.info(i.text)
        warnings.warn(i.text, exc.InfeasibleResourceWarning, stacklevel=1)

    def _do_forget_placement_group(self, i: ins.ForgetPlacementGroup) -> None:
        self.client.forget_placement_group(i.pg_id)

    def _do_watch_nodes(self, i: ins.WatchNodes) -> None:
        self.ensure_node_watch()

    def _do_ask_exit_info(self, i: ins.AskExitInfo) -> None:
        self.client.loop.create_task(self._ask_exit_info(i.lease, i.records))

    async def _ask_exit_info(self, lease: Lease, recs: list[TaskRecord]) -> None:
        detail, started = f"worker (pid {lease.worker_pid}) died", b""
        node_dead = lease.node_id in self.dead_nodes
        try:
            if not node_dead:
                info = await self.client.node(lease.node_address).GetWorkerExitInfo(
                    pb.WorkerRef(worker_id=lease.worker_id), timeout=5
                )
                detail = info.detail if info.found and info.detail else detail
                started = info.started  # what it began last (running_mark): charged
        except RpcFailure:
            node_dead = True  # its node cannot say why: it died (Ray's NODE_DIED)
        if node_dead:
            detail = f"node {lease.node_address} died or cannot be reached"
        self._event(self.state.crash_explained, lease, recs, detail, node_dead, started)

    def _do_record_crashed_attempt(self, i: ins.RecordCrashedAttempt) -> None:
        # issue 17: the dead worker never reports this attempt; its owner does
        record_crashed_attempt(
            self.client, i.record.spec, i.record.name, i.detail, i.oom, i.attempt
        )

    def _do_cancel_running(self, i: ins.CancelRunning) -> None:
        self.client.loop.create_task(self._cancel_remote(i.lease, i.task_id, i.force))

    async def _cancel_remote(self, lease: Lease, task_id: bytes, force: bool) -> None:
        client = self.client
        if force:
            with contextlib.suppress(RpcFailure):
                await client.node(lease.node_address).KillWorker(
                    pb.WorkerRef(worker_id=lease.worker_id, force=True), timeout=5
                )
            return
        with contextlib.suppress(RpcFailure):
            await client.core(lease.worker_address).CancelTask(
                pb.CancelTaskRequest(task_id=task_id), timeout=5
            )

    def _do_cancel_actor_call(self, i: ins.CancelActorCall) -> None:
        self.client.actor_submitter.cancel(i.record)

    def _do_complete(self, i: ins.Complete) -> None:
        self._complete(i.record, i.reply)

    def _do_fail(self, i: ins.Fail) -> None:
        if i.source is not None:
            self._fail_with_data(i.record, i.source.data, i.source)
        else:
            assert i.error is not None
            self._fail(i.record, i.error)

    # -- dependencies (the object table) ---------------------------------------------------------
    def _drain_inbox(self) -> None:
        with self._inbox_lock:
            batch = list(self._inbox)
            self._inbox.clear()
            self._inbox_scheduled = False
        ready: list[TaskRecord] = []
        now = time.monotonic()
        state = self.state
        with self.lock:
            for rec in batch:
                rec.submitted_at = now
                state.add(rec)
                if rec.actor:  # its place in the actor's queue is fixed now, in call order
                    self.client.actor_submitter.enqueue(rec)
                self._resolve_deps(rec, ready)
            if ready:
                self._ready(ready)
            self._flush_dirty()  # tasks and actor calls leave now, together
            self.client.actor_submitter.flush_dirty()
        self.pending_report.wake()

    def _resolve_deps(self, rec: TaskRecord, ready: list[TaskRecord]) -> None:
        table = self.client.table
        pending = 0
        for oid in rec.dep_ids:
            entry = table.get(oid)
            if entry is None and rec.lineage:  # rebuilding rec: a freed argument is made again
                entry = self._rebuild_freed(rec, oid, ready)
            if entry is not None and pins_lineage(entry):
                if rec.lineage is None:  # the makers of arguments that can be rebuilt
                    rec.lineage = {}
                rec.lineage[oid] = entry.task
            if entry is not None:  # a reply a caller's thread would read comes here now
                self.thread_tasks.loop_reads_for(entry)
            if entry is None or entry.state == READY:
                continue
            pending += 1
            if entry.dependents is None:
                entry.dependents = []
            entry.dependents.append(rec)
            if not entry.owned and not entry.fetching:
                entry.fetching = True
                self.client.loop.create_task(self.client.fetch_status(oid, entry))
        rec.pending_deps = pending
        if pending == 0:
            self._resolve(rec, ready)

    def object_ready(self, entry: Entry) -> None:
        """An object became ready: wake tasks and async waiters that wait for it."""
        waiters = self._async_waiters.pop(id(entry), None)
        if waiters:
            for fut in waiters:
                if not fut.done():
                    fut.set_result(None)
        deps = entry.dependents
        if not deps:
            return
        with self.lock:
            entry.dependents = None
            ready: list[TaskRecord] = []
            for rec in deps:
                rec.pending_deps -= 1
                if rec.pending_deps == 0 and not rec.done:
                    self._resolve(rec, ready)
            if ready:
                self._ready(ready)

    def add_async_waiter(self, entry: Entry, fut: asyncio.Future[None]) -> None:
        """Complete ``fut`` when ``entry`` becomes ready (loop thread)."""
        self.thread_tasks.loop_reads_for(entry)
        if entry.state == READY:
            fut.set_result(None)
            return
        self._async_waiters.setdefault(id(entry), []).append(fut)

    def _resolve(self, rec: TaskRecord, ready: list[TaskRecord]) -> None:
        """All dependencies are ready: fill in their values (or fail with theirs); a task
        then goes to the state machine (``ready``), an actor call to its actor's queue."""
        if rec.cancelled:
            self._fail(rec, exc.TaskCancelledError(rec.task_id.hex()))
            return
        table = self.client.table
        spec = rec.spec
        if rec.dep_ids:  # (most tasks take no ref: nothing to fill in, no bytes to follow)
            del spec.resolved_args[:]
        for oid in rec.dep_ids:
            entry = table.get(oid)
            if entry is None:
                freed = exc.ObjectFreedError(oid.hex(), "an argument was freed before the task ran")
                self._fail(rec, lost_argument(rec, freed))
                return
            if entry.exc is not None:
                self._fail(rec, lost_argument(rec, entry.exc))
                return
            if entry.is_error:
                self._fail_with_data(rec, entry.data, entry)
                return
            spec.resolved_args.add(
                object_id=oid,
                data=entry.data if not entry.in_store else b"",
                in_store=entry.in_store,
                size=entry.size,
                node_id=entry.node_id,
                node_address=entry.node_address,
                owner_address=entry.owner,
            )
        if rec.actor:
            rec.resolved = True
            self.client.actor_submitter.ready(rec)
            return
        rec.locality = locality(spec, self.client.node_address) if rec.dep_ids else ""
        ready.append(rec)

    # -- results -----------------------------------------------------------------------------
    def _complete(self, rec: TaskRecord, reply: pb.TaskReply) -> None:
        client = self.client
        table = client.table
        ready: list[Entry] = []
        orphans: list[tuple[str, bytes]] = []
        with table.lock:
            for loc in reply.returns:
                entry = table.entries.get(loc.object_id)
                if entry is None:
                    if loc.in_store:
                        orphans.append((loc.node_address, loc.object_id))
                    continue
                entry.set_ready(
                    data=None if loc.in_store else loc.data,
                    in_store=loc.in_store,
                    size=loc.size,
                    node_id=loc.node_id,
                    node_address=loc.node_address,
                    is_error=reply.is_error,
                )
                ready.append(entry)
        if rec.lineage and rec.generator is None and not any(r.in_store for r in reply.returns):
            rec.lineage = None  # no output can be lost: it never reruns (Ray: lineage released)
        self._finish(rec, ready, replied=True)
        if orphans:
            rel = Release()
            rel.free_in_store.extend(orphans)
            client._queue_release(rel)

    def _fail(self, rec: TaskRecord, error: BaseException) -> None:
        table = self.client.table
        ready = []
        with table.lock:
            for oid in rec.return_ids:
                entry = table.entries.get(oid)
                if entry is not None and entry.state == PENDING:
                    entry.set_ready(exc=error)
                    ready.append(entry)
        self._finish(rec, ready)

    def _fail_with_data(self, rec: TaskRecord, data: bytes | None, src: Entry) -> None:
        table = self.client.table
        ready = []
        with table.lock:
            for oid in rec.return_ids:
                entry = table.entries.get(oid)
                if entry is not None and entry.state == PENDING:
                    entry.set_ready(
                        data=data,
                        in_store=src.in_store,
                        size=src.size,
                        node_id=src.node_id,
                        node_address=src.node_address,
                        is_error=True,
                    )
                    ready.append(entry)
        self._finish(rec, ready)

    def _finish(self, rec: TaskRecord, ready: list[Entry], replied: bool = False) -> None:
        with self.lock:
            self.state.finish(rec)
        if self._open:
            with self._inbox_lock:
                self._open.discard(rec.task_id)
        table = self.client.table
        for entry in ready:
            table.wake(entry)
            self.object_ready(entry)
        if rec.generator is not None:  # where the stream ends (and its error's position)
            rec.generator.task_finished()
        if rec.dep_ids or rec.nested_ids:
            release = table.remove_submitted(rec.dep_ids + rec.nested_ids)
            if release:
                self.client._queue_release(release)
        if rec.actor and not replied:  # one that failed while queued held back later calls
            self.client.actor_submitter.ready(rec)

    # -- cancellation -------------------------------------------------------------------------
    def _cancel(self, task_id: bytes, force: bool) -> None:
        with self.lock:
            rec = self.client.actor_submitter.sent_call(task_id)  # a caller's thread sent it?
            if rec is not None and not rec.done and task_id not in self.state.tasks:
                self.state.add(rec)
            self._do(self.state.cancel(task_id, force))

    # -- node failures -------------------------------------------------------------------------
    def ensure_node_watch(self, hold_s: float = 0.0) -> None:
        """Watch for dead nodes while work is out (and ``hold_s`` s at least: a get() waits
        for an owned object's node to be judged); see ``node_watch.py``."""
        self.node_watch.ensure(hold_s)

    def node_died(self, node_id: bytes, address: str, reason: str) -> None:
        """A node is gone: its leases failed; objects that lived only there are lost."""
        log.warning("node %s died: %s", node_id.hex()[:8], reason)
        with self.lock:
            self._node_died(node_id, address, reason)

    def _node_died(self, node_id: bytes, address: str, reason: str) -> None:
        self._do(self.state.node_died(node_id, address))
        table = self.client.table
        resubmit: dict[bytes, TaskRecord] = {}
        lost: list[Entry] = []
        with table.lock:
            for oid, entry in table.entries.items():
                if not (
                    entry.owned
                    and entry.state == READY
                    and entry.in_store
                    and entry.node_id == node_id
                ):
                    continue
                rec = entry.task
                if isinstance(rec, TaskRecord) and rec.retries_left != 0 and not rec.cancelled:
                    entry.state = PENDING
                    entry.buffer = None
                    resubmit[rec.task_id] = rec
                elif isinstance(rec, TaskRecord):
                    entry.set_ready(
                        exc=exc.ObjectReconstructionFailedMaxAttemptsExceededError(
                            oid.hex(),
                            f"its node died ({reason}) and the task that made it ({rec.name}) has "
                            "no retries left (raise max_retries to allow reconstruction)",
                        )
                    )
                    lost.append(entry)
                else:
                    entry.set_ready(
                        exc=exc.ObjectLostError(
                            oid.hex(),
                            f"its node died ({reason}); objects made with put() cannot be rebuilt",
                        )
                    )
                    lost.append(entry)
        for entry in lost:
            table.wake(entry)
        ready: list[TaskRecord] = []
        for rec in resubmit.values():
            self._rerun(rec, ready)
        if ready:
            self._ready(ready)

    def _rerun(self, rec: TaskRecord, ready: list[TaskRecord]) -> None:
        """Lineage reconstruction: run the task that made lost objects again (one retry)."""
        self.state.reopen(rec)
        if rec.generator is not None:
            rec.generator.reopen()  # a generator task: its items are reported again
        self.client.table.add_submitted(rec.dep_ids + rec.nested_ids)
        self._resolve_deps(rec, ready)

    def _rebuild_freed(self, rec: TaskRecord, oid: bytes, ready: list[TaskRecord]) -> Entry | None:
        """``rec`` runs again, but its argument ``oid`` was freed after it first ran: make
        the argument again from its pinned lineage (recursively, as deep as needed). The
        new entry is held by ``rec`` until it finishes. None if its lineage is unknown."""
        assert rec.lineage is not None
        maker = rec.lineage.get(oid)
        if maker is None:
            return None
        table = self.client.table
        entry = table.create_owned(oid, task=maker)
        with table.lock:
            entry.submitted += 1
            if maker.done and (maker.retries_left == 0 or maker.cancelled):
                entry.set_ready(
                    exc=exc.ObjectReconstructionFailedMaxAttemptsExceededError(
                        oid.hex(),
                        f"{rec.name} needs it again after it was freed, and the task that "
                        f"made it ({maker.name}) has no retries left (raise max_retries to "
                        "allow reconstruction)",
                    )
                )
                return entry
        if maker.done:  # (not done: it is running again already and fills this entry too)
            self._rerun(maker, ready)
        return entry

    def running(self) -> bool:
        """True while a task of this process runs (or is sent) on a leased worker."""
        return self.state.running()

    def shutdown(self) -> None:
        """Stop: return leases, fail nothing (the process is going away)."""
        with self.lock:
            self.thread_tasks.shutdown()
            self._do(self.state.close())


def _EOF() -> Any:
    import grpc.aio

    return grpc.aio.EOF
