"""``ActorPool``: spread work over a fixed set of actors (Ray's ``ray.util.ActorPool``)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from nbcluster import _api as nbcluster
from nbcluster._refs import ObjectRef

__all__ = ["ActorPool"]

Submit = Callable[[Any, Any], ObjectRef]


class ActorPool:
    """Run ``fn(actor, value)`` calls over a pool of actors, one call per idle actor.

    ``fn`` must return the ref of an actor call, e.g. ``lambda a, v: a.predict.remote(v)``.
    Results come back in submission order (``map``, ``get_next``) or as they finish
    (``map_unordered``, ``get_next_unordered``).
    """

    def __init__(self, actors: Iterable[Any]) -> None:
        self._idle_actors: list[Any] = list(actors)
        self._future_to_actor: dict[ObjectRef, tuple[int, Any]] = {}
        self._index_to_future: dict[int, ObjectRef] = {}
        self._next_task_index = 0
        self._next_return_index = 0
        self._pending_submits: list[tuple[Submit, Any]] = []

    def map(self, fn: Submit, values: Iterable[Any]) -> Iterator[Any]:
        """Apply ``fn`` to every value (all submitted now); yield results in the order of ``values``."""
        while self.has_next():  # results of earlier submits are dropped, as in Ray
            with contextlib.suppress(TimeoutError):
                self.get_next_unordered(timeout=0)
        for v in values:
            self.submit(fn, v)

        def results() -> Iterator[Any]:
            while self.has_next():
                yield self.get_next()

        return results()

    def map_unordered(self, fn: Submit, values: Iterable[Any]) -> Iterator[Any]:
        """Apply ``fn`` to every value (all submitted now); yield results as they complete."""
        while self.has_next():
            with contextlib.suppress(TimeoutError):
                self.get_next_unordered(timeout=0)
        for v in values:
            self.submit(fn, v)

        def results() -> Iterator[Any]:
            while self.has_next():
                yield self.get_next_unordered()

        return results()

    def submit(self, fn: Submit, value: Any) -> None:
        """Schedule ``fn(actor, value)`` on an idle actor, or queue it until one is free."""
        if self._idle_actors:
            actor = self._idle_actors.pop()
            future = fn(actor, value)
            if not isinstance(future, ObjectRef):
                raise TypeError(
                    "the function given to ActorPool must return the ref of an actor call, "
                    f"e.g. lambda a, v: a.method.remote(v); it returned {type(future).__name__}"
                )
            self._future_to_actor[future] = (self._next_task_index, actor)
            self._index_to_future[self._next_task_index] = future
            self._next_task_index += 1
        else:
            self._pending_submits.append((fn, value))

    def has_next(self) -> bool:
        """True while some submitted call has a result not yet returned."""
        return bool(self._future_to_actor) or bool(self._pending_submits)

    def get_next(self, timeout: float | None = None, ignore_if_timedout: bool = False) -> Any:
        """The next result in submission order (raises the call's error, if any)."""
        if not self.has_next():
            raise StopIteration("No more results to get")
        if self._next_return_index >= self._next_task_index:
            raise ValueError("It is not allowed to call get_next() after get_next_unordered().")
        future = self._index_to_future[self._next_return_index]
        timeout_msg = "Timed out waiting for result"
        ignored = False
        if timeout is not None:
            ready, _ = nbcluster.wait([future], timeout=timeout)
            if not ready:
                if not ignore_if_timedout:
                    raise TimeoutError(timeout_msg)
                ignored = True  # drop the call, free its actor, and say so (as Ray does)
        del self._index_to_future[self._next_return_index]
        self._next_return_index += 1
        _, actor = self._future_to_actor.pop(future)
        if ignored:
            self._return_actor(actor)
            raise TimeoutError(f"{timeout_msg}. The task {future} has been ignored.")
        return self._result(future, actor)

    def get_next_unordered(
        self, timeout: float | None = None, ignore_if_timedout: bool = False
    ) -> Any:
        """The next result to finish, whatever its order (raises the call's error, if any)."""
        if not self.has_next():
            raise StopIteration("No more results to get")
        ready, _ = nbcluster.wait(list(self._future_to_actor), num_returns=1, timeout=timeout)
        if not ready:
            if ignore_if_timedout:
                return None
            raise TimeoutError("Timed out waiting for result")
        future = ready[0]
        i, actor = self._future_to_actor.pop(future)
        del self._index_to_future[i]
        self._next_return_index = max(self._next_return_index, i + 1)
        return self._result(future, actor)

    def _result(self, future: ObjectRef, actor: Any) -> Any:
        """The call's value; its actor goes back to the pool unless the call found it dead."""
        from nbcluster.exceptions import ActorDiedError

        try:
            value = nbcluster.get(future)
        except ActorDiedError:
            raise  # a dead actor is not given more work
        except BaseException:
            self._return_actor(actor)
            raise
        self._return_actor(actor)
        return value

    def _return_actor(self, actor: Any) -> None:
        self._idle_actors.append(actor)
        if self._pending_submits:
            self.submit(*self._pending_submits.pop(0))

    def has_free(self) -> bool:
        """True when an actor is idle and nothing is queued."""
        return bool(self._idle_actors) and not self._pending_submits

    def pop_idle(self) -> Any | None:
        """Remove and return an idle actor (None if none is idle)."""
        if self.has_free():
            return self._idle_actors.pop()
        return None

    def push(self, actor: Any) -> None:
        """Add an actor to the pool (it must not be busy in this pool)."""
        busy = [a for _, a in self._future_to_actor.values()]
        if actor in self._idle_actors or actor in busy:
            raise ValueError("Actor already belongs to current ActorPool")
        self._return_actor(actor)
