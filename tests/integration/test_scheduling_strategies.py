"""Scheduling strategies on a real 3-node cluster (issue 5, acceptance 4-5).

``"DEFAULT"``, ``"SPREAD"`` and ``NodeAffinitySchedulingStrategy`` for tasks and actors, and
``nodes()`` / ``cluster_resources()`` / ``available_resources()`` per node and in total.
Where work ran is read from ``get_runtime_context().get_node_id()`` inside it. "These tasks
ran at the same time" is shown with a barrier of signal files: each task marks a directory
and waits (hang guard: a few seconds) until every task has marked it.

Most tests share one cluster of three node managers with 2 CPUs each; after every test its
resources must return to their baseline. Tests whose bugs would leak resources into the
shared cluster (actors that end up on another node than the head records) start their own
cluster with the ``cluster`` factory and come first.
"""

from __future__ import annotations

import os
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import nbcluster
from nbcluster import state
from nbcluster.config import Config
from nbcluster.exceptions import ActorUnschedulableError, NbclusterError, TaskUnschedulableError
from nbcluster.testing import assert_no_processes, pid_alive, poll_for
from nbcluster.util import NodeAffinitySchedulingStrategy

pytestmark = pytest.mark.integration

BOGUS_NODE = "ab" * 16


# ------------------------------------------------------------------------------ remote code


@nbcluster.remote
def where():
    return nbcluster.get_runtime_context().get_node_id()


@nbcluster.remote
def barrier(directory, me, count, limit=20):
    """Mark ``directory``; wait until ``count`` tasks have. Returns (node, all met in time)."""
    Path(directory, str(me)).touch()
    deadline = time.monotonic() + limit
    met = False
    while time.monotonic() < deadline:
        if len(os.listdir(directory)) >= count:
            met = True
            break
        time.sleep(0.01)
    return nbcluster.get_runtime_context().get_node_id(), met


@nbcluster.remote
def gated(started, gate, limit=60):
    Path(started).touch()
    deadline = time.monotonic() + limit
    while not os.path.exists(gate) and time.monotonic() < deadline:
        time.sleep(0.01)
    return nbcluster.get_runtime_context().get_node_id()


@nbcluster.remote(num_cpus=1)
class Where:
    def node(self):
        return nbcluster.get_runtime_context().get_node_id()

    def pid(self):
        return os.getpid()


# ------------------------------------------------------------------------------ helpers


def affinity(node_id: str, soft: bool = False) -> NodeAffinitySchedulingStrategy:
    return NodeAffinitySchedulingStrategy(node_id, soft=soft)


def run_together(
    tmp: Path, count: int, limit: float = 20, **options: Any
) -> list[tuple[str, bool]]:
    """``count`` barrier tasks with ``options``; their (node, met) pairs."""
    d = tmp / f"barrier-{time.monotonic_ns()}"
    d.mkdir()
    refs = [barrier.options(**options).remote(str(d), i, count, limit) for i in range(count)]
    return nbcluster.get(refs, timeout=limit * 3 + 30)


def cpu_back(expected: float) -> bool:
    return nbcluster.available_resources().get("CPU") == expected


def settle() -> None:
    """Let the driver's idle leases of earlier tests go back, and the heartbeats report it.

    Leases are kept ``lease_idle_timeout_s`` after their last task; a test that checks where
    DEFAULT work lands (or places a hard-affinity actor) must not see them as load.
    """
    config = Config.from_env()
    poll_for(  # the head's view: every lease is back...
        lambda: nbcluster.available_resources() == nbcluster.cluster_resources(),
        timeout=config.lease_idle_timeout_s + 30,
        message="idle leases of earlier tests were not handed back",
    )
    time.sleep(2 * config.heartbeat_interval_s)  # ...and the nodes' views, a heartbeat later


# ------------------------------------------------------------------- special clusters (factory)


def test_killing_an_actor_that_spilled_to_another_node_ends_it_and_frees_its_cpu(cluster):
    info = cluster(num_cpus=2, _nodes=3)
    # The head sends all three to the driver's node; the third is spilled elsewhere.
    actors = [Where.remote() for _ in range(3)]
    nodes = nbcluster.get([a.node.remote() for a in actors], timeout=60)
    pids = nbcluster.get([a.pid.remote() for a in actors], timeout=60)
    assert Counter(nodes)[info.node_id] == 2
    for a in actors:
        nbcluster.kill(a)
    poll_for(lambda: cpu_back(6), 30, message=f"CPU not back: {nbcluster.available_resources()}")
    assert not any(pid_alive(p) for p in pids)


def test_spread_actors_land_on_distinct_nodes(cluster):
    cluster(num_cpus=2, _nodes=3)
    actors = [Where.options(scheduling_strategy="SPREAD").remote() for _ in range(3)]
    nodes = nbcluster.get([a.node.remote() for a in actors], timeout=60)
    assert len(set(nodes)) == 3


def test_a_hard_affinity_actor_waits_for_its_busy_node(cluster, tmp_path):
    info = cluster(num_cpus=2, _nodes=3)
    target = next(n["NodeID"] for n in nbcluster.nodes() if n["NodeID"] != info.node_id)
    gate = tmp_path / "gate"
    blocker = gated.options(num_cpus=2, scheduling_strategy=affinity(target)).remote(
        str(tmp_path / "started"), str(gate)
    )
    poll_for(lambda: (tmp_path / "started").exists(), 30)
    poll_for(lambda: cpu_back(4), 10)  # the head knows the node is busy
    actor = Where.options(scheduling_strategy=affinity(target)).remote()
    first = actor.node.remote()
    try:
        assert nbcluster.wait([first], timeout=1)[0] == []  # it waits for its node
    finally:
        gate.touch()
    assert nbcluster.get(blocker, timeout=60) == target
    assert nbcluster.get(first, timeout=60) == target


# ------------------------------------------------------------------------------ shared cluster


@pytest.fixture(scope="module")
def _three_nodes() -> Iterator[dict[str, Any]]:
    if nbcluster.is_initialized():
        nbcluster.shutdown()
    info = nbcluster.init(num_cpus=2, _nodes=3)
    ids = [n["NodeID"] for n in nbcluster.nodes()]
    yield {
        "info": info,
        "local": info.node_id,
        "ids": ids,
        "baseline": nbcluster.cluster_resources(),
    }
    nbcluster.shutdown()
    assert_no_processes(info.session_dir, timeout=10)


@pytest.fixture
def c3(_three_nodes: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """The shared cluster; afterwards its live resources must be back to the baseline."""
    if not nbcluster.is_initialized():
        pytest.fail("the module's shared cluster was shut down by an earlier test")
    yield _three_nodes
    baseline = _three_nodes["baseline"]

    def back() -> bool:
        total, avail = nbcluster.cluster_resources(), nbcluster.available_resources()
        alive = [n for n in nbcluster.nodes() if n["Alive"]]
        return (
            total == baseline
            and all(abs(avail.get(k, 0) - v) < 1e-6 for k, v in baseline.items())
            and len(alive) == 3
            and all(n["Available"] == n["Resources"] for n in alive)
        )

    poll_for(
        back,
        15,
        message=f"not back to {baseline}: total={nbcluster.cluster_resources()} "
        f"available={nbcluster.available_resources()}",
    )


def test_nodes_and_resources_are_reported_per_node_and_in_total(c3, tmp_path):
    nodes = nbcluster.nodes()
    assert len(nodes) == 3 and all(n["Alive"] for n in nodes)
    assert sorted(n["NodeName"] for n in nodes) == ["node0", "node1", "node2"]
    assert len({n["NodeID"] for n in nodes}) == 3 and c3["local"] in c3["ids"]
    assert all(n["Resources"]["CPU"] == 2 and n["Available"]["CPU"] == 2 for n in nodes)
    assert all(n["NodeManagerPort"] > 0 and n["DeathReason"] == "" for n in nodes)
    total = nbcluster.cluster_resources()
    assert total["CPU"] == 6
    for key in total:
        assert total[key] == pytest.approx(sum(n["Resources"].get(key, 0) for n in nodes))
    assert nbcluster.available_resources() == pytest.approx(total)

    busy = c3["ids"][1]
    gate = tmp_path / "gate"
    ref = gated.options(num_cpus=2, scheduling_strategy=affinity(busy)).remote(
        str(tmp_path / "started"), str(gate)
    )
    try:
        poll_for(lambda: (tmp_path / "started").exists(), 30)

        def reported() -> bool:
            per = {n["NodeID"]: n["Available"].get("CPU", 0) for n in nbcluster.nodes()}
            return per == {i: (0 if i == busy else 2) for i in c3["ids"]} and cpu_back(4)

        poll_for(reported, 10, message=f"busy node not reported: {nbcluster.nodes()}")
        assert nbcluster.cluster_resources() == total  # totals do not move
    finally:
        gate.touch()
    assert nbcluster.get(ref, timeout=60) == busy


def test_default_runs_on_the_local_node_while_it_has_room(c3, tmp_path):
    settle()
    got = run_together(tmp_path, 2)
    assert got == [(c3["local"], True)] * 2
    for _ in range(3):  # one after another too
        assert nbcluster.get(where.remote(), timeout=30) == c3["local"]


def test_default_goes_elsewhere_once_the_local_node_is_busy(c3, tmp_path):
    settle()
    got = run_together(tmp_path, 4)
    assert all(met for _, met in got), "the 4 tasks did not all run at once"
    places = Counter(node for node, _ in got)
    assert places[c3["local"]] == 2
    assert sum(places.values()) == 4 and set(places) <= set(c3["ids"])


def test_default_uses_every_node_when_the_work_needs_them_all(c3, tmp_path):
    settle()
    # A node learns the others are free from its heartbeat replies (every interval while
    # requests wait), so the spill can take a few of them on a loaded machine: the barrier
    # gives the 6 tasks 10 s to meet; a node that never spilled would keep 2 of them waiting
    # for its own CPUs, which the barrier holds, and they would not meet.
    got = run_together(tmp_path, 6, limit=10)
    assert all(met for _, met in got), f"the 6 tasks did not all run at once: {got}"
    assert Counter(node for node, _ in got) == {node: 2 for node in c3["ids"]}


def test_spread_puts_tasks_on_every_node(c3, tmp_path):
    got = run_together(tmp_path, 6, scheduling_strategy="SPREAD")
    assert all(met for _, met in got)
    assert Counter(node for node, _ in got) == {node: 2 for node in c3["ids"]}
    # one at a time too: SPREAD does not stay where there is room
    one_by_one = [
        nbcluster.get(where.options(scheduling_strategy="SPREAD").remote(), timeout=30)
        for _ in range(6)
    ]
    assert set(one_by_one) == set(c3["ids"])


@pytest.mark.parametrize("index", [0, 1, 2])
def test_hard_node_affinity_runs_every_task_on_that_node(c3, tmp_path, index):
    node_id = c3["ids"][index]
    # 4 tasks on a 2-CPU node: two at a time, and the others wait there rather than spill
    got = run_together(tmp_path, 2, scheduling_strategy=affinity(node_id))
    assert got == [(node_id, True)] * 2
    d = tmp_path / "four"
    d.mkdir()
    refs = [
        barrier.options(scheduling_strategy=affinity(node_id)).remote(str(d), i, 4, 1)
        for i in range(4)
    ]
    assert [node for node, _ in nbcluster.get(refs, timeout=60)] == [node_id] * 4


def test_soft_node_affinity_stays_on_a_live_node_even_when_it_is_busy(c3, tmp_path):
    # As in Ray (without _spill_on_unavailable): soft only matters when the node is gone or
    # can never fit the request; 4 tasks on a 2-CPU node wait there rather than spill.
    for node_id in c3["ids"]:
        d = tmp_path / node_id
        d.mkdir()
        refs = [
            barrier.options(scheduling_strategy=affinity(node_id, soft=True)).remote(
                str(d), i, 4, 1
            )
            for i in range(4)
        ]
        assert [node for node, _ in nbcluster.get(refs, timeout=60)] == [node_id] * 4


def test_affinity_to_an_unknown_node(c3):
    with pytest.raises(NbclusterError) as info:
        nbcluster.get(where.options(scheduling_strategy=affinity(BOGUS_NODE)).remote(), timeout=30)
    assert type(info.value) is TaskUnschedulableError
    assert BOGUS_NODE in str(info.value) and "soft=True" in str(info.value)
    soft = where.options(scheduling_strategy=affinity(BOGUS_NODE, soft=True)).remote()
    assert nbcluster.get(soft, timeout=30) in c3["ids"]


def test_strategy_arguments_are_checked_at_the_call(c3):
    with pytest.raises(ValueError, match="hex"):
        NodeAffinitySchedulingStrategy("not-hex")
    with pytest.raises(TypeError):
        NodeAffinitySchedulingStrategy("")
    with pytest.raises(TypeError):
        NodeAffinitySchedulingStrategy(c3["local"], soft="yes")
    with pytest.raises((TypeError, ValueError)):
        where.options(scheduling_strategy="NEAREST").remote()


def test_actors_with_node_affinity_run_on_that_node(c3):
    # the head spills a hard-affinity actor away from a busy node (see
    # test_a_hard_affinity_actor_waits_for_its_busy_node): start from a quiet cluster
    settle()
    actors = [Where.options(scheduling_strategy=affinity(n)).remote() for n in c3["ids"]]
    soft = Where.options(scheduling_strategy=affinity(BOGUS_NODE, soft=True)).remote()
    try:
        assert nbcluster.get([a.node.remote() for a in actors], timeout=60) == c3["ids"]
        assert nbcluster.get(soft.node.remote(), timeout=60) in c3["ids"]
    finally:
        for a in [*actors, soft]:
            nbcluster.kill(a)


def test_an_actor_with_hard_affinity_to_an_unknown_node_fails(c3):
    actor = Where.options(scheduling_strategy=affinity(BOGUS_NODE)).remote()
    try:
        with pytest.raises(ActorUnschedulableError):
            nbcluster.get(actor.node.remote(), timeout=3)
    finally:
        nbcluster.kill(actor)


def test_affinity_to_a_node_that_died(c3):
    """Last: it leaves a dead node in ``nodes()`` (the live resources are back to baseline)."""
    before = set(c3["ids"])
    lc = state.local_cluster()
    lc.add_node(num_cpus=1)
    (new,) = {n["NodeID"] for n in nbcluster.nodes()} - before
    assert (
        nbcluster.get(where.options(scheduling_strategy=affinity(new)).remote(), timeout=30) == new
    )
    lc.remove_node()
    poll_for(lambda: not next(n for n in nbcluster.nodes() if n["NodeID"] == new)["Alive"], 30)
    with pytest.raises(NbclusterError) as info:
        nbcluster.get(where.options(scheduling_strategy=affinity(new)).remote(), timeout=60)
    assert type(info.value) is TaskUnschedulableError
    soft = where.options(scheduling_strategy=affinity(new, soft=True)).remote()
    assert nbcluster.get(soft, timeout=60) in before
    dead = next(n for n in nbcluster.nodes() if n["NodeID"] == new)
    assert dead["Alive"] is False and dead["DeathReason"]
