"""The streaming executor's decisions, as a state machine with no I/O.

The executor (``_executor.py``) feeds this machine events — a source has blocks or read
tasks, a task finished with outputs of such sizes, the consumer took a block, an actor
died — and asks it :meth:`StreamingState.decide` what to do next. The answer is a list of
instructions (:class:`Dispatch`, :class:`StartActor`, :class:`StopActor`,
:class:`RunBarrier`, :class:`Emit`, :class:`CancelUpstream`). The machine only sees ids,
row counts and byte counts, never refs or data, so it is unit-tested without processes
(``tests/data/unit_scheduler_test.py``).

**Operators** are a chain (or a tree, for ``union``) in topological order. Each has an
input queue, tasks running, and outputs. Kinds:

- ``source``: read tasks (or ready blocks) to start; no input queue.
- ``map``: tasks (or calls on an actor pool) over bundles of input blocks.
- ``limit``: passes blocks until it has ``limit`` rows, slices the last one with a task,
  then cancels everything upstream.
- ``barrier``: an all-to-all operator (shuffle, sort, groupby, repartition, zip) that
  waits for all its input, then runs its tasks at once.
- ``union``: forwards the blocks of several inputs, no tasks.

**Backpressure.** An operator's *usage* is the bytes of its outputs that nobody has
consumed yet (waiting in the downstream input queue, in a reorder buffer, or in the
consumer's queue) plus the estimated outputs of its running tasks. The execution's total
is the sum of usages plus the inputs pinned by running tasks. A task starts only if both
the operator's usage and the total stay within their budgets after adding its estimated
output (the total budget is a fraction of the object store, from ``DataContext``; each
operator's budget is an equal share of it, at least two task outputs). One exception
keeps the pipeline live: an operator with nothing running and nothing queued downstream
may always start one task. Operators are tried from the most downstream up, so data
drains before more is read. When an operator could run but does not, :attr:`OpState.held`
says which limit holds it (shown by the progress widget and the plan graph).
"""

from __future__ import annotations

import dataclasses
import math
from collections import deque
from collections.abc import Sequence

__all__ = [
    "BundleInfo",
    "CancelUpstream",
    "Dispatch",
    "Emit",
    "OpSpec",
    "OpState",
    "RunBarrier",
    "StartActor",
    "StopActor",
    "StreamingState",
]

Instruction = object
#: ``_blocked``'s answer when an operator has nothing left to start.
_IDLE = "idle"


@dataclasses.dataclass(frozen=True)
class BundleInfo:
    """A block as the machine sees it: an id, rows and bytes."""

    id: int
    rows: int
    size: int


@dataclasses.dataclass(frozen=True)
class OpSpec:
    """The static description of an operator.

    ``inputs``: indices of upstream operators. ``max_concurrency``: most tasks at once
    (None: as many as the CPUs allow). ``cpus``: CPUs per task (or per actor).
    ``actor_pool``: ``(min, max)`` actors, or None for tasks. ``min_rows``: bundle inputs
    until this many rows (map_batches' ``batch_size``). ``limit``: rows, for ``limit`` ops.
    """

    name: str
    kind: str
    inputs: tuple[int, ...] = ()
    max_concurrency: int | None = None
    cpus: float = 1.0
    actor_pool: tuple[int, int] | None = None
    min_rows: int = 0
    limit: int | None = None
    output_ratio: float = 1.0


@dataclasses.dataclass(frozen=True)
class Dispatch:
    """Start a task of ``op`` on ``inputs`` (bundle ids; for sources: one read-task index).

    ``actor`` is the pool actor to call (None for a task). ``slice_rows``: for ``limit``
    ops, the task keeps only this many rows of its input.
    """

    op: int
    task: int
    inputs: tuple[int, ...]
    actor: int | None = None
    slice_rows: int | None = None


@dataclasses.dataclass(frozen=True)
class StartActor:
    """Create actor ``actor`` in the pool of ``op``."""

    op: int
    actor: int


@dataclasses.dataclass(frozen=True)
class StopActor:
    """Kill actor ``actor`` of the pool of ``op``."""

    op: int
    actor: int


@dataclasses.dataclass(frozen=True)
class RunBarrier:
    """All input of barrier ``op`` is here: run its all-to-all on ``inputs``."""

    op: int
    inputs: tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class Emit:
    """Hand output bundle ``bundle`` of the last operator to the consumer."""

    bundle: int


@dataclasses.dataclass(frozen=True)
class CancelUpstream:
    """A limit has all its rows: cancel the tasks of ``ops`` and drop their queues."""

    ops: tuple[int, ...]


@dataclasses.dataclass
class _Task:
    id: int
    inputs: tuple[BundleInfo, ...]
    in_bytes: int  # bytes of input blocks this task pins in the store
    est_out: int
    actor: int | None
    seq: int
    est_in: int = 0  # input size for the output/input ratio (a read task's estimate)


@dataclasses.dataclass
class OpState:
    """The dynamic state of one operator (read by the progress display)."""

    spec: OpSpec
    queue: deque[BundleInfo] = dataclasses.field(default_factory=deque)
    sources_left: deque[tuple[int, int, int]] = dataclasses.field(default_factory=deque)
    running: dict[int, _Task] = dataclasses.field(default_factory=dict)
    inputs_done: bool = False
    done: bool = False
    cancelled: bool = False
    barrier_started: bool = False
    #: Bytes of outputs not yet consumed downstream (the operator's share of the budget).
    out_bytes: int = 0
    rows_out: int = 0
    blocks_out: int = 0
    bytes_out_total: int = 0
    bytes_in_total: int = 0
    tasks_done: int = 0
    rows_left: int | None = None
    held: str = ""
    actors: dict[int, int] = dataclasses.field(default_factory=dict)  # actor -> calls in flight
    next_seq: int = 0
    next_emit_seq: int = 0
    reorder: dict[int, list[BundleInfo]] = dataclasses.field(default_factory=dict)
    #: First input (bundle id, or read-task index) of a lost task -> its output position.
    retry_seq: dict[int, int] = dataclasses.field(default_factory=dict)

    @property
    def running_out_est(self) -> int:
        """Estimated bytes the running tasks will produce."""
        return sum(t.est_out for t in self.running.values())

    @property
    def usage(self) -> int:
        """Outputs not consumed yet plus the estimated outputs of running tasks."""
        return self.out_bytes + self.running_out_est

    @property
    def queued_bytes(self) -> int:
        """Bytes waiting in the input queue."""
        return sum(b.size for b in self.queue)

    def ratio(self) -> float:
        """Output bytes per input byte so far (the spec's guess before any task ended)."""
        if self.bytes_in_total > 0 and self.tasks_done:
            return max(self.bytes_out_total / self.bytes_in_total, 0.01)
        return self.spec.output_ratio


class StreamingState:
    """Operators, budgets and the decisions of one execution (see the module docstring).

    ``ops``: the operators in topological order; the last one's outputs go to the
    consumer. ``cpu_limit``: CPUs the execution may use at once. ``budget``: bytes in
    flight allowed in total. ``preserve_order``: forward outputs in the order tasks
    started. ``max_in_flight_per_actor``: calls queued on one pool actor.
    ``scale_up_ratio``: a pool grows when more than this many bundles wait per actor.
    """

    def __init__(
        self,
        ops: Sequence[OpSpec],
        *,
        cpu_limit: float,
        budget: int,
        preserve_order: bool = False,
        max_in_flight_per_actor: int = 2,
        scale_up_ratio: float = 1.0,
    ) -> None:
        if not ops:
            raise ValueError("an execution needs at least one operator")
        self.ops = [OpState(spec) for spec in ops]
        for i, op in enumerate(self.ops):
            for j in op.spec.inputs:
                if not 0 <= j < i:
                    raise ValueError(f"operator {i} ({op.spec.name}) has input {j} out of order")
            if op.spec.kind == "limit":
                op.rows_left = op.spec.limit or 0
        self.downstream: dict[int, int] = {}
        for i, op in enumerate(self.ops):
            for j in op.spec.inputs:
                self.downstream[j] = i
        self.cpu_limit = max(float(cpu_limit), 1.0)
        self.budget = max(int(budget), 1)
        self.preserve_order = preserve_order
        self.max_in_flight_per_actor = max(int(max_in_flight_per_actor), 1)
        self.scale_up_ratio = scale_up_ratio
        self._next_task = 0
        self._next_actor = 0
        self._sizes: dict[int, tuple[int, int]] = {}  # bundle id -> (producing op, bytes)
        self.consumer: deque[BundleInfo] = deque()
        self._stopped_actors: list[StopActor] = []
        self._cancel: list[CancelUpstream] = []
        for i, op in enumerate(self.ops):
            if op.spec.kind == "limit" and op.rows_left == 0:
                self._finish_limit(i)

    # ------------------------------------------------------------------ events in
    def add_source_tasks(self, op: int, tasks: Sequence[tuple[int, int]]) -> None:
        """Source ``op`` has these read tasks to run: ``(estimated rows, estimated bytes)``."""
        st = self.ops[op]
        for i, (rows, size) in enumerate(tasks):
            st.sources_left.append((i, rows, size))
        st.inputs_done = True
        self._check_done(op)

    def add_source_bundles(self, op: int, bundles: Sequence[BundleInfo]) -> None:
        """Source ``op`` has these blocks ready (already in the store).

        They do not count against the budget: the dataset holds them whatever the
        execution does, so holding them back would only slow it down.
        """
        st = self.ops[op]
        st.inputs_done = True
        for b in bundles:
            self._output(op, [b], st.next_seq, counted=False)
            st.next_seq += 1
        self._check_done(op)

    def task_finished(self, op: int, task: int, outputs: Sequence[BundleInfo]) -> None:
        """Task ``task`` of ``op`` ended with ``outputs`` (in order)."""
        st = self.ops[op]
        t = st.running.pop(task, None)
        if t is None:
            return  # cancelled meanwhile
        for b in t.inputs:
            self._sizes.pop(b.id, None)
        if t.actor is not None and t.actor in st.actors:
            st.actors[t.actor] -= 1
        st.tasks_done += 1
        st.bytes_in_total += t.est_in
        st.bytes_out_total += sum(b.size for b in outputs)
        if st.cancelled:
            return
        self._output(op, list(outputs), t.seq)
        self._check_done(op)

    def task_lost(self, op: int, task: int) -> None:
        """Task ``task`` of ``op`` was lost with its actor: run its inputs again."""
        st = self.ops[op]
        t = st.running.pop(task, None)
        if t is None:
            return
        if t.actor is not None and t.actor in st.actors:
            st.actors[t.actor] -= 1
        # The re-run takes the lost task's place in the output order.
        st.retry_seq[t.inputs[0].id] = t.seq
        if st.spec.kind == "source":
            st.sources_left.appendleft((t.inputs[0].id, t.inputs[0].rows, t.inputs[0].size))
            return
        for b in reversed(t.inputs):
            st.queue.appendleft(b)

    def actor_died(self, op: int, actor: int) -> None:
        """Actor ``actor`` of ``op`` died (its tasks are reported by :meth:`task_lost`)."""
        self.ops[op].actors.pop(actor, None)

    def barrier_outputs(self, op: int, count: int) -> None:
        """Barrier ``op`` started ``count`` output tasks (numbered 0..count-1)."""
        st = self.ops[op]
        for _ in range(count):
            tid = self._task_id()
            st.running[tid] = _Task(tid, (), 0, 0, None, st.next_seq)
            st.next_seq += 1
        self._check_done(op)

    def barrier_task_ids(self, op: int) -> list[int]:
        """Ids of the barrier's output tasks, in order (after :meth:`barrier_outputs`)."""
        return sorted(self.ops[op].running)

    def consumed(self, bundle: int) -> None:
        """The consumer is done with output ``bundle``."""
        entry = self._sizes.pop(bundle, None)
        if entry is not None:
            producer, size = entry
            self.ops[producer].out_bytes -= size

    # ------------------------------------------------------------------ outputs
    def _output(self, op: int, outputs: list[BundleInfo], seq: int, counted: bool = True) -> None:
        st = self.ops[op]
        for b in outputs:
            size = b.size if counted else 0
            st.out_bytes += size
            self._sizes[b.id] = (op, size)
        if self.preserve_order:
            st.reorder[seq] = outputs
            while st.next_emit_seq in st.reorder:
                ready = st.reorder.pop(st.next_emit_seq)
                st.next_emit_seq += 1
                self._forward(op, ready)
        else:
            self._forward(op, outputs)

    def _forward(self, op: int, outputs: list[BundleInfo]) -> None:
        st = self.ops[op]
        for b in outputs:
            st.rows_out += b.rows
            st.blocks_out += 1
        down = self.downstream.get(op)
        if down is None:
            self.consumer.extend(outputs)
            return
        dst = self.ops[down]
        if dst.cancelled or dst.done:
            for b in outputs:
                self._drop(b)
            return
        dst.queue.extend(outputs)

    def _drop(self, b: BundleInfo) -> None:
        entry = self._sizes.pop(b.id, None)
        if entry is not None:
            self.ops[entry[0]].out_bytes -= entry[1]

    def _check_done(self, op: int) -> None:
        st = self.ops[op]
        if st.done:
            return
        upstream_done = all(self.ops[j].done for j in st.spec.inputs)
        if st.spec.inputs and upstream_done:
            st.inputs_done = True
        if st.spec.kind == "barrier" and not st.barrier_started:
            return
        if st.inputs_done and not st.queue and not st.sources_left and not st.running:
            if self.preserve_order and st.reorder and any(st.reorder.values()):
                return
            st.done = True
            st.held = ""
            for actor in list(st.actors):
                self._stopped_actors.append(StopActor(op, actor))
            st.actors.clear()
            down = self.downstream.get(op)
            if down is not None:
                self._check_done(down)

    # ------------------------------------------------------------------ accounting
    @property
    def total_usage(self) -> int:
        """Bytes in flight: every operator's usage plus the inputs running tasks pin."""
        pinned = sum(t.in_bytes for st in self.ops for t in st.running.values())
        return sum(st.usage for st in self.ops) + pinned

    def op_budget(self, op: int) -> int:
        """An equal share of the total budget (at least two task outputs)."""
        share = self.budget // max(sum(1 for s in self.ops if s.spec.kind != "union"), 1)
        st = self.ops[op]
        typical = st.bytes_out_total // st.tasks_done if st.tasks_done else 0
        return max(share, 2 * typical)

    def _actor_cpus(self) -> float:
        return sum(st.spec.cpus * len(st.actors) for st in self.ops if st.spec.actor_pool)

    def cpus_in_use(self) -> float:
        """CPUs held by running tasks and by live pool actors."""
        used = 0.0
        for st in self.ops:
            if st.spec.actor_pool is not None:
                used += st.spec.cpus * len(st.actors)
            elif st.spec.kind in ("source", "map"):
                used += st.spec.cpus * len(st.running)
        return used

    @property
    def done(self) -> bool:
        """True when the last operator is done and the consumer has every output."""
        return self.ops[-1].done

    # ------------------------------------------------------------------ decisions
    def decide(self) -> list[Instruction]:
        """What to do now (the machine assumes every instruction is carried out)."""
        out: list[Instruction] = list(self._cancel)
        self._cancel.clear()
        while self.consumer:
            out.append(Emit(self.consumer.popleft().id))
        for i in reversed(range(len(self.ops))):
            st = self.ops[i]
            if st.done or st.cancelled:
                continue
            kind = st.spec.kind
            if kind == "union":
                while st.queue:
                    b = st.queue.popleft()
                    counted = self._counted(b)
                    self._drop(b)
                    self._output(i, [b], st.next_seq, counted)
                    st.next_seq += 1
                self._check_done(i)
                continue
            if kind == "barrier":
                self._decide_barrier(i, out)
                continue
            if kind == "limit":
                self._decide_limit(i, out)
                continue
            if st.spec.actor_pool is not None:
                self._scale_pool(i, out)
            while True:
                reason = self._blocked(i)
                st.held = "" if reason == _IDLE else reason
                if reason:
                    break
                out.append(self._start_task(i))
        out.extend(self._cancel)
        self._cancel.clear()
        out.extend(self._stopped_actors)
        self._stopped_actors.clear()
        while self.consumer:
            out.append(Emit(self.consumer.popleft().id))
        return out

    def _counted(self, b: BundleInfo) -> bool:
        """Whether ``b`` counts against the budget (blocks a dataset already held do not)."""
        entry = self._sizes.get(b.id)
        return entry is None or entry[1] > 0 or b.size == 0

    def _decide_barrier(self, i: int, out: list[Instruction]) -> None:
        st = self.ops[i]
        if st.barrier_started:
            st.held = ""
            return
        if not st.inputs_done:
            st.held = "barrier: waiting for all input"
            return
        inputs = tuple(b.id for b in st.queue)
        for b in st.queue:
            self._drop(b)
        st.bytes_in_total += sum(b.size for b in st.queue)
        st.queue.clear()
        st.barrier_started = True
        st.held = ""
        out.append(RunBarrier(i, inputs))

    def _decide_limit(self, i: int, out: list[Instruction]) -> None:
        st = self.ops[i]
        assert st.rows_left is not None
        while st.queue and st.rows_left > 0:
            b = st.queue.popleft()
            if b.rows <= st.rows_left:
                st.rows_left -= b.rows
                counted = self._counted(b)
                self._drop(b)
                self._output(i, [b], st.next_seq, counted)
                st.next_seq += 1
            else:
                in_bytes = self._take_inputs((b,))
                est = b.size * st.rows_left // max(b.rows, 1)
                task = self._new_task(i, (b,), est, None, in_bytes)
                out.append(Dispatch(i, task.id, (b.id,), slice_rows=st.rows_left))
                st.rows_left = 0
        if st.rows_left == 0:
            self._finish_limit(i)
        self._check_done(i)

    def _finish_limit(self, i: int) -> None:
        st = self.ops[i]
        st.inputs_done = True
        upstream = {j for j in self._upstream_of(i) if not self.ops[j].done}
        for j in upstream:
            up = self.ops[j]
            if up.done:
                continue
            up.cancelled = True
            up.done = True
            for b in up.queue:
                self._drop(b)
            up.queue.clear()
            up.sources_left.clear()
            up.running.clear()
            for actor in list(up.actors):
                self._stopped_actors.append(StopActor(j, actor))
            up.actors.clear()
        for b in st.queue:
            self._drop(b)
        st.queue.clear()
        if upstream:
            self._cancel.append(CancelUpstream(tuple(sorted(upstream))))
        self._check_done(i)

    def _upstream_of(self, i: int) -> set[int]:
        seen: set[int] = set()
        todo = list(self.ops[i].spec.inputs)
        while todo:
            j = todo.pop()
            if j not in seen:
                seen.add(j)
                todo.extend(self.ops[j].spec.inputs)
        return seen

    def _max_tasks(self, st: OpState) -> int:
        if st.spec.actor_pool is not None:
            return len(st.actors) * self.max_in_flight_per_actor
        by_cpu = math.floor(self.cpu_limit / st.spec.cpus) if st.spec.cpus > 0 else 1 << 30
        cap = st.spec.max_concurrency
        return max(min(by_cpu, cap) if cap is not None else by_cpu, 1)

    def _next_input(self, i: int) -> tuple[BundleInfo, ...] | None:
        st = self.ops[i]
        if st.spec.kind == "source":
            if not st.sources_left:
                return None
            idx, rows, size = st.sources_left[0]
            return (BundleInfo(idx, rows, size),)
        if not st.queue:
            return None
        if st.spec.min_rows <= 1:
            return (st.queue[0],)
        rows = 0
        taken = []
        for b in st.queue:
            taken.append(b)
            rows += b.rows
            if rows >= st.spec.min_rows:
                return tuple(taken)
        return tuple(taken) if st.inputs_done else None

    def _blocked(self, i: int) -> str:
        """Why op ``i`` cannot start a task now ('' when it can)."""
        st = self.ops[i]
        inputs = self._next_input(i)
        if inputs is None:
            return "waiting for input" if not st.inputs_done else _IDLE
        if len(st.running) >= self._max_tasks(st):
            if st.spec.actor_pool is not None:
                return "actors busy" if st.actors else "actors starting"
            return "concurrency cap" if st.spec.max_concurrency else "CPUs busy"
        over = self.cpus_in_use() + st.spec.cpus > self.cpu_limit + 1e-9
        if st.spec.actor_pool is None and st.spec.cpus > 0 and over and st.running:
            return "CPUs busy"
        est = self._estimate(st, inputs)
        live = not st.running and st.out_bytes == 0
        if st.usage + est > self.op_budget(i) and not live:
            return "operator budget"
        if self.total_usage + est > self.budget and not (live and self._nothing_running()):
            return "total budget"
        return ""

    def _nothing_running(self) -> bool:
        return not any(st.running for st in self.ops)

    def _estimate(self, st: OpState, inputs: tuple[BundleInfo, ...]) -> int:
        return int(sum(b.size for b in inputs) * st.ratio())

    def _start_task(self, i: int) -> Dispatch:
        st = self.ops[i]
        inputs = self._next_input(i)
        assert inputs is not None
        actor = None
        if st.spec.actor_pool is not None:
            actor = min(st.actors, key=lambda a: (st.actors[a], a))
            st.actors[actor] += 1
        if st.spec.kind == "source":
            st.sources_left.popleft()
            in_bytes = 0
        else:
            for _ in inputs:
                st.queue.popleft()
            in_bytes = self._take_inputs(inputs)
        task = self._new_task(i, inputs, self._estimate(st, inputs), actor, in_bytes)
        task.est_in = sum(b.size for b in inputs)
        return Dispatch(i, task.id, tuple(b.id for b in inputs), actor=actor)

    def _take_inputs(self, inputs: tuple[BundleInfo, ...]) -> int:
        """The producers' outputs become a task's pinned input; return their bytes."""
        pinned = 0
        for b in inputs:
            entry = self._sizes.get(b.id)
            if entry is not None:
                self.ops[entry[0]].out_bytes -= entry[1]
                self._sizes[b.id] = (entry[0], 0)
                pinned += entry[1]  # 0 for blocks the dataset holds anyway
            else:
                pinned += b.size
        return pinned

    def _new_task(
        self,
        i: int,
        inputs: tuple[BundleInfo, ...],
        est: int,
        actor: int | None,
        in_bytes: int = 0,
    ) -> _Task:
        st = self.ops[i]
        seq = st.retry_seq.pop(inputs[0].id, None) if inputs else None
        if seq is None:
            seq = st.next_seq
            st.next_seq += 1
        task = _Task(self._task_id(), inputs, in_bytes, est, actor, seq)
        st.running[task.id] = task
        return task

    def _task_id(self) -> int:
        self._next_task += 1
        return self._next_task

    def _scale_pool(self, i: int, out: list[Instruction]) -> None:
        st = self.ops[i]
        assert st.spec.actor_pool is not None
        lo, hi = st.spec.actor_pool
        waiting = len(st.queue) + len(st.sources_left)  # bundles, or reads of a fused source
        work = waiting + len(st.running)
        if st.inputs_done and not waiting:
            for actor, calls in list(st.actors.items()):
                if calls == 0 and len(st.actors) > 0:
                    del st.actors[actor]
                    out.append(StopActor(i, actor))
            return
        # Leave room for one task of every task operator upstream that still has work,
        # or a pool holding every CPU would starve its own input.
        reserve = sum(
            self.ops[j].spec.cpus
            for j in self._upstream_of(i)
            if self.ops[j].spec.actor_pool is None
            and self.ops[j].spec.kind in ("source", "map")
            and not self.ops[j].done
        )
        room = self.cpu_limit - reserve - self._actor_cpus()
        fits = int((room + 1e-9) // st.spec.cpus) if st.spec.cpus > 0 else hi
        want = max(len(st.actors), min(lo, len(st.actors) + max(fits, 0)), 1)
        busy = all(c >= 1 for c in st.actors.values())
        if (
            st.actors
            and busy
            and waiting > self.scale_up_ratio * len(st.actors)
            and want < hi
            and fits >= 1
        ):
            want += 1
        want = min(want, hi, max(work, lo, 1))
        while len(st.actors) < want:
            self._next_actor += 1
            st.actors[self._next_actor] = 0
            out.append(StartActor(i, self._next_actor))
