"""The owner's task lifecycle as a pure state machine (DESIGN §2, issue 11).

Events come in (tasks ready to run, lease replies, reply batches from workers, broken
streams, crash explanations, idle timers, cancellation, node deaths); each returns the
instructions of :mod:`instructions` for the shell (:mod:`submitter`) to carry out. Nothing
here does I/O, reads a clock for scheduling, or touches the object table: every decision
about queues, leases, pipelining, retries and cancellation is made here, and is unit
tested without processes (``tests/unit/test_owner_state.py``).

A task's life: ``ready`` queues it on its scheduling key; ``pump`` sends it to a lease
with room (or asks for leases); ``replies`` completes it, retries it (a retriable error)
or puts it back (the worker requeued it); ``stream_broken`` + ``crash_explained`` retry
or fail what a dead worker was running; ``cancel`` drops it from its queue or asks its
worker to stop it. Completion itself (``Complete`` / ``Fail``) is carried out by the
shell, which then calls :meth:`OwnerState.finish`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from nbcluster._runtime import exceptions as exc
from nbcluster._runtime.core.instructions import (
    AskExitInfo,
    CancelActorCall,
    CancelLeaseRequest,
    CancelRunning,
    Complete,
    Fail,
    ForgetPlacementGroup,
    Instruction,
    OpenStream,
    PumpLater,
    RecordCrashedAttempt,
    RequestLease,
    ResolveRoute,
    ReturnGrant,
    ReturnLease,
    Send,
    StartIdleTimer,
    StopIdleTimer,
    WarnInfeasible,
    WatchNodes,
)
from nbcluster._runtime.core.records import FAST_TASK_S, KeyQueue, Lease, TaskRecord
from nbcluster._runtime.protocol.protos import nbcluster_pb2 as pb
from nbcluster._runtime.running_mark import encode as encode_mark

__all__ = ["MAX_LEASE_REQUESTS", "OwnerState"]

MAX_LEASE_REQUESTS = 16  # lease requests in flight per scheduling key
RETRY_REQUEST_S = 0.5  # after a lease request or a route lookup failed
RETRY_INFEASIBLE_S = 1.0  # after a node said the shape cannot run anywhere

GRANTED = pb.LeaseReply.GRANTED
SPILLBACK = pb.LeaseReply.SPILLBACK
INFEASIBLE = pb.LeaseReply.INFEASIBLE
RUNTIME_ENV_FAILED = pb.LeaseReply.RUNTIME_ENV_FAILED

Out = list[Instruction]


class OwnerState:
    """Queues, leases and in-flight tasks of one owner (driver or worker).

    ``local_address`` gives this process's node manager (lease requests go there first);
    ``new_id`` makes request ids (injectable for tests).
    """

    def __init__(
        self,
        *,
        max_depth: int = 32,
        idle_timeout_s: float = 0.5,
        oom_retries: int = 3,
        local_address: Callable[[], str] = lambda: "",
        new_id: Callable[[], bytes] = lambda: os.urandom(16),
    ) -> None:
        self.max_depth = max_depth
        self.idle_timeout_s = idle_timeout_s
        self.oom_retries = oom_retries
        self.local_address = local_address
        self.new_id = new_id
        self.keys: dict[tuple[Any, ...], KeyQueue] = {}
        self.tasks: dict[bytes, TaskRecord] = {}  # task id -> record, while not done
        self.fn_avg: dict[bytes, float] = {}  # average run time per function
        self.closed = False

    # -- submission ---------------------------------------------------------------------------
    def add(self, rec: TaskRecord) -> None:
        """A task (or actor call) was submitted: track it until :meth:`finish`."""
        self.tasks[rec.task_id] = rec

    def finish(self, rec: TaskRecord) -> None:
        """The shell placed the task's outcome: it is done."""
        rec.done = True
        self.tasks.pop(rec.task_id, None)

    def ready(self, recs: Iterable[TaskRecord]) -> Out:
        """These tasks' arguments are resolved: queue each on its key and pump the keys."""
        out: Out = []
        touched: dict[tuple[Any, ...], KeyQueue] = {}
        for rec in recs:
            if rec.cancelled:
                out.append(Fail(rec, exc.TaskCancelledError(rec.task_id.hex())))
                continue
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
            touched[rec.key] = kq
        for kq in touched.values():
            self._pump(kq, out)
        return out

    def send_now(self, rec: TaskRecord, writable: Callable[[Lease], bool]) -> Lease | None:
        """Thread writes: a task with no argument to wait for, submitted while its key has
        nothing queued and a lease with nothing in flight whose channel takes a write now
        (``writable``), goes in flight there at once; the shell writes it from the caller's
        thread. None: it takes the usual way (:meth:`add`, then :meth:`ready`). The lease's
        idle timer goes stale (its generation moves on) rather than being stopped."""
        if self.closed or rec.cancelled:
            return None
        kq = self.keys.get(rec.key)
        if kq is None or kq.queue:
            return None
        for lease in kq.leases:
            if (
                lease.inflight
                or lease.dead
                or lease.exiting
                or lease.returned
                or lease.blocked
                or not writable(lease)
            ):
                continue
            if lease.idle:
                lease.idle = False
                lease.idle_gen += 1
            self.tasks[rec.task_id] = rec
            rec.lease = lease
            lease.inflight[rec.task_id] = rec
            return lease
        return None

    def reopen(self, rec: TaskRecord) -> None:
        """Lineage reconstruction: a done task runs again (its output was lost). The caller
        checked ``rec.retries_left != 0``; this charges one retry."""
        rec.retries_left -= 1
        rec.spec.attempt += 1
        rec.done = False
        rec.lease = None
        self.tasks[rec.task_id] = rec

    # -- leases -------------------------------------------------------------------------------
    def pump(self, kq: KeyQueue) -> Out:
        """Send queued tasks to leases with room; ask for more leases when needed."""
        out: Out = []
        self._pump(kq, out)
        return out

    def _pump(self, kq: KeyQueue, out: Out) -> None:
        if self.closed:
            return
        depth = kq.depth(self.max_depth)
        queue = kq.queue
        usable = [
            le for le in kq.leases if not (le.dead or le.exiting or le.returned or le.blocked)
        ]
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
                if lease.idle:
                    lease.idle = False
                    lease.idle_gen += 1
                    out.append(StopIdleTimer(lease))
                batch: list[TaskRecord] = []
                while room > 0 and queue:
                    rec = queue[0]
                    if rec.cancelled:
                        queue.popleft()
                        out.append(Fail(rec, exc.TaskCancelledError(rec.task_id.hex())))
                        continue
                    # A task that must not run twice (max_retries=0) never waits behind
                    # another: after a broken stream only the first task in flight is
                    # charged, and those behind it, possibly run already, go again.
                    if lease.inflight and (not self._is_fast(rec) or rec.retries_left == 0):
                        break
                    queue.popleft()
                    rec.lease = lease
                    lease.inflight[rec.task_id] = rec
                    batch.append(rec)
                    room -= 1
                if batch:
                    out.append(Send(lease, batch))
                if not queue:
                    break
        idle = sum(1 for le in usable if not le.inflight)
        want = min(len(queue) - idle, MAX_LEASE_REQUESTS) - (len(kq.requests) - len(kq.cancelling))
        for i in range(max(0, want)):
            # Large arguments pull the task toward the node that holds them.
            near = queue[i].locality if i < len(queue) and kq.route is None else ""
            self._request(kq, near or self.local_address(), True, out)
        if not queue:
            for rid, address in kq.requests.items():
                if rid not in kq.cancelling:
                    kq.cancelling.add(rid)
                    out.append(CancelLeaseRequest(address, rid))
            others_waiting = any(k.requests for k in self.keys.values() if k is not kq)
            for lease in kq.leases:
                if not lease.inflight and not lease.idle and not lease.returned:
                    lease.idle = True
                    lease.idle_gen += 1
                    delay = 0.0 if others_waiting else self.idle_timeout_s
                    out.append(StartIdleTimer(lease, lease.idle_gen, delay))

    def _is_fast(self, rec: TaskRecord) -> bool:
        avg = self.fn_avg.get(rec.spec.function_id)
        return avg is not None and avg < FAST_TASK_S

    def _request(
        self, kq: KeyQueue, address: str, spill: bool, out: Out, direct: bool = False
    ) -> None:
        rid = self.new_id()
        kq.requests[rid] = address
        if not direct and kq.route is not None and spill and address == self.local_address():
            out.append(ResolveRoute(kq, rid))
        else:
            out.append(RequestLease(kq, rid, address, spill))

    def route_resolved(
        self, kq: KeyQueue, rid: bytes, addresses: Sequence[str], spill: bool
    ) -> Out:
        """The shell found the nodes a routed request may go to: pick one, round robin."""
        address = addresses[kq.rr % len(addresses)]
        kq.rr += 1
        kq.requests[rid] = address
        return [RequestLease(kq, rid, address, spill)]

    def route_unschedulable(self, kq: KeyQueue, rid: bytes, error: BaseException) -> Out:
        """The strategy can never be met (hard affinity to a dead node, a removed group)."""
        kq.requests.pop(rid, None)
        return self._fail_queue(kq, error)

    def route_unreachable(self, kq: KeyQueue, rid: bytes) -> Out:
        """The route could not be looked up (the head is away): try again shortly."""
        kq.requests.pop(rid, None)
        return [PumpLater(kq, RETRY_REQUEST_S)]

    def lease_request_failed(self, kq: KeyQueue, rid: bytes) -> Out:
        """The lease request's RPC failed: try again shortly."""
        kq.requests.pop(rid, None)
        kq.cancelling.discard(rid)
        if self.closed:
            return []
        return [PumpLater(kq, RETRY_REQUEST_S)]

    def lease_reply(self, kq: KeyQueue, rid: bytes, address: str, spill: bool, reply: Any) -> Out:
        """A node manager answered a lease request (``reply``: a ``LeaseReply``)."""
        kq.requests.pop(rid, None)
        kq.cancelling.discard(rid)
        status = reply.status
        if self.closed:
            return [ReturnGrant(address, reply.lease_id)] if status == GRANTED else []
        out: Out = []
        if status == GRANTED:
            lease = Lease(kq, reply, address)
            kq.leases.append(lease)
            out.append(OpenStream(lease))
            out.append(WatchNodes())
            self._pump(kq, out)
        elif status == SPILLBACK:
            self._request(kq, reply.spill_address, False, out)
        elif status == RUNTIME_ENV_FAILED:  # issue 17
            out.extend(self._fail_queue(kq, exc.RuntimeEnvSetupError(reply.message)))
        elif status == INFEASIBLE:
            route = kq.route
            if route is not None and route[0] == "pg":
                # Maybe the group was removed by another process: ask the head again.
                out.append(ForgetPlacementGroup(route[1]))
            if route is not None and route[0] == "node" and route[2] and not spill:
                # Soft affinity to a node that cannot run it: anywhere else will do.
                self._request(kq, self.local_address(), True, out, direct=True)
                return out
            if not kq.warned:
                kq.warned = True
                names = sorted({rec.name for rec in kq.queue})[:3]
                out.append(
                    WarnInfeasible(
                        f"Infeasible: task(s) {', '.join(names) or '?'} cannot be scheduled: "
                        f"{reply.message}"
                    )
                )
            out.append(PumpLater(kq, RETRY_INFEASIBLE_S))
        return out

    def _fail_queue(self, kq: KeyQueue, error: BaseException) -> Out:
        out: Out = [Fail(rec, error) for rec in kq.queue]
        kq.queue.clear()
        return out

    def stream_open_failed(self, lease: Lease) -> Out:
        """The stream to a new lease could not be opened: nothing ran on it; put its tasks
        back in front, unchanged, and give the worker back as failed."""
        if lease.dead or lease.returned:
            return []  # given back meanwhile: its tasks were dealt with then
        recs = list(lease.inflight.values())
        lease.inflight.clear()
        lease.dead = True
        out = self._give_back(lease, failed=True)
        for rec in reversed(recs):
            rec.lease = None
            lease.kq.queue.appendleft(rec)
        self._pump(lease.kq, out)
        return out

    def idle_expired(self, lease: Lease, gen: int) -> Out:
        """The lease's idle timer fired: give it back unless it found work meanwhile."""
        if gen != lease.idle_gen or not lease.idle:
            return []  # a stale timer
        lease.idle = False
        if lease.inflight or lease.returned or lease.dead:
            return []
        if lease.kq.queue and not lease.exiting:
            return self.pump(lease.kq)
        return self._give_back(lease, failed=False)

    def release_idle(self) -> Out:
        """Give back now every lease waiting idle for work (rather than at its timer)."""
        out: Out = []
        for kq in self.keys.values():
            for lease in list(kq.leases):
                if lease.idle and not (lease.inflight or lease.returned or lease.dead):
                    out += self._give_back(lease, failed=False)
        return out

    def _give_back(self, lease: Lease, failed: bool) -> Out:
        lease.returned = True
        if lease in lease.kq.leases:
            lease.kq.leases.remove(lease)
        out: Out = []
        if lease.idle:
            lease.idle = False
            lease.idle_gen += 1
            out.append(StopIdleTimer(lease))
        out.append(ReturnLease(lease, failed))
        return out

    # -- replies ------------------------------------------------------------------------------
    def replies(self, lease: Lease, replies: Iterable[Any]) -> Out:
        """A batch of ``TaskReply`` from the lease's worker; then pump its key."""
        out: Out = []
        touched = False
        for reply in replies:
            touched = True
            self._on_reply(lease, reply, out)
        if touched:
            self._pump(lease.kq, out)
        return out

    def _on_reply(self, lease: Lease, reply: Any, out: Out) -> None:
        rec = lease.inflight.pop(reply.task_id, None)
        kq = lease.kq
        if reply.worker_exiting:
            lease.exiting = True
        if rec is None:
            return
        if reply.requeued:
            kq.queue.appendleft(rec)
            lease.blocked = bool(lease.inflight)  # its running task blocks: none behind it
            return
        if not lease.inflight:
            lease.blocked = False
        duration = max(0.0, reply.end_time - reply.start_time)
        kq.avg_duration = (
            duration if kq.avg_duration == 1.0 else 0.8 * kq.avg_duration + 0.2 * duration
        )
        fid = rec.spec.function_id
        prev = self.fn_avg.get(fid)
        self.fn_avg[fid] = duration if prev is None else 0.8 * prev + 0.2 * duration
        if reply.cancelled or (rec.cancelled and reply.is_error):
            out.append(Fail(rec, exc.TaskCancelledError(rec.task_id.hex())))
        elif reply.is_error and reply.retryable and rec.retries_left != 0 and not rec.cancelled:
            rec.retries_left -= 1
            rec.spec.attempt += 1
            kq.queue.append(rec)
        else:
            out.append(Complete(rec, reply))
        if lease.returned:
            return
        if lease.exiting and not lease.inflight:
            out.extend(self._give_back(lease, failed=True))  # leaving: not to be leased again
        elif kq.route == ("spread",) and not lease.inflight:
            out.extend(self._give_back(lease, failed=False))  # SPREAD places each task anew

    # -- failures -----------------------------------------------------------------------------
    def stream_broken(self, lease: Lease) -> Out:
        """The worker's stream broke: the worker died. Ask why, then retry or fail."""
        if lease.dead or lease.returned:
            return []
        lease.dead = True
        inflight = list(lease.inflight.values())
        lease.inflight.clear()
        out = self._give_back(lease, failed=True)
        if self.closed:
            return out
        if inflight:
            out.append(AskExitInfo(lease, inflight))
        self._pump(lease.kq, out)
        return out

    def crash_explained(
        self,
        lease: Lease,
        recs: Sequence[TaskRecord],
        detail: str,
        node_dead: bool = False,
        started: bytes = b"",
    ) -> Out:
        """Why the worker under ``recs`` died (``detail``, from its node): the task it was
        running is charged a retry (a memory-monitor kill from its own budget); the others
        go back in front, uncharged. Out of retries, it fails with ``NodeDiedError`` when
        ``node_dead`` (its node died or could not say why), else with ``WorkerCrashedError``.

        The running task is the one the worker's running mark names (``started``, from its
        node: see ``running_mark``); tasks before it finished, but their replies died with
        the worker. Without a mark naming one of ``recs``, it is the first sent (a worker
        runs its tasks in the order sent)."""
        out: Out = []
        oom = "memory monitor" in detail
        retry: list[TaskRecord] = []
        running = recs[0] if recs else None
        if started:
            for rec in recs:
                if encode_mark(rec.task_id, rec.spec.attempt) == started:
                    running = rec
                    break
        if running is not None and not running.done and not running.cancelled:
            out.append(RecordCrashedAttempt(running, detail, oom, running.spec.attempt))
        for rec in recs:
            if rec.done:
                continue
            if rec.cancelled:
                out.append(Fail(rec, exc.TaskCancelledError(rec.task_id.hex())))
                continue
            if rec is not running:
                retry.append(rec)  # finished unanswered, or queued behind: no charge
                continue
            if oom:
                if rec.oom_retries_left is None:
                    rec.oom_retries_left = self.oom_retries
                if rec.oom_retries_left != 0:
                    rec.oom_retries_left -= 1
                    rec.spec.attempt += 1
                    retry.append(rec)
                    continue
                out.append(
                    Fail(
                        rec,
                        exc.OutOfMemoryError(
                            f"task {rec.name} failed: its {detail} (attempts: "
                            f"{rec.spec.attempt + 1}). Use less memory per task, lower the "
                            "parallelism (num_cpus/memory), or add memory."
                        ),
                    )
                )
                continue
            if rec.retries_left != 0:
                rec.retries_left -= 1
                rec.spec.attempt += 1
                retry.append(rec)
                continue
            if node_dead:  # its node died or cannot say why (Ray's NODE_DIED)
                out.append(
                    Fail(
                        rec,
                        exc.NodeDiedError(
                            f"task {rec.name} failed: the node {lease.node_id.hex()} "
                            f"({lease.node_address}) where it was running died or cannot be "
                            f"reached (attempts: {rec.spec.attempt + 1}). Raise max_retries to "
                            "retry it on another node; the node's logs tell why it died.",
                            node_id=lease.node_id.hex(),
                            address=lease.node_address,
                        ),
                    )
                )
                continue
            out.append(
                Fail(
                    rec,
                    exc.WorkerCrashedError(
                        f"task {rec.name} failed: the {detail} while running it "
                        f"(attempts: {rec.spec.attempt + 1}). Raise max_retries to retry on "
                        "crashes."
                    ),
                )
            )
        if retry and not self.closed:
            for rec in reversed(retry):
                rec.lease = None
                lease.kq.queue.appendleft(rec)
            self._pump(lease.kq, out)
        return out

    def node_died(self, node_id: bytes, address: str) -> Out:
        """A node is gone: every lease on it failed."""
        out: Out = []
        for kq in list(self.keys.values()):
            for lease in list(kq.leases):
                if lease.node_address == address or lease.node_id == node_id:
                    out.extend(self.stream_broken(lease))
        return out

    # -- cancellation -------------------------------------------------------------------------
    def cancel(self, task_id: bytes, force: bool) -> Out:
        """``nbcluster.cancel``: a queued task fails at once; a running one is asked to stop
        (its reply says how it ended); retries are off either way."""
        rec = self.tasks.get(task_id)
        if rec is None or rec.done:
            return []
        rec.cancelled = True
        rec.force_cancel = force
        rec.retries_left = 0
        if rec.actor:
            return [CancelActorCall(rec)]
        lease = rec.lease
        if lease is not None and task_id in lease.inflight:
            return [CancelRunning(lease, task_id, force)]
        kq = self.keys.get(rec.key)
        if kq is not None and rec in kq.queue:
            kq.queue.remove(rec)
        return [Fail(rec, exc.TaskCancelledError(task_id.hex()))]

    # -- whole-owner --------------------------------------------------------------------------
    def running(self) -> bool:
        """True while a task of this owner runs (or is sent) on a leased worker."""
        return any(lease.inflight for kq in self.keys.values() for lease in kq.leases)

    def has_work_out(self) -> bool:
        """True while tasks are tracked or leases held (node deaths then matter)."""
        return bool(self.tasks) or any(kq.leases for kq in self.keys.values())

    def close(self) -> Out:
        """Stop: give every lease back and drop every request; fail nothing (the process is
        going away)."""
        self.closed = True
        out: Out = []
        for kq in self.keys.values():
            for lease in list(kq.leases):
                if not lease.returned:
                    out.extend(self._give_back(lease, failed=bool(lease.inflight)))
            for rid, address in kq.requests.items():
                out.append(CancelLeaseRequest(address, rid))
        return out
