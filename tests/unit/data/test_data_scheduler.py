"""The streaming executor's decisions (``nbcluster.data._scheduler``), without processes.

Events go in (sources, finished tasks, consumed outputs, dead actors); instructions come
out. These tests pin the scheduling order, the CPU caps, the per-operator and total byte
budgets, liveness, limits, barriers, ordering and actor-pool scaling.
"""

from __future__ import annotations

import pytest

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

MB = 1 << 20


class Sim:
    """Carries out instructions like the executor would: bundle ids, task outputs."""

    def __init__(self, state: StreamingState) -> None:
        self.state = state
        self.next_id = 1000
        self.running: dict[int, Dispatch] = {}
        self.emitted: list[int] = []
        self.started: list[StartActor] = []
        self.stopped: list[StopActor] = []
        self.barriers: list[RunBarrier] = []
        self.cancelled: list[CancelUpstream] = []

    def step(self) -> list[object]:
        out = self.state.decide()
        for ins in out:
            if isinstance(ins, Dispatch):
                self.running[ins.task] = ins
            elif isinstance(ins, Emit):
                self.emitted.append(ins.bundle)
            elif isinstance(ins, StartActor):
                self.started.append(ins)
            elif isinstance(ins, StopActor):
                self.stopped.append(ins)
            elif isinstance(ins, RunBarrier):
                self.barriers.append(ins)
            elif isinstance(ins, CancelUpstream):
                self.cancelled.append(ins)
        return out

    def finish(self, task: int, rows: int = 100, size: int = MB) -> int:
        d = self.running.pop(task)
        self.next_id += 1
        self.state.task_finished(d.op, task, [BundleInfo(self.next_id, rows, size)])
        return self.next_id

    def dispatched(self, op: int) -> list[Dispatch]:
        return [d for d in self.running.values() if d.op == op]


def chain(*specs: OpSpec, cpu: float = 2, budget: int = 1 << 40, **kw: object) -> Sim:
    return Sim(StreamingState(list(specs), cpu_limit=cpu, budget=budget, **kw))  # type: ignore[arg-type]


SRC = OpSpec("Read", "source")
MAP = OpSpec("Map", "map", inputs=(0,))


def test_source_tasks_capped_by_cpus_then_refilled() -> None:
    sim = chain(SRC, cpu=2)
    sim.state.add_source_tasks(0, [(100, MB)] * 5)
    out = sim.step()
    assert [type(i) for i in out] == [Dispatch, Dispatch]
    assert sim.state.ops[0].held == "CPUs busy"
    first = next(iter(sim.running))
    bid = sim.finish(first)
    out = sim.step()
    assert Emit(bid) in out and len(sim.dispatched(0)) == 2


def test_task_pool_size_caps_concurrency() -> None:
    sim = chain(OpSpec("Read", "source", max_concurrency=1), cpu=8)
    sim.state.add_source_tasks(0, [(1, 1)] * 3)
    sim.step()
    assert len(sim.running) == 1
    assert sim.state.ops[0].held == "concurrency cap"


def test_downstream_operators_are_served_first() -> None:
    sim = chain(SRC, MAP, cpu=1)
    sim.state.add_source_tasks(0, [(100, MB)] * 3)
    sim.step()
    sim.finish(next(iter(sim.running)))
    out = sim.step()
    dispatches = [i for i in out if isinstance(i, Dispatch)]
    assert dispatches[0].op == 1  # the map drains before more is read


def test_operator_budget_holds_a_fast_producer() -> None:
    # budget 4 MB over 2 operators: each may hold 2 MB of unconsumed output.
    sim = chain(SRC, OpSpec("Map", "map", inputs=(0,), max_concurrency=1), cpu=4, budget=4 * MB)
    sim.state.add_source_tasks(0, [(100, MB)] * 10)
    sim.step()
    # Liveness allows one read; the estimate of the next keeps it within 2 MB.
    assert 1 <= len(sim.dispatched(0)) <= 2
    for d in list(sim.dispatched(0)):
        sim.finish(d.task, size=MB)
    sim.step()
    # The map runs one at a time (cap 1); queued reads plus estimates fill the budget.
    assert sim.state.ops[0].held in ("operator budget", "total budget")
    assert sim.state.total_usage <= 4 * MB + MB  # within one block of the budget


def test_consumer_backpressure_and_release() -> None:
    sim = chain(SRC, cpu=4, budget=3 * MB)
    sim.state.add_source_tasks(0, [(10, MB)] * 10)
    for _ in range(6):
        sim.step()
        for d in list(sim.running.values()):
            sim.finish(d.task)
    sim.step()
    held = len(sim.emitted)
    assert held <= 4  # outputs pile up to the budget, no further
    assert sim.state.ops[0].held in ("operator budget", "total budget")
    for bid in list(sim.emitted):
        sim.state.consumed(bid)
    sim.step()
    assert sim.running  # consuming frees the budget: reading resumes


def test_liveness_one_task_when_nothing_runs_even_over_budget() -> None:
    sim = chain(SRC, cpu=2, budget=1)  # one byte: every estimate is over
    sim.state.add_source_tasks(0, [(10, 10 * MB)] * 3)
    sim.step()
    assert len(sim.running) == 1
    for _ in range(3):
        for d in list(sim.running.values()):
            bid = sim.finish(d.task, size=10 * MB)
            sim.step()
            sim.state.consumed(bid)
        sim.step()
    assert sim.state.done and len(sim.emitted) == 3


def test_bundling_to_min_rows() -> None:
    sim = chain(SRC, OpSpec("MapBatches", "map", inputs=(0,), min_rows=250), cpu=5)
    sim.state.add_source_tasks(0, [(100, 1)] * 6)
    sim.step()
    assert len(sim.dispatched(0)) == 5
    for d in list(sim.dispatched(0)):
        sim.finish(d.task, rows=100, size=1)
    sim.step()
    # 300 rows >= 250 make one bundle; the other 200 wait for more input.
    assert [len(d.inputs) for d in sim.dispatched(1)] == [3]
    assert sim.state.ops[1].held == "waiting for input"
    sim.finish(sim.dispatched(0)[0].task, rows=100, size=1)
    sim.step()
    assert sorted(len(d.inputs) for d in sim.dispatched(1)) == [3, 3]


def test_limit_passes_slices_and_cancels_upstream() -> None:
    sim = chain(SRC, OpSpec("Limit[250]", "limit", inputs=(0,), limit=250), cpu=2)
    sim.state.add_source_tasks(0, [(100, MB)] * 10)
    sim.step()
    a, b = list(sim.running)
    b1 = sim.finish(a)
    b2 = sim.finish(b)
    sim.step()
    assert sim.emitted[:2] == [b1, b2]
    sim.step()
    c = [d for d in sim.dispatched(0)][0]
    sim.finish(c.task)
    out = sim.step()
    slices = [i for i in out if isinstance(i, Dispatch) and i.op == 1]
    assert slices and slices[0].slice_rows == 50
    assert any(isinstance(i, CancelUpstream) and i.ops == (0,) for i in out)
    assert sim.state.ops[0].cancelled
    sim.finish(slices[0].task, rows=50)
    sim.step()
    assert sim.state.done and len(sim.emitted) == 3


def test_limit_zero_is_done_at_once() -> None:
    sim = chain(SRC, OpSpec("Limit[0]", "limit", inputs=(0,), limit=0))
    sim.state.add_source_tasks(0, [(1, 1)] * 3)
    out = sim.step()
    assert not any(isinstance(i, Dispatch) for i in out)
    assert sim.state.done


def test_barrier_waits_for_all_input_then_runs() -> None:
    sim = chain(SRC, OpSpec("Sort", "barrier", inputs=(0,)), cpu=2)
    sim.state.add_source_tasks(0, [(10, 1)] * 3)
    for _ in range(2):  # 2 CPUs: two rounds of reads
        sim.step()
        assert not sim.barriers
        assert sim.state.ops[1].held == "barrier: waiting for all input"
        for d in list(sim.dispatched(0)):
            sim.finish(d.task)
    sim.step()
    assert len(sim.barriers) == 1 and len(sim.barriers[0].inputs) == 3
    sim.state.barrier_outputs(1, 2)
    t1, t2 = sim.state.barrier_task_ids(1)
    sim.state.task_finished(1, t2, [BundleInfo(1, 5, 1)])
    sim.state.task_finished(1, t1, [BundleInfo(2, 5, 1)])
    sim.step()
    assert sim.emitted == [1, 2] and sim.state.done


def test_preserve_order_reorders_outputs() -> None:
    sim = chain(SRC, cpu=3, preserve_order=True)
    sim.state.add_source_tasks(0, [(1, 1)] * 3)
    sim.step()
    t0, t1, t2 = sorted(sim.running)
    b2 = sim.finish(t2)
    b1 = sim.finish(t1)
    sim.step()
    assert sim.emitted == []
    b0 = sim.finish(t0)
    sim.step()
    assert sim.emitted == [b0, b1, b2]


def test_union_forwards_every_input() -> None:
    a = OpSpec("A", "source")
    b = OpSpec("B", "source")
    sim = chain(a, b, OpSpec("Union", "union", inputs=(0, 1)))
    sim.state.add_source_bundles(0, [BundleInfo(1, 1, 1)])
    sim.state.add_source_bundles(1, [BundleInfo(2, 1, 1), BundleInfo(3, 1, 1)])
    sim.step()
    assert sorted(sim.emitted) == [1, 2, 3] and sim.state.done


def test_actor_pool_starts_min_scales_to_max_and_stops() -> None:
    pool = OpSpec("MapBatches(Model)", "map", inputs=(0,), actor_pool=(1, 3))
    sim = chain(OpSpec("In", "source", cpus=0), pool, cpu=8, max_in_flight_per_actor=1)
    sim.state.add_source_bundles(0, [BundleInfo(i, 10, 1) for i in range(1, 11)])
    sim.step()
    assert len(sim.started) >= 1
    for _ in range(4):
        sim.step()
    assert len(sim.started) == 3  # the queue is long: grow to max, no further
    assert sim.state.ops[1].held == "actors busy"
    while sim.running:
        for d in list(sim.running.values()):
            sim.finish(d.task)
        sim.step()
    assert sim.state.done
    assert {s.actor for s in sim.stopped} == {s.actor for s in sim.started}


def test_actor_pool_leaves_a_cpu_for_its_input_task() -> None:
    pool = OpSpec("MapBatches(Model)", "map", inputs=(0,), actor_pool=(1, 8))
    sim = chain(SRC, pool, cpu=2, max_in_flight_per_actor=1)
    sim.state.add_source_tasks(0, [(10, 1)] * 20)
    for _ in range(10):
        sim.step()
        for d in list(sim.dispatched(0)):
            sim.finish(d.task)
    assert len(sim.state.ops[1].actors) == 1  # 2 CPUs: one for the pool, one for the reads


def test_lost_actor_work_is_run_again() -> None:
    pool = OpSpec("MapBatches(Model)", "map", inputs=(0,), actor_pool=(1, 1))
    sim = chain(OpSpec("In", "source", cpus=0), pool, cpu=4, max_in_flight_per_actor=2)
    sim.state.add_source_bundles(0, [BundleInfo(1, 10, 1), BundleInfo(2, 10, 1)])
    sim.step()
    actor = sim.started[0].actor
    lost = list(sim.running.values())
    assert sorted(d.inputs for d in lost) == [(1,), (2,)]
    for d in lost:
        sim.running.pop(d.task)
        sim.state.task_lost(1, d.task)
    sim.state.actor_died(1, actor)
    sim.step()
    assert len(sim.started) == 2  # a replacement
    assert sorted(d.inputs for d in sim.running.values()) == [(1,), (2,)]
    for d in list(sim.running.values()):
        sim.finish(d.task)
    sim.step()
    assert sim.state.done and len(sim.emitted) == 2


def test_operators_must_be_in_topological_order() -> None:
    with pytest.raises(ValueError, match="out of order"):
        StreamingState([OpSpec("Map", "map", inputs=(1,)), SRC], cpu_limit=1, budget=1)


def test_blocks_a_dataset_already_holds_do_not_use_the_budget() -> None:
    # 100 materialized blocks of 1 MB against a 40 MB budget: the map still runs 2 at once.
    sim = chain(OpSpec("In", "source", cpus=0), MAP, cpu=2, budget=40 * MB)
    sim.state.add_source_bundles(0, [BundleInfo(i, 10, MB) for i in range(1, 101)])
    sim.step()
    assert len(sim.dispatched(1)) == 2
    assert sim.state.total_usage == 2 * MB  # the two running tasks' estimated outputs


def test_a_read_fused_into_a_pool_runs_on_its_actors_and_scales() -> None:
    fused = OpSpec("Read->MapBatches(Model)", "source", actor_pool=(1, 2))
    sim = chain(fused, cpu=2, max_in_flight_per_actor=1)
    sim.state.add_source_tasks(0, [(100, MB)] * 6)
    for _ in range(3):
        sim.step()
    assert len(sim.started) == 2  # six reads waiting: the pool grows to its max
    assert all(d.actor is not None for d in sim.running.values())
    while sim.running:
        for d in list(sim.running.values()):
            sim.finish(d.task)
        sim.step()
    assert sim.state.done and len(sim.emitted) == 6
    assert {s.actor for s in sim.stopped} == {s.actor for s in sim.started}


def test_lost_work_keeps_its_place_when_order_is_preserved() -> None:
    fused = OpSpec("Read->MapBatches(Model)", "source", actor_pool=(1, 1))
    sim = chain(fused, cpu=2, max_in_flight_per_actor=2, preserve_order=True)
    sim.state.add_source_tasks(0, [(1, 1)] * 3)
    sim.step()
    actor = sim.started[0].actor
    first, second = sorted(sim.running)
    lost = sim.running.pop(first)
    sim.state.task_lost(0, first)
    sim.state.actor_died(0, actor)
    later = sim.finish(second)  # the second read finishes before the first is re-run
    sim.step()
    assert sim.emitted == []  # held back: the lost first read comes first
    rerun = [d for d in sim.running.values() if d.inputs == lost.inputs]
    assert rerun, sim.running
    again = sim.finish(rerun[0].task)
    sim.step()
    assert sim.emitted[:2] == [again, later]
    while sim.running:
        for d in list(sim.running.values()):
            sim.finish(d.task)
        sim.step()
    assert sim.state.done and len(sim.emitted) == 3
