"""Placement groups on a real 3-node cluster (issue 5, acceptance 3-5).

Most tests share one cluster of three node managers on this host (2 CPUs and 1 GPU each);
after every test, the groups it left are removed (and the test fails), and the cluster's
resources must return to their baseline with no ``*_group_*`` resource left (the leak check
of RELIABILITY). Tests that add nodes or need special nodes start their own cluster with the
``cluster`` factory and come first: the factory shuts down the shared cluster.

Where work ran is read from ``get_runtime_context().get_node_id()`` inside it; concurrency
and "it is running now" are shown with signal files, never with timing thresholds.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import nbcluster
from nbcluster import state
from nbcluster.exceptions import (
    ActorDiedError,
    NbclusterError,
    TaskUnschedulableError,
    WorkerCrashedError,
)
from nbcluster.testing import assert_no_processes, poll_for
from nbcluster.util import (
    NodeAffinitySchedulingStrategy,
    PlacementGroup,
    PlacementGroupSchedulingStrategy,
    get_placement_group,
    placement_group,
    placement_group_table,
    remove_placement_group,
)

pytestmark = pytest.mark.integration

NODES = [{"num_cpus": 2, "num_gpus": 1, "name": f"node{i}"} for i in range(3)]


# ------------------------------------------------------------------------------ remote code


@nbcluster.remote
def where():
    return nbcluster.get_runtime_context().get_node_id()


@nbcluster.remote
def gated(started, gate, limit=60):
    """Mark ``started``, then wait for ``gate`` (hang guard: ``limit`` s); return the node."""
    Path(started).touch()
    deadline = time.monotonic() + limit
    while not os.path.exists(gate) and time.monotonic() < deadline:
        time.sleep(0.01)
    return nbcluster.get_runtime_context().get_node_id()


@nbcluster.remote
def meet(me, other, limit):
    """Mark ``me``; report whether ``other`` was marked while this ran (within ``limit`` s)."""
    Path(me).touch()
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if os.path.exists(other):
            return "together"
        time.sleep(0.01)
    return "alone"


@nbcluster.remote
def nested(depth):
    """The nodes of this task and of ``depth`` generations of children (num_cpus=1 each)."""
    me = nbcluster.get_runtime_context().get_node_id()
    if depth == 0:
        return [me]
    return [me, *nbcluster.get(nested.remote(depth - 1), timeout=60)]


@nbcluster.remote
def gpu_ids():
    return nbcluster.get_gpu_ids(), os.environ.get("CUDA_VISIBLE_DEVICES")


@nbcluster.remote(num_cpus=1)
class Where:
    def node(self):
        return nbcluster.get_runtime_context().get_node_id()

    def child_node(self):
        return nbcluster.get(where.remote(), timeout=60)


@nbcluster.remote(num_cpus=0)
class Submitter:
    """Submits tasks into a placement group from another process than the driver."""

    def run_in(self, pg, index, limit):
        ref = where.options(
            scheduling_strategy=PlacementGroupSchedulingStrategy(pg, index)
        ).remote()
        try:
            return nbcluster.get(ref, timeout=limit)
        except Exception as e:  # noqa: BLE001 - report the type to the test
            return type(e).__name__


@nbcluster.remote(num_cpus=0)
def group_round_trip():
    """A task that creates, uses and removes a group of its own."""
    pg = placement_group([{"CPU": 1}])
    ok = pg.wait(30)
    node = nbcluster.get(
        where.options(scheduling_strategy=PlacementGroupSchedulingStrategy(pg, 0)).remote(),
        timeout=60,
    )
    row = placement_group_table(pg)
    remove_placement_group(pg)
    return ok, node, row["bundles_to_node_id"][0], placement_group_table(pg)["state"]


# ------------------------------------------------------------------------------ helpers


def in_pg(pg: PlacementGroup, index: int = -1, capture: bool | None = None) -> Any:
    return PlacementGroupSchedulingStrategy(pg, index, placement_group_capture_child_tasks=capture)


def table(pg: PlacementGroup) -> dict[str, Any]:
    return placement_group_table(pg)


def bundle_nodes(pg: PlacementGroup) -> dict[int, str]:
    return table(pg)["bundles_to_node_id"]


def group_resources(resources: dict[str, float]) -> dict[str, float]:
    return {k: v for k, v in resources.items() if "_group_" in k}


def at_baseline(baseline: dict[str, float]) -> bool:
    total = nbcluster.cluster_resources()
    avail = nbcluster.available_resources()
    if group_resources(total) or group_resources(avail):
        return False
    return all(
        abs(total.get(k, 0) - v) < 1e-6 and abs(avail.get(k, 0) - v) < 1e-6
        for k, v in baseline.items()
    )


def wait_baseline(baseline: dict[str, float], timeout: float = 15) -> None:
    poll_for(
        lambda: at_baseline(baseline),
        timeout,
        message=f"resources did not return to {baseline}: total={nbcluster.cluster_resources()} "
        f"available={nbcluster.available_resources()}",
    )


def live_groups() -> list[dict[str, Any]]:
    return [r for r in placement_group_table().values() if r["state"] != "REMOVED"]


def handle(row: dict[str, Any]) -> PlacementGroup:
    bundles = [row["bundles"][i] for i in sorted(row["bundles"])]
    return PlacementGroup(bytes.fromhex(row["placement_group_id"]), bundles, row["name"])


def remove_all_groups() -> list[str]:
    left = live_groups()
    for row in left:
        remove_placement_group(handle(row))
    return [r["placement_group_id"][:8] + ":" + r["state"] for r in left]


def raises_exactly(exc_type: type[BaseException], ref: Any, timeout: float = 60) -> BaseException:
    with pytest.raises(NbclusterError) as info:
        nbcluster.get(ref, timeout=timeout)
    assert type(info.value) is exc_type, f"expected {exc_type.__name__}, got {info.value!r}"
    return info.value


# ------------------------------------------------------------------- special clusters (factory)


def test_unplaceable_groups_stay_pending_with_a_reason_until_a_node_that_fits_joins(cluster):
    cluster(num_cpus=2, _nodes=3)
    big = placement_group([{"CPU": 8}], strategy="PACK")
    wide = placement_group([{"CPU": 1}] * 4, strategy="STRICT_SPREAD")
    assert big.wait(1) is False
    assert wide.wait(1) is False
    for pg, strategy in ((big, "PACK"), (wide, "STRICT_SPREAD")):
        row = poll_for(lambda pg=pg: table(pg) if table(pg)["stats"]["message"] else None, 10)
        assert row["state"] == "PENDING"
        assert row["bundles_to_node_id"] == {}
        message = row["stats"]["message"]
        assert "infeasible" in message and strategy in message, message
        assert "larger than every node" in message and "too few nodes" in message, message
    assert group_resources(nbcluster.available_resources()) == {}
    assert nbcluster.available_resources()["CPU"] == 6

    before = {n["NodeID"] for n in nbcluster.nodes()}
    state.local_cluster().add_node(num_cpus=9)
    (new,) = {n["NodeID"] for n in nbcluster.nodes()} - before
    assert nbcluster.get(big.ready(), timeout=60) is True
    assert wide.wait(60) is True
    assert bundle_nodes(big) == {0: new}
    assert table(big)["state"] == "CREATED" and table(big)["stats"]["message"] == ""
    spread = bundle_nodes(wide)
    assert len(set(spread.values())) == 4 and new in spread.values()
    remove_placement_group(big)
    remove_placement_group(wide)
    wait_baseline({"CPU": 15})


def test_a_group_removed_while_it_is_being_committed_stays_removed(cluster):
    cluster(
        _node_configs=[
            {"num_cpus": 2, "name": "fast", "resources": {"fast": 100}},
            {"num_cpus": 2, "name": "slow", "resources": {"slow": 100}},
        ]
    )
    # A slow node: its manager is stopped 30 ms out of every 31 (SIGSTOP/SIGCONT by PID), so
    # each RPC to it waits a while, and removals land in every phase of the placement.
    slow_pid = state.local_cluster().nodes[1].pid
    stop = threading.Event()

    def throttle() -> None:
        while not stop.is_set():
            os.kill(slow_pid, signal.SIGSTOP)
            time.sleep(0.03)
            os.kill(slow_pid, signal.SIGCONT)
            time.sleep(0.001)

    thread = threading.Thread(target=throttle, daemon=True)
    thread.start()
    try:
        for i in range(40):
            pg = placement_group([{"slow": 1}] + [{"fast": 1}] * 5, strategy="PACK")
            time.sleep(0.003 * (i % 20))
            remove_placement_group(pg)
    finally:
        stop.set()
        thread.join()
        os.kill(slow_pid, signal.SIGCONT)
    poll_for(lambda: not any(r["state"] == "PENDING" for r in live_groups()), 20)
    states = Counter(r["state"] for r in placement_group_table().values())
    assert states == {"REMOVED": 40}
    wait_baseline({"CPU": 4, "fast": 100, "slow": 100}, timeout=5)


# ------------------------------------------------------------------------------ shared cluster


@pytest.fixture(scope="module")
def _three_nodes() -> Iterator[dict[str, Any]]:
    if nbcluster.is_initialized():
        nbcluster.shutdown()
    info = nbcluster.init(_node_configs=NODES)
    nodes = nbcluster.nodes()
    yield {
        "info": info,
        "baseline": nbcluster.cluster_resources(),
        "ids": [n["NodeID"] for n in nodes],
        "by_name": {n["NodeName"]: n["NodeID"] for n in nodes},
    }
    nbcluster.shutdown()
    assert_no_processes(info.session_dir, timeout=10)


@pytest.fixture
def c3(_three_nodes: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """The shared 3-node cluster; afterwards: no live group, resources back to baseline."""
    if not nbcluster.is_initialized():
        pytest.fail("the module's shared cluster was shut down by an earlier test")
    yield _three_nodes
    left = remove_all_groups()
    wait_baseline(_three_nodes["baseline"])
    assert not left, f"the test left placement groups behind: {left}"


def test_the_shared_cluster_has_three_nodes_with_two_cpus(c3):
    assert c3["baseline"]["CPU"] == 6 and c3["baseline"]["GPU"] == 3
    assert sorted(c3["by_name"]) == ["node0", "node1", "node2"]
    assert c3["info"].node_id in c3["ids"]
    assert all(n["Resources"]["CPU"] == 2 for n in nbcluster.nodes())


@pytest.mark.parametrize(
    ("strategy", "count", "distinct"),
    [
        ("PACK", 2, 1),
        ("PACK", 3, 2),
        ("SPREAD", 3, 3),
        ("STRICT_PACK", 2, 1),
        ("STRICT_SPREAD", 3, 3),
    ],
)
def test_a_group_is_created_with_its_strategy(c3, strategy, count, distinct):
    pg = placement_group([{"CPU": 1}] * count, strategy=strategy)
    ref = pg.ready()
    assert isinstance(ref, nbcluster.ObjectRef)
    assert nbcluster.get(ref, timeout=30) is True
    assert pg.wait(10) is True
    assert pg.bundle_count == count and pg.bundle_specs == [{"CPU": 1.0}] * count
    row = table(pg)
    assert row["placement_group_id"] == pg.id.hex()
    assert (row["state"], row["strategy"], row["stats"]["message"]) == ("CREATED", strategy, "")
    assert row["bundles"] == {i: {"CPU": 1.0} for i in range(count)}
    placed = row["bundles_to_node_id"]
    assert sorted(placed) == list(range(count)) and set(placed.values()) <= set(c3["ids"])
    assert len(set(placed.values())) == distinct
    assert max(Counter(placed.values()).values()) <= 2  # a node has 2 CPUs

    # Per node: each bundle's resources appear on the node that holds it, and only there.
    hexid = pg.id.hex()

    def reported() -> bool:
        per_node = {n["NodeID"]: n for n in nbcluster.nodes() if n["Alive"]}
        for i, node_id in placed.items():
            if per_node[node_id]["Resources"].get(f"CPU_group_{i}_{hexid}") != 1.0:
                return False
            if any(
                f"CPU_group_{i}_{hexid}" in n["Resources"]
                for nid, n in per_node.items()
                if nid != node_id
            ):
                return False
        return (
            nbcluster.cluster_resources().get(f"CPU_group_{hexid}") == count
            and nbcluster.available_resources().get("CPU") == 6 - count
        )

    poll_for(reported, 10, message=f"bundles not reported per node: {nbcluster.nodes()}")
    remove_placement_group(pg)
    assert table(pg)["state"] == "REMOVED"
    wait_baseline(c3["baseline"])


def test_placement_group_table_lists_every_group(c3):
    a = placement_group([{"CPU": 1}], name="table-a")
    b = placement_group([{"CPU": 1}, {"GPU": 1}], strategy="SPREAD", lifetime="detached")
    assert a.wait(10) and b.wait(10)
    rows = placement_group_table()
    assert {a.id.hex(), b.id.hex()} <= set(rows)
    assert rows[a.id.hex()] == table(a)
    assert rows[a.id.hex()]["name"] == "table-a" and rows[a.id.hex()]["detached"] is False
    assert rows[b.id.hex()]["detached"] is True
    assert rows[b.id.hex()]["bundles"] == {0: {"CPU": 1.0}, 1: {"GPU": 1.0}}
    remove_placement_group(a)
    remove_placement_group(b)
    rows = placement_group_table()
    assert rows[a.id.hex()]["state"] == rows[b.id.hex()]["state"] == "REMOVED"


def test_tasks_run_on_the_node_of_their_bundle(c3):
    pg = placement_group([{"CPU": 1}] * 3, strategy="STRICT_SPREAD")
    assert pg.wait(10)
    placed = bundle_nodes(pg)
    for i in range(3):
        got = nbcluster.get(
            [where.options(scheduling_strategy=in_pg(pg, i)).remote() for _ in range(3)]
        )
        assert got == [placed[i]] * 3
    anywhere = nbcluster.get(
        [where.options(scheduling_strategy=in_pg(pg, -1)).remote() for _ in range(9)]
    )
    assert set(anywhere) <= set(placed.values())
    zero = where.options(num_cpus=0, scheduling_strategy=in_pg(pg, 2)).remote()
    assert nbcluster.get(zero, timeout=30) == placed[2]
    remove_placement_group(pg)


def test_actors_run_on_the_node_of_their_bundle(c3):
    pg = placement_group([{"CPU": 1}] * 3, strategy="STRICT_SPREAD")
    assert pg.wait(10)
    placed = bundle_nodes(pg)
    actors = [Where.options(scheduling_strategy=in_pg(pg, i)).remote() for i in range(3)]
    try:
        assert nbcluster.get([a.node.remote() for a in actors], timeout=60) == [
            placed[i] for i in range(3)
        ]
    finally:
        for a in actors:
            nbcluster.kill(a)
    pg2 = placement_group([{"CPU": 1}, {"CPU": 1}], strategy="STRICT_SPREAD")
    assert pg2.wait(10)
    any_bundle = Where.options(scheduling_strategy=in_pg(pg2, -1)).remote()
    try:
        assert nbcluster.get(any_bundle.node.remote(), timeout=60) in set(
            bundle_nodes(pg2).values()
        )
    finally:
        nbcluster.kill(any_bundle)
    remove_placement_group(pg)
    remove_placement_group(pg2)


def _two_whole_nodes(c3: dict[str, Any]) -> tuple[PlacementGroup, set[str], str]:
    """A group holding two whole nodes (2 CPUs each); returns it, its nodes and the free node."""
    pg = placement_group([{"CPU": 2}, {"CPU": 2}], strategy="STRICT_SPREAD")
    assert pg.wait(10)
    group = set(bundle_nodes(pg).values())
    (outside,) = set(c3["ids"]) - group
    # Let the nodes' own views of the cluster (heartbeats) see the reservation.
    poll_for(lambda: nbcluster.available_resources().get("CPU") == 2, 10)
    time.sleep(1.0)
    return pg, group, outside


def test_capture_child_tasks_keeps_a_child_inside_the_group(c3):
    pg, group, outside = _two_whole_nodes(c3)
    # The parent's node has no plain CPU left, so an uncaptured child must leave the group...
    free = nbcluster.get(
        nested.options(num_cpus=1, scheduling_strategy=in_pg(pg, 0)).remote(1), timeout=60
    )
    assert free[0] in group and free[1] == outside
    # ...and a captured one stays in it.
    captured = in_pg(pg, 0, capture=True)
    kept = nbcluster.get(
        nested.options(num_cpus=1, scheduling_strategy=captured).remote(1), timeout=60
    )
    assert kept[0] in group and kept[1] in group
    remove_placement_group(pg)


def test_capture_child_tasks_also_captures_grandchildren(c3):
    pg, group, outside = _two_whole_nodes(c3)
    try:
        captured = in_pg(pg, 0, capture=True)
        # The parent takes no CPU, so the child and grandchild (1 CPU each) fit on either
        # bundle node whichever one they are routed to (see the "any bundle" test below).
        nodes = nbcluster.get(
            nested.options(num_cpus=0, scheduling_strategy=captured).remote(2), timeout=60
        )
        assert [n in group for n in nodes] == [True, True, True], (nodes, outside)
    finally:
        remove_placement_group(pg)


def test_an_actor_with_capture_child_tasks_keeps_its_tasks_in_the_group(c3):
    pg, group, outside = _two_whole_nodes(c3)
    actor = Where.options(scheduling_strategy=in_pg(pg, 0, capture=True)).remote()
    try:
        assert nbcluster.get(actor.node.remote(), timeout=60) in group
        assert nbcluster.get(actor.child_node.remote(), timeout=60) in group
    finally:
        nbcluster.kill(actor)
        remove_placement_group(pg)


def test_a_group_is_reserved_all_or_nothing(c3, tmp_path):
    """Two 2-CPU bundles, one free node: nothing is reserved until both fit."""
    free_node, *busy_nodes = c3["ids"]  # the head's order: placement tries the free node first
    gate = tmp_path / "gate"
    blockers = []
    for k, node_id in enumerate(busy_nodes):
        started = tmp_path / f"started{k}"
        ref = gated.options(
            num_cpus=2, scheduling_strategy=NodeAffinitySchedulingStrategy(node_id)
        ).remote(str(started), str(gate))
        blockers.append((ref, started))
    try:
        poll_for(lambda: all(s.exists() for _, s in blockers), 30, message="blockers did not start")
        pg = placement_group([{"CPU": 2}, {"CPU": 2}], strategy="PACK")  # possibly on a stale view
        # Give the head time to try (and retry) and the heartbeats to report any reservation.
        time.sleep(1.2)
        for _ in range(10):
            row = table(pg)
            assert row["state"] == "PENDING" and row["bundles_to_node_id"] == {}
            assert row["stats"]["message"] == "waiting for resources to free up"
            avail = nbcluster.available_resources()
            assert avail.get("CPU") == 2 and group_resources(avail) == {}, avail
            per_node = {n["NodeID"]: n["Available"].get("CPU", 0) for n in nbcluster.nodes()}
            assert per_node == {free_node: 2, busy_nodes[0]: 0, busy_nodes[1]: 0}
            time.sleep(0.1)
        assert pg.wait(0.5) is False
    finally:
        gate.touch()
    assert nbcluster.get([r for r, _ in blockers], timeout=60) == busy_nodes
    assert pg.wait(30) is True
    assert len(set(bundle_nodes(pg).values())) == 2
    remove_placement_group(pg)


def test_removing_a_group_ends_its_tasks_and_actors_and_frees_it(c3, tmp_path):
    pg = placement_group([{"CPU": 1}] * 3, strategy="STRICT_SPREAD")
    assert pg.wait(10)
    gate = tmp_path / "never"
    no_retry = gated.options(max_retries=0, scheduling_strategy=in_pg(pg, 0)).remote(
        str(tmp_path / "s0"), str(gate)
    )
    retried = gated.options(scheduling_strategy=in_pg(pg, 1)).remote(
        str(tmp_path / "s1"), str(gate)
    )
    actor = Where.options(scheduling_strategy=in_pg(pg, 2)).remote()
    assert nbcluster.get(actor.node.remote(), timeout=60) == bundle_nodes(pg)[2]
    poll_for(lambda: (tmp_path / "s0").exists() and (tmp_path / "s1").exists(), 30)
    queued = where.options(scheduling_strategy=in_pg(pg, 1)).remote()  # bundle 1 is busy
    assert nbcluster.wait([queued], timeout=0.3)[0] == []
    assert group_resources(nbcluster.cluster_resources())

    remove_placement_group(pg)
    assert table(pg)["state"] == "REMOVED"
    raises_exactly(WorkerCrashedError, no_retry)  # killed, no retries left
    raises_exactly(TaskUnschedulableError, retried)  # killed, retried: the group is gone
    raises_exactly(TaskUnschedulableError, queued)
    raises_exactly(ActorDiedError, actor.node.remote())
    late = where.options(scheduling_strategy=in_pg(pg, 0)).remote()
    raises_exactly(TaskUnschedulableError, late)
    with pytest.raises(NbclusterError, match="removed"):
        nbcluster.get(pg.ready(), timeout=30)
    remove_placement_group(pg)  # a second removal is harmless
    wait_baseline(c3["baseline"])


def test_wait_is_false_for_a_group_removed_before_it_was_created(c3):
    pg = placement_group([{"CPU": 64}])
    assert pg.wait(0.5) is False
    remove_placement_group(pg)
    assert pg.wait(1) is False


def test_get_placement_group_by_name(c3):
    pg = placement_group([{"CPU": 1}, {"CPU": 1}], strategy="SPREAD", name="by-name")
    found = get_placement_group("by-name")
    assert found == pg and found.id == pg.id
    assert (found.name, found.bundle_specs) == ("by-name", [{"CPU": 1.0}, {"CPU": 1.0}])
    assert found.wait(10)
    node = nbcluster.get(where.options(scheduling_strategy=in_pg(found, 1)).remote(), timeout=30)
    assert node == bundle_nodes(pg)[1]
    with pytest.raises(ValueError, match="no-such-group"):
        get_placement_group("no-such-group")
    remove_placement_group(found)
    with pytest.raises(ValueError, match="by-name"):
        get_placement_group("by-name")
    again = placement_group([{"CPU": 1}], name="by-name")  # the name is free again
    assert get_placement_group("by-name").id == again.id != pg.id
    remove_placement_group(again)


def test_a_duplicate_name_raises_at_the_call(c3):
    first = placement_group([{"CPU": 1}], name="twice")
    with pytest.raises(ValueError, match="twice"):
        placement_group([{"CPU": 1}], name="twice")
    assert first.wait(10)
    assert [r["name"] for r in live_groups()] == ["twice"]
    remove_placement_group(first)


@pytest.mark.parametrize(
    ("bundles", "kwargs"),
    [
        ([], {}),
        ("CPU", {}),
        ({"CPU": 1}, {}),
        ([{}], {}),
        ([{"CPU": 1}, "GPU"], {}),
        ([{"CPU": -1}], {}),
        ([{"CPU": "1"}], {}),
        ([{"CPU": True}], {}),
        ([{"CPU": 0}], {}),
        ([{1: 1}], {}),
        ([{"CPU": 1}], {"strategy": "pack"}),
        ([{"CPU": 1}], {"strategy": "BEST_EFFORT"}),
        ([{"CPU": 1}], {"strategy": None}),
        ([{"CPU": 1}], {"lifetime": "forever"}),
    ],
)
def test_bad_bundles_or_strategy_raise_value_error_at_the_call(c3, bundles, kwargs):
    with pytest.raises(ValueError):
        placement_group(bundles, **kwargs)
    assert live_groups() == []


def test_bad_strategy_objects_raise_at_the_call(c3):
    pg = placement_group([{"CPU": 1}, {"CPU": 1}])
    for index in (2, -2, 1.0, True):
        with pytest.raises(ValueError, match="placement_group_bundle_index"):
            PlacementGroupSchedulingStrategy(pg, index)
    with pytest.raises(TypeError, match="PlacementGroup"):
        PlacementGroupSchedulingStrategy("not a group", 0)
    with pytest.raises(TypeError):
        placement_group([{"CPU": 1}], name=5)
    remove_placement_group(pg)


def test_a_task_can_create_use_and_remove_a_group(c3):
    ok, node, bundle_node, final = nbcluster.get(group_round_trip.remote(), timeout=90)
    assert ok is True and node == bundle_node and final == "REMOVED"


def test_a_detached_group_outlives_its_driver_and_a_plain_one_does_not(c3, tmp_path):
    script = textwrap.dedent(
        f"""
        import nbcluster
        from nbcluster.util import placement_group
        nbcluster.init(address={c3["info"].address!r})
        kept = placement_group([{{"CPU": 1}}], name="kept", lifetime="detached")
        dropped = placement_group([{{"CPU": 1}}], name="dropped")
        assert kept.wait(30) and dropped.wait(30)
        print("ready", flush=True)
        nbcluster.shutdown()  # the driver detaches: its job finishes
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=120,
        env=os.environ.copy(),
    )
    assert done.returncode == 0 and "ready" in done.stdout, done.stderr[-2000:]

    def by_name() -> dict[str, str]:
        return {
            r["name"]: r["state"]
            for r in placement_group_table().values()
            if r["name"] in ("kept", "dropped")
        }

    poll_for(
        lambda: by_name() == {"kept": "CREATED", "dropped": "REMOVED"}, 30, message=f"{by_name()}"
    )
    remove_all_groups()


# --------------------------------------------------------------------------- known bugs


def test_a_one_cpu_bundle_runs_one_one_cpu_task_at_a_time(c3, tmp_path):
    pg = placement_group([{"CPU": 1}])
    assert pg.wait(10)
    try:
        a = meet.options(scheduling_strategy=in_pg(pg, 0)).remote(
            str(tmp_path / "a"), str(tmp_path / "b"), 2
        )
        b = meet.options(scheduling_strategy=in_pg(pg, -1)).remote(
            str(tmp_path / "b"), str(tmp_path / "a"), 2
        )
        assert nbcluster.get([a, b], timeout=60) != ["together", "together"]
    finally:
        remove_placement_group(pg)


def test_a_task_in_a_gpu_bundle_sees_its_gpu(c3):
    pg = placement_group([{"CPU": 1, "GPU": 1}])
    assert pg.wait(10)
    try:
        ids, visible = nbcluster.get(
            gpu_ids.options(num_gpus=1, scheduling_strategy=in_pg(pg, 0)).remote(), timeout=30
        )
        assert len(ids) == 1 and visible == str(ids[0])
    finally:
        remove_placement_group(pg)


def test_a_group_removed_elsewhere_fails_new_tasks_in_every_process(c3):
    pg = placement_group([{"CPU": 1}])
    assert pg.wait(10)
    sub = Submitter.remote()
    try:
        assert nbcluster.get(sub.run_in.remote(pg, 0, 30), timeout=60) == bundle_nodes(pg)[0]
        remove_placement_group(pg)
        assert nbcluster.get(sub.run_in.remote(pg, 0, 3), timeout=60) == "TaskUnschedulableError"
    finally:
        nbcluster.kill(sub)
        remove_placement_group(pg)


def test_a_task_for_any_bundle_runs_where_the_group_has_room(c3, tmp_path):
    pg = placement_group([{"CPU": 1}, {"CPU": 1}], strategy="STRICT_SPREAD")
    assert pg.wait(10)
    placed = bundle_nodes(pg)
    address = {
        n["NodeID"]: f"{n['NodeManagerAddress']}:{n['NodeManagerPort']}" for n in nbcluster.nodes()
    }
    # Fill the bundle whose node a fresh "any bundle" request is routed to first.
    full = min(placed, key=lambda i: address[placed[i]])
    gate = tmp_path / "gate"
    holder = gated.options(scheduling_strategy=in_pg(pg, full)).remote(
        str(tmp_path / "started"), str(gate)
    )
    try:
        poll_for(lambda: (tmp_path / "started").exists(), 30)
        anywhere = where.options(scheduling_strategy=in_pg(pg, -1)).remote()
        assert nbcluster.get(anywhere, timeout=5) == placed[1 - full]
    finally:
        gate.touch()
        nbcluster.get(holder, timeout=60)
        remove_placement_group(pg)
