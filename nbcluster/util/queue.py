"""``Queue``: a first-in, first-out queue shared by tasks and actors (Ray's ``ray.util.queue``).

The items live in one async actor; a :class:`Queue` object is a light wrapper around its
handle, so it can be passed to tasks and actors, which then put and get on the same queue::

    from nbcluster.util.queue import Queue, Empty

    q = Queue(maxsize=100)

    @nbcluster.remote
    def producer(q, n):
        for i in range(n):
            q.put(i)

    producer.remote(q, 10)
    items = [q.get(timeout=10) for _ in range(10)]

``put``/``get`` block by default (``block=False`` or a ``timeout`` raise :class:`Full` /
:class:`Empty`, which are the standard library's ``queue.Full`` / ``queue.Empty``);
``put_async``/``get_async`` are the same calls for asyncio code; the ``*_nowait_batch``
variants move many items in one call.
"""

from __future__ import annotations

import asyncio
import queue as _stdqueue
from collections.abc import Iterable
from typing import Any

import nbcluster as core

__all__ = ["Empty", "Full", "Queue"]


class Empty(_stdqueue.Empty):
    """Raised by ``get`` when the queue stays empty (``block=False`` or the timeout expired)."""


class Full(_stdqueue.Full):
    """Raised by ``put`` when the queue stays full (``block=False`` or the timeout expired)."""


def _check_timeout(timeout: float | None) -> None:
    if timeout is None:
        return
    if isinstance(timeout, bool) or not isinstance(timeout, int | float):
        raise TypeError(f"timeout must be a number of seconds or None, got {timeout!r}")
    if timeout < 0:
        raise ValueError("'timeout' must be a non-negative number")


class Queue:
    """A FIFO queue on the cluster, usable from the driver, tasks and actors.

    Args:
        maxsize: the most items the queue holds; 0 (the default) means unbounded.
        actor_options: options for the queue's actor, passed to ``.options(...)``
            (for example ``{"num_cpus": 1}`` or ``{"name": "jobs"}``).

    There is no ordering guarantee between several producers blocked on a full queue, or
    several consumers blocked on an empty one. ``shutdown()`` ends the queue's actor.
    """

    def __init__(self, maxsize: int = 0, actor_options: dict[str, Any] | None = None) -> None:
        if isinstance(maxsize, bool) or not isinstance(maxsize, int):
            raise TypeError(f"maxsize must be an int (0 means unbounded), got {maxsize!r}")
        if actor_options is not None and not isinstance(actor_options, dict):
            raise TypeError(
                "actor_options must be a dict of actor options, such as {'num_cpus': 1}; "
                f"got {type(actor_options).__name__}"
            )
        self.maxsize = maxsize
        actor_class = core.remote(_QueueActor)
        self.actor: core.ActorHandle | None = actor_class.options(**(actor_options or {})).remote(
            maxsize
        )

    def _handle(self) -> core.ActorHandle:
        if self.actor is None:
            raise RuntimeError("this Queue was shut down; create a new Queue to keep going")
        return self.actor

    def __len__(self) -> int:
        return self.size()

    def __repr__(self) -> str:
        state = "shut down" if self.actor is None else f"actor={self.actor.actor_id[:8]}"
        return f"Queue(maxsize={self.maxsize}, {state})"

    def size(self) -> int:
        """The number of items in the queue."""
        return int(core.get(self._handle().qsize.remote()))

    def qsize(self) -> int:
        """The number of items in the queue (same as :meth:`size`)."""
        return self.size()

    def empty(self) -> bool:
        """Whether the queue holds no item."""
        return bool(core.get(self._handle().empty.remote()))

    def full(self) -> bool:
        """Whether the queue holds ``maxsize`` items (never, when unbounded)."""
        return bool(core.get(self._handle().full.remote()))

    def put(self, item: Any, block: bool = True, timeout: float | None = None) -> None:
        """Add ``item``; when the queue is full, wait up to ``timeout`` seconds for room.

        Raises :class:`Full` when the queue is full and ``block`` is False, or when the
        timeout expires; ``ValueError`` for a negative timeout.
        """
        if not block:
            if not core.get(self._handle().put_nowait.remote(item)):
                raise Full
            return
        _check_timeout(timeout)
        if not core.get(self._handle().put.remote(item, timeout)):
            raise Full

    async def put_async(self, item: Any, block: bool = True, timeout: float | None = None) -> None:
        """:meth:`put` for asyncio code: awaits instead of blocking the thread."""
        if not block:
            if not await self._handle().put_nowait.remote(item):
                raise Full
            return
        _check_timeout(timeout)
        if not await self._handle().put.remote(item, timeout):
            raise Full

    def get(self, block: bool = True, timeout: float | None = None) -> Any:
        """Remove and return the next item; when the queue is empty, wait up to ``timeout``.

        Raises :class:`Empty` when the queue is empty and ``block`` is False, or when the
        timeout expires; ``ValueError`` for a negative timeout.
        """
        if not block:
            ok, item = core.get(self._handle().get_nowait.remote())
        else:
            _check_timeout(timeout)
            ok, item = core.get(self._handle().get.remote(timeout))
        if not ok:
            raise Empty
        return item

    async def get_async(self, block: bool = True, timeout: float | None = None) -> Any:
        """:meth:`get` for asyncio code: awaits instead of blocking the thread."""
        if not block:
            ok, item = await self._handle().get_nowait.remote()
        else:
            _check_timeout(timeout)
            ok, item = await self._handle().get.remote(timeout)
        if not ok:
            raise Empty
        return item

    def put_nowait(self, item: Any) -> None:
        """``put(item, block=False)``: raises :class:`Full` at once when there is no room."""
        self.put(item, block=False)

    def put_nowait_batch(self, items: Iterable[Any]) -> None:
        """Add all ``items`` in order, in one call; raises :class:`Full` (adding none of
        them) when they do not all fit."""
        if not isinstance(items, Iterable):
            raise TypeError("Argument 'items' must be an Iterable")
        batch = list(items)
        room = core.get(self._handle().put_nowait_batch.remote(batch))
        if room is not None:
            size, maxsize = room
            raise Full(
                f"Cannot add {len(batch)} items to queue of size {size} and maxsize {maxsize}."
            )

    def get_nowait(self) -> Any:
        """``get(block=False)``: raises :class:`Empty` at once when there is no item."""
        return self.get(block=False)

    def get_nowait_batch(self, num_items: int) -> list[Any]:
        """Remove and return ``num_items`` items in FIFO order, in one call; raises
        :class:`Empty` (removing none) when the queue holds fewer."""
        if isinstance(num_items, bool) or not isinstance(num_items, int):
            raise TypeError("Argument 'num_items' must be an int")
        if num_items < 0:
            raise ValueError("'num_items' must be nonnegative")
        ok, items = core.get(self._handle().get_nowait_batch.remote(num_items))
        if not ok:
            raise Empty(f"Cannot get {num_items} items from queue of size {items}.")
        return list(items)

    def shutdown(self, force: bool = False, grace_period_s: int = 5) -> None:
        """End the queue's actor and free what it reserved; the items are dropped.

        Calls already sent to the actor are let finish for up to ``grace_period_s``
        seconds unless ``force`` is True. Using the queue afterwards raises RuntimeError.
        """
        actor, self.actor = self.actor, None
        if actor is None:
            return
        if not force:
            # The actor runs calls in arrival order per caller: this one returns after
            # every call this process sent before it started.
            core.wait([actor.qsize.remote()], timeout=grace_period_s)
        core.kill(actor, no_restart=True)


class _QueueActor:
    """The queue's state: an ``asyncio.Queue`` in an async actor.

    Timeouts and "full"/"empty" are answered as values (a flag), not exceptions, so the
    caller raises :class:`Empty` / :class:`Full` itself with a clean traceback.
    """

    def __init__(self, maxsize: int) -> None:
        self.maxsize = maxsize
        self.queue: asyncio.Queue[Any] = asyncio.Queue(maxsize)

    async def qsize(self) -> int:
        return self.queue.qsize()

    async def empty(self) -> bool:
        return self.queue.empty()

    async def full(self) -> bool:
        return self.queue.full()

    async def put(self, item: Any, timeout: float | None = None) -> bool:
        try:
            await asyncio.wait_for(self.queue.put(item), timeout)
        except TimeoutError:
            return False
        return True

    async def get(self, timeout: float | None = None) -> tuple[bool, Any]:
        try:
            return True, await asyncio.wait_for(self.queue.get(), timeout)
        except TimeoutError:
            return False, None

    async def put_nowait(self, item: Any) -> bool:
        try:
            self.queue.put_nowait(item)
        except asyncio.QueueFull:
            return False
        return True

    async def put_nowait_batch(self, items: list[Any]) -> tuple[int, int] | None:
        if self.maxsize > 0 and len(items) + self.queue.qsize() > self.maxsize:
            return self.queue.qsize(), self.maxsize
        for item in items:
            self.queue.put_nowait(item)
        return None

    async def get_nowait(self) -> tuple[bool, Any]:
        try:
            return True, self.queue.get_nowait()
        except asyncio.QueueEmpty:
            return False, None

    async def get_nowait_batch(self, num_items: int) -> tuple[bool, Any]:
        if num_items > self.queue.qsize():
            return False, self.queue.qsize()
        return True, [self.queue.get_nowait() for _ in range(num_items)]
