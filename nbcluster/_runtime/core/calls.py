"""Submitting work as the owner: a task, an actor creation, an actor call.

The API layer has validated the call (options, arity) and exported nothing yet; here the
arguments are serialized (top-level refs become placeholders, large values go to the
store), the runtime records and protobuf specs are built, and the work is handed to the
submitters or registered with the head. :class:`~nbcluster._runtime.core.driver.CoreDriver`
calls these functions; they were in ``_remote.py`` and ``_actor.py``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from nbcluster._runtime import exceptions as exc
from nbcluster._runtime.core.args import ArgPlaceholder
from nbcluster._runtime.core.client import CoreClient
from nbcluster._runtime.core.generators import registry, wire_num_returns
from nbcluster._runtime.core.submitter import TaskRecord
from nbcluster._runtime.driver import ActorRecord, FunctionDescriptor
from nbcluster._runtime.options import ActorOptions, TaskOptions
from nbcluster._runtime.protocol.rpc import pb
from nbcluster._runtime.ref_generators import start_generator
from nbcluster._runtime.refs import ObjectRef
from nbcluster._runtime.runtime_env import driver as runtime_env_driver
from nbcluster._runtime.scheduling.policy import pg_request
from nbcluster._runtime.serialization import SerializedValue, deserialize, serialize

__all__ = [
    "call_actor",
    "create_actor",
    "put_serialized",
    "resolve_strategy",
    "serialize_call_args",
    "submit_task",
]

Route = tuple[Any, ...]


def build_spec(
    client: CoreClient,
    *,
    task_id: bytes,
    function_id: bytes,
    name: str,
    args_blob: bytes,
    num_returns: int,
    max_calls: int,
    retry_exceptions: Any,
) -> pb.TaskSpec:
    """The wire spec of a task (resolved args are filled in when dependencies are ready)."""
    retry_blob = b""
    if retry_exceptions:
        retry_blob = serialize(retry_exceptions).to_bytes()
    return pb.TaskSpec(
        task_id=task_id,
        job_id=client.job_id,
        function_id=function_id,
        function_name=name,
        args=args_blob,
        num_returns=num_returns,
        owner_address=client.address,
        retry_exceptions=retry_blob,
        max_calls=max_calls,
        parent_task_id=client.current_task_id,
        namespace=client.namespace,
    )


def put_serialized(client: CoreClient, sv: SerializedValue) -> ObjectRef:
    """Store an already serialized value as a new object owned by ``client``."""
    oid, _ = client.put_serialized(sv)
    return ObjectRef._new(oid, client.address, client)


def resolve_strategy(
    client: CoreClient, shape: dict[str, float], strategy: Any
) -> tuple[dict[str, float], str, Route | None]:
    """(resource shape, key string, route) for a task's scheduling strategy.

    Strategy objects are known by their ``_nbcluster_strategy`` tag (``NODE_AFFINITY`` or
    ``PLACEMENT_GROUP``; the classes live in ``nbcluster.util.scheduling_strategies``).
    """
    if _inherits_capture(client, strategy):
        assert client.current_pg is not None
        pg_id = client.current_pg[0]  # captured by the parent task's placement group
        return pg_request(shape, pg_id.hex(), -1), f"PG:{pg_id.hex()}:-1", ("pg", pg_id, -1)
    if isinstance(strategy, str):
        return shape, strategy, ("spread",) if strategy == "SPREAD" else None
    kind = getattr(strategy, "_nbcluster_strategy", None)
    if kind == "NODE_AFFINITY":
        node_id = bytes.fromhex(strategy.node_id)
        return (
            shape,
            f"NODE:{strategy.node_id}:{int(strategy.soft)}",
            ("node", node_id, strategy.soft),
        )
    if kind == "PLACEMENT_GROUP":
        pg = strategy.placement_group
        idx = strategy.placement_group_bundle_index
        return pg_request(shape, pg.id.hex(), idx), f"PG:{pg.id.hex()}:{idx}", ("pg", pg.id, idx)
    raise TypeError(f"unsupported scheduling strategy {strategy!r}")


def _inherits_capture(client: CoreClient, strategy: Any) -> bool:
    return strategy == "DEFAULT" and client.current_pg is not None and client.current_pg[1]


def _captures(strategy: Any) -> bool:
    return bool(getattr(strategy, "placement_group_capture_child_tasks", False))


def _explain_unserializable_args(name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """Raise a SerializationError naming the argument (and path inside it) that fails."""
    for i, a in enumerate(args):
        serialize(a, what="an argument", name=f"{name}.remote() argument {i}")
    for k, v in kwargs.items():
        serialize(v, what="an argument", name=f"{name}.remote() argument {k}")


def _queue_key(
    opts: TaskOptions, shape: dict[str, float], strategy: str, route: Route | None, env: str
) -> tuple[Any, ...]:
    """The key of the lease queue a task waits in: tasks with equal keys share leases.

    Kept on the options for their common case (the options' own shape, not a placement
    group's), so that a burst of calls builds it once, not once per call.
    """
    own_shape = route is None or route[0] == "spread"
    if own_shape:
        cached = opts.__dict__.get("_queue_key")
        if cached is not None and cached[0] == strategy and cached[1] == env:
            return cached[2]
    key = (tuple(sorted(shape.items())), strategy, opts.max_calls > 0, env)
    if own_shape:
        opts.__dict__["_queue_key"] = (strategy, env, key)  # options are frozen: per options
    return key


_FIRST_RETURN = (1).to_bytes(4, "big")


def _return_ids(task_id: bytes, wire_num_returns: int) -> tuple[bytes, ...]:
    """The ids of a task's returns (one for a generator's end-of-stream marker).

    Tuples, and ``()`` for no refs in :func:`_ids`: a task's records are kept while its refs
    live, and each list among them would be one more container for the garbage collector to
    walk (tuples of bytes it stops walking at its first pass).
    """
    if wire_num_returns <= 1:
        return (task_id + _FIRST_RETURN,)
    return tuple([task_id + i.to_bytes(4, "big") for i in range(1, wire_num_returns + 1)])


def _ids(refs: Sequence[Any]) -> tuple[bytes, ...]:
    return tuple([r.binary() for r in refs]) if refs else ()


def _has_ref(values: Any) -> bool:
    # A loop, not any(): a generator costs more than the check itself here.
    for v in values:  # noqa: SIM110
        if isinstance(v, ObjectRef):
            return True
    return False


def serialize_call_args(
    client: CoreClient, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[SerializedValue, list[ObjectRef]]:
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

    # Most calls pass no refs: keep their arguments as they are (no copies, no closures).
    args2 = tuple(swap(a) for a in args) if _has_ref(args) else args
    kwargs2 = {k: swap(v) for k, v in kwargs.items()} if _has_ref(kwargs.values()) else kwargs
    try:
        sv = serialize((args2, kwargs2))
    except exc.SerializationError:
        _explain_unserializable_args(name, args2, kwargs2)
        raise
    limit = client.config.max_inline_bytes
    if sv.total_size > limit:
        # Large arguments travel through the object store, not inside the spec.
        def big(v: Any) -> Any:
            if isinstance(v, ArgPlaceholder):
                return v
            one = serialize(v)
            if one.total_size > limit // 2:
                return swap(put_serialized(client, one))
            return v

        args2 = tuple(big(a) for a in args2)
        kwargs2 = {k: big(v) for k, v in kwargs2.items()}
        sv = serialize((args2, kwargs2))
    return sv, dep_refs


def submit_task(
    client: CoreClient,
    function: FunctionDescriptor,
    opts: TaskOptions,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> Any:
    """Serialize the arguments, record the task as owned, and hand it to the submitter."""
    name = function.name
    client.export(function.function_id, function.payload, name)
    client.submitter.check_capacity()  # nothing is recorded for a task refused here
    sv, dep_refs = serialize_call_args(client, name, args, kwargs)
    nested = _ids(sv.contained_refs)
    task_id = client.next_task_id()
    n = opts.num_returns
    wire_n = wire_num_returns(n)  # generators: "streaming"/"dynamic" travel as -1/-2
    return_ids = _return_ids(task_id, wire_n)
    rec = TaskRecord()
    rec.task_id = task_id
    rec.name = name
    rec.spec = build_spec(
        client,
        task_id=task_id,
        function_id=function.function_id,
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
    observer = client.task_observer
    if observer is not None:
        observer(task_id, name, rec.context)
    # runtime_env (issue 17): workers are pooled per environment, so it is part of the key
    rec.spec.runtime_env = runtime_env_driver.for_submit(client, opts.runtime_env, rec.context)
    rec.key = _queue_key(opts, shape, strategy, route, rec.spec.runtime_env)
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
    rec.dep_ids = _ids(dep_refs)
    rec.nested_ids = nested
    for oid in return_ids:
        client.table.create_owned(oid, task=rec, refs=1)
    if rec.dep_ids or nested:
        client.table.add_submitted(rec.dep_ids + nested)
    refs = [ObjectRef._adopt(oid, client.address, client) for oid in return_ids]
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


def create_actor(
    client: CoreClient,
    cls: FunctionDescriptor,
    opts: ActorOptions,
    methods: dict[str, Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    creation: tuple[Any, ...] | None = None,
) -> ActorRecord:
    """Register an actor with the head (its ``__init__`` runs in its own worker)."""
    name = cls.name
    client.export(cls.function_id, cls.payload, name)
    is_async = any(m["is_async"] for m in methods.values())
    namespace = opts.namespace if opts.namespace is not None else client.namespace
    # Arguments: top-level refs are resolved now (waiting for them), like task arguments.
    dep_refs = [a for a in (*args, *kwargs.values()) if isinstance(a, ObjectRef)]
    if dep_refs:
        entries = client.ensure_tracked(dep_refs)
        client.wait_entries(entries, len(entries), None)
    idx = iter(range(len(dep_refs)))

    def swap(v: Any) -> Any:
        return ArgPlaceholder(next(idx)) if isinstance(v, ObjectRef) else v

    args2 = tuple(swap(a) for a in args)
    kwargs2 = {k: swap(v) for k, v in kwargs.items()}
    sv = serialize((args2, kwargs2), what="an actor constructor argument", name=f"{name}.remote()")
    # Refs inside the arguments (and the argument objects) live as long as this process.
    client.table.mark_escaped([r.binary() for r in (*dep_refs, *sv.contained_refs)])
    actor_id = client.next_task_id()
    spec = build_spec(
        client,
        task_id=actor_id,
        function_id=cls.function_id,
        name=name,
        args_blob=sv.to_bytes(),
        num_returns=0,
        max_calls=0,
        retry_exceptions=False,
    )
    spec.actor_id = actor_id
    spec.actor_creation = True
    spec.is_async = is_async
    spec.max_concurrency = opts.max_concurrency or 0
    spec.concurrency_groups.update(opts.concurrency_groups or {})
    spec.namespace = namespace
    spec.runtime_env = runtime_env_driver.for_submit(  # issue 17: the actor's environment
        client, opts.runtime_env, client.submit_context() if client.submit_context else None
    )
    for ref, entry in zip(dep_refs, client.ensure_tracked(dep_refs), strict=True):
        client.value_of(ref.binary(), entry)  # raises the argument's error, if any
        spec.resolved_args.add(
            object_id=ref.binary(),
            data=entry.data if not entry.in_store else b"",
            in_store=entry.in_store,
            size=entry.size,
            node_id=entry.node_id,
            node_address=entry.node_address,
            owner_address=entry.owner,
        )
    # issue 13: what `%cluster restart-actors` needs to make it again on new code (its
    # argument refs already live as long as this process: mark_escaped above)
    if creation is not None:
        client.actor_creations[actor_id] = (*creation, namespace, opts.lifetime)
    meta = {
        "class_name": name,
        "methods": methods,
        "max_task_retries": opts.max_task_retries,
        "max_pending_calls": opts.max_pending_calls,
        "function_id": cls.function_id,
        "concurrency_groups": dict(opts.concurrency_groups or {}),
    }
    resources, strategy, route = resolve_strategy(
        client, opts.resource_shape(), opts.scheduling_strategy
    )
    if (
        route is not None
        and route[0] == "pg"
        and (
            _captures(opts.scheduling_strategy)
            or _inherits_capture(client, opts.scheduling_strategy)
        )
    ):
        spec.capture_pg = route[1]
    if route is not None and route[0] == "node":
        strategy = f"NODE_AFFINITY:{route[1].hex()}:{int(route[2])}"
    elif route is not None and route[0] == "pg":
        strategy = "DEFAULT"  # the renamed resources only exist where the bundle is
    request = pb.RegisterActorRequest(
        spec=spec,
        resources=resources,
        name=opts.name or "",
        namespace=namespace,
        detached=opts.lifetime == "detached",
        get_if_exists=opts.get_if_exists,
        max_restarts=opts.max_restarts,
        class_name=name,
        preferred_node=client.node_address,
        strategy=strategy,
        handle_meta=serialize(meta).to_bytes(),
    )
    reply = client.call_head("RegisterActor", lambda head: head.RegisterActor(request, timeout=60))
    info = reply.actor
    owned = not reply.existing and not request.detached
    if not reply.existing and info.state == pb.ActorInfo.PENDING:
        client.actor_submitter.registered(info.actor_id, info.version)
    return ActorRecord(info.actor_id, deserialize(info.handle_meta), owned)


def call_actor(
    client: CoreClient,
    actor: ActorRecord,
    name: str,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    num_returns: int | str,
    backpressure: int,
    call_options: dict[str, Any],
) -> Any:
    """Queue one call on an actor; its ref(s), ``None`` or a generator."""
    meta = actor.meta
    concurrency_group = call_options.get("concurrency_group")
    enable_task_events = call_options.get("enable_task_events")
    method_opts = meta["methods"].get(name, {})
    sv, dep_refs = serialize_call_args(client, name, args, kwargs)
    task_id = client.next_task_id()
    wire_n = wire_num_returns(num_returns)  # generators: -1 streaming, -2 dynamic
    return_ids = _return_ids(task_id, wire_n)
    rec = TaskRecord()
    rec.task_id = task_id
    rec.name = f"{meta['class_name']}.{name}"
    rec.spec = build_spec(
        client,
        task_id=task_id,
        function_id=b"",
        name=name,
        args_blob=sv.to_bytes(),
        num_returns=wire_n,
        max_calls=0,
        retry_exceptions=False,
    )
    rec.spec.actor_id = actor.actor_id
    rec.spec.concurrency_group = concurrency_group or method_opts.get("concurrency_group") or ""
    if enable_task_events is None:
        enable_task_events = method_opts.get("enable_task_events", True)
    rec.spec.disable_task_events = not enable_task_events
    rec.actor = True
    rec.key = None
    rec.resources = {}
    rec.strategy = "DEFAULT"
    rec.return_ids = return_ids
    rec.retries_left = method_opts.get("max_task_retries", meta.get("max_task_retries", 0))
    rec.dep_ids = _ids(dep_refs)
    rec.nested_ids = _ids(sv.contained_refs)
    if client.submit_context is not None:
        rec.context = client.submit_context()
    observer = client.task_observer
    if observer is not None:
        observer(task_id, rec.name, rec.context)
    for oid in return_ids:
        client.table.create_owned(oid, task=rec, refs=1)
    if rec.dep_ids or rec.nested_ids:
        client.table.add_submitted(rec.dep_ids + rec.nested_ids)
    refs = [ObjectRef._adopt(oid, client.address, client) for oid in return_ids]
    generator = None
    if wire_n < 0:
        generator = start_generator(client, rec, wire_n, backpressure, refs[0])
    try:
        client.actor_submitter.submit(rec, meta.get("max_pending_calls", -1))
    except exc.PendingCallsLimitExceeded:
        for oid in return_ids:
            client.table.entries.pop(oid, None)
        client.table.remove_submitted(rec.dep_ids + rec.nested_ids)
        for r in refs:
            r._client = None
        if generator is not None:
            registry(client).pop(task_id, None)
        raise
    if generator is not None:
        return generator
    if num_returns == 1:
        return refs[0]
    if num_returns == 0:
        return None
    return refs
