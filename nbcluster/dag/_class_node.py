"""``ClassNode`` and ``ClassMethodNode``: actors and their method calls in a lazy graph.

A :class:`ClassNode` (``Cls.bind(...)``) is an actor *and the script of calls bound on
it*. Each ``execute()`` that reaches a ClassNode creates a new actor, then submits every
method call bound on that ClassNode, in the order the calls were bound, whether or not
anything uses their results: nodes run in bind order (see ``_dag_node``), and a call bound
on a ClassNode is implied by it. Calls on a live handle (``handle.method.bind(...)``) run
only when the executed DAG reaches them, in bind order among themselves.
"""

from __future__ import annotations

import inspect
from typing import Any

from nbcluster.dag._dag_node import DAGNode, Edge, check_bindable
from nbcluster.dag._function_node import changed_options, check_signature

__all__ = ["ClassMethodNode", "ClassNode"]


class ClassNode(DAGNode):
    """An actor created when the DAG runs: ``Cls.bind(...)`` or ``Cls.options(...).bind(...)``.

    ``class_node.method.bind(...)`` makes a :class:`ClassMethodNode`;
    ``class_node.method.options(num_returns=2).bind(...)`` sets ``num_returns``.
    ``class_node.execute()`` returns the new actor's handle.

    Every execute creates one new actor per ClassNode, then submits every call bound on
    it, in bind order, including calls whose result nothing uses; so a call always runs
    after the calls bound before it on the same ClassNode. The constructor may take
    upstream nodes and inputs (``Cls.bind(inp.size)``); the runtime waits for upstream refs
    of a constructor before it creates the actor. A method whose name is also a DAGNode
    attribute (``execute``, ``to_dict``...) is reached with :meth:`get_method`.
    """

    def __init__(
        self,
        actor_class: Any,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        *,
        cls: type,
        methods: dict[str, dict[str, Any]],
        options: Any = None,
        submit: Any = None,
    ) -> None:
        """Made by ``ActorClass.bind``; ``methods`` is the class's method table and
        ``submit`` what ``.remote()`` is called on (the class or its options wrapper)."""
        self._name = cls.__qualname__
        check_bindable(args, kwargs, f"{self._name}.bind()")
        check_signature(cls.__init__, args, kwargs, f"{self._name}.bind()", method=True)
        super().__init__(args, kwargs)
        self._actor_class = actor_class
        self._cls = cls
        self._submit = submit if submit is not None else actor_class
        self._options = options
        self._calls: list[ClassMethodNode] = []
        self._methods = methods

    def get_method(self, name: str) -> _UnboundMethod:
        """``class_node.<name>``, for a method whose name a DAGNode attribute hides."""
        methods = self.__dict__.get("_methods", {})
        if name not in methods:
            public = sorted(m for m in methods if not m.startswith("_"))
            raise AttributeError(
                f"actor class {self._name} has no method {name!r}; "
                f"methods: {', '.join(public) or 'none'}"
            )
        return _UnboundMethod(self, name, methods[name].get("num_returns", 1))

    def __getattr__(self, name: str) -> Any:
        methods = self.__dict__.get("_methods")
        if methods is None or name.startswith("__"):
            return super().__getattr__(name)
        if name in methods:
            return self.get_method(name)
        if name in ("remote", "bind") or name.startswith("_"):
            return super().__getattr__(name)
        return self.get_method(name)  # raises, listing the methods

    def _body(self) -> str:
        return self._name

    def _display_options(self) -> dict[str, Any]:
        return changed_options(self._options)

    def _implied(self) -> list[DAGNode]:
        return list(self._calls)

    def _run(self, ctx: Any) -> Any:
        args, kwargs = ctx.arguments(self)
        return self._submit.remote(*args, **kwargs)


class _UnboundMethod:
    """``class_node.method``: bind it to make a call node."""

    def __init__(self, class_node: ClassNode, name: str, num_returns: int) -> None:
        self._class_node = class_node
        self._name = name
        self._num_returns = num_returns

    def bind(self, *args: Any, **kwargs: Any) -> ClassMethodNode:
        """A call of this method on the ClassNode's actor, after the calls bound before it."""
        return ClassMethodNode(
            self._class_node, self._name, args, kwargs, num_returns=self._num_returns
        )

    def options(self, *, num_returns: int | None = None, **rest: Any) -> _UnboundMethod:
        """Override ``num_returns`` for the calls bound through the returned object."""
        if rest:
            raise ValueError(
                f"invalid option(s) for an actor method: {', '.join(rest)}; valid: num_returns"
            )
        n = self._num_returns if num_returns is None else num_returns
        return _UnboundMethod(self._class_node, self._name, n)

    def remote(self, *args: Any, **kwargs: Any) -> Any:
        """Not available: a ClassNode's actor exists only while its DAG executes."""
        raise TypeError(
            f"{self!r} belongs to a ClassNode, whose actor exists only while the DAG "
            f"executes. Use '.{self._name}.bind(...)' and run the DAG with .execute()."
        )

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError(
            f"Actor methods cannot be called directly. Use '.{self._name}.bind(...)' to add "
            "the call to the DAG."
        )

    def __repr__(self) -> str:
        return f"<unbound method {self._class_node._name}.{self._name} of {self._class_node!r}>"


class ClassMethodNode(DAGNode):
    """An actor method call in a DAG: ``class_node.method.bind(...)`` or, on a live actor,
    ``handle.method.bind(...)``.

    On a :class:`ClassNode` it runs on the actor that node creates in the same execute,
    after every call bound earlier on it (see ClassNode). On a live handle it runs on
    that actor each time the DAG is executed, after the calls on that actor that the same
    execute submits and that were bound earlier. Gives an ``ObjectRef`` (a list when
    ``num_returns > 1``).
    """

    def __init__(
        self,
        parent: Any,
        method_name: str,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        *,
        num_returns: int = 1,
        class_name: str | None = None,
    ) -> None:
        """Made by ``class_node.method.bind`` and ``ActorMethod.bind``: ``parent`` is the
        :class:`ClassNode` or the live ``ActorHandle``."""
        if isinstance(parent, ClassNode):
            class_name = parent._name
        self._class_name = class_name or type(parent).__name__
        self._method = method_name
        where = f"{self._class_name}.{method_name}.bind()"
        check_bindable(args, kwargs, where)
        if isinstance(parent, ClassNode):
            _check_method_signature(parent._cls, method_name, args, kwargs, where)
        if not isinstance(num_returns, int) or isinstance(num_returns, bool) or num_returns < 0:
            raise ValueError(f"num_returns must be an integer >= 0, got {num_returns!r}")
        super().__init__(args, kwargs)
        self._parent = parent
        self._num_returns = num_returns
        if isinstance(parent, ClassNode):
            parent._calls.append(self)

    def _body(self) -> str:
        return f"{self._class_name}.{self._method}"

    def _display_options(self) -> dict[str, Any]:
        return {} if self._num_returns == 1 else {"num_returns": self._num_returns}

    def _extra_upstream(self) -> list[Edge]:
        if isinstance(self._parent, ClassNode):
            return [(self._parent, self, "actor")]
        return []

    def _actor_key(self) -> object:
        if isinstance(self._parent, ClassNode):
            return self._parent
        return ("handle", getattr(self._parent, "actor_id", id(self._parent)))

    def _actor_text(self) -> str:
        """The actor, for display: the ClassNode's id, or the live actor's id."""
        if isinstance(self._parent, ClassNode):
            return self._parent.get_id()
        return f"actor({str(getattr(self._parent, 'actor_id', '?'))[:8]})"

    def _run(self, ctx: Any) -> Any:
        parent = self._parent
        handle = ctx.results[id(parent)] if isinstance(parent, ClassNode) else parent
        args, kwargs = ctx.arguments(self)
        method = getattr(handle, self._method).options(num_returns=self._num_returns)
        return method.remote(*args, **kwargs)


def _check_method_signature(
    cls: type, name: str, args: tuple[Any, ...], kwargs: dict[str, Any], where: str
) -> None:
    raw = inspect.getattr_static(cls, name, None)
    attr = getattr(cls, name, None)
    if attr is None:
        return
    plain = not isinstance(raw, staticmethod | classmethod)
    check_signature(attr, args, kwargs, where, method=plain)
