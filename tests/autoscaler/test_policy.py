"""The autoscaler's decision function on synthetic cluster states (no processes)."""

from __future__ import annotations

from typing import Any

import pytest

from nbcluster.autoscaler.config import parse_config
from nbcluster.autoscaler.policy import (
    Backoff,
    ClusterState,
    Demand,
    NodeStatus,
    PlacementGroupDemand,
    decide,
    format_shape,
    shape_key,
)

NOW = 1000.0


def config(**over: Any) -> Any:
    data: dict[str, Any] = {
        "cluster_name": "t",
        "max_workers": 20,
        "idle_timeout_minutes": 1,
        "provider": {"type": "local"},
        "available_node_types": {
            "cpu2": {"resources": {"CPU": 2}, "max_workers": 20},
            "gpu": {"resources": {"CPU": 4, "GPU": 1}, "max_workers": 2},
        },
        "launch_timeout_s": 60,
    }
    data.update(over)
    return parse_config(data)


HEAD = NodeStatus("head", None, "running", {"CPU": 2}, {"CPU": 0}, busy="the head")


def worker(
    name: str,
    *,
    free: float = 2.0,
    busy: str = "",
    idle_for: float | None = None,
    node_type: str = "cpu2",
    total: float = 2.0,
) -> NodeStatus:
    idle_since = None if busy or idle_for is None else NOW - idle_for
    return NodeStatus(
        name, node_type, "running", {"CPU": total}, {"CPU": free}, busy=busy, idle_since=idle_since
    )


def run(nodes: list[NodeStatus], demand: Demand, cfg: Any = None, **state: Any) -> Any:
    return decide(ClusterState([HEAD, *nodes], **state), demand, cfg or config(), NOW)


# -- scale up ------------------------------------------------------------------------------------
def test_queued_demand_is_bin_packed_onto_new_nodes() -> None:
    d = run([], Demand(pending=[({"CPU": 1}, 7)]))
    assert d.launch == {"cpu2": 4}  # 7 one-CPU requests on two-CPU nodes
    assert d.terminate == [] and d.infeasible == []
    assert "7 x {CPU: 1} queued" in d.reasons["cpu2"]


def test_free_resources_of_running_nodes_absorb_demand() -> None:
    d = run([worker("w1", free=2.0, busy="1 running task")], Demand(pending=[({"CPU": 1}, 2)]))
    assert d.launch == {}


def test_launching_nodes_and_launches_in_flight_count_as_capacity() -> None:
    launching = NodeStatus("w1", "cpu2", "launching", {"CPU": 2}, {"CPU": 2}, launched_at=NOW - 1)
    d = run([launching], Demand(pending=[({"CPU": 1}, 4)]), pending_launches={"cpu2": 1})
    assert d.launch == {}
    d = run([launching], Demand(pending=[({"CPU": 1}, 6)]), pending_launches={"cpu2": 1})
    assert d.launch == {"cpu2": 1}


def test_per_type_max_workers_caps_launches_and_says_why() -> None:
    cfg = config(
        available_node_types={"cpu2": {"resources": {"CPU": 2}, "max_workers": 3}},
    )
    d = run([worker("w1", free=0, busy="x")], Demand(pending=[({"CPU": 2}, 10)]), cfg)
    assert d.launch == {"cpu2": 2}
    assert len(d.waiting) == 1
    w = d.waiting[0]
    assert w.count == 8 and "node type cpu2 is at its max_workers (3)" in w.reason


def test_cluster_max_workers_caps_all_types() -> None:
    cfg = config(max_workers=2)
    d = run([], Demand(pending=[({"CPU": 2}, 5), ({"GPU": 1}, 1)]), cfg)
    assert sum(d.launch.values()) == 2
    assert any("the cluster is at max_workers (2)" in w.reason for w in d.waiting)


def test_cpu_demand_does_not_take_gpu_nodes() -> None:
    d = run([], Demand(pending=[({"CPU": 2}, 1)]))
    assert d.launch == {"cpu2": 1}
    d = run([], Demand(pending=[({"CPU": 1, "GPU": 1}, 1), ({"CPU": 1}, 1)]))
    # The GPU node has room for the CPU request too: one node, no extra cpu2.
    assert d.launch == {"gpu": 1}


def test_larger_shapes_choose_the_type_they_fit() -> None:
    d = run([], Demand(pending=[({"CPU": 3}, 1)]))
    assert d.launch == {"gpu": 1}  # only the 4-CPU type fits, even though it has a GPU


def test_upscaling_speed_limits_pending_launches() -> None:
    d = run([], Demand(pending=[({"CPU": 2}, 15)]))
    assert d.launch == {"cpu2": 5}  # no worker runs yet: the floor of 5 pending launches
    assert any("upscaling_speed" in w.reason for w in d.waiting)
    running = [worker(f"w{i}", free=0, busy="x") for i in range(8)]
    d = run(running, Demand(pending=[({"CPU": 2}, 15)]))
    assert d.launch == {"cpu2": 8}  # speed 1.0 x 8 running
    d = run(running, Demand(pending=[({"CPU": 2}, 15)]), config(upscaling_speed=0.5))
    assert d.launch == {"cpu2": 5}


def test_a_type_backing_off_after_failures_is_not_launched() -> None:
    backoff = {"cpu2": Backoff(3, NOW + 20, "exec failed")}
    demand = Demand(pending=[({"CPU": 1}, 2)])
    only = config(available_node_types={"cpu2": {"resources": {"CPU": 2}}})
    d = run([], demand, only, backoff=backoff)
    assert d.launch == {}
    assert "failed to launch 3 time(s); retrying in 20s (exec failed)" in d.waiting[0].reason
    assert run([], demand, only, backoff={"cpu2": Backoff(3, NOW - 1)}).launch == {"cpu2": 1}
    # With another type that fits, the work goes there meanwhile.
    assert run([], demand, backoff=backoff).launch == {"gpu": 1}


def test_requests_for_a_groups_bundles_and_zero_shapes_are_not_demand() -> None:
    d = run([], Demand(pending=[({"CPU_group_0_abc": 1}, 3), ({}, 4), ({"CPU": 0}, 1)]))
    assert d.launch == {} and d.infeasible == []


# -- infeasible --------------------------------------------------------------------------------------
def test_infeasible_shapes_are_reported_with_the_node_types_and_not_launched() -> None:
    d = run([], Demand(infeasible=[({"TPU": 1}, 3)], pending=[({"CPU": 8}, 1)]))
    assert d.launch == {}
    assert [format_shape(i.shape) for i in d.infeasible] == ["{CPU: 8}", "{TPU: 1}"]
    msg = d.infeasible[1].message
    assert "no node type can ever hold {TPU: 1}" in msg
    assert "cpu2 {CPU: 2}; gpu {CPU: 4, GPU: 1}" in msg
    assert d.infeasible[1].count == 3


def test_infeasible_now_but_fitting_a_node_type_launches_it() -> None:
    d = run([], Demand(infeasible=[({"GPU": 1}, 1)]))
    assert d.launch == {"gpu": 1} and d.infeasible == []


def test_shape_only_an_existing_node_has_is_not_infeasible() -> None:
    special = NodeStatus("h2", None, "running", {"disk": 1}, {"disk": 0}, busy="x")
    d = run([special], Demand(pending=[({"disk": 1}, 1)]))
    assert d.launch == {} and d.infeasible == []
    assert "no worker node type can hold it" in d.waiting[0].reason


# -- placement groups -----------------------------------------------------------------------------------
def test_strict_spread_groups_get_one_node_per_bundle() -> None:
    pg = PlacementGroupDemand([{"CPU": 1}] * 3, "STRICT_SPREAD")
    d = run([], Demand(placement_groups=[pg]))
    assert d.launch == {"cpu2": 3}


def test_strict_pack_groups_need_one_node_that_holds_all_bundles() -> None:
    pg = PlacementGroupDemand([{"CPU": 1}] * 3, "STRICT_PACK")
    d = run([], Demand(placement_groups=[pg]))
    assert d.launch == {"gpu": 1}  # only the 4-CPU type holds 3 CPUs on one node
    pg = PlacementGroupDemand([{"CPU": 1}] * 3, "PACK")
    assert run([], Demand(placement_groups=[pg])).launch == {"cpu2": 2}


def test_a_group_no_node_type_can_hold_is_infeasible() -> None:
    pg = PlacementGroupDemand([{"CPU": 3}] * 2, "STRICT_PACK")
    d = run([], Demand(placement_groups=[pg]))
    assert d.launch == {} and format_shape(d.infeasible[0].shape) == "{CPU: 6}"


# -- request_resources -----------------------------------------------------------------------------------
def test_request_resources_counts_running_work_and_bypasses_upscaling_speed() -> None:
    busy = worker("w1", free=0, busy="2 running tasks")
    d = run([busy], Demand(requested=[({"CPU": 1}, 16)]))
    # Totals: head 2 + w1 2 = 4 CPUs, so 12 more: 6 nodes (more than the 5-launch floor).
    assert d.launch == {"cpu2": 6}
    assert "request_resources" in d.reasons["cpu2"]


def test_a_huge_request_is_capped_by_max_workers_not_expanded() -> None:
    d = run([], Demand(requested=[({"CPU": 1}, 10**12)]))
    assert d.launch == {"cpu2": 20}
    assert any("max_workers" in w.reason for w in d.waiting)


def test_request_resources_keeps_idle_nodes_it_needs() -> None:
    idle = [worker(f"w{i}", idle_for=600) for i in range(3)]
    d = run(idle, Demand(requested=[({"CPU": 2}, 2), ({"CPU": 2}, 1)]))
    # The head's 2 CPUs hold one bundle; two workers are needed, one may go.
    assert len(d.terminate) == 1
    d = run(idle, Demand())
    assert len(d.terminate) == 3


# -- min_workers --------------------------------------------------------------------------------------------
def test_min_workers_are_launched_and_kept() -> None:
    cfg = config(available_node_types={"cpu2": {"resources": {"CPU": 2}, "min_workers": 2}})
    assert run([], Demand(), cfg).launch == {"cpu2": 2}
    idle = [worker(f"w{i}", idle_for=600) for i in range(3)]
    d = run(idle, Demand(), cfg)
    assert d.launch == {} and len(d.terminate) == 1


# -- scale down ----------------------------------------------------------------------------------------------
def test_idle_nodes_go_after_the_idle_timeout_only() -> None:
    d = run([worker("w1", idle_for=59)], Demand())
    assert d.terminate == []
    d = run([worker("w1", idle_for=61)], Demand())
    assert d.terminate == [("w1", "idle for 61s (idle timeout 60s)")]


@pytest.mark.parametrize(
    "busy",
    [
        "1 running task(s)/actor(s)",
        "1 placement-group bundle(s)",
        "3 object(s) (1.0 MiB) stored only here",
    ],
)
def test_busy_nodes_are_never_removed(busy: str) -> None:
    node = NodeStatus("w1", "cpu2", "running", {"CPU": 2}, {"CPU": 2}, busy=busy, idle_since=0.0)
    assert run([node], Demand()).terminate == []


def test_an_idle_node_that_demand_was_packed_onto_stays() -> None:
    d = run([worker("w1", idle_for=600)], Demand(pending=[({"CPU": 1}, 1)]))
    assert d.terminate == [] and d.launch == {}


def test_nodes_not_launched_by_the_autoscaler_are_never_removed() -> None:
    other = NodeStatus("x", None, "running", {"CPU": 2}, {"CPU": 2}, idle_since=0.0)
    assert run([other], Demand()).terminate == []


def test_nodes_that_do_not_join_in_time_are_removed() -> None:
    late = NodeStatus("w1", "cpu2", "launching", {"CPU": 2}, {"CPU": 2}, launched_at=NOW - 61)
    d = run([late], Demand())
    assert d.terminate == [("w1", "did not join the cluster within 60s")]


def test_nodes_of_a_removed_type_or_above_max_go_when_idle() -> None:
    gone = worker("w1", node_type="old", idle_for=1)
    d = run([gone], Demand())
    assert d.terminate == [("w1", "node type old is no longer in the config")]
    cfg = config(available_node_types={"cpu2": {"resources": {"CPU": 2}, "max_workers": 1}})
    two = [worker("w1", idle_for=1), worker("w2", idle_for=2)]
    d = run(two, Demand(), cfg)
    assert d.terminate == [("w2", "node type cpu2 is above its max_workers (1)")]


def test_draining_nodes_are_neither_capacity_nor_removed_again() -> None:
    draining = NodeStatus("w1", "cpu2", "draining", {"CPU": 2}, {})
    d = run([draining], Demand(pending=[({"CPU": 2}, 1)]))
    assert d.launch == {"cpu2": 1} and d.terminate == []


def test_shape_keys_are_canonical() -> None:
    assert shape_key({"GPU": 1, "CPU": 0, "A": 2}) == (("A", 2.0), ("GPU", 1.0))
    assert format_shape({"CPU": 0.5}) == "{CPU: 0.5}"
