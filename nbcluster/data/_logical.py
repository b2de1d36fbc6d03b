"""The logical plan: what a dataset computes, as a graph of operators (no execution).

Every ``Dataset`` method that transforms data returns a new dataset whose plan is the old
one plus one operator. The optimizer (``_optimizer.py``) rewrites this graph and turns it
into physical operators. What the plan can say without running anything — the schema
after projections, the row count through row-preserving operators — comes from
:func:`known_schema` and :func:`known_count`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import pyarrow as pa

from nbcluster._refs import ObjectRef
from nbcluster.data._block import BlockMetadata
from nbcluster.data._datasource import ReadTask
from nbcluster.data._transform import ProjectStage, Stage
from nbcluster.data.compute import ComputeStrategy, TaskPoolStrategy

__all__ = [
    "AllToAll",
    "InputData",
    "Limit",
    "LogicalOp",
    "MapLike",
    "Read",
    "RefBundle",
    "Union",
    "known_count",
    "known_schema",
    "walk",
]


@dataclasses.dataclass(frozen=True)
class RefBundle:
    """A block in the object store and its metadata."""

    block: ObjectRef
    meta: BlockMetadata


@dataclasses.dataclass(eq=False)
class LogicalOp:
    """A node of the logical plan."""

    inputs: tuple[LogicalOp, ...]

    @property
    def name(self) -> str:
        """How the operator is shown (``MapBatches(fn)``, ``ReadParquet``...)."""
        return type(self).__name__

    def with_inputs(self, *inputs: LogicalOp) -> LogicalOp:
        """A copy with other inputs (used by optimizer rules)."""
        return dataclasses.replace(self, inputs=tuple(inputs))


@dataclasses.dataclass(eq=False)
class InputData(LogicalOp):
    """Blocks already in the object store (``from_items``, ``materialize()``...)."""

    bundles: list[RefBundle] = dataclasses.field(default_factory=list)
    label: str = "InputData"

    @property
    def name(self) -> str:
        """``FromItems``, ``FromPandas``..."""
        return self.label


@dataclasses.dataclass(eq=False)
class Read(LogicalOp):
    """Read tasks planned from files (or generated, for ``range``).

    ``replan(columns, filter)`` plans the tasks again after the optimizer pushed a
    projection or a filter into the read (None when the source cannot take them).
    """

    tasks: list[ReadTask] = dataclasses.field(default_factory=list)
    schema: pa.Schema | None = None
    label: str = "Read"
    replan: Callable[[list[str] | None, Any], tuple[list[ReadTask], pa.Schema]] | None = None
    columns: list[str] | None = None
    filter: Any = None
    remote_args: dict[str, Any] = dataclasses.field(default_factory=dict)
    concurrency: int | None = None
    pushed_limit: int | None = None

    @property
    def name(self) -> str:
        """``ReadParquet``, ``ReadRange``... with what was pushed into it."""
        pushed = []
        if self.columns is not None:
            pushed.append("columns=" + ",".join(self.columns))
        if self.filter is not None:
            pushed.append(f"filter={self.filter}")
        return self.label + (f"[{'; '.join(pushed)}]" if pushed else "")


@dataclasses.dataclass(eq=False)
class MapLike(LogicalOp):
    """A per-block operator (``map``, ``map_batches``, ``filter``, projections...).

    ``preserves_rows``: one output row per input row (a limit may move before it, and
    the row count is known through it). ``min_rows``: bundle inputs to this many rows.
    """

    stage: Stage = dataclasses.field(default_factory=lambda: ProjectStage())
    compute: ComputeStrategy = dataclasses.field(default_factory=TaskPoolStrategy)
    remote_args: dict[str, Any] = dataclasses.field(default_factory=dict)
    preserves_rows: bool = False
    min_rows: int = 0

    @property
    def name(self) -> str:
        """The stage's name."""
        return self.stage.name


@dataclasses.dataclass(eq=False)
class Limit(LogicalOp):
    """The first ``n`` rows."""

    n: int = 0

    @property
    def name(self) -> str:
        """``Limit[n]``."""
        return f"Limit[{self.n}]"


@dataclasses.dataclass(eq=False)
class AllToAll(LogicalOp):
    """An operator that needs all its input: shuffle, sort, aggregate, repartition, zip.

    ``kind`` selects the implementation in ``_all_to_all.py``; ``params`` are its
    arguments. ``preserves_rows``: the row count is unchanged (everything but aggregates).
    """

    kind: str = ""
    params: dict[str, Any] = dataclasses.field(default_factory=dict)
    preserves_rows: bool = True
    label: str = ""

    @property
    def name(self) -> str:
        """``Sort``, ``RandomShuffle``..."""
        return self.label or self.kind


@dataclasses.dataclass(eq=False)
class Union(LogicalOp):
    """The rows of every input, one after the other."""


def walk(op: LogicalOp) -> list[LogicalOp]:
    """Operators of the plan ending at ``op``, inputs before their consumers."""
    order: list[LogicalOp] = []
    seen: set[int] = set()

    def visit(node: LogicalOp) -> None:
        if id(node) in seen:
            return
        seen.add(id(node))
        for i in node.inputs:
            visit(i)
        order.append(node)

    visit(op)
    return order


def known_schema(op: LogicalOp) -> pa.Schema | None:
    """The schema at ``op`` if it is known without running anything."""
    if isinstance(op, InputData):
        schemas = [b.meta.schema for b in op.bundles if b.meta.schema is not None]
        nonempty = [s for s in schemas if len(s.names)]
        return nonempty[0] if nonempty else (schemas[0] if schemas else None)
    if isinstance(op, Read):
        return op.schema
    if isinstance(op, MapLike):
        if isinstance(op.stage, ProjectStage):
            inner = known_schema(op.inputs[0])
            if inner is None:
                return None
            try:
                return op.stage.project(inner.empty_table()).schema
            except KeyError:
                return None
        return None
    if isinstance(op, Limit):
        return known_schema(op.inputs[0])
    if isinstance(op, AllToAll):
        if op.kind in ("aggregate", "map_groups", "zip"):
            return None
        return known_schema(op.inputs[0])
    if isinstance(op, Union):
        return known_schema(op.inputs[0])
    return None


def known_count(op: LogicalOp) -> int | None:
    """The number of rows at ``op`` if it is known without running anything."""
    if isinstance(op, InputData):
        return sum(b.meta.num_rows for b in op.bundles)
    if isinstance(op, Read):
        rows = [t.num_rows for t in op.tasks]
        return None if any(r is None for r in rows) else sum(rows)  # type: ignore[misc]
    if isinstance(op, MapLike):
        return known_count(op.inputs[0]) if op.preserves_rows else None
    if isinstance(op, Limit):
        inner = known_count(op.inputs[0])
        return None if inner is None else min(inner, op.n)
    if isinstance(op, AllToAll):
        if op.kind == "zip":
            counts = [known_count(i) for i in op.inputs]
            return None if any(c is None for c in counts) else counts[0]
        return known_count(op.inputs[0]) if op.preserves_rows else None
    if isinstance(op, Union):
        counts = [known_count(i) for i in op.inputs]
        return None if any(c is None for c in counts) else sum(c for c in counts if c)
    return None
