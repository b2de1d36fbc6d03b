"""The optimizer: logical rewrite rules, then fusion into physical operators.

Rules (each a pure function from a plan to a plan, applied until nothing changes):

- **limit pushdown**: a ``Limit`` moves before operators that keep one output row per
  input row (``map``, projections, ``add_column``), and into reads: read tasks past the
  limit are dropped (when their row counts are known) and each one stops after ``limit``
  rows (parquet stops decoding there); two limits become one.
- **projection pushdown**: ``select_columns``/``drop_columns`` right after
  ``read_parquet`` become the read's ``columns`` (only those columns are read).
- **filter pushdown**: ``filter(expr=...)`` right after ``read_parquet`` becomes the
  read's ``filter``: row groups whose statistics rule it out are never read.

Then :func:`to_physical` fuses chains of map-like operators into one physical operator
(one task per bundle runs all of them): a read with the task maps after it, consecutive
task maps with the same resources, and a read or task maps before an actor-pool map (they
run in the actors). Everything here is pure and unit-tested without processes.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import pyarrow.compute as pc

from nbcluster.data._datasource import ReadTask
from nbcluster.data._expr import parse_expression
from nbcluster.data._logical import (
    AllToAll,
    InputData,
    Limit,
    LogicalOp,
    MapLike,
    Read,
    RefBundle,
    Union,
    walk,
)
from nbcluster.data._transform import (
    FilterStage,
    PartialAggregateStage,
    ProjectStage,
    ShuffleMapStage,
    Stage,
)
from nbcluster.data.compute import ActorPoolStrategy, ComputeStrategy, TaskPoolStrategy

__all__ = ["PhysicalOp", "explain", "optimize", "to_physical"]


# --------------------------------------------------------------------------- rules


def _rewrite(op: LogicalOp, rule: Any) -> tuple[LogicalOp, bool]:
    """Apply ``rule`` bottom-up once; return the new plan and whether anything changed."""
    changed = False
    new_inputs = []
    for i in op.inputs:
        ni, c = _rewrite(i, rule)
        changed |= c
        new_inputs.append(ni)
    if changed:
        op = op.with_inputs(*new_inputs)
    new = rule(op)
    if new is not None:
        return new, True
    return op, changed


def push_limit(op: LogicalOp) -> LogicalOp | None:
    """Move ``Limit`` before row-preserving maps; merge limits; trim known-size reads."""
    if not isinstance(op, Limit):
        return None
    child = op.inputs[0]
    if isinstance(child, Limit):
        return Limit(child.inputs, n=min(op.n, child.n))
    if (
        isinstance(child, MapLike)
        and child.preserves_rows
        and not isinstance(child.compute, ActorPoolStrategy)
    ):
        return child.with_inputs(Limit(child.inputs, n=op.n))
    if isinstance(child, Read) and (child.pushed_limit is None or op.n < child.pushed_limit):
        kept = _trim_tasks(child.tasks, op.n)
        tasks = [t.with_limit(op.n) for t in (kept if kept is not None else child.tasks)]
        read = dataclasses.replace(child, tasks=tasks, pushed_limit=op.n)
        return Limit((read,), n=op.n)
    return None


def _trim_tasks(tasks: list[ReadTask], n: int) -> list[ReadTask] | None:
    rows = 0
    for i, t in enumerate(tasks):
        if t.num_rows is None:
            return None
        rows += t.num_rows
        if rows >= n:
            return tasks[: i + 1]
    return tasks


def push_projection(op: LogicalOp) -> LogicalOp | None:
    """``select_columns``/``drop_columns`` after a parquet read become its ``columns``."""
    if not (isinstance(op, MapLike) and isinstance(op.stage, ProjectStage)):
        return None
    child = op.inputs[0]
    if not isinstance(child, Read) or child.replan is None or child.schema is None:
        return None
    stage = op.stage
    if stage.select is not None:
        columns = list(stage.select)
    elif stage.drop is not None:
        columns = [c for c in child.schema.names if c not in stage.drop]
    else:
        return None
    if any(c not in child.schema.names for c in columns):
        return None  # let the projection raise its clear error at run time
    tasks, schema = child.replan(columns, child.filter)
    return dataclasses.replace(child, tasks=tasks, schema=schema, columns=columns)


def push_filter(op: LogicalOp) -> LogicalOp | None:
    """``filter(expr=...)`` after a parquet read becomes the read's row-group filter."""
    if not (isinstance(op, MapLike) and isinstance(op.stage, FilterStage)):
        return None
    if op.stage.expr is None:
        return None
    child = op.inputs[0]
    if not isinstance(child, Read) or child.replan is None:
        return None
    expr = op.stage.expr if child.filter is None else (child.filter & op.stage.expr)
    tasks, schema = child.replan(child.columns, expr)
    return dataclasses.replace(child, tasks=tasks, schema=schema, filter=expr)


#: Rule groups, each applied until the plan stops changing. Filters and projections go
#: into reads first: a limit pushed below a projection would keep it away from the read.
RULE_GROUPS = ((push_filter, push_projection), (push_limit,))


def optimize(op: LogicalOp) -> LogicalOp:
    """Apply the rule groups in turn, each until the plan stops changing."""
    for rules in RULE_GROUPS:
        for _ in range(100):
            changed = False
            for rule in rules:
                op, c = _rewrite(op, rule)
                changed |= c
            if not changed:
                break
    return op


# --------------------------------------------------------------------------- physical


@dataclasses.dataclass
class PhysicalOp:
    """One operator the executor runs (see ``_scheduler.OpSpec`` for ``kind``)."""

    name: str
    kind: str
    inputs: tuple[int, ...] = ()
    stages: list[Stage] = dataclasses.field(default_factory=list)
    read_tasks: list[ReadTask] | None = None
    bundles: list[RefBundle] | None = None
    compute: ComputeStrategy = dataclasses.field(default_factory=TaskPoolStrategy)
    remote_args: dict[str, Any] = dataclasses.field(default_factory=dict)
    min_rows: int = 0
    limit: int | None = None
    all_to_all: AllToAll | None = None
    logical: list[str] = dataclasses.field(default_factory=list)

    @property
    def uses_actors(self) -> bool:
        """True for an actor-pool map."""
        return isinstance(self.compute, ActorPoolStrategy)

    @property
    def cpus(self) -> float:
        """CPUs per task or per actor."""
        return float(self.remote_args.get("num_cpus", 1.0))


def _same_resources(a: dict[str, Any], b: dict[str, Any]) -> bool:
    keys = ("num_cpus", "num_gpus", "resources", "memory", "scheduling_strategy")
    return all(a.get(k) == b.get(k) for k in keys)


def _fusible(prev: PhysicalOp, op: MapLike) -> bool:
    if prev.kind not in ("source", "map") or prev.bundles is not None:
        return False
    if prev.uses_actors:
        return False
    if isinstance(op.compute, ActorPoolStrategy):
        # Reads and task maps before a pool run inside its actors (as Ray fuses
        # ReadFiles->MapBatches(Class)): blocks go through the store once, and the pool
        # is not capped to leave CPUs for separate read tasks.
        return _same_resources(prev.remote_args, op.remote_args)
    if not _same_resources(prev.remote_args, op.remote_args):
        return False
    return not (op.min_rows and prev.kind == "map" and not prev.stages)


def to_physical(root: LogicalOp) -> list[PhysicalOp]:
    """Fuse the (optimized) logical plan into physical operators, in topological order."""
    ops: list[PhysicalOp] = []

    def build(op: LogicalOp) -> int:
        if isinstance(op, InputData):
            ops.append(PhysicalOp(op.name, "source", bundles=list(op.bundles), logical=[op.name]))
            return len(ops) - 1
        if isinstance(op, Read):
            size = op.concurrency
            ops.append(
                PhysicalOp(
                    op.name,
                    "source",
                    read_tasks=list(op.tasks),
                    compute=TaskPoolStrategy(size=size),
                    remote_args=dict(op.remote_args),
                    logical=[op.name],
                )
            )
            return len(ops) - 1
        inputs = tuple(build(i) for i in op.inputs)
        if isinstance(op, MapLike):
            prev = ops[inputs[0]]
            if _fusible(prev, op) and inputs[0] == len(ops) - 1:
                prev.stages.append(op.stage)
                prev.name = f"{prev.name}->{op.name}"
                prev.logical.append(op.name)
                if isinstance(op.compute, ActorPoolStrategy):
                    prev.compute = op.compute
                    prev.remote_args = dict(op.remote_args)
                elif isinstance(op.compute, TaskPoolStrategy) and op.compute.size:
                    old = prev.compute.size if isinstance(prev.compute, TaskPoolStrategy) else None
                    prev.compute = TaskPoolStrategy(
                        size=min(op.compute.size, old or op.compute.size)
                    )
                if prev.kind == "map" and not prev.min_rows:
                    prev.min_rows = op.min_rows
                return inputs[0]
            ops.append(
                PhysicalOp(
                    op.name,
                    "map",
                    inputs,
                    stages=[op.stage],
                    compute=op.compute,
                    remote_args=dict(op.remote_args),
                    min_rows=op.min_rows,
                    logical=[op.name],
                )
            )
            return len(ops) - 1
        if isinstance(op, Limit):
            ops.append(PhysicalOp(op.name, "limit", inputs, limit=op.n, logical=[op.name]))
            return len(ops) - 1
        if isinstance(op, AllToAll):
            if op.kind == "aggregate" and len(inputs) == 1:
                inputs = (
                    _map_side(
                        ops,
                        inputs[0],
                        PartialAggregateStage(list(op.params["keys"]), list(op.params["aggs"])),
                    ),
                )
                op = dataclasses.replace(op, params={**op.params, "partials": True})
            shuffles = op.kind == "random_shuffle" or (
                op.kind == "repartition" and op.params.get("shuffle")
            )
            if shuffles and len(inputs) == 1:
                parts = _shuffle_partitions(ops, inputs[0], op.params.get("num_blocks"))
                if parts is not None:
                    stage = ShuffleMapStage(parts, op.params.get("seed"))
                    inputs = (_map_side(ops, inputs[0], stage),)
                    op = dataclasses.replace(
                        op, params={**op.params, "premapped": True, "partitions": parts}
                    )
            ops.append(PhysicalOp(op.name, "barrier", inputs, all_to_all=op, logical=[op.name]))
            return len(ops) - 1
        if isinstance(op, Union):
            ops.append(PhysicalOp("Union", "union", inputs, logical=["Union"]))
            return len(ops) - 1
        raise TypeError(f"unknown logical operator {type(op).__name__}")

    build(root)
    return ops


#: A shuffle aims at reduce outputs of about this many bytes (as ``_all_to_all``).
SHUFFLE_PARTITION_BYTES = 64 * 1024 * 1024


def _source_estimate(ops: list[PhysicalOp], idx: int) -> tuple[int, int] | None:
    """(blocks, bytes) that operator ``idx`` will produce, from its source's estimates."""
    op = ops[idx]
    while op.kind == "map" and op.inputs:
        op = ops[op.inputs[0]]
    if op.kind != "source":
        return None
    if op.read_tasks is not None:
        return len(op.read_tasks), sum(t.size_bytes or 0 for t in op.read_tasks)
    bundles = op.bundles or []
    return len(bundles), sum(b.meta.size_bytes for b in bundles)


def _shuffle_partitions(ops: list[PhysicalOp], src: int, requested: int | None) -> int | None:
    """How many reducers a shuffle gets, decided before the data exists (None: unknown)."""
    if requested:
        return int(requested)
    est = _source_estimate(ops, src)
    if est is None:
        return None
    blocks, size = est
    by_size = math.ceil(size / SHUFFLE_PARTITION_BYTES) if size else 1
    return max(1, min(max(blocks, 1), max(by_size, min(blocks, 2))))


def _map_side(ops: list[PhysicalOp], src: int, stage: Stage) -> int:
    """Put the map side of an all-to-all (a partial aggregation, a shuffle's partitioning)
    into the operator making its input, or into a map operator of its own: the barrier
    then receives partial states or partitioned blocks, and the work overlaps the reads."""
    prev = ops[src]
    fusible = (
        prev.kind in ("source", "map")
        and prev.bundles is None
        and not prev.uses_actors
        and src == len(ops) - 1
    )
    if fusible:
        prev.stages.append(stage)
        prev.name = f"{prev.name}->{stage.name}"
        prev.logical.append(stage.name)
        return src
    ops.append(PhysicalOp(stage.name, "map", (src,), stages=[stage], logical=[stage.name]))
    return len(ops) - 1


def explain(root: LogicalOp) -> str:
    """The logical plan, the optimized plan and the physical operators, as text."""

    def chain(op: LogicalOp) -> str:
        return " -> ".join(o.name for o in walk(op))

    optimized = optimize(root)
    phys = to_physical(optimized)
    lines = [
        "-------- Logical Plan --------",
        chain(root),
        "-------- Logical Plan (Optimized) --------",
        chain(optimized),
        "-------- Physical Plan --------",
    ]
    lines += [
        f"{i}: {p.name} [{p.kind}{', actor pool' if p.uses_actors else ''}]"
        for i, p in enumerate(phys)
    ]
    return "\n".join(lines)


def filter_expression(expr: Any) -> Any:
    """A ``filter(expr=...)`` argument as an Arrow expression: a
    ``pyarrow.compute.Expression``, or a string such as ``"x > 5 and y == 'a'"`` (Ray's
    form, parsed by ``_expr.py``, never evaluated)."""
    if isinstance(expr, str):
        return parse_expression(expr)
    if not isinstance(expr, pc.Expression):
        raise TypeError(
            "filter(expr=...) takes a string such as 'x > 5' or a pyarrow.compute.Expression "
            f"such as pc.field('x') > 5, got {type(expr).__name__}"
        )
    return expr
