"""``@serve.batch``: callers pass one item each; the function gets a list of them.

The decorated function (``async def``, a method or a plain function) takes a list and
returns a list of the same length. Each call with a single item waits in a queue; a
batch runs when ``max_batch_size`` items are waiting or ``batch_wait_timeout_s`` has passed
since the first one, and each caller gets its own result (or the batch's exception).
Up to ``max_concurrent_batches`` batches run at once. The queue lives on the event loop
of the first call (the replica's loop), one per instance for methods.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
from collections.abc import Callable
from typing import Any

from nbcluster.serve.exceptions import ServeException

__all__ = ["batch"]


def _check(max_batch_size: Any, batch_wait_timeout_s: Any, max_concurrent_batches: Any) -> None:
    if isinstance(max_batch_size, bool) or not isinstance(max_batch_size, int):
        raise TypeError(f"max_batch_size must be integer >= 1, got {max_batch_size!r}")
    if max_batch_size < 1:
        raise ValueError(f"max_batch_size must be an integer >= 1, got {max_batch_size!r}")
    if isinstance(batch_wait_timeout_s, bool) or not isinstance(batch_wait_timeout_s, (int, float)):
        raise TypeError(f"batch_wait_timeout_s must be a float >= 0, got {batch_wait_timeout_s!r}")
    if batch_wait_timeout_s < 0:
        raise ValueError(f"batch_wait_timeout_s must be a float >= 0, got {batch_wait_timeout_s!r}")
    if (
        isinstance(max_concurrent_batches, bool)
        or not isinstance(max_concurrent_batches, int)
        or max_concurrent_batches < 1
    ):
        raise TypeError(
            f"max_concurrent_batches must be an integer >= 1, got {max_concurrent_batches!r}"
        )


class _Queue:
    """The waiting items of one batched function (one instance), and the task that batches them."""

    def __init__(self, func: Callable[..., Any], owner: Any, params: dict[str, Any]) -> None:
        self.func = func
        self.owner = owner
        self.params = params
        self.items: asyncio.Queue[tuple[Any, asyncio.Future[Any]]] = asyncio.Queue()
        self.slots = asyncio.Semaphore(params["max_concurrent_batches"])
        self.task = asyncio.get_running_loop().create_task(self._loop())

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            first = await self.items.get()
            batch = [first]
            deadline = loop.time() + self.params["batch_wait_timeout_s"]
            while len(batch) < self.params["max_batch_size"]:
                remaining = deadline - loop.time()
                if remaining <= 0:
                    while len(batch) < self.params["max_batch_size"] and not self.items.empty():
                        batch.append(self.items.get_nowait())
                    break
                try:
                    batch.append(await asyncio.wait_for(self.items.get(), remaining))
                except TimeoutError:
                    break
            await self.slots.acquire()
            loop.create_task(self._run(batch))

    async def _run(self, batch: list[tuple[Any, asyncio.Future[Any]]]) -> None:
        try:
            args = [item for item, _ in batch]
            try:
                if self.owner is None:
                    results = await self.func(args)
                else:
                    results = await self.func(self.owner, args)
                if not isinstance(results, (list, tuple)) or len(results) != len(batch):
                    got = (
                        len(results)
                        if isinstance(results, (list, tuple))
                        else type(results).__name__
                    )
                    raise ServeException(
                        "Batched function doesn't preserve batch size. The input list has "
                        f"length {len(batch)} but the returned list has length {got}."
                    )
            except BaseException as e:  # noqa: BLE001 - every caller of the batch gets it
                for _, fut in batch:
                    if not fut.done():
                        fut.set_exception(e)
                return
            for (_, fut), result in zip(batch, results, strict=True):
                if not fut.done():
                    fut.set_result(result)
        finally:
            self.slots.release()


def _queue(
    func: Callable[..., Any], params: dict[str, Any], owner: Any, plain: list[_Queue]
) -> _Queue:
    """The queue of ``func`` for ``owner`` (kept on the instance), made on the running loop."""
    loop = asyncio.get_running_loop()
    if owner is None:
        if not plain or plain[0].task.get_loop() is not loop:
            plain[:] = [_Queue(func, None, params)]
        return plain[0]
    queues = owner.__dict__.setdefault("__serve_batch_queues__", {})
    q = queues.get(func.__qualname__)
    if q is None or q.task.get_loop() is not loop:
        q = queues[func.__qualname__] = _Queue(func, owner, params)
    return q  # type: ignore[no-any-return]


async def _enqueue(
    func: Callable[..., Any],
    params: dict[str, Any],
    is_method: bool,
    plain: list[_Queue],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> Any:
    owner = args[0] if is_method and args else None
    rest = args[1:] if is_method else args
    items = list(rest) + list(kwargs.values())
    if len(items) != 1:
        raise TypeError(
            f"{func.__name__} is batched: call it with exactly one item, got {len(items)}"
        )
    fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
    _queue(func, params, owner, plain).items.put_nowait((items[0], fut))
    return await fut


def batch(
    _func: Callable[..., Any] | None = None,
    /,
    max_batch_size: int = 10,
    batch_wait_timeout_s: float = 0.01,
    max_concurrent_batches: int = 1,
) -> Any:
    """Batch calls of an ``async def`` function or method that takes a list (see module)."""
    _check(max_batch_size, batch_wait_timeout_s, max_concurrent_batches)
    params = {
        "max_batch_size": max_batch_size,
        "batch_wait_timeout_s": float(batch_wait_timeout_s),
        "max_concurrent_batches": max_concurrent_batches,
    }

    def decorate(func: Callable[..., Any]) -> Callable[..., Any]:
        if not callable(func):
            raise TypeError("@serve.batch can only be used to decorate functions or methods.")
        if not inspect.iscoroutinefunction(func):
            raise TypeError("Functions decorated with @serve.batch must be 'async def'")
        names = list(inspect.signature(func).parameters)
        is_method = bool(names) and names[0] == "self"
        plain: list[_Queue] = []  # a plain function's queue (empty when pickled)

        @functools.wraps(func)
        async def wrapper(*args: Any, **kwargs: Any) -> Any:
            return await _enqueue(func, params, is_method, plain, args, kwargs)

        def set_max_batch_size(size: int) -> None:
            _check(size, params["batch_wait_timeout_s"], params["max_concurrent_batches"])
            params["max_batch_size"] = size

        def set_batch_wait_timeout_s(timeout_s: float) -> None:
            _check(params["max_batch_size"], timeout_s, params["max_concurrent_batches"])
            params["batch_wait_timeout_s"] = float(timeout_s)

        wrapper.set_max_batch_size = set_max_batch_size  # type: ignore[attr-defined]
        wrapper.set_batch_wait_timeout_s = set_batch_wait_timeout_s  # type: ignore[attr-defined]
        wrapper._get_max_batch_size = lambda: params["max_batch_size"]  # type: ignore[attr-defined]
        wrapper._get_batch_wait_timeout_s = lambda: params["batch_wait_timeout_s"]  # type: ignore[attr-defined]
        return wrapper

    return decorate(_func) if _func is not None else decorate
