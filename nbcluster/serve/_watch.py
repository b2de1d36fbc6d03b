"""One thread per process that runs callbacks when actor-call results are ready.

Routers need to know when each request they sent is answered (to free its slot and hand
the value to the caller) without a thread or a blocking ``get`` per request. The core
tells us: :func:`nbcluster.state.when_ready` calls back on the runtime's I/O thread the
moment an answer arrives. That callback may run under the ownership table's lock, so it
only queues the ref and wakes this module's thread, which runs the ref's callbacks (they
may ``get`` the value). Nothing polls: a process with nothing outstanding, or only long
polls and death watches outstanding, sleeps until an answer comes. (This replaced a
polling thread that slept 50 µs between rounds and took a core of a 2-CPU machine under
load.)

Callbacks run on the watcher thread: they must be quick (set a future, schedule on a
loop) and must not block.
"""

from __future__ import annotations

import collections
import concurrent.futures
import os
import threading
import traceback
from collections.abc import Callable
from typing import Any

import nbcluster
from nbcluster.state import when_ready

__all__ = ["Watcher", "watcher", "value_future"]

Subscribe = Callable[[Any, Callable[[Any], None]], None]


class Watcher:
    """Calls ``callback(ref)`` on its thread once ``ref`` is ready (value or error).

    ``subscribe(ref, notify)`` must call ``notify(ref)`` once the ref is ready, from any
    thread (default: :func:`nbcluster.state.when_ready`; tests pass a fake).
    """

    def __init__(self, subscribe: Subscribe | None = None) -> None:
        self._subscribe = subscribe or when_ready
        self._lock = threading.Lock()
        self._pending: dict[Any, list[Callable[[Any], None]]] = {}
        self._ready: collections.deque[Any] = collections.deque()
        self._wake = threading.Event()
        self._thread = threading.Thread(target=self._run, name="nbcluster-serve-watch", daemon=True)
        self._thread.start()

    def watch(self, ref: Any, callback: Callable[[Any], None]) -> None:
        """Run ``callback(ref)`` once ``ref`` is ready (thread-safe)."""
        with self._lock:
            callbacks = self._pending.get(ref)
            if callbacks is not None:
                callbacks.append(callback)
                return
            self._pending[ref] = [callback]
        self._subscribe(ref, self._notify)

    def pending(self) -> int:
        """Refs being watched."""
        return len(self._pending)

    def _notify(self, ref: Any) -> None:
        """On whichever thread made ``ref`` ready: queue it, wake the watcher thread."""
        self._ready.append(ref)
        self._wake.set()

    def _run(self) -> None:
        while True:
            self._wake.wait()
            self._wake.clear()
            while self._ready:
                self._fire(self._ready.popleft())

    def _fire(self, ref: Any) -> None:
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
