"""One thread per process that notices when actor-call results are ready, and calls back.

Routers need to know when each request they sent is answered (to free its slot and hand
the value to the caller) without a thread or a blocking ``get`` per request. The public
API offers ``await ref`` and ``ref.future()``, but in this build both start a thread per
ref and, inside a worker, report the worker blocked to its node manager twice per wait:
about 2 ms and 800 requests/s per proxy. A watcher thread calling ``nbcluster.wait`` on
all outstanding refs (2 ms slices) was tried too: in a worker each wait with nothing
ready makes the same two RPCs, and in a driver it measured 2.2 ms p50 for a no-op handle
call against 0.9 ms for polling. So this module polls: one thread reads the states
of all of the process's outstanding refs with :func:`nbcluster.state.ref_info` (a table
lookup, about 1 µs each), sleeping 50 µs between rounds while answers keep coming (within
5 ms of the last one), then longer (up to 1 ms, and 5 ms after 50 ms of quiet), and runs
each ready ref's callbacks once. It sleeps on an event while nothing is outstanding, so
an idle process costs nothing; refs expected to stay pending for long (long polls, death
watches) are checked only 20 times a second. When the core gets a callback-based ``await``, only this
module changes.

Callbacks run on the watcher thread: they must be quick (set a future, schedule on a
loop) and must not block.
"""

from __future__ import annotations

import concurrent.futures
import os
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

import nbcluster
from nbcluster.state import ref_info

__all__ = ["Watcher", "watcher", "value_future"]

_MIN_DELAY = 50e-6
_BUSY_DELAY = 200e-6  # while answers came in during the last _BUSY_FOR seconds
_BUSY_FOR = 0.005
_MAX_DELAY = 1e-3
_IDLE_DELAY = 5e-3
_IDLE_AFTER = 0.05
SLOW_PERIOD_S = 0.05


class Watcher:
    """Calls ``callback(ref)`` on its thread once ``ref`` is ready (value or error).

    ``slow=True`` marks a ref that is expected to stay pending for long (a long poll, a
    death watch): those are checked every ``SLOW_PERIOD_S`` only, so a process whose only
    outstanding refs are slow wakes 20 times a second, not thousands.
    """

    def __init__(self, is_ready: Callable[[Any], bool] | None = None) -> None:
        self._is_ready = is_ready or _ref_ready
        self._lock = threading.Lock()
        self._pending: dict[Any, list[Callable[[Any], None]]] = {}
        self._slow: set[Any] = set()
        self._wake = threading.Event()
        self._thread = threading.Thread(target=self._run, name="nbcluster-serve-watch", daemon=True)
        self._thread.start()

    def watch(self, ref: Any, callback: Callable[[Any], None], *, slow: bool = False) -> None:
        """Run ``callback(ref)`` once ``ref`` is ready (thread-safe)."""
        with self._lock:
            callbacks = self._pending.get(ref)
            if callbacks is None:
                self._pending[ref] = [callback]
                if slow:
                    self._slow.add(ref)
            else:
                callbacks.append(callback)
                if not slow:
                    self._slow.discard(ref)
        self._wake.set()  # a slow ref too: the thread may be asleep with nothing to watch

    def pending(self) -> int:
        """Refs being watched."""
        return len(self._pending)

    def _run(self) -> None:
        delay = _MIN_DELAY
        quiet_since = time.monotonic()
        last_slow = 0.0
        while True:
            now = time.monotonic()
            with self._lock:
                check_slow = now - last_slow >= SLOW_PERIOD_S
                refs = [r for r in self._pending if check_slow or r not in self._slow]
                fast = len(self._pending) > len(self._slow)
                if not fast:
                    self._wake.clear()
            if check_slow:
                last_slow = now
            ready = [ref for ref in refs if self._is_ready(ref)]
            if ready:
                delay, quiet_since = _MIN_DELAY, time.monotonic()
                self._fire(ready)
                continue
            if not fast:  # only slow refs (or none): sleep until a fast one comes
                self._wake.wait(SLOW_PERIOD_S if self._pending else None)
                delay, quiet_since = _MIN_DELAY, time.monotonic()
                continue
            time.sleep(delay)
            quiet = time.monotonic() - quiet_since
            if quiet < _BUSY_FOR:
                delay = _MIN_DELAY
            elif quiet < _IDLE_AFTER:
                delay = min(max(delay, _BUSY_DELAY) * 1.5, _MAX_DELAY)
            else:
                delay = _IDLE_DELAY

    def _fire(self, ready: list[Any]) -> None:
        for ref in ready:
            with self._lock:
                callbacks = self._pending.pop(ref, [])
                self._slow.discard(ref)
            for cb in callbacks:
                try:
                    cb(ref)
                except Exception:  # noqa: BLE001 - a callback's bug must not stop the watcher
                    traceback.print_exc()


def _ref_ready(ref: Any) -> bool:
    info = ref_info(ref)
    return info is None or info.state != "pending"


_watcher: Watcher | None = None
_watcher_pid = 0
_watcher_lock = threading.Lock()


def watcher() -> Watcher:
    """This process's watcher (started on first use)."""
    global _watcher, _watcher_pid
    if _watcher is None or _watcher_pid != os.getpid():
        with _watcher_lock:
            if _watcher is None or _watcher_pid != os.getpid():
                _watcher = Watcher()
                _watcher_pid = os.getpid()
    return _watcher


def value_future(ref: Any, *, slow: bool = False) -> concurrent.futures.Future[Any]:
    """A future with ``ref``'s value (or its error), resolved by the watcher."""
    fut: concurrent.futures.Future[Any] = concurrent.futures.Future()

    def done(r: Any) -> None:
        try:
            value = nbcluster.get(r)
        except BaseException as e:  # noqa: BLE001 - delivered through the future
            fut.set_exception(e)
        else:
            fut.set_result(value)

    watcher().watch(ref, done, slow=slow)
    return fut
