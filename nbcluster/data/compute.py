"""Compute strategies: run a map operator as tasks or as a pool of actors (Ray's names)."""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any

__all__ = ["ActorPoolStrategy", "ComputeStrategy", "TaskPoolStrategy", "resolve_compute"]


class ComputeStrategy:
    """Base class of :class:`TaskPoolStrategy` and :class:`ActorPoolStrategy`."""


@dataclasses.dataclass(frozen=True)
class TaskPoolStrategy(ComputeStrategy):
    """Run the operator as stateless tasks; ``size`` caps how many run at once."""

    size: int | None = None

    def __post_init__(self) -> None:
        if self.size is not None and (not isinstance(self.size, int) or self.size < 1):
            raise ValueError(f"TaskPoolStrategy size must be a positive int, got {self.size!r}")


@dataclasses.dataclass(frozen=True)
class ActorPoolStrategy(ComputeStrategy):
    """Run the operator in a pool of actors: ``size=n`` fixed, or ``min_size``..``max_size``.

    The pool starts with ``min_size`` actors and grows (up to ``max_size``, or as far as
    the cluster's CPUs allow when it is None) while inputs queue up; idle actors are
    stopped when no more input will come. Each actor builds the callable class once.
    """

    size: int | None = None
    min_size: int | None = None
    max_size: int | None = None

    def __post_init__(self) -> None:
        if self.size is not None:
            if self.min_size is not None or self.max_size is not None:
                raise ValueError("give ActorPoolStrategy either size, or min_size/max_size")
            _positive("size", self.size)
            object.__setattr__(self, "min_size", self.size)
            object.__setattr__(self, "max_size", self.size)
        if self.min_size is None:
            object.__setattr__(self, "min_size", 1)
        _positive("min_size", self.min_size)
        if self.max_size is not None:
            _positive("max_size", self.max_size)
            if self.max_size < (self.min_size or 1):
                raise ValueError(
                    f"ActorPoolStrategy: min_size ({self.min_size}) must be <= max_size "
                    f"({self.max_size})"
                )

    def bounds(self, cpu_limit: float, cpus_per_actor: float) -> tuple[int, int]:
        """``(min, max)`` actors, with an unbounded max capped by the cluster's CPUs."""
        lo = int(self.min_size or 1)
        if self.max_size is not None:
            return lo, int(self.max_size)
        by_cpu = int(cpu_limit // cpus_per_actor) if cpus_per_actor > 0 else lo * 4
        return lo, max(lo, by_cpu)


def _positive(name: str, value: Any) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"ActorPoolStrategy {name} must be a positive int, got {value!r}")


def resolve_compute(
    fn: Any, compute: ComputeStrategy | str | None, concurrency: Any, where: str
) -> ComputeStrategy:
    """The strategy from ``compute=``/``concurrency=`` as Ray reads them.

    A function runs as tasks (``concurrency=n`` caps them at n at once); a callable class
    runs in an actor pool (``concurrency=n`` fixed size, ``(min, max)`` autoscaling,
    default ``(1, CPUs)``).
    """
    is_class = inspect.isclass(fn)
    if compute is not None and concurrency is not None:
        raise ValueError(f"{where}: give either compute= or concurrency=, not both")
    if isinstance(compute, str):
        if compute == "tasks":
            compute = TaskPoolStrategy()
        elif compute == "actors":
            compute = ActorPoolStrategy()
        else:
            raise ValueError(f"{where}: compute must be 'tasks', 'actors' or a strategy object")
    if compute is not None:
        if not isinstance(compute, ComputeStrategy):
            raise TypeError(
                f"{where}: compute must be a TaskPoolStrategy or ActorPoolStrategy, got "
                f"{type(compute).__name__}"
            )
        if is_class and isinstance(compute, TaskPoolStrategy):
            raise ValueError(
                f"{where}: a callable class needs an actor pool; pass concurrency=n (or "
                "compute=ActorPoolStrategy(...)) instead of a TaskPoolStrategy"
            )
        if not is_class and isinstance(compute, ActorPoolStrategy) and fn is not None:
            raise ValueError(
                f"{where}: an actor pool needs a callable class; pass a class whose __call__ "
                "does the work, or drop compute= to run the function as tasks"
            )
        return compute
    if concurrency is None:
        return ActorPoolStrategy() if is_class else TaskPoolStrategy()
    if isinstance(concurrency, tuple):
        if len(concurrency) not in (2, 3) or not all(
            isinstance(c, int) and not isinstance(c, bool) for c in concurrency
        ):
            raise ValueError(
                f"{where}: concurrency must be an int or a (min, max) tuple of ints, got "
                f"{concurrency!r}"
            )
        if not is_class:
            raise ValueError(
                f"{where}: concurrency=(min, max) autoscales an actor pool, which needs a "
                "callable class; for a function pass concurrency=n (at most n tasks at once)"
            )
        return ActorPoolStrategy(min_size=concurrency[0], max_size=concurrency[1])
    if not isinstance(concurrency, int) or isinstance(concurrency, bool) or concurrency < 1:
        raise ValueError(f"{where}: concurrency must be a positive int, got {concurrency!r}")
    return ActorPoolStrategy(size=concurrency) if is_class else TaskPoolStrategy(size=concurrency)
