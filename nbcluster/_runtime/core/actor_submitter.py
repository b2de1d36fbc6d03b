"""Calls to actors, the shell: one stream per (caller, actor), the head's long poll.

The caller learns where an actor lives by long-polling the head (``WaitActor``). Every
decision (order, retries after a restart, death, kill, cancel, release) is made by the
pure state machine :class:`~nbcluster._runtime.core.actor_state.ActorCallState`; this
module feeds it events and carries out its instructions. Runs on the I/O loop, except
:meth:`ActorSubmitter.submit`, :meth:`ActorSubmitter.killed` and
:meth:`ActorSubmitter.release_when_idle`.

**The caller's thread writes the call itself** when nothing can come before it and
nothing is in flight: the actor is alive and its task channel open with nothing waiting to
be written, no earlier call of this process to it is queued, on its way to the loop or
waiting for its reply, and the call has no argument to wait for. Then
:meth:`ActorSubmitter.submit` puts the call straight in flight in the state machine and
writes its frame to the socket from the calling thread: no hop through the I/O loop, and
no wake-up of it until the reply comes. (A call made while others are in flight goes the
loop's way, so a burst leaves in one write per wake-up of the loop, not one system call
per call.) Every event of the state machine and every write to an actor's channel happens
under one lock (:attr:`ActorSubmitter.lock`), so the two threads never reorder calls.

**Thread reads: the caller's thread reads the reply too.** When the loop has handed over
the last reply of an actor and nothing else is out to it, it stops reading that actor's
channel (``TaskChannel.pause_reads``) and the channel is the callers': a thread that then
waits in ``get`` for the call it wrote (:meth:`ActorSubmitter.wait_reading`) polls the
socket itself and handles the reply where it reads it, under the same lock, so a call
costs no wake-up of the loop at all, neither way. The loop takes the channel back
(:meth:`ActorSubmitter._loop_reads`) before it writes a call to it, before any event of
its own on the actor (cancel, kill, release), before an observer on the loop waits for
one of its calls' results (a task's argument, an async waiter, another process asking),
when a reply carries output (printed in order, from the loop), when the socket ends, when
a call has waited ``THREAD_READ_WATCH_S`` with nobody reading it (nobody waits with
``get``: the reply and the call's output must still come in) and when the channel was
idle for ``THREAD_READ_IDLE_S``. Only the thread reading and the loop ever read the
socket, one at a time: a thread reads only under the lock and while the channel is the
callers'. On the main thread, a Ctrl-C that lands while a reply is being read and handled
is held until that is done (``thread_reads.HeldInterrupt``), so a reply is never half handled.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from nbcluster._runtime import exceptions as exc
from nbcluster._runtime.core import instructions as ins
from nbcluster._runtime.core.actor_state import (
    ALIVE,
    DEAD,
    RESTARTING,
    ActorCallState,
    ActorConn,
)
from nbcluster._runtime.core.channel import batch_frame, reply_handler
from nbcluster._runtime.core.thread_reads import CallerChannels, HeldInterrupt, read_until
from nbcluster._runtime.protocol.errors import (
    Peer,
    RpcFailure,
    RpcNotFound,
    RpcUnavailable,
    is_unavailable,
    to_exception,
)
from nbcluster._runtime.protocol.rpc import pb

if TYPE_CHECKING:
    from nbcluster._runtime.core.ports import ActorSubmitterHost
    from nbcluster._runtime.core.records import TaskRecord

__all__ = ["ALIVE", "DEAD", "RESTARTING", "ActorConn", "ActorSubmitter"]

log = logging.getLogger(__name__)

#: How long an owner keeps asking the head to end an actor dropped out of scope while the
#: head cannot be reached (or fails the call): then it gives up, logging a warning.
KILL_RETRY_S = 600.0


class ActorSubmitter:
    """Submits this process's actor calls."""

    def __init__(self, client: ActorSubmitterHost) -> None:
        self.client = client
        #: Held around every event of :attr:`state` and every write to an actor's channel,
        #: by the loop and by callers writing their own calls (reentrant: instructions run
        #: under it and may feed the state machine again). The task submitter's lock: one
        #: lock orders both (a reply one handles may complete work of the other).
        self.lock: threading.RLock = client.submitter.lock
        # Calls made and not done, per actor (for max_pending_calls); user threads read it.
        self.pending_counts: dict[bytes, int] = collections.defaultdict(int)
        # Calls on their way to the loop's queue, per actor: a later call must not pass them.
        self._unqueued: dict[bytes, int] = collections.defaultdict(int)
        # Kills that returned to the user and that the loop has not applied yet (actor id ->
        # no_restart): a call made after kill() returned must not be written to the actor
        # by its caller's thread, nor queued on the loop before the kill is applied.
        self._kill_news: dict[bytes, bool] = {}
        #: Calls written by their caller's thread / whose frame it left to the loop.
        self.sent_direct = 0
        self.handoffs = 0
        self.state = ActorCallState(pending=lambda aid: self.pending_counts.get(aid, 0))
        self._dirty: list[ActorConn] = []  # outboxes to write at the end of this loop turn
        self._flush_scheduled = False
        # Thread reads: actors whose channel is the callers', the loop's check on them.
        self.thread_reads_on = client.config.actor_thread_reads
        self.channels: CallerChannels[ActorConn] = CallerChannels(
            client.loop, self.lock, lambda: self.state.closed
        )
        self._thread_conns = self.channels.held
        #: Replies read and handled by the thread that waited for them.
        self.thread_read_replies = 0
        self._handlers: dict[type, Callable[[Any], None]] = {
            ins.WatchActor: self._do_watch,
            ins.ConnectActor: self._do_connect,
            ins.RecheckActor: self._do_recheck,
            ins.CloseActorStream: self._do_close_stream,
            ins.SendActorCalls: self._do_send,
            ins.CancelActorRemote: self._do_cancel_remote,
            ins.KillActor: self._do_kill,
            ins.CallDone: self._do_call_done,
            ins.Complete: self._do_complete,
            ins.Fail: self._do_fail,
        }

    @property
    def conns(self) -> dict[bytes, ActorConn]:
        """Actor id -> this process's view of it (loop thread)."""
        return self.state.conns

    @property
    def closed(self) -> bool:
        """True after :meth:`shutdown`."""
        return self.state.closed

    # -- user threads ----------------------------------------------------------------------
    def submit(self, rec: TaskRecord, max_pending_calls: int) -> None:
        """Queue an actor call (thread-safe); raise when the pending-call limit is reached.

        On the main thread a Ctrl-C that lands in here is held until the call is counted
        and on its way (written to the actor, or handed to the loop): it never leaves a
        call pending or in flight that was not sent (the actor would then never be idle).
        """
        if threading.current_thread() is threading.main_thread():
            with HeldInterrupt():
                self._submit(rec, max_pending_calls)
        else:
            self._submit(rec, max_pending_calls)

    def _submit(self, rec: TaskRecord, max_pending_calls: int) -> None:
        aid = rec.spec.actor_id
        with self.lock:
            if max_pending_calls > 0 and self.pending_counts[aid] >= max_pending_calls:
                raise exc.PendingCallsLimitExceeded(
                    f"the actor already has {self.pending_counts[aid]} pending calls from this "
                    f"process (max_pending_calls={max_pending_calls}); wait for some results first"
                )
            self.pending_counts[aid] += 1
            if self._send_direct(rec, aid):
                return  # no wake-up of the loop: the reply brings the rest
            self._unqueued[aid] += 1
        self.client.submitter.submit(rec)  # dependency resolution is shared with tasks

    def sent_call(self, task_id: bytes) -> TaskRecord | None:
        """The record of a call this process sent and has no reply for (any thread)."""
        with self.lock:
            for conn in self.state.conns.values():
                rec = conn.inflight.get(task_id)
                if rec is not None:
                    return rec
        return None

    def _send_direct(self, rec: TaskRecord, aid: bytes) -> bool:
        """Write ``rec`` to its actor now, from this thread (lock held), if nothing may
        come before it; False: it goes the loop's way."""
        conn = self.state.conns.get(aid)
        if (
            conn is None
            or conn.state != ALIVE
            or not conn.stream
            or conn.inflight  # calls in a burst leave together from the loop instead
            or conn.queue
            or conn.outbox
            or conn.writing
            or conn.handoff
            or conn.death is not None
            or conn.killing
            or self._kill_news  # (any: the actors a killed one created die with it)
            or self._unqueued.get(aid)
            or rec.dep_ids
            or rec.spec.num_returns < 0  # generators: their stream is set up on the loop
            or self.state.closed
        ):
            return False
        call = conn.call
        writable = getattr(call, "thread_writable", None)
        if writable is None or not writable():
            return False
        frame = batch_frame(rec.spec.SerializeToString())
        rec.resolved = True
        rec.submitted_at = conn.last_direct = time.monotonic()
        conn.inflight[rec.task_id] = rec
        sent = call.send_from_thread(frame)
        self.sent_direct += 1
        if sent < len(frame):  # the socket is full: the loop writes the rest, in order
            conn.handoff = True
            self.handoffs += 1
            self.client.loop.call_soon_threadsafe(self._handoff, conn, call, frame[sent:])
        return True

    def _handoff(self, conn: ActorConn, call: Any, rest: bytes) -> None:
        """The loop writes what a caller's thread could not (then what waited behind it)."""
        with self.lock:
            conn.handoff = False
            self._loop_reads(conn)
            if conn.call is call:
                with contextlib.suppress(ConnectionError):
                    call.write_bytes_nowait(rest)
            self._flush(conn)

    def killed(self, actor_id: bytes, no_restart: bool) -> None:
        """``nbcluster.kill`` returned (thread-safe): calls made after it fail at once."""
        with self.lock:
            self._kill_news[actor_id] = no_restart
        self.client.call_soon(self._killed, actor_id)

    def killing(self, actor_id: bytes) -> None:
        """``nbcluster.kill(no_restart=True)`` is about to ask the head (thread-safe; queued
        on the loop before the kill can break any stream)."""
        self.client.call_soon(self._locked, self.state.killing, actor_id)

    def kill_aborted(self, actor_id: bytes) -> None:
        """The kill failed before the head acted (thread-safe)."""
        self.client.call_soon(self._locked, self.state.kill_aborted, actor_id)

    def release_when_idle(self, actor_id: bytes) -> None:
        """The last handle in the owner went away: end the actor once its calls are done."""
        self.client.call_soon(self._release_when_idle, actor_id)

    # -- events (loop side) ------------------------------------------------------------------
    def _event(self, event: Callable[..., list[Any]], *args: Any) -> None:
        with self.lock:
            self._do(event(*args))

    def _locked(self, fn: Callable[..., Any], *args: Any) -> None:
        with self.lock:
            fn(*args)

    def registered(self, actor_id: bytes, version: int) -> None:
        """This process just registered the actor (the head's record is PENDING at
        ``version``): see :meth:`ActorCallState.registered`."""
        with self.lock:
            self.state.registered(actor_id, version)

    def enqueue(self, rec: TaskRecord) -> None:
        """A new call takes its place in the actor's queue (in submission order)."""
        with self.lock:
            aid = rec.spec.actor_id
            left = self._unqueued[aid] - 1
            if left > 0:
                self._unqueued[aid] = left
            else:
                del self._unqueued[aid]
            for killed in list(self._kill_news):  # kills that returned before this call
                self._killed(killed)  # (its actor, or the one that created it)
            self._do(self.state.enqueue(rec))

    def ready(self, rec: TaskRecord) -> None:
        """A queued call's arguments are resolved: send what the order allows."""
        self._event(self.state.ready, rec)

    def cancel(self, rec: TaskRecord) -> None:
        """``nbcluster.cancel`` on an actor call (loop): a queued call fails now with
        ``TaskCancelledError``; a call sent to the actor is cancelled there (an async actor's
        call gets ``asyncio.CancelledError``; a sync one sees ``is_canceled()``), and its
        reply says how it ended."""
        with self.lock:
            self._loop_reads_of(rec.spec.actor_id)
            self._do(self.state.cancel(rec))

    def _killed(self, actor_id: bytes) -> None:
        with self.lock:
            self._loop_reads_of(actor_id)
            no_restart = self._kill_news.pop(actor_id, None)
            if no_restart is not None:  # (not applied already by enqueue)
                self._do(self.state.killed(actor_id, no_restart))

    def _release_when_idle(self, actor_id: bytes) -> None:
        with self.lock:
            self._loop_reads_of(actor_id)
            self._do(self.state.release_when_idle(actor_id))

    # -- instructions -------------------------------------------------------------------------
    def _do(self, out: list[Any]) -> None:
        handlers = self._handlers
        for instruction in out:
            handlers[type(instruction)](instruction)

    def _do_watch(self, i: ins.WatchActor) -> None:
        self.client.loop.create_task(self._watch(i.conn))

    async def _watch(self, conn: ActorConn) -> None:
        head = self.client.head
        failures = 0
        try:
            while not self.closed and conn.state != DEAD:
                try:
                    # A long wait: an idle handle costs the head one RPC per 10 minutes.
                    info = await head().WaitActor(
                        pb.WaitActorRequest(
                            actor_id=conn.actor_id, after_version=conn.version, timeout=600.0
                        ),
                        timeout=630,
                    )
                except RpcFailure as err:
                    failures += 1
                    if isinstance(err, RpcNotFound):
                        self._event(self.state.actor_unknown, conn)
                        return
                    if isinstance(err, RpcUnavailable) and not self.closed:
                        # head() retried for the grace period: calls waiting for the head
                        # to place the actor fail (F11b)
                        error = to_exception(err, Peer.HEAD, "WaitActor")
                        self._event(self.state.head_unreachable, conn, error)
                    await asyncio.sleep(min(0.2 * failures, 2.0))
                    continue
                failures = 0
                self._event(self.state.actor_info, conn, info)
        finally:
            self._locked(self.state.watch_ended, conn)

    def _do_connect(self, i: ins.ConnectActor) -> None:
        conn = i.conn
        self._drop_thread_reads(conn)
        if conn.call is not None:
            with contextlib.suppress(Exception):
                conn.call.cancel()
            conn.call = None
        conn.outbox = []  # what the old stream did not write is in flight: retried or failed
        self.client.loop.create_task(self._open(conn, i.address, i.stream))

    async def _open(self, conn: ActorConn, address: str, stream: int) -> None:
        info = conn.info  # the head's record names the worker's task channel: no need to ask
        known = info.channel_address if info is not None and info.address == address else ""
        try:
            call = await self.client.submitter.streams.open(address, known=known)
        except (TimeoutError, RpcFailure, OSError) as err:
            log.debug("could not open a stream to actor at %s: %r", address, err)
            self._event(self.state.open_failed, conn, stream)
            return
        with self.lock:
            if conn.stream != stream:  # replaced or closed meanwhile
                call.cancel()
                return
            conn.call = call
            if hasattr(call, "on_replies"):  # a task channel: replies handled as they arrive
                call.on_replies(
                    reply_handler(
                        call,
                        lambda batch: self._replies(conn, stream, batch),
                        lambda: self._stream_ended(conn, call, stream),
                    )
                )
            else:
                self.client.loop.create_task(self._reader(conn, call, stream))
            self._flush(conn)

    def _do_recheck(self, i: ins.RecheckActor) -> None:
        self.client.loop.create_task(self._recheck(i.conn, i.version))

    async def _recheck(self, conn: ActorConn, version: int) -> None:
        """The stream broke, but maybe not the actor (a network fault): while the head still
        lists the incarnation we were talking to as ALIVE and its process answers a ping,
        connect to it again. A real death reaches the head, and :meth:`_watch`, as a newer
        version, which ends this."""
        delay = 0.1
        while (
            not self.closed and not conn.stream and conn.death is None and conn.version == version
        ):
            await asyncio.sleep(delay)
            delay = min(delay * 2, 2.0)
            try:
                info = await self.client.head().WaitActor(
                    pb.WaitActorRequest(actor_id=conn.actor_id, after_version=0, timeout=1.0),
                    timeout=10,
                )
                if info.version != version or info.state != ALIVE or not info.address:
                    continue  # news on its way to _watch
                await self.client.core(info.address).Ping(pb.Empty(), timeout=2)
            except RpcFailure:
                continue
            self._event(self.state.reconnect, conn, version, info.address)
            return

    def _do_close_stream(self, i: ins.CloseActorStream) -> None:
        conn = i.conn
        self._drop_thread_reads(conn)
        if conn.call is not None:
            with contextlib.suppress(Exception):
                conn.call.cancel()
            conn.call = None

    def _do_send(self, i: ins.SendActorCalls) -> None:
        conn = i.conn
        conn.outbox.extend(rec.spec for rec in i.records)
        self._flush(conn)

    def _flush(self, conn: ActorConn) -> None:
        """Write the actor's outbox: on a task channel with room, once the loop's current
        callback is done (calls queued together leave in one frame); else from a writer
        task."""
        if not conn.outbox or conn.writing or conn.call is None or conn.handoff:
            return  # (a handoff flushes when it is done)
        conn.writing = True
        self._dirty.append(conn)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self.client.loop.call_soon(self.flush_dirty)

    def flush_dirty(self) -> None:
        """Write every outbox that has calls (the loop; the submitter calls it when it has
        queued what one wake-up brought, so those calls leave at once and together)."""
        with self.lock:
            self._flush_scheduled = False
            dirty, self._dirty = self._dirty, []
            for conn in dirty:
                self._write_now(conn)

    def _write_now(self, conn: ActorConn) -> None:
        conn.writing = False
        if not conn.outbox or conn.call is None or conn.handoff:
            return
        self._loop_reads(conn)  # replies of what goes out now come to the loop
        drain = False
        write_nowait = getattr(conn.call, "write_nowait", None)
        if write_nowait is not None:
            batch, conn.outbox = conn.outbox, []
            try:
                drain = write_nowait(pb.TaskBatch(tasks=batch))
            except ConnectionError:
                conn.outbox[:0] = batch  # the writer task meets the same end
            else:
                if not drain:
                    return
        conn.writing = True
        self.client.loop.create_task(self._writer(conn, drain))

    async def _writer(self, conn: ActorConn, drain: bool = False) -> None:
        try:
            if drain and conn.call is not None:
                await conn.call.drain()
            while conn.outbox and conn.call is not None:
                call = conn.call  # a restart may replace it between two writes
                batch, conn.outbox = conn.outbox, []
                await call.write(pb.TaskBatch(tasks=batch))
        except Exception as err:  # noqa: BLE001 - the reader sees the same failure
            log.debug("write to actor failed: %r", err)
        finally:
            conn.writing = False

    async def _reader(self, conn: ActorConn, call: Any, stream: int) -> None:
        """Replies read off a gRPC stream."""
        try:
            while True:
                batch = await call.read()
                if batch is None or not hasattr(batch, "replies"):
                    break
                self._replies(conn, stream, batch)
        except (asyncio.CancelledError, Exception) as err:  # noqa: BLE001
            log.debug("actor stream ended: %r", err)
        self._stream_ended(conn, call, stream)

    def _replies(self, conn: ActorConn, stream: int, batch: pb.ReplyBatch) -> None:
        """Replies the loop read (or a reading thread left to it: output first)."""
        with self.lock:
            for record in batch.logs:  # an actor call's output goes to its caller's cell
                self.client.submitter._on_log(record, conn.inflight.get(record.task_id))
            if batch.replies:
                self._do(self.state.replies(conn, stream, batch.replies))
            if not conn.inflight and self.thread_reads_on:
                self._to_threads(conn)

    def _stream_ended(self, conn: ActorConn, call: Any, stream: int) -> None:
        with self.lock:
            if conn.call is call:
                conn.call = None
                self._drop_thread_reads(conn)
            self._do(self.state.stream_ended(conn, stream))

    # -- thread reads (module docstring) ---------------------------------------------------
    def _to_threads(self, conn: ActorConn) -> None:
        """The loop handled the last reply of an actor with nothing else out: the next
        reply is read by the thread that waits for it (loop thread, lock held)."""
        call = conn.call
        if (
            conn.thread_reads
            or conn.queue
            or conn.outbox
            or conn.writing
            or conn.handoff
            or conn.state != ALIVE
            or conn.death is not None
            or conn.killing
            or conn.kill_when_idle
            or self._kill_news
            or self._unqueued.get(conn.actor_id)
            or self.state.closed
            or call is None
        ):
            return
        readable = getattr(call, "thread_readable", None)
        if readable is None or not readable():
            return
        self.channels.hand_over(conn)

    def _loop_reads(self, conn: ActorConn) -> None:
        """The loop reads ``conn``'s replies again (loop thread, lock held)."""
        self.channels.take_back(conn)

    def _loop_reads_of(self, actor_id: bytes) -> None:
        conn = self.state.conns.get(actor_id)
        if conn is not None:
            self._loop_reads(conn)

    def _drop_thread_reads(self, conn: ActorConn) -> None:
        """``conn``'s channel is closed or replaced (a new one starts with the loop)."""
        self.channels.forget(conn)

    def loop_reads_for(self, entry: Any) -> None:
        """An observer on the loop is about to wait for ``entry`` (a task's argument, an
        async waiter, another process's question): if an actor call of a channel the
        callers read makes it, the loop reads that channel from now on. Called before the
        observer looks at the entry, so no reply can complete it unseen."""
        rec = entry.task
        if self._thread_conns and rec is not None and getattr(rec, "actor", False):
            with self.lock:
                self._loop_reads_of(rec.spec.actor_id)

    def loop_reads_soon(self, entries: Any) -> None:
        """:meth:`loop_reads_for` the actor calls behind ``entries``, from any thread (an
        observer that does not read: a callback, an awaiting loop, a wait on several). A
        channel the callers read has at most one call out: with many entries, every such
        channel with a call out is handed to the loop (no walk over the entries)."""
        if not self._thread_conns:
            return
        with self.lock:
            busy = [c for c in self._thread_conns if c.inflight]
        if busy and len(entries) <= 16:
            aids = {e.task.spec.actor_id for e in entries if getattr(e.task, "actor", False)}
            busy = [c for c in busy if c.actor_id in aids]
        if busy:
            self.client.call_soon(self._loop_reads_all, busy)

    def _loop_reads_all(self, conns: list[ActorConn]) -> None:
        with self.lock:
            for conn in conns:
                self._loop_reads(conn)

    def wait_reading(self, entries: Any, flag: Any, deadline: float | None) -> None:
        """A user thread waits for ``entries`` (not ready): when they are the results of
        one actor call on a channel the callers read, read its replies here until ``flag``
        is set, the deadline passes or the loop takes the channel back (then return: the
        caller waits on ``flag`` as usual). Results of other channels the callers read are
        handed to the loop."""
        if not self._thread_conns:
            return
        rec = entries[0].task
        if any(e.task is not rec for e in entries) or not getattr(rec, "actor", False):
            self.loop_reads_soon(entries)
            return
        with self.lock:
            conn = self.state.conns.get(rec.spec.actor_id)
            if conn is None or not conn.thread_reads or rec.task_id not in conn.inflight:
                return
            call = conn.call
            conn.readers += 1
        try:
            self._read_until(conn, call, flag, deadline)
        finally:
            with self.lock:
                conn.readers -= 1

    def _read_until(self, conn: ActorConn, call: Any, flag: Any, deadline: float | None) -> None:
        def step() -> bool:
            if not conn.thread_reads or conn.call is not call:
                return False  # the loop reads it now
            self._read_replies(conn, call)
            return True

        read_until(call.fileno(), flag, deadline, self.lock, step)

    def _read_replies(self, conn: ActorConn, call: Any) -> None:
        """Read and handle what ``conn``'s channel holds, on a caller's thread (lock held;
        the channel is the callers')."""
        batch, ok = call.read_from_thread()
        stream = conn.stream
        if batch is not None and batch.logs:  # output first, from the loop, in order
            self._to_loop(conn, call, stream, batch)
            return
        if batch is not None and batch.replies:
            self.thread_read_replies += len(batch.replies)
            for i in self.state.replies(conn, stream, batch.replies):
                if type(i) is ins.CallDone or type(i) is ins.Complete:
                    self._handlers[type(i)](i)  # (thread-safe: the table has its lock)
                else:
                    self.client.call_soon(self._locked, self._do, [i])
        if not ok:
            self._to_loop(conn, call, stream, None)  # the loop meets the end or error

    def _to_loop(self, conn: ActorConn, call: Any, stream: int, batch: Any) -> None:
        """A reading thread gives the channel back to the loop, with a batch to handle
        first (lock held)."""
        self._drop_thread_reads(conn)
        self.client.call_soon(self._locked, self._loop_takes, conn, call, stream, batch)

    def _loop_takes(self, conn: ActorConn, call: Any, stream: int, batch: Any) -> None:
        if conn.call is not call:
            return
        if batch is not None:
            self._replies(conn, stream, batch)
        if not conn.thread_reads:
            call.resume_reads()

    def _do_cancel_remote(self, i: ins.CancelActorRemote) -> None:
        self.client.loop.create_task(self._cancel_remote(i.address, i.task_id))

    async def _cancel_remote(self, address: str, task_id: bytes) -> None:
        with contextlib.suppress(RpcFailure):
            await self.client.core(address).CancelTask(
                pb.CancelTaskRequest(task_id=task_id), timeout=10
            )

    def _do_kill(self, i: ins.KillActor) -> None:
        self.client.loop.create_task(self._kill(i.actor_id, "out_of_scope"))

    async def _kill(self, actor_id: bytes, kind: str) -> None:
        """Ask the head to end an actor whose handles are all gone, until it has: a request
        lost to a busy or paused head (its deadline passed, or the head's grace period)
        would leave the actor's process running for ever. The kill is idempotent. A head
        that still fails it after ``KILL_RETRY_S`` is left alone (logged): its own cleanup
        of this owner's actors then ends it when this process exits."""
        request = pb.KillActorRequest(
            actor_id=actor_id,
            no_restart=True,
            reason="all handles to the actor went out of scope",
            kind=kind,
        )
        delay = 0.2
        give_up = time.monotonic() + KILL_RETRY_S
        while not self.closed:
            try:
                await self.client.head().KillActor(request, timeout=30)
                return
            except RpcFailure as err:
                if not is_unavailable(err) or time.monotonic() > give_up:
                    log.warning("the head did not end actor %s: %r", actor_id.hex()[:8], err)
                    return
                log.debug("ending actor %s: will ask again: %r", actor_id.hex()[:8], err)
            await asyncio.sleep(delay)
            delay = min(2 * delay, 5.0)

    def _do_call_done(self, i: ins.CallDone) -> None:
        with self.lock:
            self.pending_counts[i.record.spec.actor_id] -= 1

    def _do_complete(self, i: ins.Complete) -> None:
        self.client.submitter._complete(i.record, i.reply)

    def _do_fail(self, i: ins.Fail) -> None:
        assert i.error is not None
        self.client.submitter._fail(i.record, i.error)

    # -- whole process --------------------------------------------------------------------------
    def running(self) -> bool:
        """True while a call of this process to an actor has not replied."""
        with self.lock:
            return self.state.running()

    def shutdown(self) -> None:
        """This process stops: close every actor stream."""
        with self.lock:
            self.channels.stop()
            self._do(self.state.close())
