"""One thread per process that notices when actor-call results are ready, and calls back.

Routers need to know when each request they sent is answered (to free its slot and hand
the value to the caller) without a thread or a blocking ``get`` per request. The public
API offers ``await ref`` and ``ref.future()``, but in this build both start a thread per
ref and, inside a worker, report the worker blocked to its node manager twice per wait:
about 2 ms and 800 requests/s per proxy. ``nbcluster.wait`` on all outstanding refs with
a short timeout was tried too: it answered after the timeout rather than on completion
(2.2 ms p50 for a no-op handle call). So this module polls: one thread reads the states
of all of the process's outstanding refs with :func:`nbcluster.state.ref_info` (a table
lookup, about 1 µs each), sleeping 50 µs between rounds while answers keep coming (within
5 ms of the last one), then longer (up to 1 ms, and 5 ms after 50 ms of quiet), and runs
each ready ref's callbacks once. It sleeps on an event while nothing is outstanding, so
an idle process costs nothing. When the core gets a callback-based ``await``, only this
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


class Watcher:
    """Calls ``callback(ref)`` on its thread once ``ref`` is ready (value or error)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending: dict[Any, list[Callable[[Any], None]]] = {}
        self._wake = threading.Event()
        self._thread = threading.Thread(target=self._run, name="nbcluster-serve-watch", daemon=True)
        self._thread.start()

    def watch(self, ref: Any, callback: Callable[[Any], None]) -> None:
        """Run ``callback(ref)`` once ``ref`` is ready (thread-safe)."""
        with self._lock:
            callbacks = self._pending.get(ref)
            if callbacks is None:
                self._pending[ref] = [callback]
            else:
                callbacks.append(callback)
        self._wake.set()

    def pending(self) -> int:
        """Refs being watched."""
        return len(self._pending)

    def _run(self) -> None:
        delay = _MIN_DELAY
        quiet_since = time.monotonic()
        while True:
            with self._lock:
                refs = list(self._pending)
                if not refs:
                    self._wake.clear()
            if not refs:
                self._wake.wait()
                delay, quiet_since = _MIN_DELAY, time.monotonic()
                continue
            ready = []
            for ref in refs:
                info = ref_info(ref)
                if info is None or info.state != "pending":
                    ready.append(ref)
            if not ready:
                time.sleep(delay)
                quiet = time.monotonic() - quiet_since
                if quiet < _BUSY_FOR:
                    delay = _MIN_DELAY
                elif quiet < _IDLE_AFTER:
                    delay = min(max(delay, _BUSY_DELAY) * 1.5, _MAX_DELAY)
                else:
                    delay = _IDLE_DELAY
                continue
            delay, quiet_since = _MIN_DELAY, time.monotonic()
            for ref in ready:
                with self._lock:
                    callbacks = self._pending.pop(ref, [])
                for cb in callbacks:
                    try:
                        cb(ref)
                    except Exception:  # noqa: BLE001 - a callback's bug must not stop the watcher
                        traceback.print_exc()


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


def value_future(ref: Any) -> concurrent.futures.Future[Any]:
    """A future with ``ref``'s value (or its error), resolved by the watcher."""
    fut: concurrent.futures.Future[Any] = concurrent.futures.Future()

    def done(r: Any) -> None:
        try:
            value = nbcluster.get(r)
        except BaseException as e:  # noqa: BLE001 - delivered through the future
            fut.set_exception(e)
        else:
            fut.set_result(value)

    watcher().watch(ref, done)
    return fut
