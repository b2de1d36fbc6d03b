"""``ObjectRefGenerator`` and ``DynamicObjectRefGenerator``: what generator tasks return.

A remote generator function (or actor generator method) returns an
:class:`ObjectRefGenerator` by default (``num_returns="streaming"``, as in Ray >= 2.8):
iterating it gives one :class:`~nbcluster.ObjectRef` per yielded value as soon as the
task yields it. ``num_returns="dynamic"`` returns one ref whose value is a
:class:`DynamicObjectRefGenerator` (the refs of all the values, once the task ended).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from nbcluster._runtime import context
from nbcluster._runtime.core import generators as core_gen
from nbcluster._runtime.refs import ObjectRef

if TYPE_CHECKING:
    from nbcluster._runtime.core.client import CoreClient

__all__ = ["DynamicObjectRefGenerator", "ObjectRefGenerator", "start_generator", "wait_mixed"]


class ObjectRefGenerator:
    """The refs a streaming generator task yields, in order, as they are produced.

    ``next(gen)`` (or a ``for`` loop) blocks until the task yields its next value and
    returns its :class:`~nbcluster.ObjectRef`; ``StopIteration`` follows the last one.
    ``async for ref in gen`` / ``await gen.__anext__()`` do the same without blocking
    the event loop. ``nbcluster.wait([gen, ...])`` counts the generator as ready when
    ``next(gen)`` would not block. If the task raises, the ref at the position after
    its last yield raises the error on ``get`` (a crash or ``nbcluster.cancel(gen)``
    likewise), and the iteration then stops. Refs not taken are freed when the
    generator is garbage-collected. Not thread-safe, and cannot be passed to tasks.
    """

    def __init__(self, client: CoreClient, owner: core_gen.OwnerGenerator, done: ObjectRef) -> None:
        self._client = client
        self._owner = owner
        self._state = owner.state
        self._done = done
        self._task_id = owner.task_id

    def __iter__(self) -> ObjectRefGenerator:
        return self

    def __next__(self) -> ObjectRef:
        ref = self._next_sync(None)
        assert ref is not None
        return ref

    def _next_sync(self, timeout_s: float | None = None) -> ObjectRef | None:
        """The next ref, waiting at most ``timeout_s`` seconds (None: no limit); returns
        ``ObjectRef.nil()`` when it timed out. Raises ``StopIteration`` at the end."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:  # short slices keep Ctrl-C responsive in the main thread
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                index = self._state.take(0)
                if index is None:
                    return ObjectRef.nil()
                break
            index = self._state.take(0.1 if left is None else min(0.1, left))
            if index is not None:
                break
        return ObjectRef._new(
            core_gen.item_id(self._task_id, index), self._client.address, self._client
        )

    def __aiter__(self) -> ObjectRefGenerator:
        return self

    async def __anext__(self) -> ObjectRef:
        loop = asyncio.get_running_loop()
        while True:
            try:
                index = self._state.take(0)
            except StopIteration:
                raise StopAsyncIteration from None
            if index is not None:
                return ObjectRef._new(
                    core_gen.item_id(self._task_id, index), self._client.address, self._client
                )
            fut: asyncio.Future[None] = loop.create_future()

            def wake(fut: asyncio.Future[None] = fut) -> None:
                with contextlib.suppress(RuntimeError):  # that event loop is closed
                    loop.call_soon_threadsafe(_resolve, fut)

            self._state.add_watcher(wake)
            if self._state.ready():
                self._state.remove_watcher(wake)
                continue
            try:
                await fut
            finally:
                self._state.remove_watcher(wake)

    def completed(self) -> ObjectRef:
        """A ref that is ready when the task has finished (its value is ``None``; it
        raises the task's error, if any)."""
        return self._done

    def is_finished(self) -> bool:
        """True once the task ended and every ref was taken."""
        st = self._state
        return st.total is not None and st.consumed >= st.total

    def task_id(self) -> bytes:
        """Id of the generator task."""
        return self._task_id

    def __reduce__(self) -> Any:
        raise TypeError(
            "an ObjectRefGenerator cannot be passed to another task or actor (as in Ray); "
            "iterate it here and pass the ObjectRefs it gives instead"
        )

    def __repr__(self) -> str:
        return f"ObjectRefGenerator({self._task_id.hex()})"

    def __del__(self) -> None:
        try:
            client = self._client
            if not client.closed:
                client.call_soon(self._owner.close)
        except Exception:  # noqa: BLE001 - never raise from __del__
            pass


def _resolve(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


class DynamicObjectRefGenerator:
    """The value of a ``num_returns="dynamic"`` task's ref: its yielded values' refs.

    Iterate it (``for ref in nbcluster.get(ref)``) or take ``len()``; each item is an
    :class:`~nbcluster.ObjectRef` owned by the caller of the task.
    """

    def __init__(self, refs: Sequence[ObjectRef]) -> None:
        self._refs = list(refs)
        self._ids: list[bytes] = []
        self._owner = ""

    @classmethod
    def _from_ids(cls, ids: list[bytes], owner: str) -> DynamicObjectRefGenerator:
        """Made by the executor, which holds no refs to its caller's items."""
        gen = cls([])
        gen._ids = ids
        gen._owner = owner
        return gen

    def __iter__(self) -> Iterator[ObjectRef]:
        return iter(self._refs)

    def __len__(self) -> int:
        return len(self._refs) or len(self._ids)

    def __reduce__(self) -> Any:
        if self._ids:
            return (_rebuild_dynamic, (self._ids, self._owner))
        return (DynamicObjectRefGenerator, (self._refs,))

    def __repr__(self) -> str:
        return f"DynamicObjectRefGenerator({len(self)} refs)"


def _rebuild_dynamic(ids: list[bytes], owner: str) -> DynamicObjectRefGenerator:
    client = context.current_client()
    borrowed = client is None or owner != client.address
    return DynamicObjectRefGenerator(
        [ObjectRef._new(oid, owner, client, borrowed=borrowed) for oid in ids]
    )


def start_generator(
    client: CoreClient, rec: Any, mode: int, threshold: int, done: ObjectRef
) -> Any:
    """Set up the owner side of a just-built generator task; what ``.remote()`` returns."""
    owner = core_gen.OwnerGenerator(client, rec, mode, threshold)
    rec.generator = owner
    core_gen.registry(client)[rec.task_id] = owner
    if mode == core_gen.DYNAMIC:
        return done
    return ObjectRefGenerator(client, owner, done)


def wait_mixed(
    client: CoreClient, items: Sequence[Any], num_returns: int, deadline: float | None
) -> tuple[list[Any], list[Any]]:
    """``nbcluster.wait`` over refs and generators (a generator is ready when ``next``
    would not block)."""
    wake = threading.Event()

    class _Hit:
        def hit(self) -> None:
            wake.set()

        def set(self) -> None:
            wake.set()

    hit = _Hit()
    refs = [x for x in items if isinstance(x, ObjectRef)]
    entries = dict(zip(refs, client.ensure_tracked(refs), strict=True)) if refs else {}
    gens = [x for x in items if isinstance(x, ObjectRefGenerator)]
    table = client.table

    def is_ready(x: Any) -> bool:
        if isinstance(x, ObjectRefGenerator):
            return x._state.ready()
        return bool(entries[x].state == 1)

    with table.lock:
        for e in entries.values():
            if e.state != 1:
                if e.waiters is None:
                    e.waiters = []
                e.waiters.append(hit)
    thread_tasks = getattr(getattr(client, "submitter", None), "thread_tasks", None)
    loop_reads = getattr(thread_tasks, "loop_reads_soon", None)
    if loop_reads is not None:  # this wait reads no reply itself: the loop does
        loop_reads(list(entries.values()))
    try:
        while True:
            wake.clear()
            for g in gens:
                g._state.remove_watcher(wake.set)
                g._state.add_watcher(wake.set)
            ready = [x for x in items if is_ready(x)][:num_returns]
            if len(ready) >= num_returns:
                break
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                break
            wake.wait(0.1 if left is None else min(0.1, left))
    finally:
        for g in gens:
            g._state.remove_watcher(wake.set)
        with table.lock:
            for e in entries.values():
                if e.waiters and hit in e.waiters:
                    e.waiters.remove(hit)
    ids = {id(x) for x in ready}
    return ready, [x for x in items if id(x) not in ids]
