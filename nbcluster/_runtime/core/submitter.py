"""Task submission: dependency resolution, worker leases, streams, retries, cancellation.

The hot path (DESIGN §2): a task whose arguments are ready joins the queue of its
scheduling key (resource shape + strategy). Each key holds worker leases from node
managers; specs go to leased workers in batches over one persistent stream per lease and
replies come back the same way. A lease is kept for a short idle period so the next task
of the same shape skips the lease round trip. Everything here runs on the I/O loop except
:meth:`Submitter.submit`, which user threads call.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import contextvars
import logging
import os
import threading
import time
import warnings
from typing import TYPE_CHECKING, Any

from nbcluster._runtime import exceptions as exc
from nbcluster._runtime.core.ownership import PENDING, READY, Entry
from nbcluster._runtime.core.pending_tasks import PendingReporter
from nbcluster._runtime.protocol.errors import RpcError
from nbcluster._runtime.protocol.rpc import pb
from nbcluster._runtime.serialization import serialize
from nbcluster._runtime.task_events import record_crashed_attempt

if TYPE_CHECKING:
    from nbcluster._runtime.core.client import CoreClient

log = logging.getLogger(__name__)

MAX_LEASE_REQUESTS = 16
FAST_TASK_S = 0.002  # tasks shorter than this on average are pipelined on a worker


class TaskRecord:
    """An owner's record of one submitted task (also its lineage)."""

    __slots__ = (
        "task_id",
        "spec",
        "key",
        "resources",
        "strategy",
        "return_ids",
        "retries_left",
        "dep_ids",
        "nested_ids",
        "pending_deps",
        "cancelled",
        "force_cancel",
        "lease",
        "name",
        "done",
        "submitted_at",
        "context",
        "actor",
        "route",
        "locality",
        "oom_retries_left",
        "resolved",
        "generator",
    )

    def __init__(self) -> None:
        self.pending_deps = 0
        self.cancelled = False
        self.force_cancel = False
        self.lease: Lease | None = None
        self.done = False
        self.context: Any = None  # who submitted it (e.g. the notebook cell), for output
        self.actor = False  # an actor call: ordered by the actor submitter, not leased
        self.route: tuple[Any, ...] | None = None  # how its strategy picks nodes
        self.locality = ""  # node manager holding most of its argument bytes
        self.oom_retries_left: int | None = None  # separate budget for memory-monitor kills
        self.resolved = False  # arguments ready (actor calls wait in order until then)
        self.generator: Any = None  # generator tasks: their stream (core/generators.py)


class KeyQueue:
    """Ready tasks of one scheduling key and the leases that run them."""

    def __init__(
        self,
        key: tuple[Any, ...],
        resources: dict[str, float],
        strategy: str,
        pipeline: bool = True,
        route: tuple[Any, ...] | None = None,
        runtime_env: str = "",
    ) -> None:
        self.key = key
        self.runtime_env = runtime_env  # resolved JSON: leases come from this env's pool
        self.route = route  # ("spread",), ("node", node_id, soft) or ("pg", pg_id, index)
        self.rr = 0  # round-robin position over the route's nodes
        self.pipeline = pipeline  # False for tasks whose workers exit after max_calls
        self.resources = resources
        self.strategy = strategy
        self.queue: collections.deque[TaskRecord] = collections.deque()
        self.leases: list[Lease] = []
        self.requests: dict[bytes, str] = {}  # request id -> node address
        self.cancelling: set[bytes] = set()  # requests we asked the node to drop
        self.avg_duration = 1.0  # unknown: assume slow (no pipelining) until measured
        self.infeasible_since: float | None = None
        self.warned = False

    def depth(self, max_depth: int) -> int:
        if self.route == ("spread",):
            return 1  # every task gets its own round-robin placement
        return max_depth if self.pipeline and self.avg_duration < FAST_TASK_S else 1


class Lease:
    """A leased worker and the stream we push its tasks on."""

    def __init__(self, kq: KeyQueue, reply: pb.LeaseReply, node_address: str) -> None:
        self.kq = kq
        self.lease_id = reply.lease_id
        self.worker_id = reply.worker_id
        self.worker_address = reply.worker_address
        self.worker_pid = reply.worker_pid
        self.gpu_ids = list(reply.gpu_ids)
        self.node_address = node_address
        self.node_id = reply.node_id
        self.inflight: dict[bytes, TaskRecord] = {}
        self.outbox: list[pb.TaskSpec] = []
        self.call: Any = None
        self.writing = False
        self.dead = False
        self.exiting = False
        self.returned = False
        self.idle_handle: asyncio.TimerHandle | None = None


class Submitter:
    """Submits this process's tasks and tracks them until their results are in."""

    def __init__(self, client: CoreClient) -> None:
        self.client = client
        self.keys: dict[tuple[Any, ...], KeyQueue] = {}
        self.tasks: dict[bytes, TaskRecord] = {}  # task id -> record, while not done
        self._inbox: collections.deque[TaskRecord] = collections.deque()
        self._inbox_lock = threading.Lock()
        self._inbox_scheduled = False
        self._open: set[bytes] = set()  # tasks (not actor calls) submitted and not yet done
        self._async_waiters: dict[int, list[asyncio.Future[None]]] = {}
        self.closed = False
        self.node_watch_running = False
        self.node_watch_hold = 0.0  # keep watching until this time (monotonic) at least
        self.dead_nodes: set[bytes] = set()
        self.fn_avg: dict[bytes, float] = {}  # average run time per function
        self.pending_report = PendingReporter(client)  # issue 17: list_tasks sees waiting tasks

    # -- from user threads ------------------------------------------------------------------
    def check_capacity(self) -> None:
        """Raise ``PendingTasksLimitExceeded`` when this process already has
        ``max_pending_tasks`` tasks submitted and not finished (thread-safe)."""
        cap = self.client.config.max_pending_tasks
        if cap > 0 and len(self._open) >= cap:
            raise exc.PendingTasksLimitExceeded(limit=cap)

    def submit(self, rec: TaskRecord) -> None:
        """Queue a task built by the caller (thread-safe, batched wake-up of the loop)."""
        with self._inbox_lock:
            if not rec.actor:
                self._open.add(rec.task_id)
            self._inbox.append(rec)
            if self._inbox_scheduled:
                return
            self._inbox_scheduled = True
        # A fresh context: loop callbacks must not carry the submitting cell's contextvars.
        self.client.loop.call_soon_threadsafe(self._drain_inbox, context=contextvars.Context())

    def cancel(self, task_id: bytes, force: bool) -> None:
        """Cancel a task (thread-safe)."""
        self.client.loop.call_soon_threadsafe(self._cancel, task_id, force)

    # -- loop side --------------------------------------------------------------------------
    def _drain_inbox(self) -> None:
        with self._inbox_lock:
            batch = list(self._inbox)
            self._inbox.clear()
            self._inbox_scheduled = False
        touched: set[tuple[Any, ...]] = set()
        now = time.monotonic()
        for rec in batch:
            rec.submitted_at = now
            self.tasks[rec.task_id] = rec
            if rec.actor:  # its place in the actor's queue is fixed now, in call order
                self.client.actor_submitter.enqueue(rec)
            self._resolve_deps(rec, touched)
        for key in touched:
            self._pump(self.keys[key])
        self.pending_report.wake()

    def _resolve_deps(self, rec: TaskRecord, touched: set[tuple[Any, ...]]) -> None:
        table = self.client.table
        pending = 0
        for oid in rec.dep_ids:
            entry = table.get(oid)
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
            self._ready(rec, touched)

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
        entry.dependents = None
        touched: set[tuple[Any, ...]] = set()
        for rec in deps:
            rec.pending_deps -= 1
            if rec.pending_deps == 0 and not rec.done:
                self._ready(rec, touched)
        for key in touched:
            self._pump(self.keys[key])

    def add_async_waiter(self, entry: Entry, fut: asyncio.Future[None]) -> None:
        """Complete ``fut`` when ``entry`` becomes ready (loop thread)."""
        if entry.state == READY:
            fut.set_result(None)
            return
        self._async_waiters.setdefault(id(entry), []).append(fut)

    def _ready(self, rec: TaskRecord, touched: set[tuple[Any, ...]]) -> None:
        """All dependencies are ready: fill in their values, or fail with theirs."""
        if rec.cancelled:
            self._fail(rec, exc.TaskCancelledError(rec.task_id.hex()))
            return
        table = self.client.table
        spec = rec.spec
        del spec.resolved_args[:]
        for oid in rec.dep_ids:
            entry = table.get(oid)
            if entry is None:
                self._fail(
                    rec,
                    exc.ObjectFreedError(oid.hex(), "an argument was freed before the task ran"),
                )
                return
            if entry.exc is not None:
                self._fail(rec, entry.exc)
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
        rec.locality = _locality(spec, self.client.node_address)
        kq = self.keys.get(rec.key)
        if kq is None:
            kq = self.keys[rec.key] = KeyQueue(
                rec.key,
                rec.resources,
                rec.strategy,
                pipeline=not rec.spec.max_calls,
                route=rec.route,
                runtime_env=rec.spec.runtime_env,
            )
        kq.queue.append(rec)
        touched.add(rec.key)

    # -- leases and streams ----------------------------------------------------------------------
    def _pump(self, kq: KeyQueue) -> None:
        """Send queued tasks to leases with room; ask for more leases when needed."""
        if self.closed:
            return
        depth = kq.depth(self.client.config.max_tasks_in_flight_per_worker)
        queue = kq.queue
        usable = [le for le in kq.leases if not (le.dead or le.exiting or le.returned)]
        if queue and usable:
            # Pipelining hides round trips for tiny tasks, but must not hoard work on one
            # worker: each lease gets at most its share of the queue (counting the leases
            # still being requested), and only tasks of functions known to be fast queue
            # behind another task.
            share = -(
                -(len(queue) + sum(len(le.inflight) for le in usable))
                // max(1, len(usable) + len(kq.requests) - len(kq.cancelling))
            )
            for lease in usable:
                room = min(depth, max(1, share)) - len(lease.inflight)
                if room <= 0:
                    continue
                if lease.idle_handle is not None:
                    lease.idle_handle.cancel()
                    lease.idle_handle = None
                while room > 0 and queue:
                    rec = queue[0]
                    if rec.cancelled:
                        queue.popleft()
                        self._fail(rec, exc.TaskCancelledError(rec.task_id.hex()))
                        continue
                    if lease.inflight and not self._is_fast(rec):
                        break
                    queue.popleft()
                    self._send(lease, rec)
                    room -= 1
                self._flush(lease)
                if not queue:
                    break
        idle = sum(1 for le in usable if not le.inflight)
        want = min(len(queue) - idle, MAX_LEASE_REQUESTS) - (len(kq.requests) - len(kq.cancelling))
        for i in range(max(0, want)):
            # Large arguments pull the task toward the node that holds them.
            near = queue[i].locality if i < len(queue) and kq.route is None else ""
            self._request_lease(kq, near or self.client.node_address, spill=True)
        if not queue:
            for rid, address in list(kq.requests.items()):
                if rid not in kq.cancelling:
                    kq.cancelling.add(rid)
                    self.client.loop.create_task(self._cancel_request(address, rid))
            for lease in kq.leases:
                if not lease.inflight and lease.idle_handle is None and not lease.returned:
                    self._schedule_return(lease)

    def _is_fast(self, rec: TaskRecord) -> bool:
        """True when tasks of this function have averaged under FAST_TASK_S."""
        avg = self.fn_avg.get(rec.spec.function_id)
        return avg is not None and avg < FAST_TASK_S

    def _send(self, lease: Lease, rec: TaskRecord) -> None:
        spec = rec.spec
        spec.lease_id = lease.lease_id
        del spec.gpu_ids[:]
        spec.gpu_ids.extend(lease.gpu_ids)
        if not spec.resources:  # get_runtime_context().get_assigned_resources()
            spec.resources.update(lease.kq.resources)
        rec.lease = lease
        lease.inflight[rec.task_id] = rec
        lease.outbox.append(spec)

    def _flush(self, lease: Lease) -> None:
        if lease.outbox and not lease.writing:
            lease.writing = True
            self.client.loop.create_task(self._writer(lease))

    async def _writer(self, lease: Lease) -> None:
        try:
            while lease.outbox and not lease.dead:
                batch, lease.outbox = lease.outbox, []
                await lease.call.write(pb.TaskBatch(tasks=batch))
        except (RpcError, asyncio.InvalidStateError, Exception) as err:  # noqa: BLE001
            log.debug("write to worker failed: %r", err)
            self._lease_failed(lease)
        finally:
            lease.writing = False

    def _request_lease(self, kq: KeyQueue, address: str, spill: bool) -> None:
        rid = os.urandom(16)
        kq.requests[rid] = address
        if kq.route is not None and address == self.client.node_address and spill:
            self.client.loop.create_task(self._routed_request(kq, rid))
            return
        self.client.loop.create_task(self._lease_request(kq, rid, address, spill))

    async def _routed_request(self, kq: KeyQueue, rid: bytes) -> None:
        """Pick the node for a strategy that names one (SPREAD, node affinity, placement group)."""
        client = self.client
        route = kq.route
        assert route is not None
        spill = False
        try:
            if route[0] == "spread":
                from nbcluster._runtime.scheduling.policy import fits

                nodes = [n for n in await client.alive_nodes() if fits(kq.resources, n.total)]
                addresses = [n.address for n in nodes] or [client.node_address]
                spill = not nodes
            elif route[0] == "node":
                _, node_id, soft = route
                nodes = [n for n in await client.alive_nodes() if n.node_id == node_id]
                if not nodes:  # maybe it just joined: look again without the cache
                    nodes = [n for n in await client.alive_nodes(max_age=0) if n.node_id == node_id]
                if nodes:
                    # Soft or hard, a busy node is waited for (as Ray does by default); a
                    # soft request goes elsewhere only when that node cannot ever run it.
                    addresses = [nodes[0].address]
                    spill = False
                elif soft:
                    addresses, spill = [client.node_address], True
                else:
                    kq.requests.pop(rid, None)
                    self._fail_queue(
                        kq,
                        exc.TaskUnschedulableError(
                            f"node {node_id.hex()} is dead or unknown and the node affinity is hard "
                            "(soft=False); use soft=True to run elsewhere"
                        ),
                    )
                    return
            else:  # placement group
                _, pg_id, index = route
                info = await client.placement_group_info(pg_id)
                if info.state != pb.PlacementGroupInfo.CREATED:
                    kq.requests.pop(rid, None)
                    self._fail_queue(
                        kq, exc.TaskUnschedulableError("the task's placement group was removed")
                    )
                    return
                addrs = list(info.bundle_node_addresses)
                addresses = [addrs[index]] if index >= 0 else sorted(set(addrs))
                # "Any bundle" may be redirected: only the group's nodes have its resources.
                spill = index < 0
        except RpcError as err:
            kq.requests.pop(rid, None)
            log.warning("could not route a lease request: %s", err.code().name)
            await asyncio.sleep(0.5)
            self._pump(kq)
            return
        address = addresses[kq.rr % len(addresses)]
        kq.rr += 1
        kq.requests[rid] = address
        await self._lease_request(kq, rid, address, spill)

    def _request_lease_direct(self, kq: KeyQueue, address: str) -> None:
        rid = os.urandom(16)
        kq.requests[rid] = address
        self.client.loop.create_task(self._lease_request(kq, rid, address, True))

    def _fail_queue(self, kq: KeyQueue, error: BaseException) -> None:
        while kq.queue:
            self._fail(kq.queue.popleft(), error)

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
        except RpcError as err:
            kq.requests.pop(rid, None)
            kq.cancelling.discard(rid)
            if self.closed:
                return
            log.warning("lease request to %s failed: %s", address, err.code().name)
            await asyncio.sleep(0.5)
            self._pump(kq)
            return
        kq.requests.pop(rid, None)
        kq.cancelling.discard(rid)
        if self.closed:
            if reply.status == pb.LeaseReply.GRANTED:
                await self._return_lease_rpc(address, reply.lease_id, False)
            return
        if reply.status == pb.LeaseReply.GRANTED:
            kq.infeasible_since = None
            lease = Lease(kq, reply, address)
            try:
                lease.call = client.core(reply.worker_address).PushTasks(
                    metadata=(("nbc-lease", reply.lease_id.hex()),), wait_for_ready=True
                )
            except RpcError:
                await self._return_lease_rpc(address, reply.lease_id, True)
                self._pump(kq)
                return
            kq.leases.append(lease)
            client.loop.create_task(self._reader(lease))
            self.ensure_node_watch()
            self._pump(kq)
        elif reply.status == pb.LeaseReply.SPILLBACK:
            self._request_lease(kq, reply.spill_address, spill=False)
        elif reply.status == pb.LeaseReply.RUNTIME_ENV_FAILED:  # issue 17
            self._fail_queue(kq, exc.RuntimeEnvSetupError(reply.message))
        elif reply.status == pb.LeaseReply.INFEASIBLE:
            if kq.route is not None and kq.route[0] == "pg":
                # Maybe the group was removed by another process: ask the head again.
                self.client.forget_placement_group(kq.route[1])
            if kq.route is not None and kq.route[0] == "node" and kq.route[2] and not spill:
                self._request_lease_direct(kq, self.client.node_address)  # soft: go elsewhere
                return
            self._infeasible(kq, reply.message)
            await asyncio.sleep(1.0)
            self._pump(kq)

    def _infeasible(self, kq: KeyQueue, message: str) -> None:
        now = time.monotonic()
        if kq.infeasible_since is None:
            kq.infeasible_since = now
        if not kq.warned and now - kq.infeasible_since >= 0:
            kq.warned = True
            names = sorted({rec.name for rec in kq.queue})[:3]
            text = f"Infeasible: task(s) {', '.join(names) or '?'} cannot be scheduled: {message}"
            log.info(text)
            warnings.warn(text, exc.InfeasibleResourceWarning, stacklevel=1)

    async def _cancel_request(self, address: str, rid: bytes) -> None:
        with contextlib.suppress(RpcError):
            await self.client.node(address).CancelWorkerLease(
                pb.CancelLeaseRequest(request_id=rid), timeout=5
            )

    async def _reader(self, lease: Lease) -> None:
        call = lease.call
        try:
            while True:
                batch = await call.read()
                if batch is None or batch is _EOF():
                    break
                for record in batch.logs:
                    self._on_log(record)
                touched = False
                for reply in batch.replies:
                    touched = True
                    self._on_reply(lease, reply)
                if touched:
                    self._pump(lease.kq)
        except (RpcError, asyncio.CancelledError, Exception) as err:  # noqa: BLE001
            log.debug("stream from worker ended: %r", err)
        if not lease.returned:
            self._lease_failed(lease)

    def _on_log(self, record: pb.LogRecord, rec: TaskRecord | None = None) -> None:
        rec = rec if rec is not None else self.tasks.get(record.task_id)
        handler = self.client.output_handler
        try:
            handler(rec.context if rec is not None else None, rec.name if rec else "task", record)
        except Exception:  # noqa: BLE001 - output must never break the task stream
            log.exception("output handler failed")

    def _schedule_return(self, lease: Lease) -> None:
        others_waiting = any(k.requests for k in self.keys.values() if k is not lease.kq)
        delay = 0.0 if others_waiting else self.client.config.lease_idle_timeout_s
        lease.idle_handle = self.client.loop.call_later(delay, self._return_idle, lease)

    def _return_idle(self, lease: Lease) -> None:
        lease.idle_handle = None
        if lease.inflight or lease.returned or lease.dead:
            return
        if lease.kq.queue and not lease.exiting:
            self._pump(lease.kq)
            return
        self._return(lease, failed=False)

    def _return(self, lease: Lease, failed: bool) -> None:
        lease.returned = True
        if lease in lease.kq.leases:
            lease.kq.leases.remove(lease)
        with contextlib.suppress(Exception):
            lease.call.cancel()
        self.client.loop.create_task(
            self._return_lease_rpc(lease.node_address, lease.lease_id, failed)
        )

    async def _return_lease_rpc(self, address: str, lease_id: bytes, failed: bool) -> None:
        with contextlib.suppress(RpcError):
            await self.client.node(address).ReturnWorkerLease(
                pb.ReturnLeaseRequest(lease_id=lease_id, worker_failed=failed), timeout=10
            )

    def _lease_failed(self, lease: Lease) -> None:
        """The worker's stream broke: the worker died. Retry or fail what it was running."""
        if lease.dead or lease.returned:
            return
        lease.dead = True
        inflight = list(lease.inflight.values())
        lease.inflight.clear()
        self._return(lease, failed=True)
        if self.closed:
            return
        if inflight:
            self.client.loop.create_task(self._after_crash(lease, inflight))
        self._pump(lease.kq)

    async def _after_crash(self, lease: Lease, recs: list[TaskRecord]) -> None:
        """Retry or fail the tasks a dead worker was running, knowing why it died."""
        detail = f"worker (pid {lease.worker_pid}) died"
        with contextlib.suppress(RpcError):
            info = await self.client.node(lease.node_address).GetWorkerExitInfo(
                pb.WorkerRef(worker_id=lease.worker_id), timeout=5
            )
            if info.found and info.detail:
                detail = info.detail
        oom = "memory monitor" in detail
        retry = []
        running = recs[0] if recs else None  # a worker runs its tasks in the order sent
        if running is not None and not running.done and not running.cancelled:
            # issue 17: the dead worker never reports this attempt; its owner does
            record_crashed_attempt(self.client, running.spec, running.name, detail, oom)
        for rec in recs:
            if rec.done:
                continue
            if rec.cancelled:
                self._fail(rec, exc.TaskCancelledError(rec.task_id.hex()))
                continue
            if rec is not running:
                retry.append(rec)  # it was queued behind the one that died: no charge
                continue
            if oom:
                if rec.oom_retries_left is None:
                    rec.oom_retries_left = self.client.config.task_oom_retries
                if rec.oom_retries_left != 0:
                    rec.oom_retries_left -= 1
                    rec.spec.attempt += 1
                    retry.append(rec)
                    continue
                self._fail(
                    rec,
                    exc.OutOfMemoryError(
                        f"task {rec.name} failed: its {detail} (attempts: {rec.spec.attempt + 1}). "
                        "Use less memory per task, lower the parallelism (num_cpus/memory), or add memory."
                    ),
                )
                continue
            if rec.retries_left != 0:
                rec.retries_left -= 1
                rec.spec.attempt += 1
                retry.append(rec)
                continue
            self._fail(
                rec,
                exc.WorkerCrashedError(
                    f"task {rec.name} failed: the {detail} while running it "
                    f"(attempts: {rec.spec.attempt + 1}). Raise max_retries to retry on crashes."
                ),
            )
        if retry and not self.closed:
            for rec in reversed(retry):
                lease.kq.queue.appendleft(rec)
            self._pump(lease.kq)

    # -- results -----------------------------------------------------------------------------
    def _on_reply(self, lease: Lease, reply: pb.TaskReply) -> None:
        rec = lease.inflight.pop(reply.task_id, None)
        kq = lease.kq
        if reply.worker_exiting:
            lease.exiting = True
        if rec is None:
            return
        if reply.requeued:
            kq.queue.appendleft(rec)
            return
        duration = max(0.0, reply.end_time - reply.start_time)
        kq.avg_duration = (
            duration if kq.avg_duration == 1.0 else 0.8 * kq.avg_duration + 0.2 * duration
        )
        fid = rec.spec.function_id
        prev = self.fn_avg.get(fid)
        self.fn_avg[fid] = duration if prev is None else 0.8 * prev + 0.2 * duration
        if reply.cancelled or (rec.cancelled and reply.is_error):
            self._fail(rec, exc.TaskCancelledError(rec.task_id.hex()))
        elif reply.is_error and reply.retryable and rec.retries_left != 0 and not rec.cancelled:
            rec.retries_left -= 1
            rec.spec.attempt += 1
            kq.queue.append(rec)
        else:
            self._complete(rec, reply)
        if lease.exiting and not lease.inflight:
            self._return(lease, failed=True)  # it is leaving: the node must not lease it again
        elif kq.route == ("spread",) and not lease.inflight:
            self._return(lease, failed=False)  # SPREAD places each task anew

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
        self._finish(rec, ready)
        if orphans:
            from nbcluster._runtime.core.ownership import Release

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

    def _finish(self, rec: TaskRecord, ready: list[Entry]) -> None:
        rec.done = True
        self.tasks.pop(rec.task_id, None)
        if self._open:
            with self._inbox_lock:
                self._open.discard(rec.task_id)
        table = self.client.table
        for entry in ready:
            table.wake(entry)
            self.object_ready(entry)
        if rec.generator is not None:  # where the stream ends (and its error's position)
            rec.generator.task_finished()
        release = table.remove_submitted(rec.dep_ids + rec.nested_ids)
        if release:
            self.client._queue_release(release)
        if rec.actor:  # a call that failed while queued no longer holds back later calls
            self.client.actor_submitter.ready(rec)

    # -- cancellation -------------------------------------------------------------------------
    def _cancel(self, task_id: bytes, force: bool) -> None:
        rec = self.tasks.get(task_id)
        if rec is None or rec.done:
            return
        rec.cancelled = True
        rec.force_cancel = force
        rec.retries_left = 0
        if rec.actor:  # the actor's queue, or the actor itself, decides (Ray's semantics)
            self.client.actor_submitter.cancel(rec)
            return
        lease = rec.lease
        if lease is not None and task_id in lease.inflight:
            self.client.loop.create_task(self._cancel_remote(lease, task_id, force))
            return
        kq = self.keys.get(rec.key)
        if kq is not None and rec in kq.queue:
            kq.queue.remove(rec)
        self._fail(rec, exc.TaskCancelledError(task_id.hex()))

    async def _cancel_remote(self, lease: Lease, task_id: bytes, force: bool) -> None:
        client = self.client
        if force:
            with contextlib.suppress(RpcError):
                await client.node(lease.node_address).KillWorker(
                    pb.WorkerRef(worker_id=lease.worker_id, force=True), timeout=5
                )
            return
        with contextlib.suppress(RpcError):
            await client.core(lease.worker_address).CancelTask(
                pb.CancelTaskRequest(task_id=task_id), timeout=5
            )

    # -- node failures -------------------------------------------------------------------------
    def ensure_node_watch(self, hold_s: float = 0.0) -> None:
        """Watch for dead nodes while this process has work out in the cluster (and for at
        least ``hold_s`` seconds: a get() waiting for an owned object's node to be judged)."""
        self.node_watch_hold = max(self.node_watch_hold, time.monotonic() + hold_s)
        if not self.node_watch_running and not self.closed:
            self.node_watch_running = True
            self.client.loop.create_task(self._watch_nodes())

    async def _watch_nodes(self) -> None:
        client = self.client
        interval = max(0.2, min(1.0, client.config.heartbeat_interval_s * 2))
        try:
            while not self.closed:
                await asyncio.sleep(interval)
                if (
                    not self.tasks
                    and not any(kq.leases for kq in self.keys.values())
                    and time.monotonic() > self.node_watch_hold
                ):
                    # Nothing out in the cluster: stop polling (an idle driver costs the head
                    # nothing). A new lease, or a get() that cannot reach an owned object,
                    # starts the watch again; it then sees the deaths it missed.
                    break
                try:
                    reply = await client.head().GetNodes(
                        pb.GetNodesRequest(include_dead=True), timeout=10
                    )
                except RpcError:
                    continue
                for n in reply.nodes:
                    if not n.alive and n.node_id not in self.dead_nodes:
                        self.dead_nodes.add(n.node_id)
                        self.node_died(
                            n.node_id, n.address, n.death_reason or "it stopped responding"
                        )
        finally:
            self.node_watch_running = False

    def node_died(self, node_id: bytes, address: str, reason: str) -> None:
        """A node is gone: its leases failed; objects that lived only there are lost."""
        log.warning("node %s died: %s", node_id.hex()[:8], reason)
        for kq in list(self.keys.values()):
            for lease in list(kq.leases):
                if lease.node_address == address or lease.node_id == node_id:
                    self._lease_failed(lease)
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
        touched: set[Any] = set()
        for rec in resubmit.values():
            # Lineage reconstruction: run the producing task again.
            rec.retries_left -= 1
            rec.spec.attempt += 1
            rec.done = False
            rec.lease = None
            if rec.generator is not None:
                rec.generator.reopen()  # a generator task: its items are reported again
            self.tasks[rec.task_id] = rec
            table.add_submitted(rec.dep_ids + rec.nested_ids)
            self._resolve_deps(rec, touched)
        for key in touched:
            self._pump(self.keys[key])

    def running(self) -> bool:
        """True while a task of this process runs (or is sent) on a leased worker."""
        return any(lease.inflight for kq in self.keys.values() for lease in kq.leases)

    def shutdown(self) -> None:
        """Stop: return leases, fail nothing (the process is going away)."""
        self.closed = True
        for kq in self.keys.values():
            for lease in list(kq.leases):
                if lease.idle_handle is not None:
                    lease.idle_handle.cancel()
                if not lease.returned:
                    self._return(lease, failed=bool(lease.inflight))
            for rid, address in list(kq.requests.items()):
                self.client.loop.create_task(self._cancel_request(address, rid))


LOCALITY_MIN_BYTES = 1 << 20


def _locality(spec: pb.TaskSpec, local: str) -> str:
    """The node holding the most argument bytes, when that is worth a detour (else '')."""
    by_node: dict[str, int] = {}
    for loc in spec.resolved_args:
        if loc.in_store and loc.node_address:
            by_node[loc.node_address] = by_node.get(loc.node_address, 0) + loc.size
    if not by_node:
        return ""
    best, size = max(by_node.items(), key=lambda kv: kv[1])
    return best if size >= LOCALITY_MIN_BYTES and best != local else ""


def _EOF() -> Any:
    import grpc.aio

    return grpc.aio.EOF


def build_spec(
    client: CoreClient,
    *,
    task_id: bytes,
    function_id: bytes,
    name: str,
    args_blob: bytes,
    num_returns: int,
    max_calls: int,
    retry_exceptions: Any,
) -> pb.TaskSpec:
    """The wire spec of a task (resolved args are filled in when dependencies are ready)."""
    retry_blob = b""
    if retry_exceptions:
        retry_blob = serialize(retry_exceptions).to_bytes()
    return pb.TaskSpec(
        task_id=task_id,
        job_id=client.job_id,
        function_id=function_id,
        function_name=name,
        args=args_blob,
        num_returns=num_returns,
        owner_address=client.address,
        retry_exceptions=retry_blob,
        max_calls=max_calls,
        parent_task_id=client.current_task_id,
        namespace=client.namespace,
    )
