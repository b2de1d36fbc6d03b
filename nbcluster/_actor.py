"""Actors: ``@remote`` on a class gives an :class:`ActorClass`; ``.remote()`` gives a handle.

An actor is one instance of the class living in its own worker process. Calls from one
caller run in the order they were made. The process that creates an actor owns it: a
non-detached actor ends when the owner's last handle is gone (or the owner exits); a
detached one lives until it is killed.
"""

from __future__ import annotations

import inspect
from typing import Any, Generic, TypeVar

import cloudpickle

from nbcluster import exceptions as exc
from nbcluster import options as _options
from nbcluster._actor_methods import (
    check_call_group,
    check_concurrency_groups,
    method,
    method_meta,
)
from nbcluster._generator import start_generator
from nbcluster._refs import ObjectRef
from nbcluster._remote import _CODE_GENERATION
from nbcluster._runtime import context
from nbcluster._runtime.core.args import ArgPlaceholder
from nbcluster._runtime.core.generators import registry, wire_num_returns
from nbcluster._runtime.core.submitter import TaskRecord, build_spec
from nbcluster._runtime.protocol.errors import Peer, RpcError, to_exception
from nbcluster._runtime.protocol.rpc import pb
from nbcluster._runtime.runtime_env import driver as runtime_env_driver
from nbcluster._runtime.serialization import deserialize, function_hash, serialize

__all__ = ["ActorClass", "ActorHandle", "ActorMethod", "method", "get_actor", "kill"]

C = TypeVar("C")


class ActorClass(Generic[C]):
    """A class whose instances live in the cluster: create one with ``Cls.remote(...)``."""

    def __init__(self, cls: type[C], options: _options.ActorOptions) -> None:
        self._cls = cls
        self._options = options
        self._name = cls.__qualname__
        self._meta = method_meta(cls)
        check_concurrency_groups(self._name, self._meta, options.concurrency_groups)
        self._is_async = any(m["is_async"] for m in self._meta.values())
        self._payload: bytes | None = None
        self._function_id = b""
        self._generation = _CODE_GENERATION[0]
        self.__doc__ = cls.__doc__

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError(
            f"Actors cannot be instantiated directly. Instead of '{self._name}()', "
            f"use '{self._name}.remote()'."
        )

    def __repr__(self) -> str:
        return f"<ActorClass {self._name}>"

    def options(self, **overrides: Any) -> _ActorOptionsWrapper[C]:
        """Override actor options (``name=``, ``lifetime=``, ``num_cpus=``...) for one creation."""
        return _ActorOptionsWrapper(self, self._merged(self._options, overrides))

    def _merged(
        self, opts: _options.ActorOptions, overrides: dict[str, Any]
    ) -> _options.ActorOptions:
        merged = opts.merge(where="options", **overrides)
        if "concurrency_groups" in overrides:  # the methods' groups must still exist
            check_concurrency_groups(self._name, self._meta, merged.concurrency_groups)
        return merged

    def bind(self, *args: Any, **kwargs: Any) -> Any:
        """A lazy :class:`~nbcluster.dag.ClassNode`: an actor created when the DAG executes."""
        from nbcluster.dag import ClassNode

        return ClassNode(
            self, args, kwargs, cls=self._cls, methods=self._meta, options=self._options
        )

    def remote(self, *args: Any, **kwargs: Any) -> ActorHandle:
        """Create the actor (``__init__`` runs in its own worker); return a handle at once."""
        return self._create(args, kwargs, self._options)

    def _check_arity(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        try:
            sig = inspect.signature(self._cls.__init__)
        except (TypeError, ValueError):
            return
        try:
            sig.bind(None, *args, **kwargs)
        except TypeError as e:
            raise TypeError(f"{self._name}.remote(): {e}") from None

    def _export(self, client: Any) -> bytes:
        if self._payload is None or self._generation != _CODE_GENERATION[0]:
            self._generation = _CODE_GENERATION[0]
            try:
                self._payload = cloudpickle.dumps(self._cls)
            except Exception:  # noqa: BLE001 - name the culprit
                serialize(self._cls, what="the actor class", name=self._name)
                raise
            self._function_id = function_hash(self._payload)
        client.export(self._function_id, self._payload, self._name)
        return self._function_id

    def _create(
        self, args: tuple[Any, ...], kwargs: dict[str, Any], opts: _options.ActorOptions
    ) -> ActorHandle:
        from nbcluster import _api

        client = _api._client_or_autoinit()
        check = getattr(opts, "check_creatable", None)
        if check is not None:
            check()
        self._check_arity(args, kwargs)
        if _api._is_client(client):
            return client.create_actor(self._cls, opts, args, kwargs)  # type: ignore[no-any-return]
        fid = self._export(client)
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
        sv = serialize(
            (args2, kwargs2), what="an actor constructor argument", name=f"{self._name}.remote()"
        )
        # Refs inside the arguments (and the argument objects) live as long as this process.
        client.table.mark_escaped([r.binary() for r in (*dep_refs, *sv.contained_refs)])
        actor_id = client.next_task_id()
        spec = build_spec(
            client,
            task_id=actor_id,
            function_id=fid,
            name=self._name,
            args_blob=sv.to_bytes(),
            num_returns=0,
            max_calls=0,
            retry_exceptions=False,
        )
        spec.actor_id = actor_id
        spec.actor_creation = True
        spec.is_async = self._is_async
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
        shape_fn = getattr(opts, "scheduling_resource_shape", None) or opts.resource_shape
        # issue 13: what `%cluster restart-actors` needs to make it again on new code (its
        # argument refs already live as long as this process: mark_escaped above)
        creations = getattr(client, "actor_creations", None)
        if creations is not None:
            creations[actor_id] = (self, args, kwargs, opts.name, namespace, opts.lifetime)
        meta = {
            "class_name": self._name,
            "methods": self._meta,
            "max_task_retries": opts.max_task_retries,
            "max_pending_calls": opts.max_pending_calls,
            "function_id": fid,
            "concurrency_groups": dict(opts.concurrency_groups or {}),
        }
        from nbcluster._remote import resolve_strategy

        resources, strategy, route = resolve_strategy(
            client, opts.resource_shape(), opts.scheduling_strategy
        )
        if route is not None and route[0] == "pg":
            from nbcluster._remote import _captures, _inherits_capture

            if _captures(opts.scheduling_strategy) or _inherits_capture(
                client, opts.scheduling_strategy
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
            class_name=self._name,
            preferred_node=client.node_address,
            strategy=strategy,
            handle_meta=serialize(meta).to_bytes(),
        )
        del shape_fn
        try:
            reply = client.run(lambda: client.head().RegisterActor(request, timeout=60))
        except RpcError as err:
            if err.code().name == "ALREADY_EXISTS":
                raise ValueError(err.details()) from None
            raise to_exception(err, Peer.HEAD, "RegisterActor") from None
        info = reply.actor
        owned = not reply.existing and not request.detached
        return ActorHandle._new(info.actor_id, deserialize(info.handle_meta), client, owned=owned)


class _ActorOptionsWrapper(Generic[C]):
    """``Cls.options(...)``: the same class with some options overridden."""

    def __init__(self, ac: ActorClass[C], options: _options.ActorOptions) -> None:
        self._ac = ac
        self._options = options

    def bind(self, *args: Any, **kwargs: Any) -> Any:
        """A lazy :class:`~nbcluster.dag.ClassNode` with the overridden options."""
        from nbcluster.dag import ClassNode

        ac, opts = self._ac, self._options
        return ClassNode(ac, args, kwargs, cls=ac._cls, methods=ac._meta, options=opts, submit=self)

    def remote(self, *args: Any, **kwargs: Any) -> ActorHandle:
        """Create the actor with the overridden options."""
        return self._ac._create(args, kwargs, self._options)

    def options(self, **overrides: Any) -> _ActorOptionsWrapper[C]:
        """Override more options."""
        return _ActorOptionsWrapper(self._ac, self._ac._merged(self._options, overrides))


class ActorMethod:
    """``handle.method``: call it with ``.remote(...)``."""

    def __init__(
        self,
        handle: ActorHandle,
        name: str,
        num_returns: int | str,
        call_options: dict[str, Any] | None = None,
        backpressure: int = -1,
    ) -> None:
        self._handle = handle
        self._name = name
        self._num_returns = num_returns
        self._call_options = call_options or {}  # concurrency_group, enable_task_events
        self._backpressure = backpressure  # _generator_backpressure_num_objects

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError(
            f"Actor methods cannot be called directly. Instead of '{self._name}()', "
            f"try '{self._name}.remote()'."
        )

    def bind(self, *args: Any, **kwargs: Any) -> Any:
        """A lazy :class:`~nbcluster.dag.ClassMethodNode`: this call, on the live actor."""
        from nbcluster.dag import ClassMethodNode

        h, n, cls_name = self._handle, self._num_returns, self._handle._meta["class_name"]
        return ClassMethodNode(h, self._name, args, kwargs, num_returns=n, class_name=cls_name)

    def remote(self, *args: Any, **kwargs: Any) -> Any:
        """Queue a call on the actor; return its ref(s) at once."""
        return self._handle._call(
            self._name,
            args,
            kwargs,
            self._num_returns,
            backpressure=self._backpressure,
            **self._call_options,
        )

    def options(self, *, num_returns: int | str | None = None, **rest: Any) -> ActorMethod:
        """Override ``num_returns``, ``concurrency_group``, ``enable_task_events`` or
        ``_generator_backpressure_num_objects`` for a call.

        ``concurrency_group`` must be one of the actor's ``concurrency_groups``; a name it
        does not define raises ``ValueError`` here.
        """
        backpressure = rest.pop("_generator_backpressure_num_objects", self._backpressure)
        unknown = sorted(set(rest) - {"concurrency_group", "enable_task_events"})
        if unknown:
            raise ValueError(
                f"invalid option(s) for an actor method: {', '.join(unknown)}; valid: "
                "num_returns, concurrency_group, enable_task_events"
            )
        call_options = dict(self._call_options)
        if "concurrency_group" in rest:
            meta = self._handle._meta
            check_call_group(meta["class_name"], self._name, rest["concurrency_group"], meta)
            call_options["concurrency_group"] = rest["concurrency_group"]
        if "enable_task_events" in rest:
            if not isinstance(rest["enable_task_events"], bool):
                raise TypeError(
                    f"enable_task_events must be True or False, got {rest['enable_task_events']!r}"
                )
            call_options["enable_task_events"] = rest["enable_task_events"]
        n = self._num_returns if num_returns is None else num_returns
        _options.check_num_returns(n)
        _options.check_backpressure(backpressure)
        return ActorMethod(self._handle, self._name, n, call_options, backpressure)

    def __repr__(self) -> str:
        return f"<ActorMethod {self._handle._meta['class_name']}.{self._name}>"


class ActorHandle:
    """A handle to an actor: ``handle.method.remote(...)`` calls it.

    Handles can be passed to tasks and other actors and used there.
    """

    __slots__ = ("_actor_id", "_meta", "_client", "_owned", "__weakref__")

    _actor_id: bytes
    _meta: dict[str, Any]
    _client: Any
    _owned: bool

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise TypeError(
            "ActorHandle cannot be created directly; use Cls.remote() or nbcluster.get_actor()"
        )

    @classmethod
    def _new(
        cls, actor_id: bytes, meta: dict[str, Any], client: Any, *, owned: bool
    ) -> ActorHandle:
        h = object.__new__(cls)
        h._actor_id = actor_id
        h._meta = meta
        h._client = client
        h._owned = owned
        if owned and client is not None:
            client.actor_handles[actor_id] = client.actor_handles.get(actor_id, 0) + 1
        return h

    def __getattr__(self, name: str) -> ActorMethod:
        if name == "__ray_call__":  # Ray's built-in: fn(actor_instance, *args) in the actor
            return ActorMethod(self, name, 1)
        if name.startswith("_") and name not in ("__call__",):
            raise AttributeError(name)  # slots not set yet, or private: never a remote method
        methods = self._meta["methods"]
        if name not in methods:
            raise AttributeError(
                f"actor class {self._meta['class_name']} has no method {name!r}; "
                f"methods: {', '.join(sorted(m for m in methods if not m.startswith('_'))) or 'none'}"
            )
        return ActorMethod(self, name, methods[name]["num_returns"])

    @property
    def actor_id(self) -> str:
        """Hex id of the actor."""
        return self._actor_id.hex()

    def __repr__(self) -> str:
        return f"ActorHandle({self._meta['class_name']}, {self._actor_id.hex()})"

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, str]:
        """Class, state, node and restarts (text and escaped HTML)."""
        import html

        from nbcluster import state

        info = state.actor_info(self)
        text = repr(self)
        if info is None:
            return {"text/plain": text}
        restarts = (
            f"{info['restarts']}/{'∞' if info['max_restarts'] == -1 else info['max_restarts']}"
        )
        text = (
            f"Actor {info['class_name']}{' ' + repr(info['name']) if info['name'] else ''}: "
            f"{info['state']} on node {info['node_id'][:8]} (pid {info['pid']}), restarts {restarts}"
        )
        if info["state"] == "DEAD" and info["death_cause"]:
            text += f"; {info['death_cause']}"
        rows = "".join(
            f"<tr><th style='text-align:left'>{html.escape(k)}</th><td>{html.escape(str(v))}</td></tr>"
            for k, v in [
                ("actor", f"{info['class_name']} {info['name'] or ''}".strip()),
                ("state", info["state"]),
                ("node", info["node_id"][:8]),
                ("pid", info["pid"]),
                ("restarts", restarts),
                ("id", self._actor_id.hex()),
            ]
        )
        return {"text/plain": text, "text/html": f"<table>{rows}</table>"}

    def __hash__(self) -> int:
        return hash(self._actor_id)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ActorHandle) and other._actor_id == self._actor_id

    def __reduce__(self) -> tuple[Any, ...]:
        client = self._client
        if self._owned and client is not None:
            client.escaped_actors.add(self._actor_id)  # lives until the owner exits
        return (_rebuild_handle, (self._actor_id, self._meta))

    def __del__(self) -> None:
        client = getattr(self, "_client", None)  # unset when construction was refused
        if not getattr(self, "_owned", False) or client is None or client.closed:
            return
        try:
            n = client.actor_handles.get(self._actor_id, 0) - 1
            if n > 0:
                client.actor_handles[self._actor_id] = n
                return
            client.actor_handles.pop(self._actor_id, None)
            if self._actor_id not in client.escaped_actors:
                client.actor_submitter.release_when_idle(self._actor_id)
        except Exception:  # noqa: BLE001 - never raise from __del__
            pass

    def _call(
        self,
        name: str,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        num_returns: int | str,
        *,
        backpressure: int = -1,
        concurrency_group: str | None = None,
        enable_task_events: bool | None = None,
    ) -> Any:
        client = self._client or context.require_client()
        call_options = {
            k: v
            for k, v in (
                ("concurrency_group", concurrency_group),
                ("enable_task_events", enable_task_events),
            )
            if v is not None
        }
        if getattr(client, "mode", "") == "client":
            return client.actor_call(self, name, args, kwargs, num_returns, call_options)
        method_opts = self._meta["methods"].get(name, {})
        from nbcluster._remote import serialize_call_args

        sv, dep_refs = serialize_call_args(client, name, args, kwargs)
        task_id = client.next_task_id()
        wire_n = wire_num_returns(num_returns)  # generators: -1 streaming, -2 dynamic
        return_ids = [task_id + i.to_bytes(4, "big") for i in range(1, max(wire_n, 1) + 1)]
        rec = TaskRecord()
        rec.task_id = task_id
        rec.name = f"{self._meta['class_name']}.{name}"
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
        rec.spec.actor_id = self._actor_id
        rec.spec.concurrency_group = concurrency_group or method_opts.get("concurrency_group") or ""
        if enable_task_events is None:
            enable_task_events = method_opts.get("enable_task_events", True)
        rec.spec.disable_task_events = not enable_task_events
        rec.actor = True
        rec.key = None
        rec.resources = {}
        rec.strategy = "DEFAULT"
        rec.return_ids = return_ids
        rec.retries_left = method_opts.get(
            "max_task_retries", self._meta.get("max_task_retries", 0)
        )
        rec.dep_ids = [r.binary() for r in dep_refs]
        rec.nested_ids = [r.binary() for r in sv.contained_refs]
        if client.submit_context is not None:
            rec.context = client.submit_context()
        observer = getattr(client, "task_observer", None)
        if observer is not None:
            observer(task_id, rec.name, rec.context)
        for oid in return_ids:
            client.table.create_owned(oid, task=rec)
        client.table.add_submitted(rec.dep_ids + rec.nested_ids)
        refs = [ObjectRef._new(oid, client.address, client) for oid in return_ids]
        generator = None
        if wire_n < 0:
            generator = start_generator(client, rec, wire_n, backpressure, refs[0])
        try:
            client.actor_submitter.submit(rec, self._meta.get("max_pending_calls", -1))
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


def _rebuild_handle(actor_id: bytes, meta: dict[str, Any]) -> ActorHandle:
    return ActorHandle._new(actor_id, meta, context.current_client(), owned=False)


def get_actor(name: str, namespace: str | None = None) -> ActorHandle:
    """A handle to the live actor named ``name`` (in ``namespace``, default: the job's)."""
    client = context.require_client()
    if getattr(client, "mode", "") == "client":
        return client.call("get_actor", (name, namespace))  # type: ignore[attr-defined, no-any-return]
    ns = namespace if namespace is not None else client.namespace
    try:
        info = client.run(
            lambda: client.head().GetNamedActor(
                pb.NamedActorRequest(name=name, namespace=ns), timeout=10
            )
        )
    except RpcError as err:
        if err.code().name == "NOT_FOUND":
            raise ValueError(
                f"Failed to look up actor with name {name!r} in namespace {ns!r}"
            ) from None
        raise to_exception(err, Peer.HEAD, "GetNamedActor") from None
    return ActorHandle._new(info.actor_id, deserialize(info.handle_meta), client, owned=False)


def kill(actor: ActorHandle, *, no_restart: bool = True) -> None:
    """End an actor now: pending calls fail with ``ActorDiedError``.

    With ``no_restart=False`` an actor with ``max_restarts`` left is restarted.
    """
    if not isinstance(actor, ActorHandle):
        raise TypeError(f"kill() expects an actor handle, got {type(actor).__name__}")
    client = context.require_client()
    if getattr(client, "mode", "") == "client":
        client.call("kill", (actor._actor_id, actor._meta, no_restart))  # type: ignore[attr-defined]
        return
    try:
        client.run(
            lambda: client.head().KillActor(
                pb.KillActorRequest(
                    actor_id=actor._actor_id,
                    no_restart=no_restart,
                    reason="it was killed with nbcluster.kill()",
                    kind="killed",
                ),
                timeout=10,
            )
        )
    except RpcError as err:
        raise to_exception(err, Peer.HEAD, "KillActor") from None
    # Calls made from now on fail at once (on the I/O loop, before any later call is queued):
    # the actor's, and those of the actors it created, which the head ended with it.
    client.actor_submitter.killed(actor._actor_id, no_restart)
