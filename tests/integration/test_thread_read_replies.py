"""Replies read by the thread that waits for them (core/actor_submitter.py, "Thread reads").

Once the loop has handed over the last reply of an actor with nothing else out to it, a
thread that waits in ``get`` for the call it wrote reads the reply off the channel itself.
These tests check that this happens, and that every observer that does not read (a task
taking the result, ``await``, a callback, a call nobody waits for, output, a kill, Ctrl-C)
still gets its answer, from the loop. Real cluster, real sockets.
"""

from __future__ import annotations

import _thread
import asyncio
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
class Echo:
    def ping(self, x: object = None) -> object:
        return x

    def slow(self, s: float, x: object = None) -> object:
        time.sleep(s)
        return x

    def shout(self, text: str) -> str:
        print(text)
        return text.upper()

    def talk_slowly(self, n: int, pause: float) -> int:
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


def _conn(handle: object):  # noqa: ANN202 - the submitter's view of the actor
    return _client().actor_submitter.conns[handle._actor_id]  # type: ignore[attr-defined]


def _warm(handle: object) -> None:
    """Calls until the actor's channel is the callers' (the loop handed it over)."""
    for _ in range(3):
        nbcluster.get(handle.ping.remote(0), timeout=30)  # type: ignore[attr-defined]
    poll_for(lambda: _conn(handle).thread_reads, timeout=10, message="channel never handed over")


def test_sequential_calls_are_read_by_their_caller(shared_cluster: object) -> None:
    """Back-to-back calls: the caller's thread writes each call and reads its reply."""
    echo = Echo.remote()
    _warm(echo)
    sub = _client().actor_submitter
    before = sub.thread_read_replies
    for i in range(200):
        assert nbcluster.get(echo.ping.remote(i), timeout=30) == i
    # (the loop may take the channel back now and then: the watch, a busy machine)
    assert sub.thread_read_replies - before >= 150


def test_a_call_nobody_waits_for_still_completes(shared_cluster: object) -> None:
    """A call whose result no thread reads: the loop takes the channel back and reads it."""
    echo = Echo.remote()
    _warm(echo)
    ref = echo.ping.remote("alone")
    entry = _client().table.entries[ref.binary()]
    poll_for(lambda: entry.state == 1, timeout=10, message="the reply was never read")
    assert not _conn(echo).inflight
    assert nbcluster.get(ref, timeout=10) == "alone"


def test_a_task_taking_the_result_gets_it(shared_cluster: object) -> None:
    echo = Echo.remote()
    _warm(echo)
    assert nbcluster.get(double.remote(echo.slow.remote(0.2, 21)), timeout=30) == 42


def test_await_and_callbacks_get_the_result(shared_cluster: object) -> None:
    echo = Echo.remote()
    _warm(echo)

    async def main() -> object:
        return await echo.slow.remote(0.1, "awaited")

    assert asyncio.run(main()) == "awaited"
    _warm(echo)
    ref = echo.slow.remote(0.1, "called back")
    got = threading.Event()
    _client().add_ready_callback(ref, got.set)
    assert got.wait(10)
    assert nbcluster.get(ref, timeout=10) == "called back"


def test_wait_with_no_timeout_reads_the_reply(shared_cluster: object) -> None:
    """``wait(timeout=0)`` in a loop (polling) sees the call finish."""
    echo = Echo.remote()
    _warm(echo)
    ref = echo.ping.remote("polled")
    deadline = time.monotonic() + 10
    while not nbcluster.wait([ref], timeout=0)[0]:
        assert time.monotonic() < deadline, "never ready"
    assert nbcluster.get(ref) == "polled"


def test_two_threads_wait_for_one_call(shared_cluster: object) -> None:
    echo = Echo.remote()
    _warm(echo)
    ref = echo.slow.remote(0.3, "both")
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
    echo = Echo.remote()
    _warm(echo)
    assert nbcluster.get(echo.shout.remote("hello there"), timeout=30) == "HELLO THERE"
    poll_for(lambda: "hello there" in capsys.readouterr().out, timeout=10)


def test_output_of_a_call_nobody_waits_for_arrives(shared_cluster: object, capsys) -> None:
    """While no thread reads, the loop takes the channel back: output arrives as printed."""
    echo = Echo.remote()
    _warm(echo)
    ref = echo.talk_slowly.remote(3, 0.5)
    seen = ""

    def printed() -> bool:
        nonlocal seen
        seen += capsys.readouterr().out
        return "line 0" in seen

    poll_for(printed, timeout=10, message="no output while the call ran")
    assert nbcluster.get(ref, timeout=30) == 3


def test_kill_ends_a_reading_wait_at_once(shared_cluster: object) -> None:
    echo = Echo.remote()
    _warm(echo)
    ref = echo.slow.remote(60, "never")
    threading.Timer(0.5, nbcluster.kill, args=(echo,)).start()
    t = time.monotonic()
    with pytest.raises(nbcluster.exceptions.ActorDiedError):
        nbcluster.get(ref, timeout=30)
    assert time.monotonic() - t < 10


def test_ctrl_c_while_reading_leaves_the_actor_usable(
    shared_cluster: object, ctrl_c_raises: None
) -> None:
    """KeyboardInterrupt reaches a get() that reads its reply; the next calls work."""
    echo = Echo.remote()
    _warm(echo)
    ref = echo.slow.remote(3.0, "late")  # (room for a Timer thread late on a loaded machine)
    threading.Timer(0.3, _thread.interrupt_main).start()
    with pytest.raises(KeyboardInterrupt):
        nbcluster.get(ref, timeout=30)
    assert nbcluster.get(ref, timeout=30) == "late"
    for i in range(20):
        assert nbcluster.get(echo.ping.remote(i), timeout=30) == i


def test_ctrl_c_inside_a_reply_is_held_until_it_is_handled(
    shared_cluster: object, monkeypatch, ctrl_c_raises: None
) -> None:
    """A Ctrl-C that lands while a reply is being read and handled on the main thread is
    raised once the reply is handled whole: the result is ready, and the actor usable."""
    echo = Echo.remote()
    _warm(echo)
    sub = _client().actor_submitter
    real = sub._read_replies
    fired: list[bool] = []

    def interrupted_read(conn: object, call: object) -> None:
        if not fired and select.select([call.fileno()], [], [], 10)[0]:  # the reply is here
            fired.append(True)
            _thread.interrupt_main()  # lands at the next bytecode: inside the read
            time.sleep(0.01)
        real(conn, call)

    monkeypatch.setattr(sub, "_read_replies", interrupted_read)
    # The loop must not take the channel back before this thread reads (a loaded machine
    # can hold the thread longer than the 20 ms the loop gives it).
    monkeypatch.setattr(thread_reads, "THREAD_READ_WATCH_S", 5.0)
    ref = echo.slow.remote(0.2, "whole")
    with pytest.raises(KeyboardInterrupt):
        nbcluster.get(ref, timeout=30)
    monkeypatch.undo()
    assert fired
    # raised only after the reply was handled: the result is here, nothing half done
    assert _client().table.entries[ref.binary()].state == 1
    assert not _conn(echo).inflight
    assert nbcluster.get(ref, timeout=10) == "whole"
    for i in range(20):
        assert nbcluster.get(echo.ping.remote(i), timeout=30) == i


def test_bursts_and_single_calls_mix(shared_cluster: object) -> None:
    """Bursts (the loop reads) and single calls (the caller reads) one after the other."""
    echo = Echo.remote()
    _warm(echo)
    for round_ in range(5):
        refs = [echo.ping.remote(i) for i in range(50)]
        assert nbcluster.get(refs, timeout=60) == list(range(50))
        for i in range(20):
            assert nbcluster.get(echo.ping.remote((round_, i)), timeout=30) == (round_, i)


def test_the_watch_stops_when_channels_go_back(shared_cluster: object, monkeypatch) -> None:
    """An idle channel goes back to the loop after THREAD_READ_IDLE_S, and with none left
    the loop's check stops (no wake-ups of an idle driver)."""
    monkeypatch.setattr(thread_reads, "THREAD_READ_IDLE_S", 0.1)
    echo = Echo.remote()
    _warm(echo)
    sub = _client().actor_submitter
    poll_for(lambda: not _conn(echo).thread_reads, timeout=10)
    poll_for(lambda: not sub.channels.watching, timeout=10)
    assert nbcluster.get(echo.ping.remote("again"), timeout=30) == "again"


def test_off_switch(cluster, monkeypatch) -> None:
    """``NBCLUSTER_ACTOR_THREAD_READS=0``: every reply is the loop's. (Its own cluster: it
    runs last, after the module's shared one.)"""
    monkeypatch.setenv("NBCLUSTER_ACTOR_THREAD_READS", "0")
    cluster(num_cpus=1)
    echo = Echo.remote()
    for i in range(30):
        assert nbcluster.get(echo.ping.remote(i), timeout=30) == i
    sub = _client().actor_submitter
    assert sub.thread_read_replies == 0
    assert not _conn(echo).thread_reads
