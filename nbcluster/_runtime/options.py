"""One table of task and actor options: names, types, defaults and validation.

``@remote(...)`` builds a :class:`TaskOptions` or :class:`ActorOptions` with
:func:`task_options` / :func:`actor_options`; ``.options(...)`` derives a new one with
:meth:`TaskOptions.merge` / :meth:`ActorOptions.merge`, which validates the keys and then
calls :func:`dataclasses.replace`. Field values are validated in ``__post_init__``, so every
instance, however it was made, is valid. Both classes are frozen and hashable.

Defaults follow Ray: tasks take 1 CPU and are retried 3 times after a worker crash; actors
are not restarted.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from nbcluster._runtime.runtime_env.options import FrozenRuntimeEnv, normalize_runtime_env

__all__ = [
    "ACTOR_OPTION_NAMES",
    "TASK_OPTION_NAMES",
    "ActorOptions",
    "FrozenResources",
    "TaskOptions",
    "Where",
    "actor_options",
    "task_options",
]

#: Where options were given: ``@remote(...)`` or ``.options(...)``.
Where = Literal["decorator", "options"]

#: Strategies that are plain strings; anything else is a strategy object.
_STRING_STRATEGIES = ("DEFAULT", "SPREAD")
#: Resource names that have their own option.
_RESERVED_RESOURCES = {"CPU": "num_cpus", "GPU": "num_gpus", "memory": "memory"}


class FrozenResources(Mapping[str, float]):
    """A read-only, hashable ``{resource name: amount}`` mapping."""

    __slots__ = ("_data",)

    def __init__(self, data: Mapping[str, float] | None = None) -> None:
        self._data: dict[str, float] = dict(data or {})

    def __getitem__(self, key: str) -> float:
        return self._data[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def __hash__(self) -> int:
        return hash(frozenset(self._data.items()))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Mapping):
            return self._data == dict(other.items())
        return NotImplemented

    def __repr__(self) -> str:
        return repr(self._data)

    def __reduce__(self) -> tuple[Any, ...]:
        return (FrozenResources, (self._data,))


# --------------------------------------------------------------------------- checks


def _describe(value: object) -> str:
    return f"{value!r} ({type(value).__name__})"


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _check_amount(name: str, value: object) -> None:
    """A non-negative, finite number (bools are not numbers here)."""
    if not _is_number(value):
        raise TypeError(f"{name} must be a non-negative number, got {_describe(value)}")
    assert isinstance(value, int | float)
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{name} must be a non-negative number, got {value!r}")


def _check_int(name: str, value: object, minimum: int, meaning: str = "") -> None:
    """An int (not a bool) >= ``minimum``; ``meaning`` explains special values."""
    rule = f"{name} must be an integer >= {minimum}" + (f" ({meaning})" if meaning else "")
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{rule}, got {_describe(value)}")
    if value < minimum:
        raise ValueError(f"{rule}, got {value!r}")


def check_num_returns(value: object) -> None:
    """An int >= 0, or "streaming" / "dynamic" (generator tasks)."""
    if value in ("streaming", "dynamic"):
        return
    if isinstance(value, str):
        raise ValueError(
            f'num_returns must be an integer >= 0, "streaming" or "dynamic", got {value!r}'
        )
    _check_int("num_returns", value, 0, 'or "streaming" / "dynamic" for generators')


def check_backpressure(value: object) -> None:
    """``_generator_backpressure_num_objects``: -1 (off) or a positive int."""
    _check_int("_generator_backpressure_num_objects", value, -1, "-1 means no backpressure")
    if value == 0:
        raise ValueError(
            "_generator_backpressure_num_objects must be -1 (no backpressure) or >= 1, got 0"
        )


def _check_optional_str(name: str, value: object) -> None:
    if value is not None and not isinstance(value, str):
        raise TypeError(f"{name} must be a string or None, got {_describe(value)}")


def _check_bool(name: str, value: object) -> None:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False, got {_describe(value)}")


def _check_max_pending_calls(value: object) -> None:
    rule = "max_pending_calls must be -1 (unlimited) or a positive integer"
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{rule}, got {_describe(value)}")
    if value == 0 or value < -1:
        raise ValueError(f"{rule}, got {value!r}")


def _normalize_resources(value: object) -> FrozenResources:
    if value is None:
        return FrozenResources()
    if not isinstance(value, Mapping):
        raise TypeError(
            f"resources must be a dict of resource name to amount, such as "
            f"{{'TPU': 1}}, got {_describe(value)}"
        )
    for key, amount in value.items():
        if not isinstance(key, str) or not key:
            raise TypeError(f"resources keys must be non-empty strings, got {key!r}")
        if key in _RESERVED_RESOURCES:
            option = _RESERVED_RESOURCES[key]
            raise ValueError(
                f"Use the {option} option instead of resources={{{key!r}: ...}}: "
                f"write {option}={amount!r}"
            )
        _check_amount(f"resources[{key!r}]", amount)
    return value if isinstance(value, FrozenResources) else FrozenResources(value)


def _normalize_strategy(value: object) -> object:
    if value is None:
        return "DEFAULT"
    if isinstance(value, str):
        if value not in _STRING_STRATEGIES:
            hint = (
                f" (did you mean {value.upper()!r}?)" if value.upper() in _STRING_STRATEGIES else ""
            )
            raise ValueError(
                f"scheduling_strategy must be 'DEFAULT', 'SPREAD' or a strategy object, "
                f"got {value!r}{hint}"
            )
        return value
    if not hasattr(value, "_nbcluster_strategy"):
        raise TypeError(
            "scheduling_strategy must be 'DEFAULT', 'SPREAD' or a strategy object (such as a "
            f"node-affinity or placement-group strategy), got {_describe(value)}"
        )
    return value


def _normalize_retry_exceptions(value: object) -> bool | tuple[type[BaseException], ...]:
    if isinstance(value, bool):
        return value
    rule = "retry_exceptions must be True, False or a list of exception classes"
    if not isinstance(value, list | tuple):
        raise TypeError(f"{rule}, got {_describe(value)}")
    for item in value:
        if not (isinstance(item, type) and issubclass(item, BaseException)):
            raise TypeError(f"{rule}, but the list contains {_describe(item)}")
    return tuple(value)


def _normalize_concurrency_groups(value: object) -> FrozenResources | None:
    """``{group name: max calls at once}`` (names non-empty strings, limits ints >= 1)."""
    if value is None:
        return None
    rule = (
        "concurrency_groups must be a dict of group name to the most calls that group runs "
        "at once, such as {'io': 2, 'compute': 4}"
    )
    if not isinstance(value, Mapping):
        raise TypeError(f"{rule}, got {_describe(value)}")
    for name, limit in value.items():
        if not isinstance(name, str) or not name:
            raise TypeError(f"{rule}; group names must be non-empty strings, got {name!r}")
        _check_int(f"concurrency_groups[{name!r}]", limit, 1)
    return value if isinstance(value, FrozenResources) else FrozenResources(value)


def _public(names: frozenset[str]) -> list[str]:
    """Option names to list in errors (Ray's private ``_...`` options are accepted, not shown)."""
    return sorted(n for n in names if not n.startswith("_"))


def _check_keys(
    kwargs: Mapping[str, object],
    valid: frozenset[str],
    what: str,
    where: Where,
    decorator_only: frozenset[str] = frozenset(),
) -> None:
    """Unknown keys, and keys not allowed in ``where``, raise at once."""
    if where not in ("decorator", "options"):
        raise ValueError(f"where must be 'decorator' or 'options', got {where!r}")
    allowed = valid - decorator_only if where == "options" else valid
    for key in kwargs:
        if key in allowed:
            continue
        if key in decorator_only:
            raise ValueError(
                f"{key} can only be set in @remote(...), not in .options(): it applies to "
                f"the worker processes that run the function. Use @remote({key}=...)."
            )
        close = difflib.get_close_matches(str(key), allowed, n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise ValueError(
            f"Invalid option {key!r} for {what}. Valid options: {', '.join(_public(allowed))}.{hint}"
        )


# --------------------------------------------------------------------------- tasks


@dataclass(frozen=True)
class TaskOptions:
    """The options of a remote function: what ``@remote(...)`` and ``.options(...)`` take."""

    num_cpus: float = 1
    """CPUs reserved while the task runs."""
    num_gpus: float = 0
    """GPUs reserved while the task runs; fractions share a GPU."""
    resources: Mapping[str, float] = field(default_factory=FrozenResources)
    """Custom resources, such as ``{"TPU": 1}``. Stored as a read-only mapping."""
    memory: float = 0
    """Bytes of memory reserved for scheduling (not enforced)."""
    num_returns: int | str = 1
    """Number of ObjectRefs ``.remote()`` returns; 0 returns ``None``. ``"streaming"`` (the
    default for generator functions) returns an ``ObjectRefGenerator``; ``"dynamic"`` one
    ref to a ``DynamicObjectRefGenerator``."""
    _generator_backpressure_num_objects: int = -1
    """Streaming generators: the task pauses while this many yielded values are not yet
    taken by ``next()``; -1 (the default) never pauses."""
    max_retries: int = 3
    """Retries after the worker dies (``WorkerCrashedError``); -1 retries forever."""
    retry_exceptions: bool | tuple[type[BaseException], ...] = False
    """Also retry when user code raises: True for any exception, or these classes only."""
    max_calls: int = 0
    """Replace the worker process after this many calls; 0 means never. Decorator only."""
    name: str | None = None
    """Task name shown in the timeline and errors; defaults to the function's name."""
    scheduling_strategy: str | object = "DEFAULT"
    """``"DEFAULT"``, ``"SPREAD"``, or a strategy object (node affinity, placement group)."""
    runtime_env: FrozenRuntimeEnv | None = None
    """Ray's ``runtime_env`` (env_vars, working_dir, py_modules, pip, config); merged over
    the job's as Ray does. Checked here; local paths are uploaded at submission."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "runtime_env", normalize_runtime_env(self.runtime_env))
        _check_amount("num_cpus", self.num_cpus)
        _check_amount("num_gpus", self.num_gpus)
        _check_amount("memory", self.memory)
        object.__setattr__(self, "resources", _normalize_resources(self.resources))
        check_num_returns(self.num_returns)
        check_backpressure(self._generator_backpressure_num_objects)
        _check_int("max_retries", self.max_retries, -1, "-1 means retry forever")
        object.__setattr__(
            self, "retry_exceptions", _normalize_retry_exceptions(self.retry_exceptions)
        )
        _check_int("max_calls", self.max_calls, 0, "0 means unlimited")
        _check_optional_str("name", self.name)
        object.__setattr__(
            self, "scheduling_strategy", _normalize_strategy(self.scheduling_strategy)
        )

    def merge(self, *, where: Where = "options", **kwargs: Any) -> TaskOptions:
        """A copy with ``kwargs`` applied, validated as given in ``where``."""
        _check_keys(kwargs, TASK_OPTION_NAMES, "a remote function", where, _TASK_DECORATOR_ONLY)
        return dataclasses.replace(self, **kwargs) if kwargs else self

    def resource_shape(self) -> dict[str, float]:
        """The resources the task needs to run, without zero entries (a new dict)."""
        shape = self.__dict__.get("_shape")  # options are frozen: computed once, per options
        if shape is None:
            shape = {"CPU": self.num_cpus, "GPU": self.num_gpus, "memory": self.memory}
            shape.update(self.resources)
            shape = {k: float(v) for k, v in shape.items() if v}
            self.__dict__["_shape"] = shape
        return dict(shape)


TASK_OPTION_NAMES: frozenset[str] = frozenset(f.name for f in dataclasses.fields(TaskOptions))
_TASK_DECORATOR_ONLY = frozenset({"max_calls"})


def task_options(kwargs: Mapping[str, Any], *, where: Where) -> TaskOptions:
    """Validate ``kwargs`` given in ``where`` and build :class:`TaskOptions` from defaults."""
    _check_keys(kwargs, TASK_OPTION_NAMES, "a remote function", where, _TASK_DECORATOR_ONLY)
    return TaskOptions(**kwargs)


# --------------------------------------------------------------------------- actors


@dataclass(frozen=True)
class ActorOptions:
    """The options of an actor class: what ``@remote(...)`` and ``.options(...)`` take.

    ``num_cpus=None`` (the default) follows Ray: when no resource is given at all, the
    actor needs 1 CPU free to be placed but holds 0 CPUs while it lives, so many idle
    actors fit on one node; when another resource is given, it needs 0 CPUs for both. See
    :meth:`scheduling_resource_shape` and :meth:`resource_shape`.
    """

    num_cpus: float | None = None
    """CPUs held while the actor lives; None means 1 to place it and 0 to run it."""
    num_gpus: float = 0
    """GPUs held while the actor lives."""
    resources: Mapping[str, float] = field(default_factory=FrozenResources)
    """Custom resources, such as ``{"TPU": 1}``. Stored as a read-only mapping."""
    memory: float = 0
    """Bytes of memory reserved for scheduling (not enforced)."""
    name: str | None = None
    """Register the actor under this name, for ``nbcluster.get_actor(name)``."""
    namespace: str | None = None
    """Namespace of the name; None means the job's namespace."""
    lifetime: Literal["detached"] | None = None
    """``"detached"``: the actor outlives the driver that created it."""
    get_if_exists: bool = False
    """With a name: return the existing actor of that name instead of failing."""
    max_restarts: int = 0
    """Restarts after the actor's process dies; -1 restarts forever."""
    max_task_retries: int = 0
    """Retries of a call interrupted by an actor restart; -1 retries forever."""
    max_concurrency: int | None = None
    """Calls run at once; None means 1 for a sync actor and 1000 for an async one."""
    max_pending_calls: int = -1
    """Calls queued before ``PendingCallsLimitExceeded``; -1 means unlimited."""
    scheduling_strategy: str | object = "DEFAULT"
    """``"DEFAULT"``, ``"SPREAD"``, or a strategy object (node affinity, placement group)."""
    runtime_env: FrozenRuntimeEnv | None = None
    """Ray's ``runtime_env`` for the actor's process (see :class:`TaskOptions`)."""
    concurrency_groups: Mapping[str, int] | None = None
    """Ray's concurrency groups, ``{"io": 2, "compute": 4}``: each group runs at most that
    many of its methods' calls at once, on its own threads (or event loop, for an async
    actor); methods join one with ``@nbcluster.method(concurrency_group=...)``. Other
    calls run in the default group, limited by ``max_concurrency``."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "runtime_env", normalize_runtime_env(self.runtime_env))
        if self.num_cpus is not None:
            _check_amount("num_cpus", self.num_cpus)
        _check_amount("num_gpus", self.num_gpus)
        _check_amount("memory", self.memory)
        object.__setattr__(self, "resources", _normalize_resources(self.resources))
        _check_optional_str("name", self.name)
        if self.name == "":
            raise ValueError("name must be a non-empty string or None, got ''")
        _check_optional_str("namespace", self.namespace)
        if self.lifetime == "non_detached":  # Ray's spelling of the default
            object.__setattr__(self, "lifetime", None)
        if self.lifetime not in (None, "detached"):
            raise ValueError(f"lifetime must be None or 'detached', got {self.lifetime!r}")
        _check_bool("get_if_exists", self.get_if_exists)
        _check_int("max_restarts", self.max_restarts, -1, "-1 means restart forever")
        _check_int("max_task_retries", self.max_task_retries, -1, "-1 means retry forever")
        if self.max_concurrency is not None:
            _check_int("max_concurrency", self.max_concurrency, 1)
        _check_max_pending_calls(self.max_pending_calls)
        object.__setattr__(
            self, "scheduling_strategy", _normalize_strategy(self.scheduling_strategy)
        )
        object.__setattr__(
            self, "concurrency_groups", _normalize_concurrency_groups(self.concurrency_groups)
        )

    def merge(self, *, where: Where = "options", **kwargs: Any) -> ActorOptions:
        """A copy with ``kwargs`` applied, validated as given in ``where``."""
        _check_keys(kwargs, ACTOR_OPTION_NAMES, "an actor class", where)
        return dataclasses.replace(self, **kwargs) if kwargs else self

    def check_creatable(self) -> None:
        """Checks that involve several options, done when the actor is created.

        (They cannot run earlier: ``name`` may be given in ``.options()`` after
        ``get_if_exists`` was given in ``@remote``.)
        """
        if self.get_if_exists and self.name is None:
            raise ValueError(
                "get_if_exists=True needs a name: pass name='...' in .options() as well"
            )

    def _resource_defaults_only(self) -> bool:
        return self.num_cpus is None and not (self.num_gpus or self.memory or self.resources)

    def scheduling_resource_shape(self) -> dict[str, float]:
        """What a node must have free to place the actor (Ray: 1 CPU when nothing is set)."""
        cpus = 1.0 if self._resource_defaults_only() else float(self.num_cpus or 0)
        return self._shape(cpus)

    def resource_shape(self) -> dict[str, float]:
        """What the actor holds while it lives (0 CPUs when ``num_cpus`` is None)."""
        return self._shape(float(self.num_cpus or 0))

    def _shape(self, cpus: float) -> dict[str, float]:
        shape = {"CPU": cpus, "GPU": self.num_gpus, "memory": self.memory}
        shape.update(self.resources)
        return {k: float(v) for k, v in shape.items() if v}


ACTOR_OPTION_NAMES: frozenset[str] = frozenset(f.name for f in dataclasses.fields(ActorOptions))


def actor_options(kwargs: Mapping[str, Any], *, where: Where) -> ActorOptions:
    """Validate ``kwargs`` given in ``where`` and build :class:`ActorOptions` from defaults."""
    _check_keys(kwargs, ACTOR_OPTION_NAMES, "an actor class", where)
    return ActorOptions(**kwargs)
