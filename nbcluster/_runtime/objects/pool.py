"""How many pre-allocated files the node keeps for the next large writes: no I/O.

Writing a large object into a fresh tmpfs file runs at about 45% of memcpy, because the
kernel allocates and zeroes a page for every 4 KiB; writing into a file whose pages are
already allocated (a *pool* file, see ``store`` "Recycling") runs at memcpy speed or
better. Freed objects refill the pool by themselves, but a program that keeps what it
puts drains it. So the node manager allocates pool files ahead of demand, in the
background, after each large write (``posix_fallocate`` in a thread: the cost moves off
the writer's path).

:class:`WarmPool` decides what to allocate: enough files of the size recent large
objects had (rounded up to a MiB, so an object of that size fits one exactly and its
write needs no new pages) that the next ``depth`` such writes find one, within the pool's
byte limit and without taking room the store's own accounting has promised to objects.

**When.** Only once large writes have paused for ``quiet_s`` (:meth:`WarmPool.wait_s`).
Allocating a pool file writes every one of its pages (50-70 ms per 100 MiB here), and a
writer copying at the same moment competes for the same memory bandwidth: on 2 cores, a
loop of 100 MB puts that freed its objects (each written into the writer's own kept
mapping, ``objects.kept_maps``, so never needing the pool) copied at 10-14 ms a put
while the refill ran, against 6-9 ms after it. The pool is there to move page zeroing
off a write's path, so it is filled when nothing is being written.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable

__all__ = ["WarmPool", "usable"]

MiB = 1 << 20


class WarmPool:
    """Plans pool files from the sizes of recent large writes (events in, sizes out)."""

    def __init__(
        self,
        limit: int,
        *,
        min_size: int = MiB,
        initial_size: int = 128 * MiB,
        initial_bytes: int = 256 * MiB,
        depth: int = 2,
        history: int = 4,
        quiet_s: float = 0.25,
    ) -> None:
        self.limit = max(0, limit)
        self.min_size = min_size
        self.initial_size = initial_size
        self.initial_bytes = initial_bytes
        self.depth = depth
        self.recent: deque[int] = deque(maxlen=history)
        self.quiet_s = quiet_s
        self._last_write: float | None = None

    def writing(self, size: int, now: float) -> None:
        """An object of ``size`` bytes is being written (its room was just reserved)."""
        if size >= self.min_size:
            self._last_write = now

    def wrote(self, size: int, now: float | None = None) -> None:
        """An object of ``size`` bytes was written into this node's store (at ``now``)."""
        if size >= self.min_size:
            self.recent.append(size)
            if now is not None:
                self._last_write = now

    def wait_s(self, now: float) -> float:
        """How long to wait before allocating: until large writes have paused ``quiet_s``."""
        if self._last_write is None:
            return 0.0
        return max(0.0, self._last_write + self.quiet_s - now)

    def initial(self) -> list[int]:
        """Files to allocate when the node starts (before any write was seen)."""
        n = min(self.initial_bytes, self.limit) // self.initial_size
        return [self.initial_size] * n

    def plan(self, pool: Iterable[int], spare: int) -> tuple[list[int], list[int]]:
        """``(allocate, drop)``: sizes of the files to allocate now, and of those to delete.

        ``pool`` lists the sizes of the files in the pool; ``spare`` is how many bytes the
        store's filesystem has free; ``limit`` (set by the node: the store capacity its
        objects leave free) bounds the pool's bytes. Files too big for any recent write to
        use (see :func:`usable`) are dropped: they only hold memory.
        """
        if not self.recent:
            return [], []
        want = max(self.recent)
        size = _round_up(want)
        sizes = list(pool)
        drop = [s for s in sizes if not usable(s, want)]
        keep = [s for s in sizes if usable(s, want)]
        have = sum(1 for s in keep if s >= want)
        total = sum(keep)
        out: list[int] = []
        while have < self.depth and total + size <= self.limit and spare >= size:
            out.append(size)
            have += 1
            total += size
            spare -= size
        return out, drop


def usable(file_size: int, object_size: int) -> bool:
    """Whether a pool file of ``file_size`` bytes is worth keeping for objects of
    ``object_size``: not more than about twice as big (a write truncates the file to the
    object's size, and the pages it cuts off were allocated for nothing). A smaller file
    is kept: the part of a write that it covers is fast."""
    return file_size <= 2 * object_size + MiB


def _round_up(size: int) -> int:
    return -(-size // MiB) * MiB
