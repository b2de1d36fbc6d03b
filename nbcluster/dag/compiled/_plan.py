"""Compiling a DAG into a plan, without I/O: which actor runs which method calls in which
order, and which channels carry values between processes.

The plan is what every process of the graph needs to know: it is pickled to the actors.
Processes are named by a key: :data:`DRIVER` for the driver, an actor's id for an actor.
Every value that leaves its process gets a channel with one writer and its readers; a
value used by a later call on the same actor is passed in memory. Channel 0 carries the
arguments of ``execute`` from the driver to every actor that reads them.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from nbcluster.dag._class_node import ClassMethodNode, ClassNode
from nbcluster.dag._dag_node import DAGNode, collect, iter_nodes
from nbcluster.dag._function_node import FunctionNode
from nbcluster.dag._input_node import InputAttributeNode, InputNode

__all__ = ["DRIVER", "INPUT_CHANNEL", "Arg", "Channel", "Plan", "Task", "build_plan"]

DRIVER = "driver"
INPUT_CHANNEL = 0


@dataclasses.dataclass(frozen=True)
class Arg:
    """Where an argument of a call comes from.

    ``kind``: ``"const"`` (``value`` is the constant), ``"chan"`` (``value`` is a channel
    id), ``"local"`` (the result of the task ``value`` on the same actor), ``"input"``
    (the one argument of ``execute``) or ``"attr"`` (``value`` is ``(key, accessor,
    shown)``, an ``InputAttributeNode``).
    """

    kind: str
    value: Any = None


@dataclasses.dataclass(frozen=True)
class Task:
    """One method call of the graph, run once per execution by its actor's loop."""

    tid: int
    actor: str
    method: str
    name: str
    args: tuple[Arg, ...]
    kwargs: dict[str, Arg]
    out: int | None  # the channel its result is written to, if another process reads it


@dataclasses.dataclass(frozen=True)
class Channel:
    """A value stream from one process to others: one item per execution."""

    cid: int
    writer: str
    readers: tuple[str, ...]


@dataclasses.dataclass
class Plan:
    """The compiled graph: tasks in execution order, channels, and the outputs."""

    tasks: list[Task]
    channels: list[Channel]
    outputs: list[int]  # the channel of each output, in output order
    multi_output: bool
    input_reads: list[tuple[Any, str, str]]  # (key, accessor, shown) read from the input
    input_direct: bool  # some call takes the InputNode itself
    handles: dict[str, Any] = dataclasses.field(default_factory=dict, repr=False)

    @property
    def actors(self) -> list[str]:
        """The actors' keys, in the order their first task runs."""
        return list(dict.fromkeys(t.actor for t in self.tasks))

    def tasks_of(self, actor: str) -> list[Task]:
        """The tasks ``actor`` runs in each execution, in order."""
        return [t for t in self.tasks if t.actor == actor]

    def reads(self, key: str) -> list[Channel]:
        """The channels process ``key`` reads."""
        return [c for c in self.channels if key in c.readers]

    def writes(self, key: str) -> list[Channel]:
        """The channels process ``key`` writes."""
        return [c for c in self.channels if c.writer == key]

    def for_actor(self) -> Plan:
        """This plan without the driver's actor handles (what is sent to the actors)."""
        return dataclasses.replace(self, handles={})


def _actor_key(handle: Any) -> str:
    key = getattr(handle, "actor_id", None)
    return str(key) if key else f"handle-{id(handle)}"


def _check_node(node: DAGNode) -> None:
    if isinstance(node, FunctionNode):
        raise NotImplementedError(
            f"Compiled DAGs currently only support actor method nodes, but the DAG holds the "
            f"task {node!r}. Run it as a method of an actor, or execute the DAG uncompiled."
        )
    if isinstance(node, ClassNode) or (
        isinstance(node, ClassMethodNode) and isinstance(node._parent, ClassNode)
    ):
        raise ValueError(
            "Compiled DAGs can only bind methods to an actor that is already created with "
            f"Actor.remote(), but {node!r} belongs to a ClassNode (Actor.bind()). Create the "
            "actor first: a = Actor.remote(), then bind a.method.bind(...)."
        )
    if isinstance(node, ClassMethodNode) and node._num_returns != 1:
        raise NotImplementedError(
            f"Compiled DAGs support methods with one return value; {node!r} has "
            f"num_returns={node._num_returns}. Return a tuple instead."
        )


def _arg(
    value: Any,
    task: ClassMethodNode,
    tids: dict[int, int],
    producer: dict[int, ClassMethodNode],
    consumers: dict[int, set[str]],
    reads: dict[tuple[Any, str, str], None],
) -> tuple[Arg, bool]:
    """The :class:`Arg` for one bound argument, and whether it is a graph node."""
    if not isinstance(value, DAGNode):
        if next(iter_nodes(value), None) is not None:
            raise NotImplementedError(
                f"{task!r}: Compiled DAGs take graph nodes only as direct arguments, not "
                "inside lists, tuples or dicts. Pass each node as an argument of its own."
            )
        return Arg("const", value), False
    if isinstance(value, InputNode):
        return Arg("input"), True
    if isinstance(value, InputAttributeNode):
        shown = value._body()
        reads[(value._key, value._accessor, shown)] = None
        return Arg("attr", (value._key, value._accessor, shown)), True
    if isinstance(value, ClassMethodNode):
        up = producer[id(value)]
        actor = _actor_key(task._parent)
        consumers.setdefault(id(up), set()).add(actor)
        if _actor_key(up._parent) == actor:
            return Arg("local", tids[id(up)]), True
        return Arg("chan", id(up)), True  # patched to a channel id below
    raise ValueError(f"{task!r}: unsupported argument {value!r} in a compiled DAG")


def build_plan(root: DAGNode) -> Plan:
    """Check that ``root`` can be compiled and make its :class:`Plan`.

    Raises ``NotImplementedError`` / ``ValueError`` with Ray's messages for what compiled
    graphs do not support: tasks, ``Actor.bind()`` actors, several InputNodes, calls with
    no graph input, nodes nested in containers, ``num_returns != 1``.
    """
    nodes = collect(root)
    for node in nodes:
        _check_node(node)
    inputs = [n for n in nodes if isinstance(n, InputNode)]
    if len(inputs) != 1:
        raise NotImplementedError(
            f"Compiled DAGs currently require exactly one InputNode, found {len(inputs)}. "
            "Bind the first calls to 'with InputNode() as inp:'."
        )
    if root._is_output_marker:
        outputs = list(root._args)
        multi = True
    else:
        outputs = [root]
        multi = False
    for out in outputs:
        if not isinstance(out, ClassMethodNode):
            raise ValueError(
                f"the outputs of a compiled DAG must be actor method calls, got {out!r}"
            )
    calls = [n for n in nodes if isinstance(n, ClassMethodNode)]
    tids = {id(n): i for i, n in enumerate(calls)}
    producer = {id(n): n for n in calls}
    consumers: dict[int, set[str]] = {}
    reads: dict[tuple[Any, str, str], None] = {}
    staged: list[tuple[ClassMethodNode, list[Arg], dict[str, Arg]]] = []
    input_readers: list[str] = []
    direct = False
    for node in calls:
        args: list[Arg] = []
        kwargs: dict[str, Arg] = {}
        has_input = False
        for value in node._args:
            a, is_node = _arg(value, node, tids, producer, consumers, reads)
            args.append(a)
            has_input = has_input or is_node
        for k, value in node._kwargs.items():
            a, is_node = _arg(value, node, tids, producer, consumers, reads)
            kwargs[k] = a
            has_input = has_input or is_node
        if not has_input:
            raise ValueError(
                "Compiled DAGs require each task to take a nbcluster.dag.InputNode or at least "
                f"one other DAGNode as an input. Invalid task node:\n{node!r}"
            )
        used = [a for a in (*args, *kwargs.values()) if a.kind in ("input", "attr")]
        if used:
            input_readers.append(_actor_key(node._parent))
            direct = direct or any(a.kind == "input" for a in used)
        staged.append((node, args, kwargs))
    # Every call is upstream of an output (the graph is collected from the outputs), so
    # every result reaches the driver: a slot is reused only after all its readers read it.
    output_ids = {id(o) for o in outputs}
    channels = [Channel(INPUT_CHANNEL, DRIVER, tuple(dict.fromkeys(input_readers)))]
    out_channel: dict[int, int] = {}
    for node in calls:
        actor = _actor_key(node._parent)
        readers = [a for a in sorted(consumers.get(id(node), ())) if a != actor]
        if id(node) in output_ids:
            readers.append(DRIVER)
        if readers:
            out_channel[id(node)] = len(channels)
            channels.append(Channel(len(channels), actor, tuple(readers)))
    tasks = []
    for node, args, kwargs in staged:

        def patch(a: Arg) -> Arg:
            return Arg("chan", out_channel[a.value]) if a.kind == "chan" else a

        tasks.append(
            Task(
                tid=tids[id(node)],
                actor=_actor_key(node._parent),
                method=node._method,
                name=node._body(),
                args=tuple(patch(a) for a in args),
                kwargs={k: patch(a) for k, a in kwargs.items()},
                out=out_channel.get(id(node)),
            )
        )
    handles = {_actor_key(n._parent): n._parent for n in calls}
    return Plan(
        tasks=tasks,
        channels=channels,
        outputs=[out_channel[id(o)] for o in outputs],
        multi_output=multi,
        input_reads=list(reads),
        input_direct=direct,
        handles=handles,
    )
