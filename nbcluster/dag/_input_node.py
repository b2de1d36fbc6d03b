"""``InputNode`` and ``InputAttributeNode``: where the arguments of ``execute()`` enter a graph."""

from __future__ import annotations

from typing import Any

from nbcluster.dag._dag_node import DAGNode, Edge, short_repr

__all__ = ["InputAttributeNode", "InputNode"]


class DAGInput:
    """The arguments of one ``execute(*args, **kwargs)`` call, as the InputNode's result."""

    __slots__ = ("args", "kwargs")

    def __init__(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        self.args = args
        self.kwargs = kwargs

    def is_single(self) -> bool:
        """Exactly one positional argument and no keywords: the input is that value."""
        return len(self.args) == 1 and not self.kwargs

    def describe(self) -> str:
        """The call's arguments, for error messages."""
        parts = [short_repr(a) for a in self.args]
        parts += [f"{k}={short_repr(v)}" for k, v in self.kwargs.items()]
        return f"execute({', '.join(parts)})"

    def single(self) -> Any:
        """The value a node bound to the InputNode itself receives."""
        if not self.is_single():
            raise TypeError(
                f"{self.describe()}: the DAG passes the InputNode itself to a node, so "
                "execute() takes exactly one positional argument and no keywords. To pass "
                "several values, bind inp[0], inp[1], inp.name or inp['name'] instead."
            )
        return self.args[0]

    def lookup(self, key: int | str, accessor: str, shown: str) -> Any:
        """``inp[key]`` or ``inp.key`` for this call (Ray's rules, see InputAttributeNode)."""
        if self.is_single():
            value = self.args[0]
            try:
                return getattr(value, key) if accessor == "attr" else value[key]  # type: ignore[arg-type]
            except (AttributeError, LookupError, TypeError) as e:
                raise TypeError(
                    f"{self.describe()}: the DAG reads {shown}, and with one positional "
                    f"argument {shown} is looked up in that value, which failed: "
                    f"{type(e).__name__}: {e}. Pass the inputs as separate arguments "
                    "(execute(a, b, name=c)) to read them by position or name."
                ) from None
        if isinstance(key, int):
            if -len(self.args) <= key < len(self.args):
                return self.args[key]
            raise TypeError(
                f"{self.describe()}: the DAG reads {shown}, but execute() got only "
                f"{len(self.args)} positional argument(s)"
            )
        if key in self.kwargs:
            return self.kwargs[key]
        raise TypeError(
            f"{self.describe()}: the DAG reads {shown}, but execute() got no keyword "
            f"argument {key!r}"
        )


class InputNode(DAGNode):
    """The input of a DAG: stands for the arguments given to ``dag.execute(...)``.

    Use it as a context manager and bind inside the block::

        with InputNode() as inp:
            dag = combine.bind(f.bind(inp[0]), g.bind(inp.scale))
        dag.execute(3, scale=2)

    Bound as it is (``f.bind(inp)``) it is the one positional argument of ``execute``.
    ``inp[i]``, ``inp["name"]`` and ``inp.name`` make :class:`InputAttributeNode` s, which
    follow Ray: with exactly one positional argument and no keywords, they index into (or
    take the attribute of) that value, so ``execute([2, 3])`` and ``execute({"x": 1})``
    work; otherwise ``inp[i]`` is the i-th positional argument and ``inp["name"]`` /
    ``inp.name`` the keyword argument ``name``. A DAG has at most one InputNode.
    Attribute names that DAGNode itself defines (``inp.execute``...) need ``inp["..."]``.
    """

    def __init__(self) -> None:
        super().__init__()
        self._entered = False
        self._attributes: dict[tuple[str, int | str], InputAttributeNode] = {}

    def __enter__(self) -> InputNode:
        self._entered = True
        return self

    def __exit__(self, *exc_info: object) -> None:
        # Like Ray, the node stays usable after the block: a DAG built in a cell can be
        # extended in the next one.
        return None

    def __getitem__(self, key: int | str) -> InputAttributeNode:
        if isinstance(key, bool) or not isinstance(key, int | str):
            raise TypeError(
                f"DAG inputs are read with an int index or a str key, got {short_repr(key)} "
                f"({type(key).__name__})"
            )
        return self._attribute("item", key)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            return super().__getattr__(name)
        return self._attribute("attr", name)

    def _attribute(self, accessor: str, key: int | str) -> InputAttributeNode:
        node = self._attributes.get((accessor, key))
        if node is None:
            node = self._attributes[(accessor, key)] = InputAttributeNode(self, key, accessor)
        return node

    def _body(self) -> str:
        return "InputNode"

    def _input_root(self) -> InputNode:
        return self

    def _run(self, ctx: Any) -> DAGInput:
        return ctx.inputs


class InputAttributeNode(DAGNode):
    """One part of the DAG input: ``inp[0]``, ``inp["key"]`` or ``inp.key`` (see InputNode)."""

    def __init__(self, input_node: InputNode, key: int | str, accessor: str) -> None:
        super().__init__()
        self._input = input_node
        self._key = key
        self._accessor = accessor

    def _body(self) -> str:
        return f"inp.{self._key}" if self._accessor == "attr" else f"inp[{self._key!r}]"

    def _extra_upstream(self) -> list[Edge]:
        return [(self._input, self, "input")]

    def _input_root(self) -> InputNode:
        return self._input

    def _run(self, ctx: Any) -> Any:
        return ctx.inputs.lookup(self._key, self._accessor, self._body())
