"""Mappings a reader keeps: a worker's large task arguments, mapped in at once.

``store.read_object`` maps an object read-only; a worker keeps the mappings of its large
task arguments while more tasks are queued (:class:`MappedObjects`), so tasks sharing
an argument (``put`` once, many tasks) map it, and fault its pages in, once per worker,
and maps a new one's pages in with one call (:func:`populate`).
"""

from __future__ import annotations

import collections
import contextlib
import mmap
import threading
import time

__all__ = ["MAPPED_LINGER_S", "MappedObjects", "POPULATE_MAX", "populate"]

#: How long a worker keeps mapped arguments after its queue runs empty (see MappedObjects).
MAPPED_LINGER_S = 0.02
#: Largest mapped argument whose pages a worker maps in at once (see ``populate``).
POPULATE_MAX = 1 << 30
_MADV_POPULATE_READ = getattr(mmap, "MADV_POPULATE_READ", 22)  # Linux 5.14


def populate(view: memoryview) -> None:
    """Map in every page of a read-only mapping from :func:`read_object`, in one call.

    A task that reads its large argument would otherwise fault its pages in one by one
    (16 pages per read fault on tmpfs): ``MADV_POPULATE_READ`` does the same work in the
    kernel in about half the time (100 MiB: 2 ms against 3-5 ms). Objects larger than
    ``POPULATE_MAX`` are left to fault (a task may read only part of one). No-op on
    kernels before 5.14 and for views that are not a whole mapping.
    """
    mapping = view.obj
    if not isinstance(mapping, mmap.mmap) or not 0 < view.nbytes <= POPULATE_MAX:
        return
    with contextlib.suppress(OSError, ValueError):
        mapping.madvise(_MADV_POPULATE_READ)


class MappedObjects:
    """Mappings of stored objects a worker keeps between the tasks queued on it.

    Every task that takes a large stored argument would otherwise map it anew and fault
    in each of its pages again (about 3 ms per 100 MiB); queued tasks often share an
    argument (``put`` once, many tasks). Objects are immutable and a mapping stays valid
    after the object is freed, so a kept mapping is always right; what it costs is
    memory: a freed object's pages live (and its file cannot be reused, by the pool or by
    its writer's kept mapping) until its mappings are gone. So a mapping no task has used
    for ``linger_s`` is dropped at the next lookup, the worker calls :meth:`clear` when
    its queue has been empty for ``MAPPED_LINGER_S`` (one timed wait, not a poll), and at
    most ``max_bytes`` stay mapped (least recently used first out).
    """

    def __init__(
        self, max_bytes: int = 2 << 30, max_count: int = 16, linger_s: float = MAPPED_LINGER_S
    ) -> None:
        self.max_bytes = max_bytes
        self.max_count = max_count
        self.linger_s = linger_s
        # object id -> (view, when a task last used it), least recently used first
        self._views: collections.OrderedDict[bytes, tuple[memoryview, float]] = (
            collections.OrderedDict()
        )
        self._bytes = 0
        self._lock = threading.Lock()
        self.hits = 0  #: lookups that found a kept mapping

    def get(self, object_id: bytes, now: float | None = None) -> memoryview | None:
        """The kept mapping of ``object_id``, if any (``now``: ``time.monotonic()``)."""
        now = time.monotonic() if now is None else now
        with self._lock:
            dropped = self._expire(now)
            item = self._views.pop(object_id, None)
            if item is not None:
                self._views[object_id] = (item[0], now)
                self.hits += 1
        del dropped  # (unmapped here, outside the lock, if no value uses them)
        return None if item is None else item[0]

    def keep(self, object_id: bytes, view: memoryview, now: float | None = None) -> None:
        """Keep ``view`` (a mapping from :func:`read_object`) for the next tasks."""
        if view.nbytes > self.max_bytes:
            return
        now = time.monotonic() if now is None else now
        with self._lock:
            old = self._views.pop(object_id, None)
            if old is not None:
                self._bytes -= old[0].nbytes
            self._views[object_id] = (view, now)
            self._bytes += view.nbytes
            dropped = self._expire(now)
            while self._bytes > self.max_bytes or len(self._views) > self.max_count:
                _, (gone, _) = self._views.popitem(last=False)
                self._bytes -= gone.nbytes
                dropped.append(gone)
        del dropped

    def _expire(self, now: float) -> list[memoryview]:
        dropped = []
        while self._views:
            oid, (view, used) = next(iter(self._views.items()))
            if now - used < self.linger_s:
                break
            del self._views[oid]
            self._bytes -= view.nbytes
            dropped.append(view)
        return dropped

    def clear(self) -> None:
        """Forget every kept mapping (those no value still uses are unmapped)."""
        with self._lock:
            self._views.clear()
            self._bytes = 0

    def __len__(self) -> int:
        return len(self._views)
