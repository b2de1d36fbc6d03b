"""``@remote``: turn a function into a :class:`RemoteFunction` whose calls run in the cluster."""

from __future__ import annotations

import functools
import inspect
import warnings
from collections.abc import Callable
from typing import Any, Generic, TypeVar, overload

import cloudpickle

from nbcluster import options as _options
from nbcluster._generator import start_generator
from nbcluster._refs import ObjectRef
from nbcluster._runtime.core.args import ArgPlaceholder
from nbcluster._runtime.core.generators import wire_num_returns
from nbcluster._runtime.core.submitter import TaskRecord, build_spec
from nbcluster._runtime.runtime_env import driver as runtime_env_driver
from nbcluster._runtime.serialization import function_hash, serialize
from nbcluster.exceptions import SerializationError

__all__ = ["RemoteFunction", "remote"]

R = TypeVar("R")


#: Bumped to make every remote function and actor class pickle itself again at its next
#: export (issue 13: after ``%autoreload``, what their code refers to may have changed).
_CODE_GENERATION = [0]


def refresh_exported_code() -> None:
    """Make every remote function and actor class pickle itself again when next used."""
    _CODE_GENERATION[0] += 1


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
        self._payload: bytes | None = None
        self._function_id = b""
        self._generation = _CODE_GENERATION[0]
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
        sig = self._signature
        if sig is None:
            try:
                sig = self._signature = inspect.signature(self._function)
            except (TypeError, ValueError):
                return
        try:
            sig.bind(*args, **kwargs)
        except TypeError as e:
            raise TypeError(f"{self._name}.remote(): {e}") from None

    def _export(self, client: Any) -> bytes:
        if self._payload is None or self._generation != _CODE_GENERATION[0]:
            self._generation = _CODE_GENERATION[0]
            try:
                payload = cloudpickle.dumps(self._function)
            except Exception as e:  # noqa: BLE001 - say what could not be pickled
                serialize(self._function, what="the remote function", name=self._name)
                raise TypeError(f"could not pickle {self._name}: {e}") from None
            _check_function_size(self._name, len(payload), client.config)
            self._payload = payload
            self._function_id = function_hash(payload)
        client.export(self._function_id, self._payload, self._name)
        return self._function_id

    def _remote(
        self, args: tuple[Any, ...], kwargs: dict[str, Any], opts: _options.TaskOptions
    ) -> Any:
        from nbcluster import _api

        client = _api._client_or_autoinit()
        self._check_arity(args, kwargs)
        if _api._is_client(client):
            return client.submit_task(self._function, opts, args, kwargs)
        fid = self._export(client)
        return submit_task(client, fid, self._name, args, kwargs, opts)


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


def resolve_strategy(
    client: Any, shape: dict[str, float], strategy: Any
) -> tuple[dict[str, float], str, tuple[Any, ...] | None]:
    """(resource shape, key string, route) for a task's scheduling strategy."""
    from nbcluster._runtime.scheduling.policy import pg_request
    from nbcluster.util.scheduling_strategies import (
        NodeAffinitySchedulingStrategy,
        PlacementGroupSchedulingStrategy,
    )

    if strategy == "DEFAULT" and client.current_pg is not None and client.current_pg[1]:
        pg_id = client.current_pg[0]  # captured by the parent task's placement group
        return pg_request(shape, pg_id.hex(), -1), f"PG:{pg_id.hex()}:-1", ("pg", pg_id, -1)
    if isinstance(strategy, str):
        return shape, strategy, ("spread",) if strategy == "SPREAD" else None
    if isinstance(strategy, NodeAffinitySchedulingStrategy):
        node_id = bytes.fromhex(strategy.node_id)
        return (
            shape,
            f"NODE:{strategy.node_id}:{int(strategy.soft)}",
            ("node", node_id, strategy.soft),
        )
    if isinstance(strategy, PlacementGroupSchedulingStrategy):
        pg = strategy.placement_group
        idx = strategy.placement_group_bundle_index
        return pg_request(shape, pg.id.hex(), idx), f"PG:{pg.id.hex()}:{idx}", ("pg", pg.id, idx)
    raise TypeError(f"unsupported scheduling strategy {strategy!r}")


def _inherits_capture(client: Any, strategy: Any) -> bool:
    return strategy == "DEFAULT" and client.current_pg is not None and client.current_pg[1]


def _captures(strategy: Any) -> bool:
    return bool(getattr(strategy, "placement_group_capture_child_tasks", False))


def _explain_unserializable_args(name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """Raise a SerializationError naming the argument (and path inside it) that fails."""
    for i, a in enumerate(args):
        serialize(a, what="an argument", name=f"{name}.remote() argument {i}")
    for k, v in kwargs.items():
        serialize(v, what="an argument", name=f"{name}.remote() argument {k}")


def _check_function_size(name: str, size: int, config: Any) -> None:
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


def serialize_call_args(
    client: Any, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[Any, list[ObjectRef]]:
    """(args, kwargs) of a task or actor call, serialized, with top-level refs as placeholders.

    Returns the serialized value and the refs the placeholders stand for. Arguments too big
    to travel inline go to the object store first (and become refs too).
    """
    dep_refs: list[ObjectRef] = []

    def swap(v: Any) -> Any:
        if isinstance(v, ObjectRef):
            dep_refs.append(v)
            return ArgPlaceholder(len(dep_refs) - 1)
        return v

    args2 = tuple(swap(a) for a in args)
    kwargs2 = {k: swap(v) for k, v in kwargs.items()}
    try:
        sv = serialize((args2, kwargs2))
    except SerializationError:
        _explain_unserializable_args(name, args2, kwargs2)
        raise
    limit = client.config.max_inline_bytes
    if sv.total_size > limit:
        # Large arguments travel through the object store, not inside the spec.
        from nbcluster import _api

        def big(v: Any) -> Any:
            if isinstance(v, ArgPlaceholder):
                return v
            one = serialize(v)
            if one.total_size > limit // 2:
                return swap(_api._put_serialized(client, one))
            return v

        args2 = tuple(big(a) for a in args2)
        kwargs2 = {k: big(v) for k, v in kwargs2.items()}
        sv = serialize((args2, kwargs2))
    return sv, dep_refs


def submit_task(
    client: Any,
    function_id: bytes,
    name: str,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    opts: _options.TaskOptions,
) -> Any:
    """Serialize the arguments, record the task as owned, and hand it to the submitter."""
    client.submitter.check_capacity()  # nothing is recorded for a task refused here
    sv, dep_refs = serialize_call_args(client, name, args, kwargs)
    nested = [r.binary() for r in sv.contained_refs]
    task_id = client.next_task_id()
    n = opts.num_returns
    wire_n = wire_num_returns(n)  # generators: "streaming"/"dynamic" travel as -1/-2
    return_ids = [task_id + i.to_bytes(4, "big") for i in range(1, max(wire_n, 1) + 1)]
    rec = TaskRecord()
    rec.task_id = task_id
    rec.name = name
    rec.spec = build_spec(
        client,
        task_id=task_id,
        function_id=function_id,
        name=name,
        args_blob=sv.to_bytes(),
        num_returns=wire_n,
        max_calls=opts.max_calls,
        retry_exceptions=opts.retry_exceptions,
    )
    shape, strategy, route = resolve_strategy(
        client, opts.resource_shape(), opts.scheduling_strategy
    )
    rec.resources = shape
    rec.strategy = strategy
    rec.route = route
    provider = client.submit_context
    rec.context = provider() if provider is not None else None
    observer = getattr(client, "task_observer", None)
    if observer is not None:
        observer(task_id, name, rec.context)
    # runtime_env (issue 17): workers are pooled per environment, so it is part of the key
    rec.spec.runtime_env = runtime_env_driver.for_submit(client, opts.runtime_env, rec.context)
    rec.key = (tuple(sorted(shape.items())), strategy, opts.max_calls > 0, rec.spec.runtime_env)
    if (
        route is not None
        and route[0] == "pg"
        and (
            _captures(opts.scheduling_strategy)
            or _inherits_capture(client, opts.scheduling_strategy)
        )
    ):
        rec.spec.capture_pg = route[1]  # its own children (and theirs) stay in the group
    rec.return_ids = return_ids
    rec.retries_left = opts.max_retries
    rec.dep_ids = [r.binary() for r in dep_refs]
    rec.nested_ids = nested
    for oid in return_ids:
        client.table.create_owned(oid, task=rec)
    client.table.add_submitted(rec.dep_ids + nested)
    refs = [ObjectRef._new(oid, client.address, client) for oid in return_ids]
    if wire_n < 0:
        result = start_generator(
            client, rec, wire_n, opts._generator_backpressure_num_objects, refs[0]
        )
        client.submitter.submit(rec)
        return result
    client.submitter.submit(rec)
    if n == 1:
        return refs[0]
    if n == 0:
        return None
    return refs


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
        from nbcluster._actor import ActorClass

        return ActorClass(target, _options.actor_options(options, where="decorator"))
    if not callable(target):
        raise TypeError(
            f"@nbcluster.remote needs a function or a class, got {type(target).__name__}"
        )
    if "num_returns" not in options and inspect.isgeneratorfunction(target):
        options = {**options, "num_returns": "streaming"}  # Ray >= 2.8: generators stream
    return RemoteFunction(target, _options.task_options(options, where="decorator"))
