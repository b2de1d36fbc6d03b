"""Running a DAG once: ``execute(dag, args, kwargs)``.

The nodes to run are the output, everything upstream of it, and every call bound on a
ClassNode among them (see ``_class_node``). They run in the order they were made, which is
a topological order in which each actor's calls come in bind order. Each node runs once
and its result (a ref, a handle, or an input value) is kept for this execution only.
"""

from __future__ import annotations

from typing import Any

from nbcluster.dag._dag_node import DAGNode, collect, iter_nodes, substitute
from nbcluster.dag._input_node import DAGInput, InputAttributeNode, InputNode

__all__ = ["execute"]


class Execution:
    """The inputs and results of one ``execute()`` call."""

    def __init__(self, inputs: DAGInput) -> None:
        self.inputs = inputs
        self.results: dict[int, Any] = {}

    def value(self, node: DAGNode) -> Any:
        """What a downstream node receives for ``node``."""
        result = self.results[id(node)]
        return result.single() if isinstance(result, DAGInput) else result

    def arguments(self, node: DAGNode) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """``node``'s bound arguments with upstream nodes replaced by their results."""
        args = list(node._args)
        for i in node._dynamic_args:
            args[i] = substitute(args[i], self.value)
        kwargs = dict(node._kwargs)
        for k in node._dynamic_kwargs:
            kwargs[k] = substitute(kwargs[k], self.value)
        return tuple(args), kwargs


def _check_inputs(nodes: list[DAGNode], output: DAGNode, inputs: DAGInput) -> None:
    """Refuse bad ``execute()`` arguments before anything is submitted."""
    roots = [n for n in nodes if isinstance(n, InputNode)]
    if len(roots) > 1:
        raise ValueError(
            f"this DAG uses {len(roots)} different InputNodes ({', '.join(map(repr, roots))}); "
            "a DAG has one InputNode. Bind every input inside one 'with InputNode() as inp:'."
        )
    if not roots:
        if inputs.args or inputs.kwargs:
            raise TypeError(
                f"{inputs.describe()}: this DAG has no InputNode, so execute() takes no "
                "arguments. Bind 'with InputNode() as inp:' to give it inputs."
            )
        return
    root = roots[0]
    if not root._entered:
        raise ValueError(
            f"{root!r} was never entered: create it with 'with InputNode() as inp:' and "
            "bind inside the block"
        )
    direct = output is root or any(
        not isinstance(n, InputAttributeNode)
        and any(u is root for a in (*n._args, *n._kwargs.values()) for u in iter_nodes(a))
        for n in nodes
    )
    if direct:
        inputs.single()  # raises unless there is exactly one positional argument


def execute(output: DAGNode, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Submit every node of the DAG that ends at ``output``; return ``output``'s result."""
    nodes = collect(output)
    ctx = Execution(DAGInput(args, kwargs))
    _check_inputs(nodes, output, ctx.inputs)
    # Inputs first: reading them can fail, and then nothing has been submitted.
    local = [n for n in nodes if n._input_root() is not None]
    remote = [n for n in nodes if n._input_root() is None]
    for node in (*local, *remote):
        try:
            ctx.results[id(node)] = node._run(ctx)
        except Exception as e:
            e.add_note(f"(while executing DAG node {node!r})")
            raise
    return ctx.value(output)
