"""The direct task channel of a plain sync actor (worker/direct.py), without processes.

A socket pair stands for the caller's channel; the thread that runs ``DirectLoop.run``
stands for the worker's main thread, and an asyncio loop on another thread for its I/O loop.
"""

from __future__ import annotations

import asyncio
import socket
import struct
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from nbcluster._runtime.protocol.rpc import pb
from nbcluster._runtime.worker.direct import DirectLoop, DirectStream, hung_up

LEN = struct.Struct("<I")
MAX_FRAME = 1 << 20


def frame(batch: Any) -> bytes:
    data = batch.SerializeToString()
    return LEN.pack(len(data)) + data


def specs(*ids: int) -> pb.TaskBatch:
    return pb.TaskBatch(tasks=[pb.TaskSpec(task_id=bytes([i]) * 4) for i in ids])


def read_frames(sock: socket.socket, n: int) -> list[pb.ReplyBatch]:
    """``n`` reply frames off the caller's end (10 s at most)."""
    sock.settimeout(10)
    buf = b""
    out = []
    while len(out) < n:
        chunk = sock.recv(1 << 16)
        assert chunk, "the worker's end closed"
        buf += chunk
        while len(buf) >= 4 and len(buf) - 4 >= LEN.unpack_from(buf)[0]:
            (size,) = LEN.unpack_from(buf)
            batch = pb.ReplyBatch()
            batch.ParseFromString(buf[4 : 4 + size])
            out.append(batch)
            buf = buf[4 + size :]
    return out


class Worker:
    """A DirectLoop served on its own thread, with an I/O loop beside it."""

    def __init__(self, run_call: Any = None, dropped: Any = None) -> None:
        self.io = asyncio.new_event_loop()
        self.io_thread = threading.Thread(target=self.io.run_forever, daemon=True)
        self.io_thread.start()
        self.ran: list[tuple[bytes, str]] = []
        self.registered: list[bytes] = []
        self.queued: list[Any] = []
        self.stop = False
        self.direct = DirectLoop(
            max_frame=MAX_FRAME,
            loop=self.io,
            run_call=run_call or self.run_call,
            drain_queue=self.drain_queue,
            register=lambda spec, stream: self.registered.append(spec.task_id),
            dropped=dropped,
            requeued=lambda spec: pb.TaskReply(task_id=spec.task_id, requeued=True),
        )
        self.thread = threading.Thread(target=self.direct.run, daemon=True)
        self.thread.start()

    def run_call(self, spec: pb.TaskSpec, stream: DirectStream) -> None:
        self.ran.append((spec.task_id, threading.current_thread().name))
        stream.send(pb.TaskReply(task_id=spec.task_id))

    def drain_queue(self) -> bool:
        self.queued.append("drained")
        return not self.stop

    def connect(self, lease: str = "") -> socket.socket:
        ours, theirs = socket.socketpair()
        self.direct.adopt(theirs, lease)
        ok = ours.recv(1)
        assert ok == b"\x00", "the hello's answer comes on the adopted socket"
        return ours

    def close(self) -> None:
        self.stop = True
        self.direct.wake()
        self.thread.join(10)
        assert not self.thread.is_alive()
        self.direct.close()
        self.io.call_soon_threadsafe(self.io.stop)
        self.io_thread.join(10)
        self.io.close()


@pytest.fixture
def worker() -> Iterator[Worker]:
    w = Worker()
    yield w
    w.close()


def test_calls_run_on_the_reading_thread_in_order_and_are_answered(worker: Worker) -> None:
    caller = worker.connect()
    caller.sendall(frame(specs(1)) + frame(specs(2, 3)))
    replies = [r.task_id for b in read_frames(caller, 1) for r in b.replies]
    while len(replies) < 3:
        replies += [r.task_id for b in read_frames(caller, 1) for r in b.replies]
    assert replies == [b"\x01" * 4, b"\x02" * 4, b"\x03" * 4]
    assert [t for t, _ in worker.ran] == replies
    # Every call ran on the loop's own thread: no hand-off to another thread.
    assert {name for _, name in worker.ran} == {worker.thread.name}
    assert worker.registered == replies  # cancel and exit can see each call before it runs


def test_replies_of_calls_that_arrived_together_leave_in_one_frame(worker: Worker) -> None:
    caller = worker.connect()
    caller.sendall(frame(specs(*range(1, 51))))
    (batch,) = read_frames(caller, 1)
    assert [r.task_id[0] for r in batch.replies] == list(range(1, 51))


def test_a_held_reply_leaves_by_the_io_loops_deadline_while_a_long_call_runs() -> None:
    release = threading.Event()

    def run_call(spec: pb.TaskSpec, stream: DirectStream) -> None:
        if spec.task_id == b"\x02" * 4:
            assert release.wait(10)  # a long call after a short one
        stream.send(pb.TaskReply(task_id=spec.task_id))

    w = Worker(run_call)
    try:
        caller = w.connect()
        caller.sendall(frame(specs(1, 2)))
        (first,) = read_frames(caller, 1)  # while call 2 still runs
        assert [r.task_id for r in first.replies] == [b"\x01" * 4]
        release.set()
        (second,) = read_frames(caller, 1)
        assert [r.task_id for r in second.replies] == [b"\x02" * 4]
    finally:
        release.set()
        w.close()


def test_output_goes_before_its_reply_and_running_output_goes_at_once() -> None:
    def run_call(spec: pb.TaskSpec, stream: DirectStream) -> None:
        stream.send_logs(spec.task_id, [("stdout", "while running\n", 0)])  # the I/O loop's flush
        stream.send_rest(spec.task_id, [("stdout", "last words\n", 0)])
        stream.send(pb.TaskReply(task_id=spec.task_id))

    w = Worker(run_call)
    try:
        caller = w.connect()
        caller.sendall(frame(specs(7)))
        running, last = read_frames(caller, 2)
        assert [r.text for r in running.logs] == ["while running\n"] and not running.replies
        assert [r.text for r in last.logs] == ["last words\n"]
        assert [r.task_id for r in last.replies] == [b"\x07" * 4]
    finally:
        w.close()


def test_several_callers_and_a_frame_split_across_reads(worker: Worker) -> None:
    a, b = worker.connect(), worker.connect()
    data = frame(specs(9))
    a.sendall(data[:3])
    b.sendall(frame(specs(8)))
    (rb,) = read_frames(b, 1)
    assert [r.task_id for r in rb.replies] == [b"\x08" * 4]
    a.sendall(data[3:])
    (ra,) = read_frames(a, 1)
    assert [r.task_id for r in ra.replies] == [b"\x09" * 4]


def test_an_oversized_frame_or_a_hang_up_closes_only_that_channel(worker: Worker) -> None:
    bad, good = worker.connect(), worker.connect()
    bad.sendall(LEN.pack(MAX_FRAME + 1))
    bad.settimeout(10)
    assert bad.recv(1) == b""  # closed by the worker
    gone = worker.connect()
    gone.close()
    good.sendall(frame(specs(5)))
    (reply,) = read_frames(good, 1)
    assert [r.task_id for r in reply.replies] == [b"\x05" * 4]


def test_wake_runs_queued_work(worker: Worker) -> None:
    worker.direct.wake()
    deadline = threading.Event()
    for _ in range(100):
        if worker.queued:
            break
        deadline.wait(0.05)
    assert worker.queued


def test_a_blocked_task_lends_its_lease_channel_and_the_loop_requeues_what_comes() -> None:
    blocked, resume = threading.Event(), threading.Event()
    holder: list[Worker] = []

    def run_call(spec: pb.TaskSpec, stream: DirectStream) -> None:
        w = holder[0]
        w.ran.append((spec.task_id, threading.current_thread().name))
        if spec.task_id == b"\x01" * 4:  # blocks in get: the loop reads meanwhile
            w.direct.lend()
            blocked.set()
            assert resume.wait(10)
            w.direct.take_back()
        stream.send(pb.TaskReply(task_id=spec.task_id))

    dropped: list[DirectStream] = []
    w = Worker(run_call, dropped=dropped.append)
    holder.append(w)
    try:
        caller = w.connect(lease="ab")
        caller.sendall(frame(specs(1)))
        assert blocked.wait(10)
        # Two frames, the second split in two writes: answered by the I/O loop, requeued.
        second = frame(specs(2, 3))
        caller.sendall(frame(specs(4)) + second[:5])
        caller.sendall(second[5:])
        got: list[tuple[bytes, bool]] = []
        while len(got) < 3:
            got += [(r.task_id, r.requeued) for b in read_frames(caller, 1) for r in b.replies]
        assert sorted(got) == [(bytes([i]) * 4, True) for i in (2, 3, 4)]
        fifth = frame(specs(5))
        caller.sendall(fifth[:5])  # half a frame, read by the loop
        threading.Event().wait(0.1)
        resume.set()
        (batch,) = read_frames(caller, 1)
        assert [(r.task_id, r.requeued) for r in batch.replies] == [(b"\x01" * 4, False)]
        # Taken back: the main thread finishes the half frame and runs the call.
        caller.sendall(fifth[5:])
        (batch,) = read_frames(caller, 1)
        assert [(r.task_id, r.requeued) for r in batch.replies] == [(b"\x05" * 4, False)]
        assert [t for t, _ in w.ran] == [b"\x01" * 4, b"\x05" * 4]
        assert {name for _, name in w.ran} == {w.thread.name}
        caller.close()  # the owner hangs up: the lease's channel is dropped (its lease returned)
        deadline = threading.Event()
        for _ in range(200):
            if dropped:
                break
            deadline.wait(0.05)
        assert [s.lease for s in dropped] == ["ab"]
    finally:
        resume.set()
        w.close()


def test_an_owner_that_hung_up_is_seen_without_reading_its_calls() -> None:
    ours, theirs = socket.socketpair()
    stream = DirectStream(theirs, MAX_FRAME, None, "ab")
    assert not hung_up(stream)
    ours.sendall(frame(specs(1)))  # calls sent, unread
    assert not hung_up(stream)
    ours.close()  # then it died
    assert hung_up(stream)
    theirs.close()


def test_a_task_its_owners_thread_wrote_asks_for_a_poll_after_it() -> None:
    """``TaskSpec.poll_after`` (set by the owner's thread writes, core/thread_tasks.py):
    after running such a task the main thread polls for the next before it sleeps; after
    tasks the owner's loop sent it does not (``run`` polls for every actor call)."""
    ran: list[bytes] = []
    direct = DirectLoop(
        max_frame=MAX_FRAME,
        loop=None,
        run_call=lambda spec, stream: ran.append(spec.task_id),
        drain_queue=lambda: True,
        register=lambda spec, stream: None,
    )
    caller, worker = socket.socketpair()
    stream = DirectStream(worker, MAX_FRAME, None, lease="ab")
    try:
        caller.sendall(frame(pb.TaskBatch(tasks=[pb.TaskSpec(task_id=b"1111", poll_after=True)])))
        assert direct._on_readable(stream) is True
        caller.sendall(frame(specs(2)))
        assert direct._on_readable(stream) is False
        last_from_loop = [pb.TaskSpec(task_id=b"3333", poll_after=True), pb.TaskSpec(task_id=b"4")]
        caller.sendall(frame(pb.TaskBatch(tasks=last_from_loop)))
        assert direct._on_readable(stream) is False
        assert ran == [b"1111", bytes([2]) * 4, b"3333", b"4"]
    finally:
        caller.close()
        direct.close()


def test_a_read_takes_a_frame_longer_than_one_recv_and_what_came_before_the_end() -> None:
    a, b = socket.socketpair()
    try:
        stream = DirectStream(b, MAX_FRAME)
        big = pb.TaskBatch(tasks=[pb.TaskSpec(task_id=b"big!", args=b"x" * 300_000)])
        sender = threading.Thread(target=a.sendall, args=(frame(big) + frame(specs(7)),))
        sender.start()  # (a socket pair's buffer holds less than the whole)
        got: list[pb.TaskBatch] = []
        while len(got) < 2:
            batches = stream.read()
            assert batches is not None
            got += batches
        sender.join(10)
        assert [t.task_id for g in got for t in g.tasks] == [b"big!", bytes([7]) * 4]
        assert got[0].tasks[0].args == b"x" * 300_000
        assert stream.read() == []  # nothing there: no block, nothing lost
        a.sendall(frame(specs(9)))
        a.close()
        last = stream.read()  # the calls that came before the end first...
        assert last is not None and [t.task_id for t in last[0].tasks] == [bytes([9]) * 4]
        assert stream.read() is None  # ...then the end
    finally:
        a.close()
        b.close()
