"""Actors: ``@remote`` on a class gives an :class:`ActorClass`; ``.remote()`` gives a handle.

An actor is one instance of the class living in its own worker process. Calls from one
caller run in the order they were made. The process that creates an actor owns it: a
non-detached actor ends when the owner's last handle is gone (or the owner exits); a
detached one lives until it is killed.
"""

from __future__ import annotations

import inspect
from typing import Any, Generic, TypeVar

from nbcluster import _api
from nbcluster import options as _options
from nbcluster._actor_methods import (
    check_call_group,
    check_concurrency_groups,
    method,
    method_meta,
)
from nbcluster._exported import CODE_GENERATION
from nbcluster._runtime import context
from nbcluster._runtime.driver import ActorRecord, Driver, FunctionDescriptor
from nbcluster._runtime.serialization import dumps_code, function_hash, serialize

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
        self._descriptor: FunctionDescriptor | None = None
        self._generation = CODE_GENERATION[0]
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

    def _export(self) -> FunctionDescriptor:
        """The class's pickle and hash, made again after the code generation changed."""
        desc = self._descriptor
        if desc is None or self._generation != CODE_GENERATION[0]:
            self._generation = CODE_GENERATION[0]
            try:
                payload = dumps_code(self._cls)
            except Exception:  # noqa: BLE001 - name the culprit
                serialize(self._cls, what="the actor class", name=self._name)
                raise
            desc = self._descriptor = FunctionDescriptor(
                function_hash(payload), self._name, payload
            )
        return desc

    def _create(
        self, args: tuple[Any, ...], kwargs: dict[str, Any], opts: _options.ActorOptions
    ) -> ActorHandle:
        driver = _api._driver_or_autoinit()
        opts.check_creatable()
        self._check_arity(args, kwargs)
        # (self, args, kwargs, name): what `%cluster restart-actors` needs to make it again
        record = driver.create_actor(
            self._export(), opts, self._meta, args, kwargs, (self, args, kwargs, opts.name)
        )
        return ActorHandle._new(record.actor_id, record.meta, driver, owned=record.owned)


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

    __slots__ = ("_actor_id", "_meta", "_record", "_driver", "_owned", "__weakref__")

    _actor_id: bytes
    _meta: dict[str, Any]
    _record: ActorRecord
    _driver: Driver | None
    _owned: bool

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise TypeError(
            "ActorHandle cannot be created directly; use Cls.remote() or nbcluster.get_actor()"
        )

    @classmethod
    def _new(
        cls, actor_id: bytes, meta: dict[str, Any], driver: Driver | None, *, owned: bool
    ) -> ActorHandle:
        h = object.__new__(cls)
        h._actor_id = actor_id
        h._meta = meta
        h._record = ActorRecord(actor_id, meta)
        h._driver = driver
        h._owned = owned
        if owned and driver is not None:
            driver.add_actor_handle(actor_id)
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

        driver = self._driver or context.current_driver()
        info = None if driver is None else driver.actor_state(self._actor_id)
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
        driver = self._driver
        if self._owned and driver is not None:
            driver.actor_escaped(self._actor_id)  # lives until the owner exits
        return (_rebuild_handle, (self._actor_id, self._meta))

    def __del__(self) -> None:
        driver = getattr(self, "_driver", None)  # unset when construction was refused
        if not getattr(self, "_owned", False) or driver is None:
            return
        try:  # noqa: SIM105 - contextlib may be gone at interpreter shutdown
            driver.remove_actor_handle(self._actor_id)
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
        driver = self._driver or context.require_driver()
        call_options = {
            k: v
            for k, v in (
                ("concurrency_group", concurrency_group),
                ("enable_task_events", enable_task_events),
            )
            if v is not None
        }
        return driver.call_actor(
            self._record, name, args, kwargs, num_returns, backpressure, call_options
        )


def _rebuild_handle(actor_id: bytes, meta: dict[str, Any]) -> ActorHandle:
    return ActorHandle._new(actor_id, meta, context.current_driver(), owned=False)


def get_actor(name: str, namespace: str | None = None) -> ActorHandle:
    """A handle to the live actor named ``name`` (in ``namespace``, default: the job's)."""
    driver = context.require_driver()
    record = driver.get_named_actor(name, namespace)
    return ActorHandle._new(record.actor_id, record.meta, driver, owned=False)


def kill(actor: ActorHandle, *, no_restart: bool = True) -> None:
    """End an actor now: pending calls fail with ``ActorDiedError``.

    With ``no_restart=False`` an actor with ``max_restarts`` left is restarted.
    """
    if not isinstance(actor, ActorHandle):
        raise TypeError(f"kill() expects an actor handle, got {type(actor).__name__}")
    context.require_driver().kill_actor(actor._actor_id, no_restart)
