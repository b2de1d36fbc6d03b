"""The loop's brief poll for a lone fast task's reply (``core/thread_reads.py``,
``LoopSpin``): when it polls, when it backs off, and what it counts. No processes: a
socket pair stands for the task channel."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest

from nbcluster._runtime.core import thread_reads
from nbcluster._runtime.core.thread_reads import (
    LOOP_SPIN_MAX_RUN_S,
    LOOP_SPIN_PROBE,
    LoopSpin,
    runnable_threads,
)

FAST = LOOP_SPIN_MAX_RUN_S / 10


@pytest.fixture
def calm(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int | None]]:
    """The machine's runnable threads, as the test sets them (one: this one)."""
    ready: list[int | None] = [1]
    monkeypatch.setattr(thread_reads, "runnable_threads", lambda: ready[0])
    yield ready


def test_only_functions_known_to_be_fast_are_polled_for(calm: list[int | None]) -> None:
    spin = LoopSpin()
    assert not spin.wanted(None)  # never ran: unknown
    assert not spin.wanted(LOOP_SPIN_MAX_RUN_S)  # its reply would not come in time
    assert spin.wanted(FAST)


def test_no_poll_while_the_machine_runs_more_threads_than_cpus(
    calm: list[int | None], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(thread_reads, "CROWD_CHECK_S", 0.0)  # look every time
    spin = LoopSpin()
    spin.cpus = 2
    calm[0] = 2  # this thread and one more: a CPU each
    assert all(spin.wanted(FAST) for _ in range(20))
    calm[0] = 4  # two busy programs besides: after a few looks, no more polls
    answers = [spin.wanted(FAST) for _ in range(20)]
    assert answers[0] and not any(answers[-10:])
    calm[0] = None  # (no /proc/loadavg: what was seen stays)
    assert not spin.wanted(FAST)
    calm[0] = 1
    answers = [spin.wanted(FAST) for _ in range(20)]
    assert not answers[0] and all(answers[-10:])  # calm again: it polls again


def test_a_hit_and_a_miss_are_counted() -> None:
    a, b = socket.socketpair()
    with a, b:
        spin = LoopSpin()
        assert not spin.spin(a.fileno())  # nothing comes: gives up after LOOP_SPIN_S
        assert (spin.hits, spin.misses) == (0, 1)
        b.send(b"reply")
        assert spin.spin(a.fileno())
        assert (spin.hits, spin.misses) == (1, 1)


def test_polls_that_mostly_miss_stop_it_but_for_a_probe_now_and_then(
    calm: list[int | None],
) -> None:
    a, b = socket.socketpair()
    with a, b:
        spin = LoopSpin()
        while spin.score >= 0.5:
            assert spin.wanted(FAST)
            spin.spin(a.fileno())  # misses
        answers = [spin.wanted(FAST) for _ in range(3 * LOOP_SPIN_PROBE)]
        assert answers.count(True) == 3  # one probe in LOOP_SPIN_PROBE
        b.send(b"reply")
        for _ in range(8):  # replies come in time again: it polls again
            assert spin.spin(a.fileno())
        assert spin.score >= 0.5 and spin.wanted(FAST)


def test_runnable_threads_reads_this_machine() -> None:
    n = runnable_threads()
    assert n is None or n >= 1  # (this thread runs)
