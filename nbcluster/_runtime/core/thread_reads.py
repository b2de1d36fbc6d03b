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
import select
import threading
import time
from collections.abc import Callable
from typing import Any

__all__ = ["THREAD_READ_SPIN_S", "HeldInterrupt", "read_until"]

#: How long a thread that waits for its reply first polls without sleeping: a reply that
#: comes within it costs no wake-up of the waiting thread (on a VM, waking a thread on
#: another CPU costs both sides tens of microseconds: benchmarks/RESULTS.md).
THREAD_READ_SPIN_S = 0.0003
#: How long a thread reading replies waits in one poll (Ctrl-C stays prompt).
POLL_MS = 100


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
