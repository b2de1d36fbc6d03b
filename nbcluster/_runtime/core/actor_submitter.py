"""Calls to actors: in submission order, on one stream per (caller, actor).

The caller learns where an actor lives by long-polling the head (``WaitActor``). Calls
wait in the actor's queue until their arguments are ready and the actor is ALIVE, then go
out in order. When the actor's process dies, calls already sent are retried after the
restart if ``max_task_retries`` allows (in their original order), else they fail with
``ActorDiedError``; once the actor is DEAD every queued and later call fails at once.
Runs on the I/O loop, except :meth:`ActorSubmitter.submit`.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import threading
from typing import TYPE_CHECKING, Any

from nbcluster._runtime import exceptions as exc
from nbcluster._runtime.protocol.errors import RpcError
from nbcluster._runtime.protocol.rpc import pb
from nbcluster._runtime.serialization import deserialize

if TYPE_CHECKING:
    from nbcluster._runtime.core.client import CoreClient
    from nbcluster._runtime.core.submitter import TaskRecord

log = logging.getLogger(__name__)

ALIVE, RESTARTING, DEAD = pb.ActorInfo.ALIVE, pb.ActorInfo.RESTARTING, pb.ActorInfo.DEAD


class ActorConn:
    """This process's view of one actor, and the stream its calls travel on."""

    def __init__(self, actor_id: bytes) -> None:
        self.actor_id = actor_id
        self.state = pb.ActorInfo.PENDING
        self.version = 0
        self.address = ""
        self.info: pb.ActorInfo | None = None
        self.queue: collections.deque[TaskRecord] = collections.deque()
        self.inflight: collections.OrderedDict[bytes, TaskRecord] = collections.OrderedDict()
        self.call: Any = None
        self.writing = False
        self.outbox: list[pb.TaskSpec] = []
        self.watching = False
        self.death: BaseException | None = None
        self.kill_when_idle = False


class ActorSubmitter:
    """Submits this process's actor calls."""

    def __init__(self, client: CoreClient) -> None:
        self.client = client
        self.conns: dict[bytes, ActorConn] = {}
        self.pending_counts: dict[bytes, int] = collections.defaultdict(
            int
        )  # for max_pending_calls
        self.count_lock = threading.Lock()
        self.closed = False

    # -- user threads ----------------------------------------------------------------------
    def submit(self, rec: TaskRecord, max_pending_calls: int) -> None:
        """Queue an actor call (thread-safe); raise when the pending-call limit is reached."""
        aid = rec.spec.actor_id
        with self.count_lock:
            if max_pending_calls > 0 and self.pending_counts[aid] >= max_pending_calls:
                raise exc.PendingCallsLimitExceeded(
                    f"the actor already has {self.pending_counts[aid]} pending calls from this "
                    f"process (max_pending_calls={max_pending_calls}); wait for some results first"
                )
            self.pending_counts[aid] += 1
        self.client.submitter.submit(rec)  # dependency resolution is shared with tasks

    def killed(self, actor_id: bytes, no_restart: bool) -> None:
        """``nbcluster.kill`` returned (thread-safe): calls made after it fail at once."""
        self.client.call_soon(self._killed, actor_id, no_restart)

    def release_when_idle(self, actor_id: bytes) -> None:
        """The last handle in the owner went away: end the actor once its calls are done."""
        self.client.call_soon(self._release_when_idle, actor_id)

    # -- loop side ---------------------------------------------------------------------------
    def conn(self, actor_id: bytes) -> ActorConn:
        conn = self.conns.get(actor_id)
        if conn is None:
            conn = self.conns[actor_id] = ActorConn(actor_id)
        if not conn.watching and conn.state != DEAD:
            conn.watching = True
            self.client.loop.create_task(self._watch(conn))
        return conn

    def enqueue(self, rec: TaskRecord) -> None:
        """A new call takes its place in the actor's queue (in submission order)."""
        conn = self.conn(rec.spec.actor_id)
        if conn.death is not None:
            self._fail(rec, conn.death)
            return
        conn.queue.append(rec)

    def ready(self, rec: TaskRecord) -> None:
        """A queued call's arguments are resolved: send what the order allows."""
        self._pump(self.conn(rec.spec.actor_id))

    def _pump(self, conn: ActorConn) -> None:
        while conn.queue:
            rec = conn.queue[0]
            if rec.done:  # failed while waiting (e.g. an argument's task failed)
                conn.queue.popleft()
                self._count_done(rec)
                continue
            if rec.cancelled:
                conn.queue.popleft()
                self._fail(rec, exc.TaskCancelledError(rec.task_id.hex()))
                continue
            if not rec.resolved or conn.state != ALIVE or conn.call is None:
                break  # later calls wait: calls from one caller run in order
            conn.queue.popleft()
            conn.inflight[rec.task_id] = rec
            conn.outbox.append(rec.spec)
        if conn.outbox and not conn.writing:
            conn.writing = True
            self.client.loop.create_task(self._writer(conn, conn.call))
        self._maybe_release(conn)

    async def _writer(self, conn: ActorConn, call: Any) -> None:
        try:
            while conn.outbox and conn.call is call:
                batch, conn.outbox = conn.outbox, []
                await call.write(pb.TaskBatch(tasks=batch))
        except Exception as err:  # noqa: BLE001 - the reader sees the same failure
            log.debug("write to actor failed: %r", err)
        finally:
            conn.writing = False

    async def _watch(self, conn: ActorConn) -> None:
        head = self.client.head
        failures = 0
        while not self.closed:
            try:
                # A long wait: an idle handle costs the head one RPC per 10 minutes.
                info = await head().WaitActor(
                    pb.WaitActorRequest(
                        actor_id=conn.actor_id, after_version=conn.version, timeout=600.0
                    ),
                    timeout=630,
                )
            except RpcError as err:
                failures += 1
                if err.code().name == "NOT_FOUND":
                    self._dead(
                        conn,
                        exc.ActorDiedError(
                            conn.actor_id.hex(), reason="the head has no such actor"
                        ),
                    )
                    return
                await asyncio.sleep(min(0.2 * failures, 2.0))
                continue
            failures = 0
            if info.version <= conn.version and info.state != DEAD:
                continue
            conn.version = info.version
            conn.info = info
            if info.state == DEAD:
                self._dead(conn, _death_error(info))
                return
            if (
                info.state == ALIVE
                and info.address
                and (info.address != conn.address or conn.call is None)
            ):
                self._connect(conn, info.address)
            elif info.state != ALIVE:
                conn.state = info.state
        conn.watching = False

    def _connect(self, conn: ActorConn, address: str) -> None:
        if conn.call is not None:
            with contextlib.suppress(Exception):
                conn.call.cancel()
        conn.address = address
        conn.state = ALIVE
        conn.call = self.client.core(address).PushTasks(wait_for_ready=True)
        # Calls sent to the previous incarnation and allowed to retry go first, in order.
        self.client.loop.create_task(self._reader(conn, conn.call))
        self._pump(conn)

    async def _reader(self, conn: ActorConn, call: Any) -> None:
        try:
            while True:
                batch = await call.read()
                if batch is None or not hasattr(batch, "replies"):
                    break
                for record in batch.logs:  # an actor call's output goes to its caller's cell
                    self.client.submitter._on_log(record, conn.inflight.get(record.task_id))
                for reply in batch.replies:
                    rec = conn.inflight.pop(reply.task_id, None)
                    if rec is not None:
                        self._complete(rec, reply)
                self._maybe_release(conn)
        except (RpcError, asyncio.CancelledError, Exception) as err:  # noqa: BLE001
            log.debug("actor stream ended: %r", err)
        if conn.call is call:
            self._disconnected(conn)

    def _disconnected(self, conn: ActorConn) -> None:
        """The actor's process went away under in-flight calls."""
        conn.call = None
        conn.address = ""
        if conn.state == ALIVE:
            conn.state = RESTARTING  # until the head says otherwise
        retry = []
        for rec in conn.inflight.values():
            if rec.retries_left != 0 and conn.death is None:
                rec.retries_left -= 1
                rec.spec.attempt += 1
                retry.append(rec)
            else:
                self._fail(
                    rec,
                    conn.death
                    or exc.ActorDiedError(
                        conn.actor_id.hex(),
                        reason="the actor's process died while running this call "
                        "(set max_task_retries to retry calls after a restart)",
                    ),
                )
        conn.inflight.clear()
        conn.queue.extendleft(reversed(retry))

    def _dead(self, conn: ActorConn, error: BaseException) -> None:
        conn.state = DEAD
        conn.death = error
        conn.watching = False
        if conn.call is not None:
            with contextlib.suppress(Exception):
                conn.call.cancel()
            conn.call = None
        for rec in [*conn.inflight.values(), *conn.queue]:
            if rec.done:
                self._count_done(rec)
            else:
                self._fail(rec, error)
        conn.inflight.clear()
        conn.queue.clear()

    def _killed(self, actor_id: bytes, no_restart: bool) -> None:
        """The head ended the actor (and, having stopped its process, every non-detached
        actor it created, and theirs): treat them as dead here too, so a call made after
        ``kill`` returned fails at once rather than racing the head's news."""
        conn = self.conns.get(actor_id)
        if conn is None or conn.state == DEAD:
            return
        address = conn.address or (conn.info.address if conn.info is not None else "")
        if no_restart:
            self._dead(
                conn,
                exc.ActorDiedError(
                    actor_id.hex(),
                    reason="it was killed with nbcluster.kill()",
                    class_name=conn.info.class_name if conn.info is not None else None,
                ),
            )
        owners = {address} if address else set()
        while owners:  # the actors it owned die with it (owner fate-sharing), transitively
            children = [
                c
                for c in self.conns.values()
                if c.state != DEAD
                and c.info is not None
                and not c.info.detached
                and c.info.owner_address in owners
            ]
            owners = {c.address or c.info.address for c in children if c.info is not None} - {""}
            for child in children:
                self._dead(
                    child,
                    exc.ActorDiedError(
                        child.actor_id.hex(),
                        reason="the actor that created it (its owner) was killed",
                        class_name=child.info.class_name if child.info is not None else None,
                    ),
                )

    def cancel(self, rec: TaskRecord) -> None:
        """``nbcluster.cancel`` on an actor call (loop): a queued call fails now with
        ``TaskCancelledError``; a call sent to the actor is cancelled there (an async actor's
        call gets ``asyncio.CancelledError``; a sync one sees ``is_canceled()``), and its
        reply says how it ended."""
        conn = self.conns.get(rec.spec.actor_id)
        if conn is not None and rec.task_id in conn.inflight:
            if conn.address:
                self.client.loop.create_task(self._cancel_remote(conn.address, rec.task_id))
            return
        # Not sent yet: _pump drops it from the queue (and counts it) when it reaches it.
        self.client.submitter._fail(rec, exc.TaskCancelledError(rec.task_id.hex()))

    async def _cancel_remote(self, address: str, task_id: bytes) -> None:
        with contextlib.suppress(RpcError):
            await self.client.core(address).CancelTask(
                pb.CancelTaskRequest(task_id=task_id), timeout=10
            )

    def _complete(self, rec: TaskRecord, reply: pb.TaskReply) -> None:
        self._count_done(rec)
        self.client.submitter._complete(rec, reply)

    def _fail(self, rec: TaskRecord, error: BaseException) -> None:
        self._count_done(rec)
        self.client.submitter._fail(rec, error)

    def _count_done(self, rec: TaskRecord) -> None:
        with self.count_lock:
            self.pending_counts[rec.spec.actor_id] -= 1

    def _release_when_idle(self, actor_id: bytes) -> None:
        conn = self.conns.get(actor_id)
        if conn is None:
            self.client.loop.create_task(self._kill(actor_id, "out_of_scope"))
            return
        conn.kill_when_idle = True
        self._maybe_release(conn)

    def _maybe_release(self, conn: ActorConn) -> None:
        if conn.kill_when_idle and not conn.queue and not conn.inflight and conn.death is None:
            pending = self.pending_counts.get(conn.actor_id, 0)
            if pending <= 0:
                conn.kill_when_idle = False
                self.client.loop.create_task(self._kill(conn.actor_id, "out_of_scope"))

    async def _kill(self, actor_id: bytes, kind: str) -> None:
        with contextlib.suppress(RpcError):
            await self.client.head().KillActor(
                pb.KillActorRequest(
                    actor_id=actor_id,
                    no_restart=True,
                    reason="all handles to the actor went out of scope",
                    kind=kind,
                ),
                timeout=10,
            )

    def running(self) -> bool:
        """True while a call of this process to an actor has not replied."""
        return any(conn.inflight for conn in self.conns.values())

    def shutdown(self) -> None:
        self.closed = True
        for conn in self.conns.values():
            if conn.call is not None:
                with contextlib.suppress(Exception):
                    conn.call.cancel()


def _death_error(info: pb.ActorInfo) -> BaseException:
    """The ActorDiedError callers of a dead actor see."""
    if info.death_kind == "unschedulable":
        return exc.ActorUnschedulableError(info.death_cause, name=info.class_name)
    init_failed = info.death_kind == "init_failed"
    cause = None
    reason = info.death_cause or "the actor is dead"
    if init_failed and info.init_error:
        with contextlib.suppress(Exception):
            cause = deserialize(info.init_error)
    kinds = {
        "killed": "it was killed with nbcluster.kill()",
        "out_of_scope": "all handles to it went out of scope",
        "owner_died": "the process that created it exited",
    }
    reason = kinds.get(info.death_kind, reason)
    return exc.ActorDiedError(
        info.actor_id.hex(),
        actor_init_failed=init_failed,
        reason=reason,
        cause=cause if isinstance(cause, exc.TaskError) else None,
        class_name=info.class_name,
        name=info.name or None,
        pid=info.worker_pid or None,
        exited=info.death_kind == "exited",
    )
