"""``MultiOutputNode``: several outputs of one DAG."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

from nbcluster.dag._dag_node import DAGNode, check_bindable, short_repr

__all__ = ["MultiOutputNode"]


class MultiOutputNode(DAGNode):
    """Marks several nodes as the outputs of a DAG: ``MultiOutputNode([a, b])``.

    ``execute()`` runs everything they need once and returns a list with one result per
    node, in order (refs for function and method nodes, a handle for a ClassNode). It
    cannot be an argument of another node.
    """

    _is_output_marker: ClassVar[bool] = True

    def __init__(self, nodes: Sequence[DAGNode]) -> None:
        if isinstance(nodes, DAGNode) or not isinstance(nodes, list | tuple):
            raise TypeError(
                f"MultiOutputNode takes a list of DAG nodes, got {short_repr(nodes)}; "
                "write MultiOutputNode([a, b])"
            )
        if not nodes:
            raise ValueError("MultiOutputNode needs at least one node, got an empty list")
        for i, node in enumerate(nodes):
            if not isinstance(node, DAGNode):
                raise TypeError(
                    f"MultiOutputNode takes DAG nodes (made with .bind() or InputNode), but "
                    f"item {i} is {short_repr(node)} ({type(node).__name__}). Bind a remote "
                    "function to produce it, or pass constants as arguments of a bind()."
                )
        check_bindable(tuple(nodes), {}, "MultiOutputNode")
        super().__init__(tuple(nodes))

    def _body(self) -> str:
        return "MultiOutputNode"

    def _run(self, ctx: Any) -> list[Any]:
        args, _ = ctx.arguments(self)
        return list(args)
