"""``@remote``: turn a function into a :class:`RemoteFunction` whose calls run in the cluster."""

from __future__ import annotations

import functools
import inspect
import warnings
from collections.abc import Callable
from typing import Any, Generic, TypeVar, overload

from nbcluster import _api
from nbcluster import options as _options
from nbcluster._actor import ActorClass
from nbcluster._exported import CODE_GENERATION, refresh_exported_code
from nbcluster._runtime.config import Config
from nbcluster._runtime.driver import FunctionDescriptor
from nbcluster._runtime.serialization import dumps_code, function_hash, serialize

__all__ = ["RemoteFunction", "refresh_exported_code", "remote"]

R = TypeVar("R")


class RemoteFunction(Generic[R]):
    """A function that runs as a task in the cluster: call it with ``.remote(...)``.

    Created by ``@nbcluster.remote``. ``f.remote(*args)`` returns an :class:`ObjectRef`
    (or a list of them when ``num_returns > 1``; for a generator function an
    :class:`~nbcluster.ObjectRefGenerator`) at once; the task runs on a worker.
    ``f.options(**overrides).remote(...)`` changes options for one call.
    """

    def __init__(self, function: Callable[..., R], options: _options.TaskOptions) -> None:
        if inspect.iscoroutinefunction(function):
            raise TypeError(
                f"{function.__qualname__} is an async function; async remote functions are not "
                "supported. Make it a regular function, or an async method of an actor."
            )
        self._function = function
        self._options = options
        self._name = getattr(function, "__qualname__", getattr(function, "__name__", "function"))
        self._signature: inspect.Signature | None = None
        self._positional: tuple[int, int] | None = None  # see _check_arity
        self._descriptor: FunctionDescriptor | None = None
        self._generation = CODE_GENERATION[0]
        functools.update_wrapper(self, function, updated=())

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError(
            f"Remote functions cannot be called directly. Instead of running '{self._name}()', "
            f"try '{self._name}.remote()'."
        )

    def __repr__(self) -> str:
        return f"<RemoteFunction {self._name}>"

    @property
    def function(self) -> Callable[..., R]:
        """The plain Python function."""
        return self._function

    def options(self, **overrides: Any) -> _OptionsWrapper[R]:
        """Override options for the calls made through the returned object.

        ``f.options(num_cpus=2, max_retries=0).remote(x)``. Unknown or ill-typed options
        raise here, before anything is submitted.
        """
        return _OptionsWrapper(self, self._options.merge(where="options", **overrides))

    def bind(self, *args: Any, **kwargs: Any) -> Any:
        """A lazy :class:`~nbcluster.dag.FunctionNode` for this call; run it with .execute()."""
        from nbcluster.dag import FunctionNode

        return FunctionNode(self, args, kwargs, options=self._options)

    def remote(self, *args: Any, **kwargs: Any) -> Any:
        """Submit a task running this function on ``args``; return its ref(s) at once."""
        return self._remote(args, kwargs, self._options)

    # -- submission --------------------------------------------------------------------------
    def _check_arity(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        positional = self._positional
        if positional is not None and not kwargs and positional[0] <= len(args) <= positional[1]:
            return  # (a hot path: Signature.bind costs more than the rest of a submission)
        sig = self._signature
        if sig is None:
            try:
                sig = self._signature = inspect.signature(self._function)
            except (TypeError, ValueError):
                return
            self._positional = _positional_range(sig)
        try:
            sig.bind(*args, **kwargs)
        except TypeError as e:
            raise TypeError(f"{self._name}.remote(): {e}") from None

    def _export(self, config: Config) -> FunctionDescriptor:
        """The function's pickle and hash, made again after the code generation changed."""
        desc = self._descriptor
        if desc is None or self._generation != CODE_GENERATION[0]:
            self._generation = CODE_GENERATION[0]
            try:
                payload = dumps_code(self._function)
            except Exception as e:  # noqa: BLE001 - say what could not be pickled
                serialize(self._function, what="the remote function", name=self._name)
                raise TypeError(f"could not pickle {self._name}: {e}") from None
            _check_function_size(self._name, len(payload), config)
            desc = self._descriptor = FunctionDescriptor(
                function_hash(payload), self._name, payload
            )
        return desc

    def _remote(
        self, args: tuple[Any, ...], kwargs: dict[str, Any], opts: _options.TaskOptions
    ) -> Any:
        driver = _api._driver_or_autoinit()
        self._check_arity(args, kwargs)
        return driver.submit_task(self._export(driver.config), opts, args, kwargs)


def _positional_range(sig: inspect.Signature) -> tuple[int, int] | None:
    """(required, total) when every parameter is plain positional (then positional
    arguments alone bind iff their count is in that range); None otherwise."""
    plain = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    params = list(sig.parameters.values())
    if any(p.kind not in plain for p in params):
        return None
    return sum(1 for p in params if p.default is inspect.Parameter.empty), len(params)


class _OptionsWrapper(Generic[R]):
    """``f.options(...)``: the same function with some options overridden."""

    def __init__(self, rf: RemoteFunction[R], options: _options.TaskOptions) -> None:
        self._rf = rf
        self._options = options

    def bind(self, *args: Any, **kwargs: Any) -> Any:
        """A lazy :class:`~nbcluster.dag.FunctionNode` with the overridden options."""
        from nbcluster.dag import FunctionNode

        return FunctionNode(self._rf, args, kwargs, options=self._options, submit=self)

    def remote(self, *args: Any, **kwargs: Any) -> Any:
        """Submit with the overridden options."""
        return self._rf._remote(args, kwargs, self._options)

    def options(self, **overrides: Any) -> _OptionsWrapper[R]:
        """Override more options."""
        return _OptionsWrapper(self._rf, self._options.merge(where="options", **overrides))

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._rf(*args, **kwargs)


def _check_function_size(name: str, size: int, config: Config) -> None:
    mib = size / 2**20
    if size > config.function_size_error_bytes:
        raise ValueError(
            f"the remote function {name} pickles to {mib:.1f} MiB, over the "
            f"{config.function_size_error_bytes / 2**20:.0f} MiB limit; it probably captures a large "
            "object from its scope. Pass large values with nbcluster.put() and give the task the ref."
        )
    if size > config.function_size_warn_bytes:
        warnings.warn(
            f"the remote function {name} pickles to {mib:.1f} MiB; it probably captures a large "
            "object. Use nbcluster.put() for large values and pass the ref instead.",
            UserWarning,
            stacklevel=4,
        )


@overload
def remote(function: Callable[..., R], /) -> RemoteFunction[R]: ...
@overload
def remote(**options: Any) -> Callable[[Callable[..., R]], RemoteFunction[R]]: ...
def remote(*args: Any, **options: Any) -> Any:
    """Make a function or a class run in the cluster.

    Use bare (``@nbcluster.remote``) or with options
    (``@nbcluster.remote(num_cpus=2, max_retries=1)``); ``nbcluster.remote(num_cpus=1)(fn)``
    works too. On a function it gives a :class:`RemoteFunction` (tasks); on a class an
    :class:`~nbcluster.ActorClass` (actors). Options are checked here: an unknown or
    ill-typed one raises at once with the list of valid options.
    """
    if args:
        if len(args) != 1 or options or not callable(args[0]):
            raise TypeError(
                "@nbcluster.remote takes either a function or class, or keyword options only, "
                "e.g. @nbcluster.remote(num_cpus=2)"
            )
        return _make(args[0], {})
    # Checked when applied, against the target's own options (a function's or a class's), as Ray does.
    return lambda target: _make(target, options)


def _make(target: Any, options: dict[str, Any]) -> Any:
    if inspect.isclass(target):
        return ActorClass(target, _options.actor_options(options, where="decorator"))
    if not callable(target):
        raise TypeError(
            f"@nbcluster.remote needs a function or a class, got {type(target).__name__}"
        )
    if "num_returns" not in options and inspect.isgeneratorfunction(target):
        options = {**options, "num_returns": "streaming"}  # Ray >= 2.8: generators stream
    return RemoteFunction(target, _options.task_options(options, where="decorator"))
