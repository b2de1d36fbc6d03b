"""``with_parameters``, ``with_resources``, and how the Tuner reads a trainable.

A trainable is a function ``fn(config)``, a :class:`Trainable` subclass, or a Train trainer
(an object with ``as_trainable()``, such as ``TorchTrainer``). :func:`inspect_trainable`
unwraps the ``with_resources``/``with_parameters`` layers and says what it is, its name,
and the resources each trial needs.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from collections.abc import Callable
from typing import Any

import nbcluster
from nbcluster.train import DataParallelTrainer
from nbcluster.tune.trainable.trainable import Trainable
from nbcluster.tune.trainable.trainer import as_trainable

__all__ = [
    "TrainableInfo",
    "inspect_trainable",
    "normalize_resources",
    "with_parameters",
    "with_resources",
]


def normalize_resources(
    resources: dict[str, Any], where: str = "with_resources"
) -> dict[str, float]:
    """``{"cpu": 2, "gpu": 1, "memory": ...}`` -> ``{"CPU": 2.0, "GPU": 1.0, ...}``."""
    if not isinstance(resources, dict):
        raise TypeError(
            f"{where}: resources must be a dict such as {{'cpu': 1}}, got {type(resources).__name__}"
        )
    out: dict[str, float] = {}
    for key, value in resources.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
            raise ValueError(f"{where}: resource {key!r} must be a number >= 0, got {value!r}")
        name = {"cpu": "CPU", "gpu": "GPU"}.get(key, key)
        if key == "custom_resources" and isinstance(value, dict):
            out.update({k: float(v) for k, v in value.items()})
            continue
        out[name] = out.get(name, 0.0) + float(value)
    out.setdefault("CPU", 0.0 if out else 1.0)
    return out


class _WithResources:
    """A trainable with its per-trial resources attached (what ``with_resources`` returns)."""

    def __init__(
        self, trainable: Any, resources: dict[str, Any] | Callable[[dict[str, Any]], Any]
    ) -> None:
        self.trainable = trainable
        self.resources = resources
        self.__name__ = getattr(trainable, "__name__", type(trainable).__name__)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.trainable(*args, **kwargs)

    def __repr__(self) -> str:
        return f"with_resources({self.__name__}, {self.resources!r})"


def with_resources(
    trainable: Any, resources: dict[str, Any] | Callable[[dict[str, Any]], dict[str, Any]]
) -> Any:
    """Attach the resources each trial of ``trainable`` needs (``{"cpu": 2, "gpu": 1}``).

    ``resources`` may also be a function of the trial's config returning such a dict.
    """
    if not callable(resources):
        normalize_resources(resources)  # fail now, naming the bad entry
    elif isinstance(resources, type):
        raise TypeError("with_resources: resources must be a dict or a function of the config")
    return _WithResources(trainable, resources)


class _WithParameters:
    """A function trainable called as ``fn(config, **params)``; params come from the store."""

    def __init__(self, fn: Callable[..., Any], refs: dict[str, Any]) -> None:
        self.fn = fn
        self.refs = refs
        self._values: dict[str, Any] | None = None
        functools.update_wrapper(self, fn)

    def __call__(self, config: dict[str, Any]) -> Any:
        if self._values is None:
            self._values = dict(
                zip(self.refs, nbcluster.get(list(self.refs.values())), strict=True)
            )
        return self.fn(config, **self._values)

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_values"] = None  # values travel through the object store, never in the pickle
        return state


def with_parameters(trainable: Any, **kwargs: Any) -> Any:
    """Pass large objects to every trial through the object store, once.

    ``tune.with_parameters(train_fn, data=df)`` puts ``df`` in the object store now; each
    runner fetches it once (zero-copy for numpy) and calls ``train_fn(config, data=df)``.
    For a ``Trainable`` class, ``setup(config, data=df)`` receives them.
    """
    if not kwargs:
        raise TypeError("with_parameters() needs keyword arguments to pass, e.g. data=df")
    refs = {name: nbcluster.put(value) for name, value in kwargs.items()}
    inner = trainable.trainable if isinstance(trainable, _WithResources) else trainable
    if inspect.isclass(inner) and issubclass(inner, Trainable):
        base = inner

        class _Parametrized(base):  # type: ignore[misc, valid-type]
            _tune_parameter_refs = refs

            def setup(self, config: dict[str, Any]) -> None:
                values = dict(zip(refs, nbcluster.get(list(refs.values())), strict=True))
                base.setup(self, config, **values)  # type: ignore[call-arg]

        _Parametrized.__name__ = base.__name__
        _Parametrized.__qualname__ = base.__qualname__
        wrapped: Any = _Parametrized
    elif callable(inner):
        wrapped = _WithParameters(inner, refs)
    else:
        raise TypeError(
            f"with_parameters() needs a function or a Trainable class, got {type(inner).__name__}"
        )
    if isinstance(trainable, _WithResources):
        return _WithResources(wrapped, trainable.resources)
    return wrapped


@dataclasses.dataclass
class TrainableInfo:
    """What the Tuner knows about a trainable."""

    trainable: Any  # the function, class, or trainer-derived function (resources layer removed)
    name: str
    kind: str  # "function", "class" or "trainer"
    resources: dict[str, float] | Callable[[dict[str, Any]], dict[str, float]]
    #: What the runner actor itself holds, from the trial's resources (None: all of them).
    actor_resources: Callable[[dict[str, float]], dict[str, float]] | None = None


def _no_resources(trial_resources: dict[str, float]) -> dict[str, float]:
    """A trainer's runner holds nothing: the trainer's worker group holds the trial's share."""
    return {"CPU": 0.0}


def inspect_trainable(trainable: Any) -> TrainableInfo:
    """Unwrap and classify a trainable; raise ``TypeError`` saying what is accepted."""
    resources: Any = None
    if isinstance(trainable, _WithResources):
        resources = trainable.resources
        trainable = trainable.trainable
    if isinstance(trainable, DataParallelTrainer):
        if resources is not None:
            raise TypeError(
                f"with_resources() does not apply to a {type(trainable).__name__}: its trials "
                "reserve what its ScalingConfig asks for (set scaling_config, or put a "
                "'scaling_config' in the param_space)"
            )
        fn, per_config = as_trainable(trainable)
        return TrainableInfo(
            fn, type(trainable).__name__, "trainer", _resources_of(per_config), _no_resources
        )
    if inspect.isclass(trainable):
        if not issubclass(trainable, Trainable):
            raise TypeError(
                f"Tuner: the class {trainable.__name__} is not a tune.Trainable subclass; "
                "subclass tune.Trainable (setup/step) or pass a function fn(config)"
            )
        cls = trainable
        if resources is None:

            def class_resources(config: dict[str, Any]) -> dict[str, float]:
                return normalize_resources(cls.default_resource_request(config) or {"CPU": 1})

            return TrainableInfo(trainable, trainable.__name__, "class", class_resources)
        return TrainableInfo(trainable, trainable.__name__, "class", _resources_of(resources))
    if callable(trainable):
        name = getattr(trainable, "__name__", None) or type(trainable).__name__
        _check_function_signature(trainable, name)
        return TrainableInfo(trainable, name, "function", _resources_of(resources or {"CPU": 1}))
    if isinstance(trainable, str):
        raise TypeError(
            f"Tuner: registered trainable names ({trainable!r}) are not supported; pass the function or class"
        )
    raise TypeError(
        f"Tuner: trainable must be a function fn(config), a tune.Trainable subclass, or a trainer "
        f"such as TorchTrainer; got {type(trainable).__name__}"
    )


def _resources_of(resources: Any) -> Any:
    if callable(resources):

        def per_config(config: dict[str, Any]) -> dict[str, float]:
            return normalize_resources(resources(config), "with_resources(fn)")

        return per_config
    return normalize_resources(resources)


def _check_function_signature(fn: Any, name: str) -> None:
    target = fn.fn if isinstance(fn, _WithParameters) else fn
    try:
        sig = inspect.signature(target)
    except (TypeError, ValueError):
        return
    params = [
        p
        for p in sig.parameters.values()
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty
    ]
    if isinstance(fn, _WithParameters):
        params = [p for p in params if p.name not in fn.refs]
    has_varargs = any(p.kind == p.VAR_POSITIONAL for p in sig.parameters.values())
    if len(params) > 1 or (not params and not has_varargs and not sig.parameters):
        raise TypeError(
            f"Tuner: the trainable function {name}{sig} must take exactly one argument, the config "
            "dict: def train_fn(config): ..."
        )
