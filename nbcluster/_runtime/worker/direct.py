"""Direct task channels: the worker's main thread reads its calls and answers them.

A task worker (its leases' channels) and a plain sync actor (``max_concurrency=1``, no
concurrency groups, not async) run their calls one at a time on the worker's main thread.
Served on the I/O loop, each call would cross two more threads: the loop reads the frame
and queues the call for the main thread, which runs it and queues the reply back for the
loop to write. Here the loop only checks a new channel's hello (the token, as for any
channel) and then hands the connected socket to the main thread, which waits on every such
socket (and on a wake-up for work queued the other way, e.g. a gRPC ``PushTasks`` stream)
with a selector, runs each call where it reads it, and writes the reply itself: one thread
from the socket to the method and back.

The output a call prints while it runs still goes out from the loop (the periodic flush);
the rest of it goes with the reply. ``OutputCapture.send_lock`` keeps a call's output in
order between the two. TLS channels stay on the loop (the loop owns the TLS state).

A task that blocks in ``get`` (a task worker's) lends its lease channels to the I/O loop
until it resumes (:meth:`DirectLoop.lend`): tasks the owner pipelined behind it are
answered "requeued" at once, as on the loop's streams, instead of waiting behind it (the
task it waits for may be one of them). While a task runs, the loop checks now and then that
its owner has not hung up (:func:`hung_up`; the worker shares its owner's fate).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import select
import selectors
import socket
import struct
import threading
import time
from collections.abc import Callable
from typing import Any

from nbcluster._runtime.core.channel import OK
from nbcluster._runtime.protocol import faults
from nbcluster._runtime.protocol.rpc import pb
from nbcluster._runtime.worker.owner_stream import log_records

__all__ = ["DirectLoop", "DirectStream", "detach", "hung_up"]

log = logging.getLogger(__name__)

_LEN = struct.Struct("<I")
_WAKE = object()
#: Bytes per ``recv``. A bigger buffer is above malloc's mmap threshold: each call would map
#: and unmap it, 15 µs of a 120-byte call's read here against 1.7 µs (a frame that is
#: longer is read in several).
_READ_SIZE = 1 << 16


class DirectStream:
    """One caller's channel, read and answered by the main thread.

    Replies of calls that arrived together go out together: while more calls of the same
    read wait to run (``more``), a reply is held, and the held batch leaves when the run
    ends, when it is full, or at the latest ``HOLD_S`` later from the I/O loop (so a long
    call after short ones does not hold their replies back).
    """

    HOLD_S = 0.002
    HOLD_MAX = 256

    def __init__(
        self,
        sock: socket.socket,
        max_frame: int,
        loop: asyncio.AbstractEventLoop | None = None,
        lease: str = "",
    ) -> None:
        self.sock = sock
        self.fd = sock.fileno()
        self.max_frame = max_frame
        self.loop = loop
        self.lease = lease  # a task lease's channel (hex id); "" for an actor's
        self.open = True
        self.cut = False  # testing (F13): replies of a cut batch are lost
        self.retried: set[bytes] = set()  # testing (F13): no faults while a retry is out
        self.more = False  # set by the main thread: calls of the same read wait to run
        self._buf = bytearray()
        self._wlock = threading.Lock()
        self._out = pb.ReplyBatch()  # output and replies not written yet, in order

    # -- the stream interface (see owner_stream) ---------------------------------------------
    def send(self, reply: pb.TaskReply) -> None:
        """Send a reply, after the rest of its call's output (any thread)."""
        with self._wlock:
            out = self._out
            first = not out.replies
            out.replies.append(reply)
            if self.more and len(out.replies) < self.HOLD_MAX and not reply.worker_exiting:
                if first and self.loop is not None:  # a deadline for the held replies
                    with contextlib.suppress(RuntimeError):
                        self.loop.call_soon_threadsafe(self._arm)
                return
            self._flush_locked()

    def send_rest(self, task_id: bytes, chunks: list[tuple[str, str, int]]) -> None:
        """A call's last output: it leaves with its reply (any thread)."""
        records = log_records(task_id, chunks)
        with self._wlock:
            self._out.logs.extend(records)

    def send_logs(self, task_id: bytes, chunks: list[tuple[str, str, int]]) -> None:
        """Output of a running call, sent now (the loop's periodic flush), with any held
        replies."""
        with self._wlock:
            self._out.logs.extend(log_records(task_id, chunks))
            self._flush_locked()

    def send_now(self, reply: pb.TaskReply) -> None:
        """Send a reply now, with anything held (any thread)."""
        with self._wlock:
            self._out.replies.append(reply)
            self._flush_locked()

    def flush(self) -> None:
        """Write what is held (any thread)."""
        with self._wlock:
            self._flush_locked()

    def flushed(self) -> bool:
        """True when nothing is held."""
        with self._wlock:
            return not self._out.replies and not self._out.logs

    def _arm(self) -> None:
        assert self.loop is not None
        self.loop.call_later(self.HOLD_S, self.flush)

    def _flush_locked(self) -> None:
        out = self._out
        if not out.replies and not out.logs:
            return
        self._out = pb.ReplyBatch()
        injector = faults.current()  # testing only (F13): None in production
        if (
            out.replies
            and injector is not None
            and (self.cut or (not self.retried and injector.fire("PushTasks", "drop")))
        ):
            self.hang_up()  # a batch of replies lost, the channel broken
            return
        if self.retried:
            self.retried.difference_update(r.task_id for r in out.replies)
        self._write(out)

    # -- socket -------------------------------------------------------------------------------
    def _write(self, batch: pb.ReplyBatch) -> None:
        if not self.open:
            return
        data = batch.SerializeToString()
        try:
            self.sock.sendall(_LEN.pack(len(data)) + data)
        except OSError as err:
            log.debug("direct channel: write failed: %r", err)
            self.hang_up()

    def read(self) -> list[pb.TaskBatch] | None:
        """The batches completed by what the socket holds now, read without blocking until
        it is empty; None when the channel ended or broke, or a frame is over the limit
        (bytes read before its end are fed first: the next read meets the end)."""
        sock = self.sock
        out: list[pb.TaskBatch] = []
        while True:
            try:
                data = sock.recv(_READ_SIZE, socket.MSG_DONTWAIT)
            except (BlockingIOError, InterruptedError):
                return out
            except OSError:
                data = b""
            if not data:
                return out or None
            batches = self.feed(data)
            if batches is None:
                return None
            out += batches
            if len(data) < _READ_SIZE:
                return out

    def feed(self, data: bytes) -> list[pb.TaskBatch] | None:
        """Frames completed by ``data``; None when a frame is over the limit."""
        buf = self._buf
        buf += data
        out = []
        pos = 0
        while len(buf) - pos >= 4:
            (n,) = _LEN.unpack_from(buf, pos)
            if n > self.max_frame:
                log.warning("task channel: a %d-byte frame is over the limit; closing", n)
                return None
            if len(buf) - pos - 4 < n:
                break
            batch = pb.TaskBatch()
            batch.ParseFromString(bytes(buf[pos + 4 : pos + 4 + n]))
            out.append(batch)
            pos += 4 + n
        if pos:
            del buf[:pos]
        return out

    def hang_up(self) -> None:
        """End the connection (any thread); the main thread sees it end and closes it."""
        self.open = False
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        """Close the socket (the main thread, once it no longer waits on it)."""
        self.open = False
        with contextlib.suppress(OSError):
            self.sock.close()


class DirectLoop:
    """The main thread's wait: direct channels, and a wake-up for queued work.

    ``run_call(spec, stream)`` runs one call and sends its reply; ``drain_queue()`` takes
    work queued by the I/O loop (returns False when the worker should stop);
    ``dropped(stream)`` runs when a channel ended (a lease's goes back to its node);
    ``requeued(spec)`` is the reply to a task that arrives while the running one blocks.
    """

    #: After answering, how long the main thread polls for the next call before sleeping.
    SPIN_S = 0.0003

    def __init__(
        self,
        *,
        max_frame: int,
        loop: asyncio.AbstractEventLoop | None,
        run_call: Callable[[pb.TaskSpec, DirectStream], None],
        drain_queue: Callable[[], bool],
        register: Callable[[pb.TaskSpec, DirectStream], None],
        dropped: Callable[[DirectStream], None] | None = None,
        requeued: Callable[[pb.TaskSpec], pb.TaskReply] | None = None,
    ) -> None:
        self.max_frame = max_frame
        self.loop = loop
        self._run_call = run_call
        self._drain_queue = drain_queue
        self._register = register
        self._dropped = dropped
        self._requeued = requeued
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._selector.register(self._wake_r, selectors.EVENT_READ, _WAKE)
        self._adopted: list[DirectStream] = []
        self._lock = threading.Lock()
        self._woken = False
        self._streams: set[DirectStream] = set()  # registered with the selector (main thread)
        self._lent = 0  # tasks blocked in get: the loop answers the lease channels meanwhile
        self._lent_to: list[DirectStream] = []  # what the loop watches (loop thread)

    # -- any thread --------------------------------------------------------------------------
    def wake(self) -> None:
        """Make the main thread look at its queue (thread-safe; coalesced)."""
        with self._lock:
            if self._woken:
                return
            self._woken = True
        with contextlib.suppress(OSError):
            os.write(self._wake_w, b"x")

    def adopt(self, sock: socket.socket, lease: str = "") -> None:
        """Hand a connected, authenticated channel to the main thread (I/O loop); ``lease``:
        the task lease it serves (hex id), "" for an actor's channel."""
        sock.setblocking(True)
        try:
            sock.sendall(bytes([OK]))  # the hello's answer, now that the socket is ours
        except OSError:
            sock.close()
            return
        stream = DirectStream(sock, self.max_frame, self.loop, lease)
        with self._lock:
            self._adopted.append(stream)
        self.wake()

    # -- main thread ---------------------------------------------------------------------------
    def run(self) -> None:
        """Serve until ``drain_queue`` says stop. After answering calls it polls without
        sleeping for ``SPIN_S`` (an actor's calls, a task its owner's thread wrote): a
        caller's next call that comes within it costs neither side a wake-up (see
        ``core/thread_reads.py``, ``THREAD_READ_SPIN_S``)."""
        look = self._selector.select
        clock = time.perf_counter
        answered = False
        while True:
            events = None
            if answered:
                until = clock() + self.SPIN_S
                while not (events := look(0)) and clock() < until:
                    pass
                answered = False
            if not events:
                events = look(None)
            for key, _ in events:
                if key.data is _WAKE:
                    if not self._on_wake():
                        return
                else:
                    # An actor's caller writes its next call itself (no loop between): it
                    # may come within the poll; so may a task's, when its owner's thread
                    # wrote it or its owner's loop polls for its reply (``poll_after``:
                    # core/thread_tasks.py, core/thread_reads.py ``LoopSpin``). Other tasks
                    # the loop sent are followed later than that: polling would only take
                    # the CPU the owner's loop needs.
                    answered = self._on_readable(key.data) or not key.data.lease
            if self._lent:
                self.take_back()  # a thread of a finished task still blocks: read again

    def _on_wake(self) -> bool:
        with contextlib.suppress(OSError):
            os.read(self._wake_r, 4096)
        with self._lock:
            self._woken = False
            adopted, self._adopted = self._adopted, []
        for stream in adopted:
            self._selector.register(stream.sock, selectors.EVENT_READ, stream)
            self._streams.add(stream)
        return self._drain_queue()

    def _on_readable(self, stream: DirectStream) -> bool:
        """Run the calls that came on ``stream``; True when the last asks for a poll
        after it (``TaskSpec.poll_after``)."""
        batches = stream.read()
        if batches is None:
            self._drop(stream)
            return False
        injector = faults.current()  # testing only (F13): None in production
        calls: list[pb.TaskSpec] = []
        for batch in batches:
            tasks = list(batch.tasks)
            if injector is not None:  # no faults while a retried task is here (as on the loop)
                stream.retried.update(t.task_id for t in tasks if t.attempt and not t.actor_id)
            if (
                injector is not None
                and tasks
                and not stream.retried
                and injector.fire("PushTasks", "cut")
            ):
                calls.extend(tasks[: injector.pick(len(tasks))])
                stream.cut = True  # the rest is lost, and the replies; the channel breaks
                break
            calls.extend(tasks)
        for spec in calls:
            self._register(spec, stream)
        last = len(calls) - 1
        for i, spec in enumerate(calls):
            stream.more = i < last  # replies of calls that came together leave together
            try:  # noqa: SIM105 - no context manager on the hot path
                self._run_call(spec, stream)
            except KeyboardInterrupt:
                pass  # a task's cancel that landed just after it ended: go on with the rest
            if not stream.open:
                break
        stream.more = False
        stream.flush()
        if stream.cut or not stream.open:
            self._drop(stream)
            return False
        return bool(calls) and calls[-1].poll_after

    def _drop(self, stream: DirectStream) -> None:
        with contextlib.suppress(KeyError, ValueError):
            self._selector.unregister(stream.fd)
        self._streams.discard(stream)
        stream.close()
        if self._dropped is not None:
            self._dropped(stream)

    def running_from(self, stream: DirectStream | None) -> bool:
        """True when ``stream`` is a lease channel served here (what a running task came on)."""
        return stream is not None and bool(stream.lease) and stream in self._streams

    # -- a task blocked in get: its lease channels lent to the I/O loop ------------------------
    def lend(self) -> None:
        """A task blocks in ``get`` (the thread that blocks): until :meth:`take_back`, the
        I/O loop reads the lease channels and answers each task on them "requeued"."""
        if self.loop is None or self._requeued is None:
            return
        with self._lock:
            self._lent += 1
            if self._lent > 1:
                return
            streams = [s for s in self._streams if s.lease and s.open]
        if streams:
            with contextlib.suppress(RuntimeError):  # a closed loop: the process ends
                self.loop.call_soon_threadsafe(self._watch, streams)

    def take_back(self) -> None:
        """The task resumes: the loop stops reading before this returns (so the main thread
        is the only reader again; a frame half read stays in the stream's buffer)."""
        with self._lock:
            if self._lent == 0:
                return
            self._lent -= 1
            if self._lent and threading.current_thread() is not threading.main_thread():
                return  # another thread of the task still blocks
            self._lent = 0
        if self.loop is None:
            return
        done = threading.Event()

        def unwatch() -> None:
            for stream in self._lent_to:
                with contextlib.suppress(ValueError, OSError):
                    self.loop.remove_reader(stream.fd)  # type: ignore[union-attr]
            self._lent_to = []
            done.set()

        try:
            self.loop.call_soon_threadsafe(unwatch)
        except RuntimeError:
            return  # the loop is closed: the process ends
        done.wait(10)

    def _watch(self, streams: list[DirectStream]) -> None:
        if not self._lent:
            return  # taken back before the loop got here
        assert self.loop is not None
        for stream in streams:
            with contextlib.suppress(ValueError, OSError):
                self.loop.add_reader(stream.fd, self._on_lent_readable, stream)
                self._lent_to.append(stream)

    def _on_lent_readable(self, stream: DirectStream) -> None:
        """The loop reads a lent channel: every task on it goes back to its owner."""
        assert self.loop is not None and self._requeued is not None
        batches = stream.read()
        if batches is None:  # the owner hung up (or broke a frame): the main thread drops it
            with contextlib.suppress(ValueError, OSError):
                self.loop.remove_reader(stream.fd)
            with contextlib.suppress(ValueError):
                self._lent_to.remove(stream)
            stream.hang_up()
            return
        for batch in batches:
            for spec in batch.tasks:
                stream.send_now(self._requeued(spec))

    def close(self) -> None:
        """Close every channel and the selector."""
        for key in list(self._selector.get_map().values()):
            if isinstance(key.data, DirectStream):
                key.data.close()
        self._selector.close()
        for fd in (self._wake_r, self._wake_w):
            with contextlib.suppress(OSError):
                os.close(fd)


def hung_up(stream: DirectStream) -> bool:
    """True when the owner at the other end of ``stream`` has hung up (closed, or died),
    even with calls it sent still unread (any thread; the socket is not read)."""
    if not stream.open:
        return False  # ended here: closed, or closing (its descriptor may be gone)
    poller = select.poll()
    poller.register(stream.fd, select.POLLRDHUP)
    try:
        events = poller.poll(0)
    except OSError:
        return False
    return any(ev & (select.POLLRDHUP | select.POLLHUP | select.POLLERR) for _, ev in events)


def detach(writer: Any) -> socket.socket | None:
    """The connected socket under an asyncio stream writer, taken from the loop (a duplicate
    of its descriptor; the transport is closed without closing the connection). None when
    the transport has no plain socket (TLS)."""
    transport = writer.transport
    if transport.get_extra_info("sslcontext") is not None:
        return None
    raw = transport.get_extra_info("socket")
    if raw is None:
        return None
    transport.pause_reading()
    fd = os.dup(raw.fileno())
    try:
        sock = socket.socket(fileno=fd)
    except OSError:
        os.close(fd)
        return None
    transport.abort()
    return sock
