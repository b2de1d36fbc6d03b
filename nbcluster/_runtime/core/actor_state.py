"""The caller's side of actor calls as a pure state machine (issue 11).

One :class:`ActorConn` per actor this process calls: its state as the head last reported
it, the calls waiting in submission order, the calls sent on the current stream. Events
(a call queued or made ready, the head's news, replies, a stream's end, ``kill``,
``cancel``, the last handle gone) return instructions of :mod:`instructions` for the shell
(:mod:`actor_submitter`). Ray's semantics:

- calls from one caller run in submission order; a call waits until its arguments are
  ready and every earlier call has gone out;
- when the actor's process dies, calls already sent are retried after the restart (in
  their original order) while ``max_task_retries`` allows, else they fail with
  ``ActorDiedError``; once the actor is DEAD every queued and later call fails at once;
- ``kill`` ends the actor here at once (no race with the head's news) and, with it, the
  non-detached actors it created, transitively.
"""

from __future__ import annotations

import collections
import contextlib
from collections.abc import Callable
from typing import Any

from nbcluster._runtime import exceptions as exc
from nbcluster._runtime.core.instructions import (
    CallDone,
    CancelActorRemote,
    CloseActorStream,
    Complete,
    ConnectActor,
    Fail,
    Instruction,
    KillActor,
    RecheckActor,
    SendActorCalls,
    WatchActor,
)
from nbcluster._runtime.core.records import TaskRecord
from nbcluster._runtime.protocol.protos import nbcluster_pb2 as pb
from nbcluster._runtime.serialization import deserialize

__all__ = ["ALIVE", "DEAD", "RESTARTING", "ActorCallState", "ActorConn", "death_error"]

ALIVE, RESTARTING, DEAD = pb.ActorInfo.ALIVE, pb.ActorInfo.RESTARTING, pb.ActorInfo.DEAD

Out = list[Instruction]


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
        self.stream = 0  # number of the current stream; 0: none open
        self.streams = 0  # streams opened so far
        self.watching = False
        self.death: BaseException | None = None
        self.killing = False  # nbcluster.kill(no_restart=True) is on its way to the head
        self.kill_when_idle = False
        # The shell's side: the stream itself, what waits to be written, whether a writer
        # runs. The state machine never reads these.
        self.call: Any = None
        self.outbox: list[Any] = []
        self.writing = False
        self.handoff = False  # a caller's thread left part of a frame for the loop to write
        # Thread reads (actor_submitter.py): the loop's reading of ``call`` is paused and
        # the thread waiting for a reply reads it; how many threads wait that way; when
        # the last call went out from a caller's thread.
        self.thread_reads = False
        self.readers = 0
        self.last_direct = 0.0


class ActorCallState:
    """Every actor this process calls. ``pending(actor_id)`` tells how many calls to it
    this process made that are not done yet (including those still on their way to
    :meth:`enqueue`): an actor whose last handle went away ends only when it is 0."""

    def __init__(self, pending: Callable[[bytes], int] = lambda _aid: 0) -> None:
        self.pending = pending
        self.conns: dict[bytes, ActorConn] = {}
        self.closed = False

    def registered(self, actor_id: bytes, version: int) -> None:
        """This process registered the actor and the head answered with its record at
        ``version``, still PENDING: the first watch asks for a later version than that one
        (one ``WaitActor`` per creation, not two: the first no longer returns at once)."""
        conn = self.conns.get(actor_id)
        if conn is None:
            conn = self.conns[actor_id] = ActorConn(actor_id)
        if conn.version == 0 and conn.state == pb.ActorInfo.PENDING:
            conn.version = version

    # -- calls --------------------------------------------------------------------------------
    def _conn(self, actor_id: bytes, out: Out) -> ActorConn:
        conn = self.conns.get(actor_id)
        if conn is None:
            conn = self.conns[actor_id] = ActorConn(actor_id)
        if not conn.watching and conn.state != DEAD and not self.closed:
            conn.watching = True
            out.append(WatchActor(conn))
        return conn

    def enqueue(self, rec: TaskRecord) -> Out:
        """A new call takes its place in the actor's queue (in submission order)."""
        out: Out = []
        conn = self._conn(rec.spec.actor_id, out)
        if conn.death is not None:
            out += [CallDone(rec), Fail(rec, conn.death)]
            return out
        conn.queue.append(rec)
        return out

    def ready(self, rec: TaskRecord) -> Out:
        """A queued call's arguments are resolved (or it failed): send what order allows."""
        out: Out = []
        self._pump(self._conn(rec.spec.actor_id, out), out)
        return out

    def _pump(self, conn: ActorConn, out: Out) -> None:
        batch: list[TaskRecord] = []
        queue = conn.queue
        while queue:
            rec = queue[0]
            if rec.done:  # failed while waiting (e.g. an argument's task failed)
                queue.popleft()
                out.append(CallDone(rec))
                continue
            if rec.cancelled:
                queue.popleft()
                out += [CallDone(rec), Fail(rec, exc.TaskCancelledError(rec.task_id.hex()))]
                continue
            if not rec.resolved or conn.state != ALIVE or not conn.stream:
                break  # later calls wait: calls from one caller run in order
            queue.popleft()
            conn.inflight[rec.task_id] = rec
            batch.append(rec)
        if batch:
            out.append(SendActorCalls(conn, batch))
        self._maybe_release(conn, out)

    def cancel(self, rec: TaskRecord) -> Out:
        """``nbcluster.cancel`` on an actor call: a call sent to the actor is cancelled
        there (its reply says how it ended); one not sent yet fails now with
        ``TaskCancelledError`` (the queue drops it when it reaches it)."""
        conn = self.conns.get(rec.spec.actor_id)
        if conn is not None and rec.task_id in conn.inflight:
            return [CancelActorRemote(conn.address, rec.task_id)] if conn.address else []
        return [Fail(rec, exc.TaskCancelledError(rec.task_id.hex()))]

    # -- the stream -----------------------------------------------------------------------------
    def replies(self, conn: ActorConn, stream: int, replies: Any) -> Out:
        """Replies arrived on stream ``stream``."""
        out: Out = []
        for reply in replies:
            rec = conn.inflight.pop(reply.task_id, None)
            if rec is not None:
                out += [CallDone(rec), Complete(rec, reply)]
        self._maybe_release(conn, out)
        return out

    def stream_ended(self, conn: ActorConn, stream: int) -> Out:
        """Stream ``stream`` ended. If it is the current one, the actor's process went
        away under the calls in flight (or the connection broke): retry those that may
        be, fail the others, and check whether the same incarnation can be reached again."""
        if stream != conn.stream:
            return []  # an old incarnation's stream, replaced already
        conn.stream = 0
        conn.address = ""
        if conn.state == ALIVE:
            conn.state = RESTARTING  # until the head says otherwise
        out = self._retry_or_fail_inflight(conn)
        if conn.death is None and not self.closed:
            out.append(RecheckActor(conn, conn.version))
        return out

    def open_failed(self, conn: ActorConn, stream: int) -> Out:
        """Stream ``stream`` could not be opened (a refused or timed-out connection, e.g.
        on a loaded machine). Nothing went out on it, so the calls given to it go back to
        the front of the queue in order, without spending a retry, and the actor is asked
        after as after a break."""
        if stream != conn.stream or conn.death is not None or self.closed:
            return self.stream_ended(conn, stream)
        conn.stream = 0
        conn.address = ""
        if conn.state == ALIVE:
            conn.state = RESTARTING  # until the head or a ping says otherwise
        conn.queue.extendleft(reversed(conn.inflight.values()))
        conn.inflight.clear()
        return [RecheckActor(conn, conn.version)]

    def _retry_or_fail_inflight(self, conn: ActorConn) -> Out:
        out: Out = []
        retry = []
        for rec in conn.inflight.values():
            if rec.retries_left != 0 and conn.death is None and not conn.killing:
                rec.retries_left -= 1
                rec.spec.attempt += 1
                retry.append(rec)
            else:
                out += [CallDone(rec), Fail(rec, conn.death or self._broke_error(conn))]
        conn.inflight.clear()
        conn.queue.extendleft(reversed(retry))
        return out

    @staticmethod
    def _broke_error(conn: ActorConn) -> BaseException:
        if conn.killing:  # the kill this process asked for broke the stream (F07)
            return exc.ActorDiedError(
                conn.actor_id.hex(),
                reason="it was killed with nbcluster.kill()",
                class_name=conn.info.class_name if conn.info is not None else None,
            )
        return exc.ActorDiedError(
            conn.actor_id.hex(),
            reason="the actor's process died, or the connection to it broke, "
            "while running this call (set max_task_retries to retry calls)",
        )

    def killing(self, actor_id: bytes) -> None:
        """``nbcluster.kill(no_restart=True)`` is about to ask the head: a stream that
        breaks from now on broke because of it, and its calls fail saying so."""
        conn = self.conns.get(actor_id)
        if conn is not None:
            conn.killing = True

    def kill_aborted(self, actor_id: bytes) -> None:
        """The kill did not reach the head (it raised): streams break for other reasons."""
        conn = self.conns.get(actor_id)
        if conn is not None and conn.state != DEAD:
            conn.killing = False

    def reconnect(self, conn: ActorConn, version: int, address: str) -> Out:
        """The incarnation the broken stream went to is still ALIVE and answers: open a
        new stream to it (unless news of a newer incarnation came meanwhile)."""
        if self.closed or conn.stream or conn.death is not None or conn.version != version:
            return []
        return self._connect(conn, address)

    def _connect(self, conn: ActorConn, address: str) -> Out:
        out: Out = []
        if conn.stream and conn.inflight:  # sent to an incarnation that is gone
            out += self._retry_or_fail_inflight(conn)
        # Calls sent to the previous incarnation and allowed to retry go first, in order.
        conn.address = address
        conn.state = ALIVE
        conn.streams += 1
        conn.stream = conn.streams
        out.append(ConnectActor(conn, address, conn.stream))
        self._pump(conn, out)
        return out

    # -- the head's news ------------------------------------------------------------------------
    def actor_info(self, conn: ActorConn, info: pb.ActorInfo) -> Out:
        """The head reported the actor's state (``WaitActor``)."""
        if info.version <= conn.version and info.state != DEAD:
            return []
        conn.version = info.version
        conn.info = info
        if info.state == DEAD:
            return self._dead(conn, death_error(info))
        if (
            info.state == ALIVE
            and info.address
            and (info.address != conn.address or not conn.stream)
        ):
            return self._connect(conn, info.address)
        if info.state != ALIVE:
            conn.state = info.state
        return []

    def actor_unknown(self, conn: ActorConn) -> Out:
        """The head has no such actor."""
        return self._dead(
            conn, exc.ActorDiedError(conn.actor_id.hex(), reason="the head has no such actor")
        )

    def head_unreachable(self, conn: ActorConn, error: BaseException) -> Out:
        """The head stayed unreachable for the grace period while calls wait for it to
        place or restart the actor: they fail with ``error`` (``HeadUnavailableError``)
        instead of waiting for ever (F11b). Calls on a connected actor go on, and so does
        the watch: calls made once the head is back run."""
        if conn.stream:
            return []
        out: Out = []
        while conn.queue:
            rec = conn.queue.popleft()
            out.append(CallDone(rec))
            if not rec.done:
                out.append(Fail(rec, error))
        return out

    def watch_ended(self, conn: ActorConn) -> None:
        """The shell stopped watching (the actor is dead, or this process stops)."""
        conn.watching = False

    def _dead(self, conn: ActorConn, error: BaseException) -> Out:
        conn.state = DEAD
        conn.death = error
        conn.watching = False
        out: Out = []
        if conn.stream:
            conn.stream = 0
            out.append(CloseActorStream(conn))
        for rec in [*conn.inflight.values(), *conn.queue]:
            out.append(CallDone(rec))
            if not rec.done:
                out.append(Fail(rec, error))
        conn.inflight.clear()
        conn.queue.clear()
        return out

    def killed(self, actor_id: bytes, no_restart: bool) -> Out:
        """``nbcluster.kill`` returned. The head ended the actor (and, having stopped its
        process, every non-detached actor it created, and theirs): treat them as dead here
        too, so a call made after ``kill`` returned fails at once. The actor itself may be
        dead here already (the head's news of its death came first); its children are
        still held dead here, as the head ended them too."""
        conn = self.conns.get(actor_id)
        if conn is None:
            return []
        out: Out = []
        address = conn.address or (conn.info.address if conn.info is not None else "")
        if no_restart and conn.state != DEAD:
            out += self._dead(
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
                out += self._dead(
                    child,
                    exc.ActorDiedError(
                        child.actor_id.hex(),
                        reason="the actor that created it (its owner) was killed",
                        class_name=child.info.class_name if child.info is not None else None,
                    ),
                )
        return out

    # -- handles ------------------------------------------------------------------------------
    def release_when_idle(self, actor_id: bytes) -> Out:
        """The last handle in the owner went away: end the actor once its calls are done."""
        conn = self.conns.get(actor_id)
        if conn is None:
            return [KillActor(actor_id)]
        conn.kill_when_idle = True
        out: Out = []
        self._maybe_release(conn, out)
        return out

    def _maybe_release(self, conn: ActorConn, out: Out) -> None:
        if (
            conn.kill_when_idle
            and not conn.queue
            and not conn.inflight
            and conn.death is None
            and self.pending(conn.actor_id) - _leaving(out, conn.actor_id) <= 0
        ):
            conn.kill_when_idle = False
            out.append(KillActor(conn.actor_id))

    def running(self) -> bool:
        """True while a call of this process to an actor has not replied."""
        return any(conn.inflight for conn in self.conns.values())

    def close(self) -> Out:
        """This process stops: close every stream."""
        self.closed = True
        out: Out = []
        for conn in self.conns.values():
            if conn.stream:
                conn.stream = 0
                out.append(CloseActorStream(conn))
        return out


def _leaving(out: Out, actor_id: bytes) -> int:
    """Calls to ``actor_id`` that ``out`` is about to mark done (not yet counted)."""
    return sum(1 for i in out if type(i) is CallDone and i.record.spec.actor_id == actor_id)


def death_error(info: pb.ActorInfo) -> BaseException:
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
