"""A timer for what a process keeps only while it is used: the kept mappings of
``kept_maps`` (writers) and ``readers`` (readers).

Each keeps mappings of store files for its next use, and drops those unused for a while
so that an idle process holds no freed memory. The timer runs only while something is
kept (an idle process has no timer thread): armed when something is kept, it looks once,
drops what has been unused long enough, and arms itself again while anything is left.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

__all__ = ["Closable", "Linger"]


class Closable(Protocol):
    """What the timer drops: closed outside the owner's lock."""

    def close(self) -> None: ...


#: ``sweep(now)`` (owner's lock held): what to drop now, and whether to look again later.
Sweep = Callable[[float], tuple[list[Closable], bool]]


class Linger:
    """Calls ``sweep`` ``delay_s`` after :meth:`arm`, under the owner's ``lock``, and closes
    what it returns outside the lock; arms again while ``sweep`` says something is left."""

    def __init__(self, delay_s: float, lock: Any, sweep: Sweep) -> None:
        self.delay_s = delay_s
        self._lock = lock
        self._sweep = sweep
        self._timer: threading.Timer | None = None

    @property
    def armed(self) -> bool:
        """True while the timer waits to fire."""
        return self._timer is not None

    def arm(self) -> None:
        """Start the timer unless it waits already (the owner's lock held)."""
        if self._timer is not None:
            return
        timer = threading.Timer(self.delay_s, self._fire)
        timer.daemon = True
        self._timer = timer
        timer.start()

    def cancel(self) -> None:
        """Stop the timer (the owner's lock held)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def after_fork(self, lock: Any) -> None:
        """In a forked child: the parent's timer thread is not there; the owner's new lock."""
        self._lock = lock
        self._timer = None

    def _fire(self) -> None:
        now = time.monotonic()
        with self._lock:
            self._timer = None
            old, again = self._sweep(now)
            if again:
                self.arm()
        for item in old:
            item.close()
