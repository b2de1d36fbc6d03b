"""Thread I/O for tasks on leased workers: the caller's thread writes the task and reads
its reply, as actor calls do (``actor_submitter.py``, module docstring).

**Thread writes.** A task with no argument to wait for, submitted while its scheduling key
has nothing queued and holds a lease with nothing in flight whose task channel takes a
write now, goes in flight in the state machine (:meth:`OwnerState.send_now`) and its frame
is written to the socket by the submitting thread: no hop through the I/O loop. A frame the
socket does not take whole is finished by the loop (a handoff), before anything else is
written to that lease.

**Thread reads.** When the loop has handled the last reply of a lease and nothing else is
out or queued on its key, it stops reading the lease's channel; a thread that then waits in
``get`` for the one task it sent there polls the socket itself and handles the reply where
it reads it (``thread_reads.read_until``). The loop takes the channel back before it writes
to the lease, before an observer on the loop waits for a result made there (a task's
argument, an async waiter, a callback), when a reply carries output (printed in order, from
the loop), when the socket ends, when a task sent there has waited ``THREAD_READ_WATCH_S``
with no thread reading, and after ``THREAD_READ_IDLE_S`` idle. Completing a task and failing
one are done on the reading thread (the object table has its lock); idle timers it would
start are started by the loop's watch (within ``THREAD_READ_WATCH_S``), and any other
instruction goes to the loop.

All of it happens under the owner's lock (:attr:`Submitter.lock`, shared with the actor
submitter), which orders every event of the state machine and every write to a channel.
This class is also where the client asks about reading while it waits: results of actor
calls are passed on to the actor submitter.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from nbcluster._runtime.core import instructions as ins
from nbcluster._runtime.core.channel import batch_frame
from nbcluster._runtime.core.records import Lease, TaskRecord
from nbcluster._runtime.core.thread_reads import CallerChannels, HeldInterrupt, read_until

if TYPE_CHECKING:
    from nbcluster._runtime.core.owner_state import OwnerState
    from nbcluster._runtime.core.ownership import Entry
    from nbcluster._runtime.core.ports import ThreadTasksHost

__all__ = ["ThreadTasks"]


def fill_spec(spec: Any, lease: Lease) -> None:
    """What a task's spec learns from the lease it goes to (every path that sends one)."""
    spec.lease_id = lease.lease_id
    spec.poll_after = False  # (set by a thread write or the loop's poll, for this send alone)
    if spec.gpu_ids:  # (a retry on another lease)
        del spec.gpu_ids[:]
    if lease.gpu_ids:
        spec.gpu_ids.extend(lease.gpu_ids)
    if not spec.resources:  # get_runtime_context().get_assigned_resources()
        # (item by item: the map's update() is MutableMapping's, in Python, several times
        # slower for a one-entry shape)
        resources = spec.resources
        for name, amount in lease.kq.resources.items():
            resources[name] = amount


class TaskOwner(Protocol):
    """What the thread I/O uses of its task submitter (``submitter.py``)."""

    lock: threading.RLock
    state: OwnerState
    client: ThreadTasksHost
    handlers: dict[type, Callable[[Any], None]]

    def flush(self, lease: Lease) -> None: ...
    def locked_do(self, out: list[Any]) -> None: ...
    def replies_read(self, lease: Lease, batch: Any) -> None: ...


def _writable(lease: Lease) -> bool:
    call = lease.call
    if call is None or lease.outbox or lease.writing or lease.handoff:
        return False
    writable = getattr(call, "thread_writable", None)
    return writable is not None and writable()


class ThreadTasks:
    """The caller-thread side of a :class:`Submitter` (module docstring)."""

    def __init__(self, submitter: TaskOwner) -> None:
        self.sub = submitter
        self.client: ThreadTasksHost = submitter.client
        self.on = self.client.config.task_thread_io
        #: Leases whose channel the callers read, and the loop's watch on them.
        self.channels: CallerChannels[Lease] = CallerChannels(
            self.client.loop, submitter.lock, lambda: submitter.state.closed, self._chores
        )
        self.leases = self.channels.held
        self._idle_later: list[tuple[ins.StartIdleTimer, float]] = []
        #: Tasks written by their caller's thread / whose frame it left to the loop /
        #: replies read and handled by the thread that waited for them.
        self.sent_direct = 0
        self.handoffs = 0
        self.thread_read_replies = 0

    # -- thread writes (a caller's thread) -----------------------------------------------------
    def send(self, rec: TaskRecord) -> bool:
        """Put ``rec`` in flight and write it from this thread, if it may go so; False:
        it goes the loop's way."""
        if not self.on or rec.dep_ids or rec.generator is not None or rec.spec.num_returns < 0:
            return False
        sub = self.sub
        kq = sub.state.keys.get(rec.key)  # (a first look without the lock: the common "no")
        if kq is None or kq.queue or all(lease.inflight for lease in kq.leases):
            return False
        lock = sub.lock
        if not lock.acquire(blocking=False):
            return False  # the loop is at work on the owner's state: it takes this one too
        try:
            if threading.current_thread() is not threading.main_thread():
                return self._send(rec)
            with HeldInterrupt():  # a Ctrl-C must not leave the task in flight, unwritten
                return self._send(rec)
        finally:
            lock.release()

    def _send(self, rec: TaskRecord) -> bool:
        self.check_ends()
        lease = self.sub.state.send_now(rec, _writable)
        if lease is None:
            return False
        rec.submitted_at = lease.last_direct = time.monotonic()
        rec.locality = ""
        spec = rec.spec
        fill_spec(spec, lease)
        spec.poll_after = True  # this thread's next task may follow soon: the worker polls
        frame = batch_frame(spec.SerializeToString())
        call = lease.call
        sent = call.send_from_thread(frame)
        self.sent_direct += 1
        if sent < len(frame):  # the socket is full: the loop writes the rest, in order
            lease.handoff = True
            self.handoffs += 1
            self.client.call_soon(self._handoff, lease, call, frame[sent:])
        return True

    def _handoff(self, lease: Lease, call: Any, rest: bytes) -> None:
        """The loop writes what a caller's thread could not (then what waited behind it)."""
        with self.sub.lock:
            lease.handoff = False
            self.loop_reads(lease)
            if lease.call is call:
                with contextlib.suppress(ConnectionError):  # (the reader meets the end)
                    call.write_bytes_nowait(rest)
            self.sub.flush(lease)

    # -- the channel goes to the callers, and back (the loop, lock held) -----------------------
    def to_threads(self, lease: Lease) -> None:
        """The loop handled the last reply of ``lease`` with nothing else out: the next
        reply is read by the thread that waits for it."""
        call = lease.call
        if (
            not self.on
            or lease.thread_reads
            or lease.inflight
            or lease.outbox
            or lease.writing
            or lease.handoff
            or lease.dead
            or lease.returned
            or lease.exiting
            or lease.kq.queue
            or self.sub.state.closed
            or call is None
        ):
            return
        readable = getattr(call, "thread_readable", None)
        if readable is None or not readable():
            return
        self.channels.hand_over(lease)

    def loop_reads(self, lease: Lease) -> None:
        """The loop reads ``lease``'s replies again."""
        self.channels.take_back(lease)

    def drop(self, lease: Lease) -> None:
        """``lease``'s channel is closed (a new one starts with the loop)."""
        self.channels.forget(lease)

    def _chores(self, now: float) -> None:
        """The watch's first chore (lock held): start the idle timers reading threads
        left to it (a thread leaves them only while it reads a held channel, so the watch
        is due)."""
        later, self._idle_later = self._idle_later, []
        for i, at in later:
            lease = i.lease
            if i.gen == lease.idle_gen and lease.idle and not lease.returned:
                self.sub.handlers[ins.StartIdleTimer](
                    i._replace(delay=max(0.0, i.delay - (now - at)))
                )

    # -- thread reads (a caller's thread) ------------------------------------------------------
    def wait_reading(self, entries: Any, flag: Any, deadline: float | None) -> None:
        """A user thread waits for ``entries`` (not ready): when they are the results of
        one task on a lease whose channel the callers read, read its replies here until
        ``flag`` is set, the deadline passes or the loop takes the channel back (then
        return: the caller waits on ``flag`` as usual). Actor calls' results go to the
        actor submitter; results of other channels the callers read, to the loop."""
        rec = entries[0].task
        if not isinstance(rec, TaskRecord) or rec.actor or any(e.task is not rec for e in entries):
            self._loop_reads_soon(entries)
            self.client.actor_submitter.wait_reading(entries, flag, deadline)
            return
        if not self.leases:
            return
        sub = self.sub
        with sub.lock:
            lease = rec.lease
            if lease is None or not lease.thread_reads or rec.task_id not in lease.inflight:
                return
            call = lease.call
            lease.readers += 1

        def step() -> bool:
            if not lease.thread_reads or lease.call is not call:
                return False  # the loop reads it now
            self._read(lease, call)
            return True

        try:
            read_until(call.fileno(), flag, deadline, sub.lock, step)
        finally:
            with sub.lock:
                lease.readers -= 1

    def _read(self, lease: Lease, call: Any) -> None:
        """Read and handle what ``lease``'s channel holds (lock held; it is the callers')."""
        batch, ok = call.read_from_thread()
        if batch is not None and batch.logs:  # output first, from the loop, in order
            self._to_loop(lease, call, batch)
            return
        sub = self.sub
        if batch is not None and batch.replies:
            self.thread_read_replies += len(batch.replies)
            self._carry_out(sub.state.replies(lease, batch.replies))
        if not ok:  # the worker is gone: its lease is, now (nothing more goes to it)
            self.drop(lease)
            self._carry_out(sub.state.stream_broken(lease))

    def _carry_out(self, out: list[Any]) -> None:
        """Instructions of an event a reading thread fed the state machine: outcomes are
        placed here, idle timers started by the watch, the rest by the loop."""
        sub = self.sub
        now = time.monotonic()
        for i in out:
            kind = type(i)
            if kind is ins.Complete or kind is ins.Fail:
                sub.handlers[kind](i)  # (thread-safe: the table has its lock)
            elif kind is ins.StartIdleTimer and i.delay > 0:
                self._idle_later.append((i, now))  # the watch starts it
            elif kind is not ins.StopIdleTimer:  # (a stopped timer is stale already)
                self.client.call_soon(sub.locked_do, [i])

    def check_ends(self) -> None:
        """Before work goes to an idle lease whose channel the callers read (lock held):
        the loop does not read it, so a worker that died idle is seen here, by its end on
        the channel, and its lease given back, rather than sent a task it would be charged
        for."""
        for lease in list(self.leases):
            call = lease.call
            if not lease.inflight and lease.thread_reads and not call.thread_quiet():
                self._read(lease, call)

    def _to_loop(self, lease: Lease, call: Any, batch: Any) -> None:
        """A reading thread gives the channel back to the loop, with a batch to handle
        first (lock held)."""
        self.drop(lease)
        self.client.call_soon(self._loop_takes, lease, call, batch)

    def _loop_takes(self, lease: Lease, call: Any, batch: Any) -> None:
        with self.sub.lock:
            if lease.call is not call:
                return
            if batch is not None:
                self.sub.replies_read(lease, batch)
            if not lease.thread_reads:
                call.resume_reads()

    # -- observers that do not read ------------------------------------------------------------
    def loop_reads_for(self, entry: Entry) -> None:
        """An observer on the loop is about to wait for ``entry`` (a task's argument, an
        async waiter): the loop reads the channel that brings it from now on (called
        before the observer looks at the entry, so no reply can complete it unseen)."""
        rec = entry.task
        if not isinstance(rec, TaskRecord):
            return
        if rec.actor:
            self.client.actor_submitter.loop_reads_for(entry)
            return
        if self.leases:
            with self.sub.lock:
                lease = rec.lease
                if lease is not None and lease.thread_reads:
                    self.loop_reads(lease)

    def loop_reads_soon(self, entries: Any) -> None:
        """:meth:`loop_reads_for` the tasks and actor calls behind ``entries``, from any
        thread (an observer that does not read: a callback, an awaiting loop, a wait on
        several)."""
        self._loop_reads_soon(entries)
        self.client.actor_submitter.loop_reads_soon(entries)

    def _loop_reads_soon(self, entries: Any) -> None:
        if not self.leases:
            return
        with self.sub.lock:
            busy = [lease for lease in self.leases if lease.inflight]
        if busy and len(entries) <= 16:
            ids = {e.task.task_id for e in entries if isinstance(e.task, TaskRecord)}
            busy = [lease for lease in busy if not ids.isdisjoint(lease.inflight)]
        if busy:
            self.client.call_soon(self._loop_reads_all, busy)

    def _loop_reads_all(self, leases: list[Lease]) -> None:
        with self.sub.lock:
            for lease in leases:
                self.loop_reads(lease)

    def shutdown(self) -> None:
        """This process stops (the loop, lock held)."""
        self.channels.stop()
