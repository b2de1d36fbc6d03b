"""Moving a value's bytes into a store file: ``pwritev``, or copies through a mapping.

``store`` decides which file an object goes into and how (see its "Recycling" and "Kept
mappings"); this module moves the bytes:

* into a new file with ``pwritev`` straight from the value's buffers (one copy, and the
  kernel allocates each page as it writes it);
* into a file whose pages are allocated already (a pooled or kept file) through a
  populated shared mapping, large pieces copied by numpy with the GIL released, by two
  threads when the piece is big enough and the machine has two cores (``copy_threads``).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import errno
import functools
import mmap
import os
from collections.abc import Callable
from typing import Any

import numpy as np

__all__ = [
    "IOV_MAX",
    "close_quiet",
    "copy_chunks",
    "copy_threads",
    "pwritev_all",
    "pwritev_at",
    "run_aside",
    "write_mapped",
]

#: Most buffers one ``pwritev`` takes.
IOV_MAX = min(os.sysconf("SC_IOV_MAX"), 1024) if os.sysconf("SC_IOV_MAX") > 0 else 16
#: Threads that copy one large piece of a put (1 turns the parallel copy off).
copy_threads = 2

_MAP_POPULATE = getattr(mmap, "MAP_POPULATE", 0)
_NUMPY_COPY_MIN = 256 << 10
_PARALLEL_COPY_MIN = 16 << 20
_copy_executor: concurrent.futures.ThreadPoolExecutor | None = None


def write_mapped(fd: int, size: int, chunks: list[bytes | memoryview]) -> mmap.mmap:
    """Copy ``chunks`` into ``fd``'s first ``size`` bytes through a pre-faulted mapping;
    return the mapping (the caller keeps it for its next write, or closes it).

    Only for files whose pages are all allocated (a recycled file): ``MAP_POPULATE`` maps
    them in one call, so the copy runs without page faults (a full disk cannot turn a
    write into a ``SIGBUS``).
    """
    mapping = mmap.mmap(
        fd, size, flags=mmap.MAP_SHARED | _MAP_POPULATE, prot=mmap.PROT_READ | mmap.PROT_WRITE
    )
    try:
        copy_chunks(mapping, size, chunks)
    except BaseException:
        close_quiet(mapping)
        raise
    return mapping


def copy_chunks(mapping: mmap.mmap, size: int, chunks: list[bytes | memoryview]) -> None:
    """Copy ``chunks`` back to back into the first ``size`` bytes of ``mapping``."""
    dest = np.frombuffer(mapping, dtype=np.uint8, count=size)
    pos = 0
    for chunk in chunks:
        n = len(chunk) if isinstance(chunk, bytes) else chunk.nbytes
        if n >= _NUMPY_COPY_MIN:
            _parallel_copy(dest[pos : pos + n], np.frombuffer(chunk, dtype=np.uint8))
        elif n:
            dest[pos : pos + n] = np.frombuffer(chunk, dtype=np.uint8)
        pos += n
    del dest


def close_quiet(mapping: mmap.mmap) -> None:
    """Unmap ``mapping``; if a view of it is still exported, it is unmapped when collected."""
    with contextlib.suppress(BufferError):
        mapping.close()


def run_aside(fn: Callable[[], Any]) -> None:
    """Run ``fn`` in the copy thread when copies use two threads (an unmap of 100 MiB costs
    2-3 ms the writer need not wait for), else now."""
    if copy_threads < 2 or _cpus() < 2:
        fn()
    else:
        _copy_pool().submit(fn)


def _parallel_copy(dest: np.ndarray, src: np.ndarray) -> None:
    """``np.copyto(dest, src)``; halves in two threads for large copies on 2+ free cores."""
    n = src.nbytes
    if n < _PARALLEL_COPY_MIN or copy_threads < 2 or _cpus() < 2:
        np.copyto(dest, src)
        return
    half = (n // 2) & ~4095
    other = _copy_pool().submit(np.copyto, dest[half:], src[half:])
    np.copyto(dest[:half], src[:half])
    other.result()


@functools.cache
def _cpus() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1


def _copy_pool() -> concurrent.futures.ThreadPoolExecutor:
    global _copy_executor
    if _copy_executor is None:
        _copy_executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="nbc-copy")
    return _copy_executor


def pwritev_all(fd: int, chunks: list[bytes | memoryview]) -> None:
    """Write ``chunks`` back to back from offset 0, handling short writes and IOV_MAX."""
    pwritev_at(fd, [memoryview(c) for c in chunks], 0)


def pwritev_at(fd: int, views: list[memoryview], offset: int) -> None:
    """Write ``views`` back to back from ``offset`` (``views`` is consumed)."""
    count = len(views)
    i = 0
    while i < count:
        written = os.pwritev(fd, views[i : i + IOV_MAX], offset)
        if written <= 0:
            raise OSError(errno.EIO, "pwritev made no progress")
        offset += written
        while written and i < count:
            n = views[i].nbytes
            if written >= n:
                written -= n
                i += 1
            else:
                views[i] = views[i][written:]
                written = 0
        while i < count and views[i].nbytes == 0:
            i += 1
