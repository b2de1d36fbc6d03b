"""Tasks written and read by their caller's thread (core/thread_tasks.py).

A task with no argument to wait for, submitted while a lease of its shape waits idle, is
written to the worker by the submitting thread; a thread waiting in ``get`` for it reads
the reply off the lease's channel itself. These tests check that this happens, and that
every other way of using a task still works beside it: a task nobody waits for, a task
taking the result, ``await``, callbacks, ``wait``, two waiters, output, retries, crashes,
cancellation, Ctrl-C, many threads at once, and bursts. Real cluster, real sockets.
"""

from __future__ import annotations

import _thread
import asyncio
import os
import select
import sys
import threading
import time

import cloudpickle
import pytest

import nbcluster
from nbcluster._runtime import client_slot
from nbcluster._runtime.core import thread_reads
from nbcluster.testing import poll_for

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # workers cannot import tests/


@nbcluster.remote
def echo(x: object = None) -> object:
    return x


@nbcluster.remote
def slow(s: float, x: object = None) -> object:
    time.sleep(s)
    return x


@nbcluster.remote
def shout(text: str) -> str:
    print(text)
    return text.upper()


@nbcluster.remote
def talk_slowly(n: int, pause: float) -> int:
    for i in range(n):
        print(f"line {i}", flush=True)
        time.sleep(pause)
    return n


@nbcluster.remote
def double(x: int) -> int:
    return 2 * x


def _client():  # noqa: ANN202 - this driver's core client
    client = client_slot.current_client()
    assert client is not None
    return client


def _io():  # noqa: ANN202 - the submitter's thread I/O
    return _client().submitter.thread_tasks


def _warm() -> None:
    """Tasks until a lease's channel (of the 1-CPU shape every task here has) is the
    callers'."""
    for _ in range(3):
        nbcluster.get(echo.remote(0), timeout=30)
    poll_for(lambda: _io().leases, timeout=10, message="no channel handed over")


def test_sequential_tasks_are_written_and_read_by_their_caller(shared_cluster: object) -> None:
    _warm()
    io = _io()
    sent, read = io.sent_direct, io.thread_read_replies
    for i in range(200):
        assert nbcluster.get(echo.remote(i), timeout=30) == i
    # (the loop may take the channel back now and then: the watch, a busy machine)
    assert io.sent_direct - sent >= 150
    assert io.thread_read_replies - read >= 150


def test_a_task_nobody_waits_for_still_completes(shared_cluster: object) -> None:
    """A task whose result no thread reads: the loop takes the channel back and reads it."""
    _warm()
    sent = _io().sent_direct
    ref = echo.remote("alone")
    assert _io().sent_direct == sent + 1
    entry = _client().table.entries[ref.binary()]
    assert entry.task.spec.poll_after  # its worker polls for this thread's next task
    poll_for(lambda: entry.state == 1, timeout=10, message="the reply was never read")
    assert nbcluster.get(ref, timeout=10) == "alone"


def test_a_task_taking_the_result_gets_it(shared_cluster: object) -> None:
    _warm()
    assert nbcluster.get(double.remote(slow.remote(0.2, 21)), timeout=30) == 42


def test_await_and_callbacks_get_the_result(shared_cluster: object) -> None:
    _warm()

    async def main() -> object:
        return await slow.remote(0.1, "awaited")

    assert asyncio.run(main()) == "awaited"
    _warm()
    ref = slow.remote(0.1, "called back")
    got = threading.Event()
    _client().add_ready_callback(ref, got.set)
    assert got.wait(10)
    assert nbcluster.get(ref, timeout=10) == "called back"


def test_wait_with_no_timeout_and_a_wait_on_several(shared_cluster: object) -> None:
    _warm()
    ref = echo.remote("polled")
    deadline = time.monotonic() + 10
    while not nbcluster.wait([ref], timeout=0)[0]:
        assert time.monotonic() < deadline, "never ready"
    assert nbcluster.get(ref) == "polled"
    _warm()
    refs = [slow.remote(0.1, "a"), echo.remote("b")]
    ready, _ = nbcluster.wait(refs, num_returns=2, timeout=30)
    assert len(ready) == 2 and nbcluster.get(refs) == ["a", "b"]


def test_two_threads_wait_for_one_task(shared_cluster: object) -> None:
    _warm()
    ref = slow.remote(0.3, "both")
    out: list[object] = []
    threads = [
        threading.Thread(target=lambda: out.append(nbcluster.get(ref, timeout=30)))
        for _ in range(2)
    ]
    for t in threads:
        t.start()
    assert nbcluster.get(ref, timeout=30) == "both"
    for t in threads:
        t.join(30)
    assert out == ["both", "both"]


def test_output_comes_first_and_whole(shared_cluster: object, capsys) -> None:
    """A reply with output goes to the loop, which prints the output, then completes."""
    _warm()
    assert nbcluster.get(shout.remote("hello there"), timeout=30) == "HELLO THERE"
    poll_for(lambda: "hello there" in capsys.readouterr().out, timeout=10)


def test_output_of_a_task_nobody_waits_for_arrives(shared_cluster: object, capsys) -> None:
    _warm()
    ref = talk_slowly.remote(3, 0.5)
    seen = ""

    def printed() -> bool:
        nonlocal seen
        seen += capsys.readouterr().out
        return "line 0" in seen

    poll_for(printed, timeout=10, message="no output while the task ran")
    assert nbcluster.get(ref, timeout=30) == 3


def test_a_retried_error_is_sent_again_and_succeeds(shared_cluster: object, tmp_path) -> None:
    marker = str(tmp_path / "failed-once")

    @nbcluster.remote(max_retries=2, retry_exceptions=True)
    def flaky(path: str) -> str:
        if not os.path.exists(path):
            open(path, "w").close()
            raise ValueError("first time")
        return "second time"

    _warm()  # (a lease of its shape: the retry options are not part of it)
    sent = _io().sent_direct
    assert nbcluster.get(flaky.remote(marker), timeout=30) == "second time"
    assert _io().sent_direct > sent  # the first attempt was written by this thread


def test_a_worker_crash_while_its_caller_reads_is_retried(shared_cluster: object) -> None:
    @nbcluster.remote(max_retries=1)
    def crash_once(path: str) -> int:
        if not os.path.exists(path):
            open(path, "w").close()
            os._exit(1)
        return os.getpid()

    @nbcluster.remote(max_retries=0)
    def crash(_: int = 0) -> int:
        os._exit(1)

    _warm()
    path = f"/tmp/nbcluster-crash-once-{os.getpid()}-{time.monotonic_ns()}"
    try:
        assert nbcluster.get(crash_once.remote(path), timeout=60) > 0
    finally:
        if os.path.exists(path):
            os.remove(path)
    _warm()
    with pytest.raises(nbcluster.exceptions.WorkerCrashedError):
        nbcluster.get(crash.remote(), timeout=60)


def test_cancel_ends_a_reading_wait(shared_cluster: object) -> None:
    _warm()
    for force in (False, True):
        ref = slow.remote(60, "never")
        threading.Timer(0.3, nbcluster.cancel, args=(ref,), kwargs={"force": force}).start()
        t = time.monotonic()
        with pytest.raises(nbcluster.exceptions.TaskCancelledError):  # as Ray: even forced
            nbcluster.get(ref, timeout=30)
        assert time.monotonic() - t < 20
        assert nbcluster.get(echo.remote(force), timeout=30) is force


def test_ctrl_c_while_reading_leaves_the_cluster_usable(
    shared_cluster: object, ctrl_c_raises: None
) -> None:
    _warm()
    ref = slow.remote(3.0, "late")  # (room for a Timer thread late on a loaded machine)
    threading.Timer(0.3, _thread.interrupt_main).start()
    with pytest.raises(KeyboardInterrupt):
        nbcluster.get(ref, timeout=30)
    assert nbcluster.get(ref, timeout=30) == "late"
    for i in range(20):
        assert nbcluster.get(echo.remote(i), timeout=30) == i


def test_ctrl_c_inside_a_reply_is_held_until_it_is_handled(
    shared_cluster: object, monkeypatch, ctrl_c_raises: None
) -> None:
    """A Ctrl-C that lands while a reply is read and handled on the main thread is raised
    once the reply is handled whole: the result is ready, and the lease usable."""
    _warm()
    io = _io()
    real = io._read
    fired: list[bool] = []

    def interrupted_read(lease: object, call: object) -> None:
        if not fired and select.select([call.fileno()], [], [], 10)[0]:  # the reply is here
            fired.append(True)
            _thread.interrupt_main()  # lands at the next bytecode: inside the read
            time.sleep(0.01)
        real(lease, call)

    monkeypatch.setattr(io, "_read", interrupted_read)
    monkeypatch.setattr(thread_reads, "THREAD_READ_WATCH_S", 5.0)
    ref = slow.remote(0.2, "whole")
    with pytest.raises(KeyboardInterrupt):
        nbcluster.get(ref, timeout=30)
    monkeypatch.undo()
    assert fired
    assert _client().table.entries[ref.binary()].state == 1
    assert nbcluster.get(ref, timeout=10) == "whole"
    for i in range(20):
        assert nbcluster.get(echo.remote(i), timeout=30) == i


def test_a_frame_the_socket_takes_in_part_is_finished_by_the_loop(
    shared_cluster: object, monkeypatch
) -> None:
    """When the socket takes only part of a thread-written frame (as when it is full), the
    loop writes the rest, and tasks made meanwhile go out after it: every frame whole."""
    from nbcluster._runtime.core.channel import TaskChannel

    _warm()
    io = _io()
    real = TaskChannel.send_from_thread

    def half(self: TaskChannel, frame: bytes) -> int:  # the socket took only half of it
        return real(self, frame[: len(frame) // 2])

    monkeypatch.setattr(TaskChannel, "send_from_thread", half)
    before, sent = io.handoffs, io.sent_direct
    blob = b"x" * (60 * 1024)
    for i in range(10):
        assert nbcluster.get(echo.remote(blob), timeout=30) == blob  # alone: cut in two
        refs = [echo.remote(blob if j % 2 else (i, j)) for j in range(10)]  # behind it
        assert nbcluster.get(refs, timeout=30) == [blob if j % 2 else (i, j) for j in range(10)]
    assert io.handoffs - before >= 5 and io.sent_direct - sent >= 5
    monkeypatch.undo()
    for i in range(20):  # the lease and its channel serve on
        assert nbcluster.get(echo.remote(i), timeout=30) == i


def test_many_threads_submitting_and_reading_at_once(shared_cluster: object) -> None:
    """Threads race for the idle leases (one writes, the others go the loop's way) and for
    the channels: every task runs once and every result is right."""
    _warm()
    errors: list[BaseException] = []

    def worker(n: int) -> None:
        try:
            for i in range(150):
                value = (n, i)
                if i % 10 == 0:  # a small burst among the single tasks
                    refs = [echo.remote((n, i, j)) for j in range(5)]
                    assert nbcluster.get(refs, timeout=60) == [(n, i, j) for j in range(5)]
                assert nbcluster.get(echo.remote(value), timeout=60) == value
        except BaseException as err:  # noqa: BLE001 - reported below
            errors.append(err)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not any(t.is_alive() for t in threads)
    assert not errors, errors[0]


def test_bursts_and_single_tasks_mix(shared_cluster: object) -> None:
    _warm()
    for round_ in range(5):
        refs = [echo.remote(i) for i in range(50)]
        assert nbcluster.get(refs, timeout=60) == list(range(50))
        entries = _client().table.entries
        assert not all(entries[r.binary()].task.spec.poll_after for r in refs)  # the loop's
        for i in range(20):
            assert nbcluster.get(echo.remote((round_, i)), timeout=30) == (round_, i)


def test_idle_leases_go_back_and_the_watch_stops(shared_cluster: object, monkeypatch) -> None:
    """An idle channel goes back to the loop, the lease to its node at its idle timer
    (started by the watch for a reply a thread read), and the loop's check stops."""
    monkeypatch.setattr(thread_reads, "THREAD_READ_IDLE_S", 0.1)
    _warm()
    for i in range(5):
        assert nbcluster.get(echo.remote(i), timeout=30) == i
    sub = _client().submitter
    poll_for(lambda: not sub.thread_tasks.leases, timeout=10)
    poll_for(lambda: not sub.thread_tasks.channels.watching, timeout=10)
    poll_for(
        lambda: not any(kq.leases for kq in sub.state.keys.values()),
        timeout=10,
        message="the idle lease was never returned",
    )
    assert nbcluster.get(echo.remote("again"), timeout=30) == "again"


def test_a_worker_that_died_idle_is_not_charged_for_the_next_task(shared_cluster: object) -> None:
    """While the callers read a lease's channel the loop does not: a worker that dies idle
    is seen by its channel's end before the next task goes to it (sent by a thread, or
    by the loop in a burst), and tasks that must not run twice still run once."""
    from nbcluster.testing import pid_alive

    @nbcluster.remote(max_retries=0)
    def once(x: int) -> int:
        return x

    sub = _client().submitter
    for burst in (1, 3):
        _warm()
        lease = next(iter(sub.thread_tasks.leases))
        os.kill(lease.worker_pid, 9)
        poll_for(lambda: not pid_alive(lease.worker_pid), timeout=10)  # noqa: B023
        # Its channel's end arrives when every holder of the socket has closed it, which
        # may be a little after the process is gone; from then on nobody may send there.
        assert select.select([lease.call.fileno()], [], [], 10)[0], "the channel never ended"
        refs = [once.remote(i) for i in range(burst)]
        assert nbcluster.get(refs, timeout=60) == list(range(burst))
        assert lease.dead and lease.returned


def test_a_chain_of_fast_tasks_has_the_loop_poll_for_each_reply(
    shared_cluster: object, monkeypatch
) -> None:
    """Each task of a chain is sent by the loop, alone, once the last one's reply is in:
    the loop polls for its reply (``LoopSpin``) and the task carries ``poll_after``."""
    monkeypatch.setattr(thread_reads, "runnable_threads", lambda: 1)  # a CPU to spare
    # Known fast however the machine stretches a run (a preempted one lifts the average).
    monkeypatch.setattr(thread_reads, "LOOP_SPIN_MAX_RUN_S", 10.0)
    _warm()
    spin = _client().submitter.spin
    assert spin is not None
    spin.score = 1.0
    nbcluster.get(double.remote(1), timeout=30)  # known fast from now on
    tried = spin.hits + spin.misses
    x = double.remote(1)
    refs = [x]
    for _ in range(60):
        x = double.remote(x)
        refs.append(x)
    assert nbcluster.get(x, timeout=60) == 2**61
    # Hits or misses (a busy machine makes polls miss, and then it backs off): polled.
    assert spin.hits + spin.misses - tried >= 5
    entries = _client().table.entries
    polled = [entries[r.binary()].task.spec.poll_after for r in refs[1:]]
    assert sum(polled) >= 5


def test_off_switch(cluster, monkeypatch) -> None:
    """``NBCLUSTER_TASK_THREAD_IO=0``: every task goes through the loop. (Its own cluster:
    it runs last, after the module's shared one.)"""
    monkeypatch.setenv("NBCLUSTER_TASK_THREAD_IO", "0")
    cluster(num_cpus=1)
    for i in range(30):
        assert nbcluster.get(echo.remote(i), timeout=30) == i
    io = _io()
    assert io.sent_direct == 0 and io.thread_read_replies == 0 and not io.leases


def test_loop_spin_off_switch(cluster, monkeypatch) -> None:
    """``NBCLUSTER_LOOP_SPIN=0``: the loop never polls for a reply."""
    monkeypatch.setenv("NBCLUSTER_LOOP_SPIN", "0")
    cluster(num_cpus=1)
    x = double.remote(1)
    for _ in range(20):
        x = double.remote(x)
    assert nbcluster.get(x, timeout=60) == 2**21
    assert _client().submitter.spin is None
