"""``DAGNode``: the base of every node of a lazy graph, and the walk that runs one.

A node holds what to call (its *body*), the arguments it was bound with and its options.
Arguments may be plain values or other nodes, at the top level or inside lists, tuples and
dicts (of exactly those types). Nodes only point upstream, and every node is numbered when
it is made (``_seq``). A node can only be bound to nodes that already exist, so the
numbering is a topological order: running the nodes of a graph by number runs every node
after its inputs, and every actor call after the calls bound before it.
"""

from __future__ import annotations

import dataclasses
import itertools
import reprlib
from collections.abc import Callable, Iterator
from typing import Any, ClassVar

__all__ = ["DAGNode", "Edge", "GraphTools", "install_tools"]

#: ``(upstream node, downstream node, kind)``. Kinds: ``"arg"`` (the upstream's result is an
#: argument), ``"input"`` (an input attribute reads the InputNode), ``"actor"`` (a method
#: call runs on the actor the ClassNode creates), ``"output"`` (an element of a
#: MultiOutputNode), ``"order"`` (two calls on one actor, in the order they were bound).
Edge = tuple["DAGNode", "DAGNode", str]

_seq = itertools.count(1)


@dataclasses.dataclass(frozen=True)
class GraphTools:
    """The functions behind the :class:`DAGNode` methods that know every kind of node.

    They live in the modules above this one (``_execute``, ``_format``, ``_display``,
    ``compiled``), which import :class:`DAGNode` and its subclasses; ``nbcluster.dag``
    installs them with :func:`install_tools` on import, which runs before any node exists
    (every node module is inside that package).
    """

    execute: Callable[[DAGNode, tuple[Any, ...], dict[str, Any]], Any]
    to_dict: Callable[[DAGNode], dict[str, Any]]
    nested: Callable[[DAGNode], str]
    listing: Callable[[DAGNode], str]
    to_html: Callable[[DAGNode], str]
    to_figure: Callable[[DAGNode], Any]
    compile: Callable[..., Any]


_tools: GraphTools | None = None


def install_tools(tools: GraphTools) -> None:
    """Install the functions behind :meth:`DAGNode.execute`, display and compilation."""
    global _tools
    _tools = tools


def _installed() -> GraphTools:
    if _tools is None:  # pragma: no cover - nbcluster.dag installs them on import
        raise RuntimeError("import nbcluster.dag before using a DAG node")
    return _tools


_short = reprlib.Repr()
_short.maxstring = 60
_short.maxother = 60
_short.maxlist = _short.maxtuple = _short.maxdict = _short.maxset = 6
_short.maxlevel = 3


def short_repr(value: object) -> str:
    """A bounded ``repr`` for display (long strings and containers are cut with ``...``)."""
    return _short.repr(value)


# ----------------------------------------------------------------------------- arguments


def iter_nodes(value: object) -> Iterator[DAGNode]:
    """The nodes in ``value``: itself, or inside (nested) lists, tuples and dicts."""
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, DAGNode):
            yield v
        elif type(v) in (list, tuple):
            stack.extend(reversed(v))  # type: ignore[arg-type]
        elif type(v) is dict:
            stack.extend(reversed(list(v.values())))  # type: ignore[attr-defined]


def has_node(value: object) -> bool:
    """Whether ``value`` is a node or holds one in lists, tuples or dicts."""
    return next(iter_nodes(value), None) is not None


def substitute(value: object, resolve: Callable[[DAGNode], Any]) -> Any:
    """``value`` with every node in it replaced by ``resolve(node)`` (containers are copied)."""
    if isinstance(value, DAGNode):
        return resolve(value)
    if type(value) is list:
        return [substitute(v, resolve) for v in value]  # type: ignore[union-attr]
    if type(value) is tuple:
        return tuple(substitute(v, resolve) for v in value)  # type: ignore[union-attr]
    if type(value) is dict:
        return {k: substitute(v, resolve) for k, v in value.items()}  # type: ignore[union-attr]
    return value


def check_bindable(args: tuple[Any, ...], kwargs: dict[str, Any], where: str) -> None:
    """Refuse arguments that cannot be part of a graph, saying what to do instead."""
    for value in (*args, *kwargs.values()):
        for node in iter_nodes(value):
            if node._is_output_marker:
                raise TypeError(
                    f"{where}: a MultiOutputNode cannot be an argument; it only marks the "
                    "outputs of a DAG. Bind the nodes it lists instead."
                )
            root = node._input_root()
            if root is not None and not root._entered:
                raise ValueError(
                    f"{where}: InputNode() is used outside its 'with' block. Create it as a "
                    "context manager and bind inside the block:\n"
                    "    with InputNode() as inp:\n"
                    "        dag = f.bind(inp[0])"
                )


# ----------------------------------------------------------------------------- the base


class DAGNode:
    """A node of a lazy task graph: nothing runs until :meth:`execute`.

    Nodes are made by ``.bind(...)`` on remote functions (:class:`FunctionNode`), actor
    classes (:class:`ClassNode`) and actor methods (:class:`ClassMethodNode`), and by
    :class:`InputNode` and :class:`MultiOutputNode`. ``print(node)`` shows the nested
    structure; :meth:`to_dict` gives nodes and edges for tools; in a notebook a node
    renders as a graph, laid out left to right by depth.

    To watch the tasks of one execution live, pass the refs that :meth:`execute` returned
    to :class:`nbcluster.jupyter.widgets.DAGView`.
    """

    _is_output_marker: ClassVar[bool] = False

    def __init__(self, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None) -> None:
        self._seq = next(_seq)
        self._args = tuple(args)
        self._kwargs = dict(kwargs or {})
        # Which arguments hold nodes, so execute() copies only those.
        self._dynamic_args = tuple(i for i, a in enumerate(self._args) if has_node(a))
        self._dynamic_kwargs = tuple(k for k, v in self._kwargs.items() if has_node(v))

    # -- what subclasses define -------------------------------------------------------------
    def _body(self) -> str:
        """What the node runs, for display: a function, class, method or input key."""
        raise NotImplementedError

    def _run(self, ctx: Any) -> Any:
        """Submit this node's work (its upstream results are in ``ctx``); return the result."""
        raise NotImplementedError

    def _display_options(self) -> dict[str, Any]:
        """The options that differ from the defaults."""
        return {}

    def _extra_upstream(self) -> list[Edge]:
        """Upstream edges that do not come from the arguments (the actor of a method)."""
        return []

    def _implied(self) -> list[DAGNode]:
        """Nodes that run whenever this one runs (a ClassNode's bound method calls)."""
        return []

    def _actor_key(self) -> object:
        """For actor method calls: what identifies their actor (for ``order`` edges)."""
        return None

    def _input_root(self) -> Any:
        """For InputNode and its attributes: the InputNode; None for other nodes."""
        return None

    # -- public helpers ---------------------------------------------------------------------
    def get_id(self) -> str:
        """This node's id: unique in this process, shown by ``print`` and ``to_dict``."""
        return f"n{self._seq}"

    def get_args(self) -> tuple[Any, ...]:
        """The positional arguments the node was bound with (nodes stay nodes)."""
        return self._args

    def get_kwargs(self) -> dict[str, Any]:
        """The keyword arguments the node was bound with (a copy)."""
        return dict(self._kwargs)

    def get_options(self) -> dict[str, Any]:
        """The node's options that differ from the defaults (e.g. ``{"num_cpus": 2}``)."""
        return self._display_options()

    def get_nodes(self) -> list[DAGNode]:
        """Every node that :meth:`execute` runs, in the order it submits them.

        That is this node, everything upstream of it, and every method call bound on a
        :class:`ClassNode` among them (with its own upstream nodes).
        """
        return collect(self)

    def get_edges(self) -> list[Edge]:
        """The edges between :meth:`get_nodes`, as ``(upstream, downstream, kind)``."""
        return graph_edges(collect(self))

    def experimental_compile(
        self,
        _submit_timeout: float | None = None,
        _buffer_size_bytes: int | None = None,
        enable_asyncio: bool = False,
        _max_inflight_executions: int | None = None,
        _max_buffered_results: int | None = None,
        **kwargs: Any,
    ) -> Any:
        """Compile this graph of actor method calls (Ray's compiled graphs).

        The graph is set up once: channels are preallocated (shared memory between
        processes of one host) and each actor starts a loop that runs its calls. The
        returned :class:`~nbcluster.dag.compiled.CompiledDAG`'s ``execute(*args)`` then
        costs a channel write and a read instead of task submissions; ``teardown()`` ends
        the loops. ``_max_inflight_executions`` (default 10) executions may be in flight
        before their results are read; ``_buffer_size_bytes`` is the size of a channel
        slot (larger values still travel, through a file of their own).
        """
        return _installed().compile(
            self,
            _submit_timeout=_submit_timeout,
            _buffer_size_bytes=_buffer_size_bytes,
            enable_asyncio=enable_asyncio,
            _max_inflight_executions=_max_inflight_executions,
            _max_buffered_results=_max_buffered_results,
            **kwargs,
        )

    def execute(self, *args: Any, **kwargs: Any) -> Any:
        """Run the graph that ends at this node; ``args``/``kwargs`` feed its InputNode.

        Returns at once: an ``ObjectRef`` for a function or method node (a list when it
        has ``num_returns > 1``), an ``ActorHandle`` for a :class:`ClassNode`, a list for
        a :class:`MultiOutputNode`. Every node runs once per call, however many nodes
        use it; upstream results travel as refs, and the driver never waits for them.
        """
        return _installed().execute(self, args, kwargs)

    def to_dict(self) -> dict[str, Any]:
        """Nodes and edges for tools (JSON-serialisable).

        ``{"output": id, "nodes": [...], "edges": [...]}``. Nodes come in execution
        order, each with ``id``, ``kind``, ``name``, ``args`` and ``kwargs`` (each item
        ``{"node": id}`` or ``{"value": repr}``, plus ``"nodes": [ids]`` for containers
        holding nodes), ``options`` and ``depth`` (longest path from a source). Edges are
        ``{"source": id, "target": id, "kind": ...}`` (kinds: see :data:`Edge`).
        """
        return _installed().to_dict(self)

    def to_figure(self) -> Any:
        """A static plotly ``Figure`` of the graph, laid out left to right by depth."""
        return _installed().to_figure(self)

    # -- display ----------------------------------------------------------------------------
    def __str__(self) -> str:
        return _installed().nested(self)

    def __repr__(self) -> str:
        kind, body = type(self).__name__, self._body()
        return f"<{kind} {self.get_id()}{'' if body == kind else ' ' + body}>"

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, str]:
        """text/plain (one line per node) and text/html (an SVG drawing of the graph)."""
        tools = _installed()
        return {"text/plain": tools.listing(self), "text/html": tools.to_html(self)}

    # -- misuse -----------------------------------------------------------------------------
    def __getattr__(self, name: str) -> Any:
        if name == "remote":
            raise AttributeError(
                f"{type(self).__name__} has no .remote(): it is a node of a lazy graph. Run "
                "the graph with .execute(...)."
            )
        if name == "bind":
            raise AttributeError(
                f"{type(self).__name__} is already bound; pass it as an argument to another "
                ".bind(...) to build on it"
            )
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def __reduce__(self) -> Any:
        raise TypeError(
            f"{self!r} cannot be pickled or sent to the cluster. bind() replaces nodes that "
            "are arguments, or inside lists, tuples and dicts, with their results; a node "
            "anywhere else (another container, an object's attribute, a closure) stays a "
            "node. Pass it as an argument instead."
        )


# ----------------------------------------------------------------------------- the graph


def upstream_edges(node: DAGNode) -> list[Edge]:
    """Edges into ``node``: from its arguments, then the extra ones (deduplicated)."""
    edges: list[Edge] = []
    seen: set[int] = set()
    for value in (*node._args, *node._kwargs.values()):
        for up in iter_nodes(value):
            if id(up) not in seen:
                seen.add(id(up))
                edges.append((up, node, "output" if node._is_output_marker else "arg"))
    for edge in node._extra_upstream():
        if id(edge[0]) not in seen:
            seen.add(id(edge[0]))
            edges.append(edge)
    return edges


def collect(root: DAGNode) -> list[DAGNode]:
    """``root``, its upstream nodes and the calls implied by them, in execution order."""
    seen: dict[int, DAGNode] = {}
    stack = [root]
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen[id(node)] = node
        stack.extend(up for up, _, _ in upstream_edges(node))
        stack.extend(node._implied())
    return sorted(seen.values(), key=lambda n: n._seq)


def graph_edges(nodes: list[DAGNode]) -> list[Edge]:
    """Every edge among ``nodes`` (which are in execution order), ``order`` edges included."""
    edges: list[Edge] = []
    pairs: set[tuple[int, int]] = set()
    for node in nodes:
        for edge in upstream_edges(node):
            edges.append(edge)
            pairs.add((id(edge[0]), id(node)))
    last_call: dict[object, DAGNode] = {}
    for node in nodes:
        key = node._actor_key()
        if key is None:
            continue
        prev = last_call.get(key)
        if prev is not None and (id(prev), id(node)) not in pairs:
            edges.append((prev, node, "order"))
        last_call[key] = node
    return edges


def depths(nodes: list[DAGNode], edges: list[Edge]) -> dict[int, int]:
    """``id(node)`` -> length of the longest path reaching it (sources are 0)."""
    preds: dict[int, list[DAGNode]] = {}
    for a, b, _ in edges:
        preds.setdefault(id(b), []).append(a)
    depth: dict[int, int] = {}
    for node in nodes:  # execution order is topological
        depth[id(node)] = max((depth[id(p)] + 1 for p in preds.get(id(node), ())), default=0)
    return depth
