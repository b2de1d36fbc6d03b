"""Lazy task graphs (Ray's ``ray.dag``): build with ``.bind()``, run with ``.execute()``.

``f.bind(...)``, ``Cls.bind(...)`` and ``actor.method.bind(...)`` (on a ClassNode or a
live handle) build nodes instead of submitting work; the arguments may be constants or
other nodes. Nothing runs until ``dag.execute(*args, **kwargs)``::

    with InputNode() as inp:
        counter = Counter.bind()
        counter.inc.bind(inp.step)          # its result is never used; it still runs
        dag = MultiOutputNode([double.bind(inp[0]), counter.get.bind()])
    refs = dag.execute(21, step=2)          # [ref, ref]; nbcluster.get(refs) == [42, 2]

Semantics (one ``execute`` call):

- every node runs once, however many nodes use it; upstream results are passed to
  downstream tasks as refs, so the driver never waits;
- each :class:`ClassNode` creates one new actor, then every method call bound on that
  ClassNode is submitted in the order it was bound, including calls whose result nothing
  uses, so each call runs after the calls bound before it on that actor. (Ray chains each
  call to the previous one and runs a chain up to the last call the output needs; here a
  ClassNode is an actor with a script of calls, and the whole script runs whenever the
  actor is created);
- calls bound on a live handle run when the output needs them, in bind order;
- :class:`InputNode` values come from ``execute``'s arguments (see its docstring).

``print(dag)`` shows the nested structure, ``dag.to_dict()`` the nodes and edges, and a
notebook draws the graph. :class:`nbcluster.jupyter.widgets.DAGView` shows the tasks of
an execution live: pass it the refs ``execute`` returned.

``dag.experimental_compile()`` compiles a graph of calls on live actors: set up once,
each ``execute`` then costs a channel write and read (see :mod:`nbcluster.dag.compiled`).
"""

from nbcluster.dag import _display, _execute, _format
from nbcluster.dag._class_node import ClassMethodNode, ClassNode
from nbcluster.dag._dag_node import DAGNode, GraphTools, install_tools
from nbcluster.dag._function_node import FunctionNode
from nbcluster.dag._input_node import InputAttributeNode, InputNode
from nbcluster.dag._output_node import MultiOutputNode
from nbcluster.dag.compiled import compile_dag

# The node classes sit below the modules that run, draw and compile graphs of them.
install_tools(
    GraphTools(
        execute=_execute.execute,
        to_dict=_format.to_dict,
        nested=_format.nested,
        listing=_format.listing,
        to_html=_display.to_html,
        to_figure=_display.to_figure,
        compile=compile_dag,
    )
)

__all__ = [
    "ClassMethodNode",
    "ClassNode",
    "DAGNode",
    "FunctionNode",
    "InputAttributeNode",
    "InputNode",
    "MultiOutputNode",
]
