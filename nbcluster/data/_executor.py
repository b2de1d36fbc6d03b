"""The streaming executor: a thread that carries out the scheduler's instructions.

:class:`Execution` optimizes a logical plan, fuses it into physical operators, and runs
them on a background thread: it asks the pure :class:`~._scheduler.StreamingState` what to
do, submits tasks and pool-actor calls through the public API (``remote``, ``wait``,
``get``, ``cancel``, ``kill``), and feeds completions back in. Output blocks go to a queue
that :meth:`Execution.iter_bundles` reads; a block counts against the budget until the
consumer asks for the next one.

Stopping — the consumer breaks out early, raises, or the kernel is interrupted
(``KeyboardInterrupt`` in the consuming thread) — cancels every task still running and
kills the operator's actor pools before :meth:`iter_bundles` returns or re-raises, so
nothing is left running. A pool actor that dies has its calls run again on another
actor; tasks are retried by the core (``max_retries``), so a killed worker's blocks are
recomputed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import queue
import threading
import time
from collections.abc import Iterator
from typing import Any

import nbcluster
from nbcluster import state as nbstate
from nbcluster._refs import ObjectRef
from nbcluster.data._all_to_all import run_all_to_all
from nbcluster.data._block import unify_schemas_or_raise
from nbcluster.data._logical import LogicalOp, RefBundle
from nbcluster.data._optimizer import PhysicalOp, optimize, to_physical
from nbcluster.data._progress import make_progress
from nbcluster.data._scheduler import (
    BundleInfo,
    CancelUpstream,
    Dispatch,
    Emit,
    OpSpec,
    RunBarrier,
    StartActor,
    StopActor,
    StreamingState,
)
from nbcluster.data._stats import ExecutionStats, OpSnapshot
from nbcluster.data._tasks import MapWorker, map_task, read_task, remote_options, slice_task
from nbcluster.data.compute import ActorPoolStrategy, TaskPoolStrategy
from nbcluster.data.context import DataContext
from nbcluster.exceptions import ActorDiedError

__all__ = ["Execution", "cluster_limits"]

#: All-to-all operators whose output order is their meaning: the execution keeps order.
ORDERED_KINDS = frozenset({"sort", "zip", "repartition", "aggregate"})
_POLL_S = 0.05
#: An execution with nothing running, nothing to start and a waiting consumer for this
#: long is stuck: it fails with the scheduler's state instead of hanging silently.
STALL_S = 30.0


@dataclasses.dataclass
class _Running:
    op: int
    task: int
    block: ObjectRef
    inputs: tuple[int, ...]
    actor: int | None


@dataclasses.dataclass
class _Error:
    exc: BaseException


_END = object()


def cluster_limits() -> tuple[float, int]:
    """``(CPUs, object store bytes)`` of the live nodes (starts a cluster if none)."""
    if not nbcluster.is_initialized():
        nbcluster.init()
    cpus = float(nbcluster.cluster_resources().get("CPU", 1.0))
    store = sum(int(n.get("ObjectStoreCapacity", 0)) for n in nbcluster.nodes() if n.get("Alive"))
    return max(cpus, 1.0), max(store, 1)


def _rss() -> int:
    try:
        import psutil

        return int(psutil.Process(os.getpid()).memory_info().rss)
    except Exception:  # noqa: BLE001 - statistics only
        return 0


def _spilled() -> int:
    try:
        return sum(n.store_spilled for n in nbstate.node_stats())
    except Exception:  # noqa: BLE001 - statistics only
        return 0


class Execution:
    """One run of a plan (see the module docstring).

    ``preserve_order``: None follows ``DataContext.execution_options.preserve_order``
    (order is always kept when the plan sorts, zips, aggregates or repartitions).
    ``progress``: show the progress display (None: ``DataContext.enable_progress_bars``).
    """

    def __init__(
        self,
        root: LogicalOp,
        ctx: DataContext,
        *,
        preserve_order: bool | None = None,
        progress: bool | None = None,
        label: str = "",
    ) -> None:
        self.ctx = ctx
        self.plan = optimize(root)
        self.phys: list[PhysicalOp] = to_physical(self.plan)
        ordered = any(
            p.kind == "barrier" and p.all_to_all is not None and p.all_to_all.kind in ORDERED_KINDS
            for p in self.phys
        )
        want = ctx.execution_options.preserve_order if preserve_order is None else preserve_order
        self.preserve_order = bool(want or ordered)
        self.show_progress = ctx.enable_progress_bars if progress is None else progress
        self.label = label
        #: Identifies the dataset plan for the plan views that listen (``id`` of its root).
        self.plan_key = id(root)
        self.state: StreamingState | None = None
        self.stats: ExecutionStats | None = None
        self._out: queue.Queue[Any] = queue.Queue()
        self._consumed: queue.Queue[int] = queue.Queue()
        self._stop = threading.Event()
        self._consumer_waiting = threading.Event()
        self._thread: threading.Thread | None = None
        self._pending: dict[ObjectRef, _Running] = {}
        self._bundles: dict[int, RefBundle] = {}
        self._producer: dict[int, int] = {}
        self._task_inputs: dict[tuple[int, int], tuple[int, ...]] = {}
        self._actors: dict[tuple[int, int], Any] = {}
        self._union_schemas: dict[int, Any] = {}
        self._remote_fns: dict[int, Any] = {}
        self._actor_deaths = 0
        self._stage_refs: dict[int, Any] = {}
        self._next_id = 0
        self._started_at = 0.0
        self._op_started: dict[int, float] = {}
        self._op_ended: dict[int, float] = {}
        self._peak_total = 0
        self._peak_op: dict[int, int] = {}
        self._task_time: dict[int, float] = {}
        self._progress: Any = None
        self._last_progress = 0.0
        self._rss_start = 0
        self._rss_peak = 0
        self._spilled_start = 0
        self.cpu_limit = 1.0
        self.budget = 0

    # ------------------------------------------------------------------ set-up
    def _specs(self) -> list[OpSpec]:
        specs = []
        for p in self.phys:
            pool = None
            cap = None
            if isinstance(p.compute, ActorPoolStrategy):
                pool = p.compute.bounds(self.cpu_limit, max(p.cpus, 1e-9))
            elif isinstance(p.compute, TaskPoolStrategy):
                cap = p.compute.size
            specs.append(
                OpSpec(
                    name=p.name,
                    kind=p.kind,
                    inputs=p.inputs,
                    max_concurrency=cap,
                    cpus=p.cpus if p.kind in ("source", "map") else 0.0,
                    actor_pool=pool,
                    min_rows=p.min_rows,
                    limit=p.limit,
                )
            )
        return specs

    def start(self) -> None:
        """Plan the budget, register the sources, and start the executor thread."""
        if self._thread is not None:
            return
        cpus, store = cluster_limits()
        limits = self.ctx.execution_options.resource_limits
        self.cpu_limit = float(limits.cpu) if limits.cpu else cpus
        self.budget = self.ctx.object_store_budget(store)
        self.state = StreamingState(
            self._specs(),
            cpu_limit=self.cpu_limit,
            budget=self.budget,
            preserve_order=self.preserve_order,
            max_in_flight_per_actor=self.ctx.max_tasks_in_flight_per_actor,
            scale_up_ratio=self.ctx.actor_pool_scale_up_queue_ratio,
        )
        for i, p in enumerate(self.phys):
            if p.stages:
                self._stage_refs[i] = nbcluster.put(p.stages)
            if p.kind != "source":
                continue
            if p.bundles is not None:
                infos = []
                for b in p.bundles:
                    bid = self._register(b, i)
                    infos.append(BundleInfo(bid, b.meta.num_rows, b.meta.size_bytes))
                self.state.add_source_bundles(i, infos)
            else:
                tasks = p.read_tasks or []
                self.state.add_source_tasks(
                    i, [(t.num_rows or 0, t.size_bytes or 0) for t in tasks]
                )
        self._started_at = time.monotonic()
        self._rss_start = self._rss_peak = _rss()
        self._spilled_start = _spilled()
        self._progress = make_progress(
            self.label, [p.name for p in self.phys], self.plan_key, visible=self.show_progress
        )
        self._thread = threading.Thread(
            target=self._run, name="nbcluster-data-executor", daemon=True
        )
        self._thread.start()

    def _register(self, bundle: RefBundle, producer: int) -> int:
        self._check_union(bundle, producer)
        self._next_id += 1
        self._bundles[self._next_id] = bundle
        self._producer[self._next_id] = producer
        return self._next_id

    def _check_union(self, bundle: RefBundle, producer: int) -> None:
        """Blocks that meet in a union must have one schema (checked as they arrive)."""
        if self.state is None:
            return
        down = self.state.downstream.get(producer)
        schema = bundle.meta.schema
        if down is None or self.phys[down].kind != "union" or schema is None:
            return
        if not bundle.meta.num_rows and not len(schema.names):
            return
        seen = self._union_schemas.setdefault(down, schema)
        if seen is not schema:
            unify_schemas_or_raise([seen, schema], "union")

    # ------------------------------------------------------------------ the thread
    def _run(self) -> None:
        assert self.state is not None
        error: BaseException | None = None
        try:
            idle_since = time.monotonic()
            while not self._stop.is_set():
                self._drain_consumed()
                instructions = self.state.decide()
                for ins in instructions:
                    self._apply(ins)
                self._track()
                if self.state.done and not self._pending and not self.state.consumer:
                    break
                if instructions or self._pending or not self._consumer_waiting.is_set():
                    idle_since = time.monotonic()
                elif time.monotonic() - idle_since > STALL_S:
                    raise RuntimeError(self._stall_report())
                self._poll()
                self._tick_progress()
        except BaseException as err:  # noqa: BLE001 - handed to the consumer
            error = err
        finally:
            stopped = self._stop.is_set() or error is not None
            self._cleanup(cancel=stopped)
            self._finish_stats(
                "stopped" if self._stop.is_set() else "failed" if error else "finished"
            )
            self._out.put(_Error(error) if error is not None else _END)

    def _drain_consumed(self) -> None:
        assert self.state is not None
        while True:
            try:
                bid = self._consumed.get_nowait()
            except queue.Empty:
                return
            self.state.consumed(bid)
            self._bundles.pop(bid, None)
            self._producer.pop(bid, None)

    def _poll(self) -> None:
        refs = list(self._pending)
        if not refs:
            try:
                bid = self._consumed.get(timeout=_POLL_S)
            except queue.Empty:
                return
            self._consumed.put(bid)
            return
        ready, _ = nbcluster.wait(refs, num_returns=1, timeout=_POLL_S)
        if not ready:
            return
        if len(refs) > 1:
            ready, _ = nbcluster.wait(refs, num_returns=len(refs), timeout=0)
        for ref in ready:
            self._complete(ref)

    def _complete(self, meta_ref: ObjectRef) -> None:
        assert self.state is not None
        run = self._pending.pop(meta_ref)
        try:
            meta = nbcluster.get(meta_ref)
        except ActorDiedError as err:
            if err.actor_init_failed or run.actor is None:
                raise
            self._actor_lost(run)
            return
        self._task_time[run.op] = self._task_time.get(run.op, 0.0) + meta.exec_time_s
        bid = self._register(RefBundle(run.block, meta), run.op)
        self.state.task_finished(
            run.op, run.task, [BundleInfo(bid, meta.num_rows, meta.size_bytes)]
        )
        self._release_inputs(run)
        if self.state.ops[run.op].done:
            self._op_ended.setdefault(run.op, time.monotonic())

    def _release_inputs(self, run: _Running) -> None:
        for bid in run.inputs:
            self._bundles.pop(bid, None)
            self._producer.pop(bid, None)

    def _actor_lost(self, run: _Running) -> None:
        assert self.state is not None and run.actor is not None
        self._actor_deaths += 1
        pool = self.state.ops[run.op].spec.actor_pool or (1, 1)
        if self._actor_deaths > 3 + 2 * pool[1]:
            raise RuntimeError(
                f"{self.phys[run.op].name}: {self._actor_deaths} pool actors died; giving up. "
                "Check the workers' logs for why they exit (memory, crashes in native code)."
            )
        self.state.task_lost(run.op, run.task)
        if (run.op, run.actor) in self._actors:
            self._actors.pop((run.op, run.actor))
            self.state.actor_died(run.op, run.actor)

    # ------------------------------------------------------------------ instructions
    def _apply(self, ins: object) -> None:
        if isinstance(ins, Emit):
            self._out.put((ins.bundle, self._bundles[ins.bundle]))
        elif isinstance(ins, Dispatch):
            self._dispatch(ins)
        elif isinstance(ins, StartActor):
            p = self.phys[ins.op]
            opts = dict(p.remote_args)
            opts.setdefault("num_cpus", 1)
            opts.pop("name", None)
            opts.pop("max_retries", None)
            opts.pop("retry_exceptions", None)
            self._actors[(ins.op, ins.actor)] = MapWorker.options(**opts).remote(
                self._stage_refs[ins.op]
            )
        elif isinstance(ins, StopActor):
            handle = self._actors.pop((ins.op, ins.actor), None)
            if handle is not None:
                nbcluster.kill(handle)
        elif isinstance(ins, RunBarrier):
            self._run_barrier(ins)
        elif isinstance(ins, CancelUpstream):
            self._cancel_ops(set(ins.ops))

    def _dispatch(self, ins: Dispatch) -> None:
        self._op_started.setdefault(ins.op, time.monotonic())
        p = self.phys[ins.op]
        stages = self._stage_refs.get(ins.op, [])
        if p.kind == "source":
            assert p.read_tasks is not None
            rt = p.read_tasks[ins.inputs[0]]
            if ins.actor is not None:  # a read fused into an actor pool
                block, meta = self._actors[(ins.op, ins.actor)].run_read.remote(rt)
            else:
                block, meta = self._remote_fn(ins.op, read_task).remote(stages, rt)
            inputs: tuple[int, ...] = ()
        elif p.kind == "limit":
            bundle = self._bundles[ins.inputs[0]]
            block, meta = slice_task.remote(bundle.block, 0, ins.slice_rows or 0)
            inputs = ins.inputs
        else:
            blocks = [self._bundles[b].block for b in ins.inputs]
            if ins.actor is not None:
                block, meta = self._actors[(ins.op, ins.actor)].run.remote(*blocks)
            else:
                block, meta = self._remote_fn(ins.op, map_task).remote(stages, *blocks)
            inputs = ins.inputs
        self._pending[meta] = _Running(ins.op, ins.task, block, inputs, ins.actor)

    def _remote_fn(self, op: int, fn: Any) -> Any:
        """``fn`` with the operator's options (made once per operator, not per task)."""
        made = self._remote_fns.get(op)
        if made is None:
            p = self.phys[op]
            made = self._remote_fns[op] = fn.options(**remote_options(p.remote_args, p.name))
        return made

    def _run_barrier(self, ins: RunBarrier) -> None:
        assert self.state is not None
        self._op_started.setdefault(ins.op, time.monotonic())
        p = self.phys[ins.op]
        assert p.all_to_all is not None
        groups: list[list[RefBundle]] = [[] for _ in p.inputs]
        for bid in ins.inputs:
            src = self._producer.get(bid, -1)
            while src not in p.inputs and src in self.state.downstream:
                src = self.state.downstream[src]
            idx = p.inputs.index(src) if src in p.inputs else 0
            groups[idx].append(self._bundles[bid])
        outputs = run_all_to_all(p.all_to_all, groups, self.ctx, self.cpu_limit)
        for bid in ins.inputs:
            self._bundles.pop(bid, None)
            self._producer.pop(bid, None)
        self.state.barrier_outputs(ins.op, len(outputs))
        for tid, out in zip(self.state.barrier_task_ids(ins.op), outputs, strict=True):
            if isinstance(out, RefBundle):
                bid = self._register(out, ins.op)
                info = BundleInfo(bid, out.meta.num_rows, out.meta.size_bytes)
                self.state.task_finished(ins.op, tid, [info])
            else:
                block, meta = out
                self._pending[meta] = _Running(ins.op, tid, block, (), None)

    def _cancel_ops(self, ops: set[int]) -> None:
        for meta, run in list(self._pending.items()):
            if run.op in ops:
                del self._pending[meta]
                if run.actor is None:
                    with contextlib.suppress(Exception):  # it may have finished meanwhile
                        nbcluster.cancel(run.block)

    # ------------------------------------------------------------------ stopping
    def _cleanup(self, cancel: bool) -> None:
        if cancel:
            for run in list(self._pending.values()):
                if run.actor is None:
                    with contextlib.suppress(Exception):  # best effort
                        nbcluster.cancel(run.block)
            self._pending.clear()
        for handle in list(self._actors.values()):
            with contextlib.suppress(Exception):  # already dead
                nbcluster.kill(handle)
        self._actors.clear()
        self._stage_refs.clear()
        self._bundles.clear()
        self._producer.clear()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the execution: cancel its tasks and kill its pools; wait for the thread."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)

    # ------------------------------------------------------------------ consumer side
    def iter_bundles(self) -> Iterator[RefBundle]:
        """The output blocks, as they come (in order when the execution keeps order)."""
        self.start()
        last: int | None = None
        finished = False
        try:
            while True:
                if last is not None:
                    self._consumed.put(last)
                    last = None
                item = self._next_item()
                if item is _END:
                    finished = True
                    return
                if isinstance(item, _Error):
                    finished = True
                    raise item.exc
                last, bundle = item
                yield bundle
        finally:
            if not finished:
                self.stop()
                self._drop_outputs()
            self._close_progress()

    def _drop_outputs(self) -> None:
        """Release the blocks nobody will consume (a stopped run must not pin them)."""
        while True:
            try:
                self._out.get_nowait()
            except queue.Empty:
                return

    def _next_item(self) -> Any:
        self._consumer_waiting.set()
        try:
            while True:
                try:
                    return self._out.get(timeout=0.1)
                except queue.Empty:
                    continue
        except KeyboardInterrupt:
            self.stop()
            raise
        finally:
            self._consumer_waiting.clear()

    def _stall_report(self) -> str:
        """Why an execution that cannot move is stuck (a bug: it should never happen)."""
        assert self.state is not None
        lines = [
            f"nbcluster.data: the execution made no progress for {STALL_S:.0f}s with nothing "
            "running while the consumer waits; this is a bug in the executor, please report "
            "it with this state:"
        ]
        for i, st in enumerate(self.state.ops):
            lines.append(
                f"  {i} {st.spec.name} [{st.spec.kind}] queued={len(st.queue)} "
                f"sources_left={len(st.sources_left)} running={len(st.running)} "
                f"done={st.done} held={st.held!r} out_bytes={st.out_bytes}"
            )
        lines.append(f"  budget={self.budget} total_usage={self.state.total_usage}")
        return "\n".join(lines)

    # ------------------------------------------------------------------ statistics
    def _track(self) -> None:
        assert self.state is not None
        self._peak_total = max(self._peak_total, self.state.total_usage)
        for i, st in enumerate(self.state.ops):
            self._peak_op[i] = max(self._peak_op.get(i, 0), st.usage)

    def snapshot(self) -> list[OpSnapshot]:
        """Every operator's counters now."""
        assert self.state is not None
        now = time.monotonic()
        out = []
        for i, st in enumerate(self.state.ops):
            started = self._op_started.get(i, self._started_at)
            ended = self._op_ended.get(i, now)
            out.append(
                OpSnapshot(
                    name=st.spec.name,
                    kind=st.spec.kind,
                    rows_out=st.rows_out,
                    blocks_out=st.blocks_out,
                    bytes_out=st.bytes_out_total,
                    tasks_running=len(st.running),
                    tasks_done=st.tasks_done,
                    queued_blocks=len(st.queue),
                    queued_bytes=st.queued_bytes,
                    usage_bytes=st.usage,
                    peak_usage_bytes=self._peak_op.get(i, 0),
                    budget_bytes=self.state.op_budget(i),
                    held=st.held,
                    actors=len(st.actors),
                    done=st.done,
                    elapsed_s=max(ended - started, 1e-9),
                    task_time_s=self._task_time.get(i, 0.0),
                )
            )
        return out

    def _tick_progress(self) -> None:
        now = time.monotonic()
        if now - self._last_progress < self.ctx.progress_update_interval_s:
            return
        self._last_progress = now
        self._rss_peak = max(self._rss_peak, _rss())
        if self._progress is not None:
            try:
                self._progress.update(
                    self.snapshot(), self.state.total_usage if self.state else 0, self.budget
                )
            except Exception:  # noqa: BLE001 - a display must not break the pipeline
                self._progress = None

    def _finish_stats(self, status: str) -> None:
        if self.state is None:
            return
        self._rss_peak = max(self._rss_peak, _rss())
        snap = self.snapshot()
        self.stats = ExecutionStats(
            ops=snap,
            wall_time_s=time.monotonic() - self._started_at,
            budget_bytes=self.budget,
            peak_bytes_in_flight=self._peak_total,
            spilled_bytes=max(_spilled() - self._spilled_start, 0),
            driver_rss_start=self._rss_start,
            driver_rss_peak=self._rss_peak,
            status=status,
        )

    def _close_progress(self) -> None:
        if self._progress is not None and self.stats is not None:
            with contextlib.suppress(Exception):  # a display must not break the pipeline
                self._progress.close(self.stats)
        self._progress = None
