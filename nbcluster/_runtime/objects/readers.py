"""Who still views a store file: read locks held by live values, and the reader's kept maps.

A large store file is reused once its object is freed (the node's pool, a writer's kept
mapping: ``store``, ``kept_maps``). It may be rewritten only when nobody can still see
its old contents. Here that is shown by **locks**: every reader of a large file holds an
open-file-description read lock (``F_OFD_SETLK``, ``F_RDLCK``) on it for as long as any
value made from it lives, and a file is rewritten only by whoever takes the write lock
(``F_WRLCK``, never waiting: :func:`readers_state`) after renaming the file away from its
object name.

Why locks, not mappings: a lock says "a value views this file"; a mapping only says "this
process has the file mapped". So a reader can keep the **mapping** of a file across the
objects written into it, lock-free between reads: when the file comes back holding a new
object, its pages are already in the reader's page tables. A 100 MiB argument then costs a
worker no ``mmap``, no populate (25,600 page-table entries, 2-13 ms when two workers map
the same file at once) and no ``munmap`` (2-3 ms): Ray's readers have this from the plasma
arena they keep mapped. The writer keeps its mappings the same way (``kept_maps``).

**The reader's order** (:meth:`ReaderMaps.read`): open the object's file by its name,
take the read lock (waiting out a writer that holds the write lock for microseconds), then
check that the name still leads to the same file. **The rewriter's order**: rename the
file away from its name (nobody can open it by the name any more), then try the write
lock. Either the reader's lock came first, and the rewriter fails (the file waits), or the
rename did, and the reader's check fails (the object is gone: it reads as absent).

A value keeps its lock through its buffer's exporter: the view handed out is exported by
a numpy array made for this read, and every slice and array deserialized from it refers
back to that exporter; when the last one is collected, the read is over, and when a
file's last read is over its lock is released. Files under ``RECYCLE_MIN_SIZE`` are never
reused (the node deletes them) and are read as before: mapped, the descriptor closed.

Every process that maps store files goes through here, or through ``open_locked`` for a
transient read by descriptor (the node's pulls and spills). A process that mapped a store
file behind the store's back would not be seen: the store directory is private (0700).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import mmap
import os
import struct
import sys
import threading
import time
import weakref
from dataclasses import dataclass, field

import numpy as np

from nbcluster._runtime.objects.linger import Linger

__all__ = [
    "LOCKS",
    "READER_LINGER_S",
    "RECYCLE_MIN_SIZE",
    "ReaderMaps",
    "open_locked",
    "reader_maps",
    "readers_state",
]

#: Smallest object file worth keeping for reuse (smaller ones are deleted when freed).
RECYCLE_MIN_SIZE = 1 << 20
#: How long a reader keeps the mapping of a file no value views any more.
READER_LINGER_S = 1.0
#: Most files one process keeps mapped for reading, and their most bytes.
MAX_FILES = 8
MAX_BYTES = 4 << 30
#: Largest mapping whose pages a reader maps in with one call (see ``_populate``).
POPULATE_MAX = 1 << 30
#: Whether open-file-description locks are available (Linux 3.15+).
LOCKS = sys.platform == "linux" and hasattr(fcntl, "F_OFD_SETLK")

_FLOCK = "hhqqi4x"  # struct flock: l_type, l_whence, l_start, l_len, l_pid (0 for OFD locks)
_MMAP_KW = {"trackfd": False} if sys.version_info >= (3, 13) else {}
_MADV_POPULATE_READ = getattr(mmap, "MADV_POPULATE_READ", 22)  # Linux 5.14


def _lock(fd: int, kind: int, wait: bool) -> bool:
    """Take (or with ``F_UNLCK`` release) a whole-file OFD lock on ``fd``; ``False`` if
    another open file description holds a conflicting one (only when not ``wait``)."""
    cmd = fcntl.F_OFD_SETLKW if wait else fcntl.F_OFD_SETLK
    arg = struct.pack(_FLOCK, kind, os.SEEK_SET, 0, 0, 0)
    while True:
        try:
            fcntl.fcntl(fd, cmd, arg)
            return True
        except InterruptedError:
            continue
        except OSError as err:
            if err.errno in (errno.EAGAIN, errno.EACCES):
                return False
            raise


def readers_state(fd: int) -> str:
    """``"free"`` if no value anywhere still views ``fd``'s file, ``"busy"`` if one does,
    ``"unknown"`` where locks are unavailable. ``fd`` must be open for writing.

    Call it only after renaming the file away from its object name (see the module
    docstring): then nobody can start viewing it after the answer.
    """
    if not LOCKS:
        return "unknown"
    try:
        if not _lock(fd, fcntl.F_WRLCK, wait=False):
            return "busy"
        _lock(fd, fcntl.F_UNLCK, wait=False)
    except OSError:
        return "unknown"
    return "free"


def _same_file(path: str, st: os.stat_result) -> bool:
    try:
        now = os.stat(path)
    except FileNotFoundError:
        return False
    return (now.st_dev, now.st_ino) == (st.st_dev, st.st_ino)


def open_locked(path: str) -> int | None:
    """Open ``path`` read-only with its read lock held; ``None`` if it is gone.

    For a transient read by descriptor (a pull, a spill): closing the descriptor releases
    the lock. The file cannot be rewritten while it is open.
    """
    for _ in range(3):
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return None
        st = os.fstat(fd)
        if not LOCKS or st.st_size < RECYCLE_MIN_SIZE:
            return fd  # never reused: nothing to hold
        try:
            _lock(fd, fcntl.F_RDLCK, wait=True)
        except BaseException:
            os.close(fd)
            raise
        if _same_file(path, st):
            return fd
        os.close(fd)  # freed (or spilled and restored) between the open and the lock
    return None


def _populate(mapping: mmap.mmap, length: int) -> None:
    """Map in every page of a fresh read-only mapping in one call (no-op before 5.14).

    A task that reads its large argument would otherwise fault its pages in 16 at a time;
    ``MADV_POPULATE_READ`` does the same work in the kernel in about half the time.
    """
    if 0 < length <= POPULATE_MAX:
        with contextlib.suppress(OSError, ValueError):
            mapping.madvise(_MADV_POPULATE_READ, 0, length)


@dataclass(eq=False)
class _File:
    """One file a reader keeps mapped: its descriptor (holding the lock) and mapping."""

    fd: int
    dev: int
    ino: int
    mapping: mmap.mmap | None = None
    length: int = 0  #: bytes mapped
    populated: int = 0  #: bytes whose pages were mapped in
    views: int = 0  #: live reads (values made from this file)
    last_used: float = field(default_factory=time.monotonic)

    def close(self) -> None:
        self.mapping = None  # unmapped when no exporter still refers to it
        if self.fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self.fd)
            self.fd = -1


class ReaderMaps:
    """The read-only mappings one process keeps of large store files (thread-safe).

    See the module docstring. A file is kept mapped while a value views it, and for
    ``linger_s`` after (a timer; an idle process keeps none), at most ``max_files`` and
    ``max_bytes`` of files no value views (least recently used out first).
    """

    def __init__(
        self,
        max_files: int = MAX_FILES,
        max_bytes: int = MAX_BYTES,
        linger_s: float = READER_LINGER_S,
    ) -> None:
        self.max_files = max_files
        self.max_bytes = max_bytes
        self.linger_s = linger_s
        self._files: dict[tuple[int, int], _File] = {}
        # Reentrant: a read's finalizer (``_release``) may run from a garbage collection
        # that an allocation inside the lock sets off.
        self._lock = threading.RLock()
        self._linger = Linger(linger_s, self._lock, self._expired)
        self.reused = 0  #: reads through a mapping kept from an earlier read
        self.mapped = 0  #: reads that had to map their file

    def __len__(self) -> int:
        return len(self._files)

    def read(self, path: str) -> memoryview | None:
        """A read-only view of the whole file at ``path``; ``None`` if it is gone.

        The view (and everything sliced or deserialized from it) holds the file's read
        lock while it lives.
        """
        for _ in range(3):
            try:
                fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            except FileNotFoundError:
                return None
            try:
                st = os.fstat(fd)
                if not LOCKS or st.st_size < RECYCLE_MIN_SIZE:
                    return _map_once(fd, st.st_size)
                view = self._read_kept(fd, path, st)
            finally:
                os.close(fd)
            if view is not None:
                return view
        return None

    def _read_kept(self, fd: int, path: str, st: os.stat_result) -> memoryview | None:
        key = (st.st_dev, st.st_ino)
        with self._lock:
            kept = self._files.get(key)
            if kept is None:
                kept = _File(os.dup(fd), st.st_dev, st.st_ino)
                self._files[key] = kept
            kept.views += 1
            try:
                if kept.views == 1:  # (a writer holds the write lock for microseconds)
                    _lock(kept.fd, fcntl.F_RDLCK, wait=True)
            except BaseException:
                kept.views -= 1
                raise
        dropped: list[_File] = []
        try:
            if not _same_file(path, st):
                self._release(kept)  # freed between the open and the lock: look again
                return None
            size = os.fstat(kept.fd).st_size  # stable while locked
            with self._lock:
                mapping = kept.mapping
                if mapping is None or kept.length < size:
                    if size == 0:
                        raise ValueError(f"empty object file {path}")
                    mapping = mmap.mmap(kept.fd, size, prot=mmap.PROT_READ, **_MMAP_KW)
                    kept.mapping, kept.length, kept.populated = mapping, size, 0
                    self.mapped += 1
                    dropped = self._sweep()
                else:
                    self.reused += 1
                grown = kept.populated < size
                kept.populated = max(kept.populated, size)
            if grown:
                _populate(mapping, size)
            exporter = np.frombuffer(mapping, dtype=np.uint8, count=size)
            done = weakref.finalize(exporter, self._release, kept)
            done.atexit = False  # (at exit the process's locks go with it)
        except BaseException:
            self._release(kept)
            raise
        finally:
            for old in dropped:
                old.close()
        return memoryview(exporter)

    def _release(self, kept: _File) -> None:
        with self._lock:
            kept.views -= 1
            if kept.views:
                return
            kept.last_used = time.monotonic()
            if self._files.get((kept.dev, kept.ino)) is not kept:
                kept.close()  # forgotten (a fork) or replaced meanwhile
                return
            with contextlib.suppress(OSError):
                _lock(kept.fd, fcntl.F_UNLCK, wait=False)
            dropped = self._trim()
            if self._files:
                self._linger.arm()
        for old in dropped:
            old.close()

    def _sweep(self) -> list[_File]:
        """Drop the unviewed files that were deleted (lock held; on a miss, which maps
        and populates a file anyway): their memory is freed only when unmapped."""
        dropped = []
        for key, f in list(self._files.items()):
            if f.views:
                continue
            try:
                gone = os.fstat(f.fd).st_nlink == 0
            except OSError:
                gone = True
            if gone and self._files.pop(key, None) is f:
                dropped.append(f)
        return dropped

    def _trim(self) -> list[_File]:
        """Drop the least recently used unviewed files beyond the limits (lock held)."""
        files = list(self._files.values())
        idle = sorted((f for f in files if not f.views), key=lambda f: f.last_used)
        total = sum(f.length for f in idle)
        dropped = []
        while idle and (len(idle) > self.max_files or total > self.max_bytes):
            old = idle.pop(0)
            total -= old.length
            if self._files.pop((old.dev, old.ino), None) is old:
                dropped.append(old)
        return dropped

    def _expired(self, now: float) -> tuple[list[_File], bool]:
        """(Linger, lock held) the unviewed files unused for ``linger_s``, dropped; and
        whether unviewed files are left to look at later."""
        files = list(self._files.values())
        old = [f for f in files if not f.views and now - f.last_used >= self.linger_s]
        for f in old:
            self._files.pop((f.dev, f.ino), None)
        return old, any(not f.views for f in files if f not in old)

    def clear(self) -> None:
        """Drop every kept mapping no value views (for tests and shutdown)."""
        with self._lock:
            old = [f for f in list(self._files.values()) if not f.views]
            for f in old:
                self._files.pop((f.dev, f.ino), None)
        for f in old:
            f.close()

    def _forget_in_child(self) -> None:
        """After ``fork``: the child keeps only the files its inherited values view, each
        under a read lock of its own.

        The child shares the parent's open file descriptions, and so its locks: when the
        parent's values are gone, the parent's unlock would leave the child's copies (a
        data loader's forked workers reading an argument, say) unprotected. So the child
        opens each such file anew (through ``/proc/self/fd``, which works after a rename
        or an unlink) and locks that; the rest it closes.
        """
        self._lock = threading.RLock()
        self._linger.after_fork(self._lock)
        files, self._files = self._files, {}
        for key, f in files.items():
            inherited, f.fd = f.fd, -1
            if f.views:
                with contextlib.suppress(OSError):
                    fd = os.open(f"/proc/self/fd/{inherited}", os.O_RDONLY | os.O_CLOEXEC)
                    if _lock(fd, fcntl.F_RDLCK, wait=False):
                        f.fd = fd
                        self._files[key] = f
                    else:
                        os.close(fd)
            with contextlib.suppress(OSError):
                os.close(inherited)  # (the parent's descriptor keeps its own lock)
            if f.fd < 0:
                f.mapping = None


def _map_once(fd: int, size: int) -> memoryview:
    mapping = mmap.mmap(fd, 0, prot=mmap.PROT_READ, **_MMAP_KW)
    return memoryview(mapping)


reader_maps = ReaderMaps()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=reader_maps._forget_in_child)
