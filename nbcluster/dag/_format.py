"""Text forms of a DAG: ``str(node)`` (nested), the one-line-per-node listing, ``to_dict``."""

from __future__ import annotations

from typing import Any

from nbcluster.dag._class_node import ClassMethodNode, ClassNode
from nbcluster.dag._dag_node import (
    DAGNode,
    collect,
    depths,
    graph_edges,
    has_node,
    iter_nodes,
    short_repr,
)
from nbcluster.dag._function_node import FunctionNode
from nbcluster.dag._input_node import InputAttributeNode, InputNode
from nbcluster.dag._output_node import MultiOutputNode

#: Nodes that run something and so have args and options, always shown by ``str()``.
_CALLS = (FunctionNode, ClassNode, ClassMethodNode)

__all__ = ["arg_text", "call_text", "listing", "nested", "option_text", "to_dict"]

_INDENT = "    "
#: ``str(node)`` stops descending below this depth (the rest is in ``to_dict()``).
MAX_NESTING = 40
#: The text/plain listing shows at most this many nodes.
MAX_LISTED = 60


def arg_text(value: object) -> str:
    """An argument for display: a node is its id, containers holding nodes are spelled out."""
    if isinstance(value, DAGNode):
        return value.get_id()
    if not has_node(value):
        return short_repr(value)
    if type(value) is dict:
        inner = ", ".join(f"{k!r}: {arg_text(v)}" for k, v in value.items())  # type: ignore[union-attr]
        return "{" + inner + "}"
    items = [arg_text(v) for v in value]  # type: ignore[union-attr]
    if type(value) is tuple:
        return "(" + ", ".join(items) + ("," if len(items) == 1 else "") + ")"
    return "[" + ", ".join(items) + "]"


def option_text(options: dict[str, Any]) -> str:
    """``{num_cpus: 2, name: 'x'}``."""
    return "{" + ", ".join(f"{k}: {short_repr(v)}" for k, v in options.items()) + "}"


def call_text(node: DAGNode) -> str:
    """The node as a call: ``combine(n4, 2)``, ``n3.inc()``, ``inp[0]``, ``[n4, n5]``."""
    parts = [arg_text(a) for a in node._args]
    parts += [f"{k}={arg_text(v)}" for k, v in node._kwargs.items()]
    joined = ", ".join(parts)
    if isinstance(node, InputNode):
        return "InputNode()"
    if isinstance(node, InputAttributeNode):
        return node._body()
    if isinstance(node, MultiOutputNode):
        return f"[{joined}]"
    if isinstance(node, ClassMethodNode):
        return f"{node._actor_text()}.{node._method}({joined})"
    return f"{node._body()}({joined})"


# ------------------------------------------------------------------------------- nested


def nested(root: DAGNode) -> str:
    """``str(node)``: the node and everything upstream, nested; each node is spelled out
    once, and later mentions of it say ``<shown above>``."""
    lines: list[str] = []
    _nested(root, 0, set(), lines, "")
    return "\n".join(lines)


def _nested(node: DAGNode, level: int, shown: set[int], lines: list[str], prefix: str) -> None:
    pad = _INDENT * level
    head = f"({type(node).__name__} {node.get_id()})"
    if isinstance(node, InputNode):
        lines.append(f"{pad}{prefix}{head}")
        return
    if id(node) in shown:
        lines.append(f"{pad}{prefix}{head} <shown above>")
        return
    shown.add(id(node))
    if level >= MAX_NESTING:
        lines.append(f"{pad}{prefix}{head} <deeper nodes: see to_dict()>")
        return
    lines.append(f"{pad}{prefix}{head}(")
    inner = _INDENT * (level + 1)
    lines.append(f"{inner}body={node._body()}")
    if isinstance(node, ClassMethodNode):
        if isinstance(node._parent, DAGNode):
            _nested(node._parent, level + 1, shown, lines, "actor=")
        else:
            lines.append(f"{inner}actor={short_repr(node._parent)}")
    if isinstance(node, InputAttributeNode):
        _nested(node._input, level + 1, shown, lines, "input=")
    if node._args or isinstance(node, _CALLS):
        _values("args", list(enumerate(node._args)), level + 1, shown, lines)
    if node._kwargs:
        _values("kwargs", list(node._kwargs.items()), level + 1, shown, lines)
    if isinstance(node, _CALLS):
        lines.append(f"{inner}options={option_text(node._display_options())}")
    if isinstance(node, ClassNode):
        lines.append(f"{inner}calls=[{', '.join(c.get_id() for c in node._calls)}]")
    lines.append(f"{pad})")


def _values(
    label: str, items: list[tuple[Any, Any]], level: int, shown: set[int], lines: list[str]
) -> None:
    pad = _INDENT * level
    keyed = label == "kwargs"
    open_, close = ("{", "}") if keyed else ("[", "]")
    if not any(has_node(v) for _, v in items):
        body = ", ".join(f"{k}: {short_repr(v)}" if keyed else short_repr(v) for k, v in items)
        lines.append(f"{pad}{label}={open_}{body}{close}")
        return
    lines.append(f"{pad}{label}={open_}")
    for key, value in items:
        prefix = f"{key}: " if keyed else ""
        if isinstance(value, DAGNode):
            _nested(value, level + 1, shown, lines, prefix)
        elif has_node(value):
            lines.append(f"{pad}{_INDENT}{prefix}{arg_text(value)}")
            for node in iter_nodes(value):
                _nested(node, level + 2, shown, lines, "")
        else:
            lines.append(f"{pad}{_INDENT}{prefix}{short_repr(value)}")
    lines.append(f"{pad}{close}")


# ------------------------------------------------------------------------------ listing


def listing(root: DAGNode) -> str:
    """One line per node, in execution order: ``n5  FunctionNode  combine(n4, 2)``."""
    nodes = collect(root)
    lines = [f"DAG of {len(nodes)} node(s); output {root.get_id()} ({type(root).__name__})"]
    shown = nodes if len(nodes) <= MAX_LISTED else nodes[: MAX_LISTED - 1]
    width = max(len(n.get_id()) for n in shown)
    for node in shown:
        opts = node._display_options()
        extra = f"  options={option_text(opts)}" if opts else ""
        lines.append(
            f"  {node.get_id():<{width}}  {type(node).__name__:<19} {call_text(node)}{extra}"
        )
    if len(shown) < len(nodes):
        lines.append(f"  ... {len(nodes) - len(shown)} more node(s): see to_dict()")
    return "\n".join(lines)


# ------------------------------------------------------------------------------ to_dict


def _jsonable(value: Any) -> Any:
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    return repr(value)


def _arg_entry(value: Any) -> dict[str, Any]:
    if isinstance(value, DAGNode):
        return {"node": value.get_id()}
    if has_node(value):
        return {"value": arg_text(value), "nodes": [n.get_id() for n in iter_nodes(value)]}
    return {"value": short_repr(value)}


def to_dict(root: DAGNode) -> dict[str, Any]:
    """See :meth:`DAGNode.to_dict`."""
    nodes = collect(root)
    edges = graph_edges(nodes)
    depth = depths(nodes, edges)
    out_nodes = []
    for node in nodes:
        entry: dict[str, Any] = {
            "id": node.get_id(),
            "kind": type(node).__name__,
            "name": node._body(),
            "args": [_arg_entry(a) for a in node._args],
            "kwargs": {k: _arg_entry(v) for k, v in node._kwargs.items()},
            "options": _jsonable(node._display_options()),
            "depth": depth[id(node)],
        }
        if isinstance(node, ClassMethodNode):
            parent = node._parent
            entry["actor"] = (
                parent.get_id() if isinstance(parent, DAGNode) else getattr(parent, "actor_id", "")
            )
        if isinstance(node, ClassNode):
            entry["calls"] = [c.get_id() for c in node._calls]
        if isinstance(node, InputAttributeNode):
            entry["key"] = node._key
            entry["accessor"] = node._accessor
        out_nodes.append(entry)
    return {
        "output": root.get_id(),
        "nodes": out_nodes,
        "edges": [
            {"source": a.get_id(), "target": b.get_id(), "kind": kind} for a, b, kind in edges
        ],
    }
