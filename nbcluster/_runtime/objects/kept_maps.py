"""Writable mappings a process keeps of the store files it wrote, for its next writes.

A large write into a pooled file costs, besides the copy, mapping the file in
(``MAP_POPULATE``: 25,600 page-table entries per 100 MiB, 2.5-6 ms) and unmapping it
afterwards (2-3 ms): about as much as the copy itself. Ray's writers skip both: the plasma
arena stays mapped in every process. Here a writer keeps the populated mapping (and its
read-write descriptor) of each file it wrote, and when the object in it is freed, writes
its next object of a fitting size into the same file through the same mapping.

**Safety.** A kept file may be written again only when no value anywhere can still see
its old contents:

* the object must have been freed: the node moved its file to the pool (``.free/``, ready
  or waiting for readers as ``.busy-``), so nobody can open it by its object name any
  more. The writer finds it there by inode, and claims it by renaming it to its own
  temporary name (atomic: the node, pruning the pool, or another writer, cannot have it
  too);
* then the write lock must be free (:func:`~nbcluster._runtime.objects.readers.readers_state`
  on the kept read-write descriptor): every value made from a store file holds the file's
  read lock while it lives (``objects.readers``), so a reader's view keeps the file from
  being reused, exactly as for the node's own recycling check (``store``). If the lock is
  held, the file is renamed back and waits.

A kept file whose name is gone (the node trimmed the pool, or the store was removed)
is dropped at the next write, and every kept mapping is dropped after ``LINGER_S``
without a large write (a timer), so an idle process holds no freed memory; a forked
child drops the copies it inherited. This module only decides and bookkeeps; ``store``
does the writing.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import threading
import time
from dataclasses import dataclass, field

from nbcluster._runtime.objects.linger import Linger
from nbcluster._runtime.objects.readers import LOCKS, readers_state

__all__ = [
    "KeptMap",
    "KeptMaps",
    "LINGER_S",
    "fits",
    "kept_maps",
]

#: How long a kept mapping outlives the last large write of its process.
LINGER_S = 1.0
#: Most files one process keeps mapped.
MAX_FILES = 3
_MiB = 1 << 20


def fits(mapped_len: int, file_size: int, size: int) -> bool:
    """Whether an object of ``size`` bytes may go into a kept file (pure).

    The file must hold it within the pages it has (``file_size``: written in full, so
    allocated) and the mapping must cover it; and the file must not be more than about
    twice as big (the write truncates it, and the pages cut off were kept for nothing).
    """
    return 0 < size <= min(mapped_len, file_size) and file_size <= 2 * size + _MiB


@dataclass(eq=False)
class KeptMap:
    """One kept file: its read-write descriptor, its populated mapping, its identity."""

    fd: int
    mapping: mmap.mmap
    length: int
    dev: int
    ino: int
    last_used: float = field(default_factory=time.monotonic)

    def close(self) -> None:
        """Unmap and close (a view still exported keeps the mapping until collected)."""
        with contextlib.suppress(BufferError):
            self.mapping.close()
        with contextlib.suppress(OSError):
            os.close(self.fd)


class KeptMaps:
    """The kept mappings of one process (thread-safe; see the module docstring)."""

    def __init__(self, max_files: int = MAX_FILES, linger_s: float = LINGER_S) -> None:
        self.max_files = max_files
        self.linger_s = linger_s
        self._maps: list[KeptMap] = []
        self._lock = threading.Lock()
        self._linger = Linger(linger_s, self._lock, self._expired)
        self.reused = 0  #: writes that went into a kept mapping

    def __len__(self) -> int:
        return len(self._maps)

    def fitting(self, size: int) -> bool:
        """Whether a kept file could take an object of ``size`` bytes once it is freed."""
        with self._lock:
            candidates = list(self._maps)
        for kept in candidates:
            with contextlib.suppress(OSError):
                if fits(kept.length, os.fstat(kept.fd).st_size, size):
                    return True
        return False

    def claim(self, pool_files: list[str], size: int, tmp: str) -> tuple[KeptMap | None, list[str]]:
        """``(kept, released)``: a kept file, freed and seen by nobody else, renamed to
        ``tmp`` and truncated to ``size`` bytes (``None`` if no kept file qualifies); and
        the paths of freed kept files that do not fit ``size``, dropped here so the store's
        pool can have them (the caller promotes them: ``store.promote_waiting``).

        ``pool_files``: the paths of the store's freed files (``.free/``: ready, and
        waiting for their readers as ``.busy-...``). The caller writes through
        ``kept.mapping`` and calls :meth:`keep`.
        """
        released: list[str] = []
        if not LOCKS:
            return None, released
        with self._lock:
            candidates = list(self._maps)
        if not candidates:
            return None, released
        by_inode: dict[tuple[int, int], str] = {}
        for path in pool_files:
            with contextlib.suppress(FileNotFoundError):
                st = os.stat(path)
                by_inode[(st.st_dev, st.st_ino)] = path
        for kept in candidates:
            try:
                st = os.fstat(kept.fd)
            except OSError:
                continue
            if st.st_nlink == 0:
                self._drop(kept)  # the file was deleted: its pages are ours alone
                continue
            path = by_inode.get((kept.dev, kept.ino))
            if path is None:
                continue  # its object is alive (or the file is someone else's now)
            if not fits(kept.length, st.st_size, size):
                self._drop(kept)  # freed, but not for this size: let the pool have it
                released.append(path)
                continue
            if self._take(kept, path, size, tmp):
                return kept, released
        return None, released

    def _take(self, kept: KeptMap, path: str, size: int, tmp: str) -> bool:
        with self._lock:
            if kept not in self._maps:
                return False  # another thread has it
            self._maps.remove(kept)
        try:
            os.rename(path, tmp)  # nobody else can find it now
        except FileNotFoundError:  # the node trimmed or promoted it meanwhile
            self._put_back(kept)
            return False
        if readers_state(kept.fd) != "free" or os.fstat(kept.fd).st_ino != kept.ino:
            with contextlib.suppress(OSError):
                os.rename(tmp, path)  # still read somewhere: let it wait
            self._put_back(kept)
            return False
        try:
            os.ftruncate(kept.fd, size)
        except OSError:
            os.rename(tmp, path)
            self._put_back(kept)
            return False
        kept.length = min(kept.length, size)
        return True

    def _put_back(self, kept: KeptMap) -> None:
        with self._lock:
            self._maps.append(kept)

    def keep(self, kept: KeptMap) -> list[KeptMap]:
        """Keep ``kept`` (just written and sealed) for this process's next writes; return
        the kept maps it displaced (the least recently used), for the caller to close."""
        kept.last_used = time.monotonic()
        dropped: list[KeptMap] = []
        with self._lock:
            self._maps.append(kept)
            while len(self._maps) > self.max_files:
                dropped.append(self._maps.pop(0))
            self._linger.arm()
        return dropped

    def _expired(self, now: float) -> tuple[list[KeptMap], bool]:
        """(Linger, lock held) the kept maps unused for ``linger_s``, dropped; and whether
        any are left."""
        old = [k for k in self._maps if now - k.last_used >= self.linger_s]
        self._maps = [k for k in self._maps if k not in old]
        return old, bool(self._maps)

    def _drop(self, kept: KeptMap) -> None:
        with self._lock:
            if kept not in self._maps:
                return
            self._maps.remove(kept)
        kept.close()

    def clear(self) -> None:
        """Drop every kept mapping (its files wait for the node to pool them)."""
        with self._lock:
            old, self._maps = self._maps, []
            self._linger.cancel()
        for kept in old:
            kept.close()

    def _forget_in_child(self) -> None:
        # A forked child must not hold its parent's files open (they would never pool).
        self._lock = threading.Lock()
        self._linger.after_fork(self._lock)
        old, self._maps = self._maps, []
        for kept in old:
            kept.close()


kept_maps = KeptMaps()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=kept_maps._forget_in_child)
