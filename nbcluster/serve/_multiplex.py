"""``@serve.multiplexed``: many models per deployment, a few loaded per replica.

Decorate an ``async def get_model(self, model_id)`` method; calling it returns the model
from the replica's cache, loading it (and evicting the least recently used one beyond
``max_num_models_per_replica``, calling its ``__del__`` if it has one) when needed. The
replica reports the ids it holds, and routers prefer replicas that hold the requested
model (``handle.options(multiplexed_model_id=...)`` or the ``serve_multiplexed_model_id``
HTTP header; read it with ``serve.get_multiplexed_model_id()``).
"""

from __future__ import annotations

import asyncio
import collections
import functools
import inspect
import weakref
from collections.abc import Callable
from typing import Any

__all__ = ["loaded_model_ids", "multiplexed"]

_caches: weakref.WeakSet[_ModelCache] = weakref.WeakSet()


class _ModelCache:
    """One instance's loaded models, least recently used first."""

    def __init__(self, loader: Callable[..., Any], owner: Any, capacity: int) -> None:
        self.loader = loader
        self.owner = owner
        self.capacity = capacity
        self.models: collections.OrderedDict[str, Any] = collections.OrderedDict()
        self.loading: dict[str, asyncio.Future[Any]] = {}
        _caches.add(self)

    async def get(self, model_id: str) -> Any:
        if model_id in self.models:
            self.models.move_to_end(model_id)
            return self.models[model_id]
        pending = self.loading.get(model_id)
        if pending is not None:
            return await asyncio.shield(pending)
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.loading[model_id] = fut
        try:
            while len(self.models) >= self.capacity:
                _, old = self.models.popitem(last=False)
                await _unload(old)
            args = (model_id,) if self.owner is None else (self.owner, model_id)
            model = await self.loader(*args)
            self.models[model_id] = model
            fut.set_result(model)
            return model
        except BaseException as e:
            fut.set_exception(e)
            fut.exception()  # retrieved: no "never retrieved" warning when nobody else waits
            raise
        finally:
            self.loading.pop(model_id, None)


async def _unload(model: Any) -> None:
    delete = getattr(model, "__del__", None)
    if delete is None:
        return
    result = delete()
    if inspect.isawaitable(result):
        await result


def loaded_model_ids() -> frozenset[str]:
    """Every model id held by a multiplexed cache in this process."""
    out: set[str] = set()
    for cache in list(_caches):
        out.update(cache.models)
    return frozenset(out)


async def _get(
    loader: Callable[..., Any],
    capacity: int,
    is_method: bool,
    plain: list[_ModelCache],
    args: tuple[Any, ...],
) -> Any:
    if is_method:
        owner, model_id = args
        caches = owner.__dict__.setdefault("__serve_model_caches__", {})
        cache = caches.get(loader.__qualname__)
        if cache is None:
            cache = caches[loader.__qualname__] = _ModelCache(loader, owner, capacity)
    else:
        (model_id,) = args
        if not plain:
            plain.append(_ModelCache(loader, None, capacity))
        cache = plain[0]
    if not isinstance(model_id, str):
        raise TypeError(f"the model id must be a string, got {type(model_id).__name__}")
    return await cache.get(model_id)


def multiplexed(func: Callable[..., Any] | None = None, max_num_models_per_replica: int = 3) -> Any:
    """Cache the models an ``async def`` loader returns, per replica (see module docstring)."""
    if (
        isinstance(max_num_models_per_replica, bool)
        or not isinstance(max_num_models_per_replica, int)
        or not (max_num_models_per_replica == -1 or max_num_models_per_replica > 0)
    ):
        raise TypeError(
            "max_num_models_per_replica must be an integer > 0 (or -1 for no limit), "
            f"got {max_num_models_per_replica!r}"
        )
    capacity = max_num_models_per_replica if max_num_models_per_replica > 0 else 1 << 30

    def decorate(loader: Callable[..., Any]) -> Callable[..., Any]:
        if not inspect.iscoroutinefunction(loader):
            raise TypeError(
                "@serve.multiplexed can only decorate an 'async def' function or method "
                "that takes a model id"
            )
        params = list(inspect.signature(loader).parameters)
        is_method = bool(params) and params[0] == "self"
        if len(params) != (2 if is_method else 1):
            raise TypeError(
                "@serve.multiplexed: the function must take exactly one argument, the model id"
            )
        plain: list[_ModelCache] = []  # a plain function's cache (empty when pickled)

        @functools.wraps(loader)
        async def wrapper(*args: Any) -> Any:
            return await _get(loader, capacity, is_method, plain, args)

        return wrapper

    return decorate(func) if func is not None else decorate
