"""Thread reads: a thread waiting in ``get`` reads its own reply off a task channel.

Shared by actor calls (``actor_submitter.py``) and tasks on leased workers
(``thread_tasks.py``). While the I/O loop's reading of a channel is paused
(``TaskChannel.pause_reads``), the one thread that waits for a reply sent on it polls the
socket and handles what it reads under the owner's lock, so the reply costs no wake-up of
the loop and no hand-over from the loop to the waiting thread. The loop takes the channel
back whenever anything else needs it; the owner of the channel decides when
(:func:`read_until`'s ``step`` returns False once the channel is no longer the callers').
"""

from __future__ import annotations

import _signal  # (signal's own functions, without its enum conversions: a hot path)
import os
import select
import threading
import time
from collections.abc import Callable
from typing import Any, Generic, Protocol, TypeVar

__all__ = [
    "THREAD_READ_IDLE_S",
    "THREAD_READ_SPIN_S",
    "THREAD_READ_WATCH_S",
    "CallerChannels",
    "HeldInterrupt",
    "LoopSpin",
    "read_until",
]

#: How long a thread that waits for its reply first polls without sleeping: a reply that
#: comes within it costs no wake-up of the waiting thread (on a VM, waking a thread on
#: another CPU costs both sides tens of microseconds: benchmarks/RESULTS.md).
THREAD_READ_SPIN_S = 0.0003
#: How long a thread reading replies waits in one poll (Ctrl-C stays prompt).
POLL_MS = 100
#: How long a call or task written on a channel the callers read may wait with no thread
#: reading it before the loop reads the channel again (and how often the loop looks), and
#: how long an idle channel stays the callers'.
THREAD_READ_WATCH_S = 0.02
THREAD_READ_IDLE_S = 0.5


#: How long the loop polls for the reply of a lone fast task it has just written.
LOOP_SPIN_S = 0.0003
#: The longest average run time of a function whose lone task the loop polls for: its
#: reply comes within :data:`LOOP_SPIN_S` (with the worker's wake-up and the reply's trip).
LOOP_SPIN_MAX_RUN_S = 0.00015
#: While polls mostly miss (the spin is off), one in this many is tried anyway.
LOOP_SPIN_PROBE = 32
#: How often the loop looks at how many threads the machine runs (while it would poll).
CROWD_CHECK_S = 0.01


def _cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def runnable_threads() -> int | None:
    """How many threads on this machine run or wait for a CPU now (Linux's
    ``/proc/loadavg``; None where it cannot be read)."""
    try:
        with open("/proc/loadavg", "rb") as f:
            return int(f.read().split()[3].split(b"/")[0])
    except (OSError, ValueError, IndexError):
        return None


class LoopSpin:
    """The loop's brief poll for the reply of a lone fast task it has just written (a
    chain of dependent tasks: each is sent by the loop when the last one's reply is
    handled). A reply that comes within :data:`LOOP_SPIN_S` costs the loop no sleep and
    wake-up; the task carries ``poll_after``, so its worker polls for the next one in
    turn. Polling pays only with a CPU to spare: not while the machine runs more threads
    than it has CPUs (a spinning thread then takes CPU time from the worker it waits for,
    and loses the scheduler's preference for threads that sleep). The loop looks every
    :data:`CROWD_CHECK_S` and keeps a moving average (this thread counts: on an idle
    machine it reads 1 or 2, with two busy programs on two CPUs 3 to 5); over half a
    CPU above their number, it does not poll. And, as spinning locks do, it backs off
    while polls mostly miss (a moving score under 1/2): then only one in
    :data:`LOOP_SPIN_PROBE` is tried."""

    __slots__ = ("score", "skipped", "hits", "misses", "cpus", "ready", "checked_at")

    def __init__(self) -> None:
        self.score = 1.0
        self.skipped = 0
        self.hits = 0
        self.misses = 0
        self.cpus = _cpus()
        self.ready = 1.0  # moving average of runnable_threads()
        self.checked_at = 0.0

    @property
    def crowded(self) -> bool:
        """True while the machine runs more threads than it has CPUs (on average)."""
        return self.ready > self.cpus + 0.5

    def wanted(self, avg_run_s: float | None) -> bool:
        """True when the loop should poll for the reply of a lone task of a function that
        runs ``avg_run_s`` on average (None: not known yet)."""
        if avg_run_s is None or avg_run_s >= LOOP_SPIN_MAX_RUN_S:
            return False
        now = time.monotonic()
        if now - self.checked_at >= CROWD_CHECK_S:
            self.checked_at = now
            ready = runnable_threads()
            if ready is not None:
                self.ready = 0.75 * self.ready + 0.25 * ready
        if self.crowded:
            return False
        if self.score >= 0.5:
            return True
        self.skipped += 1
        if self.skipped < LOOP_SPIN_PROBE:
            return False
        self.skipped = 0
        return True

    def spin(self, fileno: int) -> bool:
        """Poll ``fileno`` until it is readable (True) or :data:`LOOP_SPIN_S` passes."""
        poller = select.poll()
        poller.register(fileno, select.POLLIN)
        poll = poller.poll
        clock = time.perf_counter
        until = clock() + LOOP_SPIN_S
        while not poll(0):
            if clock() >= until:
                self.misses += 1
                self.score *= 0.875
                return False
        self.hits += 1
        self.score = self.score * 0.875 + 0.125
        return True


class ReadChannel(Protocol):
    """What :class:`CallerChannels` uses of a channel's owner-side record (a task
    ``Lease``, an ``ActorConn``)."""

    thread_reads: bool  # the callers read its replies (the loop's reading is paused)
    readers: int  # threads reading it now
    last_direct: float  # when a caller last wrote or read on it (monotonic)
    inflight: Any  # what was sent and not answered (truthy while anything is)
    call: Any  # the channel (None once closed)


C = TypeVar("C", bound=ReadChannel)


class CallerChannels(Generic[C]):
    """The channels whose replies callers' threads read, and the loop's watch that takes
    them back: a channel whose work waited :data:`THREAD_READ_WATCH_S` with no thread
    reading it, or that was idle for :data:`THREAD_READ_IDLE_S`. The watch runs every
    :data:`THREAD_READ_WATCH_S` while some channel is the callers', under ``lock``; it
    first runs ``chores(now)``. Every method but the watch runs on the loop with ``lock``
    held."""

    def __init__(
        self,
        loop: Any,
        lock: Any,
        closed: Callable[[], bool],
        chores: Callable[[float], None] | None = None,
    ) -> None:
        self.held: set[C] = set()
        self._loop = loop
        self._lock = lock
        self._closed = closed
        self._chores = chores
        self._handle: Any = None

    @property
    def watching(self) -> bool:
        """True while the watch is scheduled."""
        return self._handle is not None

    def hand_over(self, conn: C) -> None:
        """The loop stops reading ``conn``'s channel: the thread that waits for its next
        reply reads it."""
        conn.call.pause_reads()
        conn.thread_reads = True
        conn.last_direct = time.monotonic()
        self.held.add(conn)
        self.watch()

    def take_back(self, conn: C) -> None:
        """The loop reads ``conn``'s replies again."""
        if conn.thread_reads:
            conn.thread_reads = False
            self.held.discard(conn)
        call = conn.call
        if call is not None and getattr(call, "reads_paused", False):
            call.resume_reads()

    def forget(self, conn: C) -> None:
        """``conn``'s channel is closed or replaced (a new one starts with the loop)."""
        conn.thread_reads = False
        self.held.discard(conn)

    def watch(self) -> None:
        """Have the watch run (it goes on while it has something to look at)."""
        if self._handle is None:
            self._handle = self._loop.call_later(THREAD_READ_WATCH_S, self._watch)

    def _watch(self) -> None:
        self._handle = None
        now = time.monotonic()
        with self._lock:
            if self._chores is not None:
                self._chores(now)
            for conn in list(self.held):
                if not conn.thread_reads:
                    self.held.discard(conn)
                elif conn.readers:
                    continue
                elif now - conn.last_direct >= (
                    THREAD_READ_WATCH_S if conn.inflight else THREAD_READ_IDLE_S
                ):
                    self.take_back(conn)
            if self.held and not self._closed():
                self.watch()

    def stop(self) -> None:
        """This process stops: forget every channel, end the watch."""
        for conn in list(self.held):
            self.forget(conn)
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None


def read_until(
    fileno: int,
    flag: Any,
    deadline: float | None,
    lock: Any,
    step: Callable[[], bool],
    spin_s: float = THREAD_READ_SPIN_S,
) -> None:
    """Poll ``fileno`` and call ``step()`` (under ``lock``) each time it may hold data,
    until ``flag`` is set, the deadline passes or ``step`` returns False (the channel is
    the loop's again). On the main thread a Ctrl-C that lands inside ``step`` is held
    until it returns, so a reply is never half handled."""
    poller = select.poll()
    poller.register(fileno, select.POLLIN)
    poll = poller.poll
    held = HeldInterrupt() if threading.current_thread() is threading.main_thread() else None
    spin_until = time.perf_counter() + spin_s
    if deadline is not None and deadline - time.monotonic() < spin_s:
        spin_until = 0.0  # (wait(timeout=0) and the like: one look, no polling)
    while not flag.is_set():
        ms = POLL_MS
        if deadline is not None:
            ms = max(0, min(ms, int((deadline - time.monotonic()) * 1000)))
        if spin_until:  # a short call's reply comes before sleeping would pay off
            while not poll(0) and time.perf_counter() < spin_until:
                pass
            spin_until = 0.0
        poll(ms)
        with lock:
            if held is None:
                keep = step()
            else:
                with held:
                    keep = step()
        if not keep:
            return
        if ms == 0 and deadline is not None and time.monotonic() >= deadline:
            return


class HeldInterrupt:
    """Holds a Ctrl-C (SIGINT) that lands on the main thread inside the block, and raises
    it when the block is done: a reply read off a channel is handled whole."""

    __slots__ = ("_prev", "_got")

    def __init__(self) -> None:
        self._prev: Any = None
        self._got: tuple[int, Any] | None = None

    def _hold(self, signum: int, frame: Any) -> None:
        self._got = (signum, frame)

    def __enter__(self) -> None:
        prev = _signal.getsignal(_signal.SIGINT)
        self._prev = prev if callable(prev) else None
        self._got = None
        if self._prev is not None:
            _signal.signal(_signal.SIGINT, self._hold)

    def __exit__(self, *exc_info: Any) -> None:
        prev = self._prev
        if prev is None:
            return
        _signal.signal(_signal.SIGINT, prev)  # (a signal still pending is held first)
        got, self._got, self._prev = self._got, None, None
        if got is not None:
            prev(*got)
