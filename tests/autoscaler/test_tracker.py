"""The autoscaler's bookkeeping between decisions (no processes): launches, joins,
failures with back-off, removals, head and monitor restarts, infeasible reported once."""

from __future__ import annotations

from typing import Any

from nbcluster.autoscaler.config import parse_config
from nbcluster.autoscaler.policy import ClusterState, Decision, Demand, Infeasible, decide
from nbcluster.autoscaler.providers import TAG_LAUNCH_TIME, TAG_NODE_TYPE
from nbcluster.autoscaler.tracker import HeadNode, Tracker


def config(**over: Any) -> Any:
    data: dict[str, Any] = {
        "cluster_name": "t",
        "max_workers": 4,
        "idle_timeout_minutes": 1,
        "provider": {"type": "local"},
        "available_node_types": {"cpu2": {"resources": {"CPU": 2}}},
        "launch_backoff_s": 5,
        "launch_backoff_max_s": 30,
    }
    data.update(over)
    return parse_config(data)


def head(name: str, busy: str = "", idle_s: float = 0.0) -> HeadNode:
    return HeadNode(name + "-id", name, {"CPU": 2}, {"CPU": 2}, busy, idle_s)


TAGS = {TAG_NODE_TYPE: "cpu2", TAG_LAUNCH_TIME: "100"}


def states(state: ClusterState) -> dict[str, str]:
    return {n.node_id: n.state for n in state.nodes}


def test_a_launch_goes_from_in_flight_to_launching_to_joined() -> None:
    t = Tracker(config())
    t.launch_started("cpu2", 2, 100.0, "2 x {CPU: 2} queued")
    assert t.observe(100.0, {}, []).pending_launches == {"cpu2": 2}
    t.launch_done("cpu2", ["a", "b"], 2, 101.0)
    st = t.observe(101.0, {"a": TAGS, "b": TAGS}, [])
    assert st.pending_launches == {} and states(st) == {"a": "launching", "b": "launching"}
    st = t.observe(103.0, {"a": TAGS, "b": TAGS}, [head("a", busy="1 running task")])
    assert states(st) == {"a": "running", "b": "launching"}
    kinds = [(e.kind, e.message) for e in t.take_events()]
    assert kinds[0] == ("launch", "launching 2 x cpu2 for 2 x {CPU: 2} queued")
    assert kinds[1] == ("joined", "node a (cpu2) joined after 2.0s")
    assert t.counts() == {"cpu2": (1, 1)}


def test_an_unmanaged_node_is_kept_out_of_the_autoscalers_hands() -> None:
    t = Tracker(config())
    st = t.observe(1.0, {}, [head("headnode", idle_s=100)])
    assert [(n.node_type, n.busy) for n in st.nodes] == [(None, "not launched by the autoscaler")]


def test_failed_launches_back_off_exponentially_and_are_reported() -> None:
    t = Tracker(config())
    for i, expect in enumerate([5, 10, 20, 30, 30]):
        t.launch_started("cpu2", 1, 100.0 + i, "x")
        t.launch_failed("cpu2", 1, "no such image", 100.0 + i)
        st = t.observe(100.0 + i, {}, [])
        assert st.backoff["cpu2"].retry_at == 100.0 + i + expect
        assert st.pending_launches == {}
    events = [e for e in t.take_events() if e.kind == "launch-failed"]
    assert len(events) == 5
    assert events[0].message == "cpu2: no such image; failure 1, retrying in 5s"
    # The back-off ends once a node of the type joins.
    t.launch_done("cpu2", ["a"], 1, 200.0)
    t.observe(201.0, {"a": TAGS}, [head("a")])
    assert "cpu2" not in t.backoff


def test_a_node_that_exits_before_joining_counts_as_a_failed_launch() -> None:
    t = Tracker(config())
    t.launch_started("cpu2", 1, 100.0, "x")
    t.launch_done("cpu2", ["a"], 1, 100.0)
    t.observe(100.5, {"a": TAGS}, [])
    st = t.observe(101.0, {}, [], describe=lambda i: f"{i} exited with code 1: ImportError")
    assert st.backoff["cpu2"].failures == 1
    ev = [e for e in t.take_events() if e.kind == "launch-failed"][0]
    assert "node exited before joining the cluster: a exited with code 1: ImportError" in ev.message


def test_fewer_nodes_than_asked_is_a_partial_failure() -> None:
    t = Tracker(config())
    t.launch_started("cpu2", 3, 1.0, "x")
    t.launch_done("cpu2", ["a"], 3, 1.0)
    assert t.backoff["cpu2"].failures == 1 and "a" in t.instances


def test_a_restarted_monitor_adopts_the_providers_nodes() -> None:
    t = Tracker(config())
    st = t.observe(500.0, {"a": TAGS, "b": TAGS}, [head("a", idle_s=30)])
    assert states(st) == {"a": "running", "b": "launching"}
    a = next(n for n in st.nodes if n.node_id == "a")
    assert a.node_type == "cpu2" and a.idle_since == 470.0
    assert t.instances["b"].launched_at == 100.0  # from the tag: times out as before
    resumed = [e for e in t.take_events() if e.kind == "resumed"]
    assert resumed[0].message == "found 2 node(s) launched earlier; managing them again"
    # Adopted nodes are neither relaunched nor removed while busy.
    d = decide(st, Demand(), config(), 500.0)
    assert d.launch == {} and [i for i, _ in d.terminate] == ["b"]  # b never joined (400 s)


def test_a_head_restart_does_not_lose_or_relaunch_nodes() -> None:
    t = Tracker(config())
    t.launch_started("cpu2", 1, 100.0, "x")
    t.launch_done("cpu2", ["a"], 1, 100.0)
    t.observe(101.0, {"a": TAGS}, [head("a", busy="1 running task")])
    t.take_events()
    # The head restarted: it knows no nodes until they register again.
    st = t.observe(110.0, {"a": TAGS}, [])
    a = st.nodes[0]
    assert (a.state, a.launched_at) == ("launching", 110.0)  # capacity, not idle, not failed
    assert decide(st, Demand(pending=[({"CPU": 2}, 1)]), config(), 111.0).launch == {}
    st = t.observe(112.0, {"a": TAGS}, [head("a", busy="1 running task")])
    assert states(st) == {"a": "running"}
    assert t.take_events() == []  # no failure, no second "joined"


def test_removal_drains_then_reports_the_node_gone() -> None:
    t = Tracker(config())
    t.observe(1.0, {"a": TAGS}, [head("a", idle_s=100)])
    t.take_events()
    t.terminate_started("a", "idle for 100s", 2.0)
    st = t.observe(2.0, {"a": TAGS}, [head("a", idle_s=100)])
    assert states(st) == {"a": "draining"}
    t.observe(3.0, {}, [])
    kinds = [(e.kind, e.message) for e in t.take_events()]
    assert kinds == [
        ("terminate", "removing a (cpu2): idle for 100s"),
        ("removed", "node a is gone (idle for 100s)"),
    ]


def test_a_failed_removal_is_retried_later() -> None:
    t = Tracker(config())
    t.observe(1.0, {"a": TAGS}, [head("a", idle_s=100)])
    t.terminate_started("a", "idle", 2.0)
    t.terminate_failed("a", "permission denied", 2.5)
    assert states(t.observe(3.0, {"a": TAGS}, [head("a", idle_s=100)])) == {"a": "running"}
    assert [e.kind for e in t.take_events()][-1] == "terminate-failed"


def _decision(*shapes: tuple[tuple[str, float], ...]) -> Decision:
    infeasible = [Infeasible(s, 1, "no node type can ever hold it") for s in shapes]
    return Decision({}, [], infeasible, [], {})


def test_infeasible_shapes_are_reported_once() -> None:
    t = Tracker(config())
    tpu = (("TPU", 1.0),)
    for now in range(100, 160):  # a minute of rounds with the same infeasible demand
        t.note_decision(_decision(tpu), float(now))
    events = [e for e in t.take_events() if e.kind == "infeasible"]
    assert len(events) == 1
    assert events[0].shape == {"TPU": 1.0}
    assert "{TPU: 1}" in events[0].message
    # Gone for longer than a minute and back: reported again.
    t.note_decision(_decision(), 300.0)
    t.note_decision(_decision(tpu), 301.0)
    assert [e.kind for e in t.take_events()] == ["infeasible"]


def test_a_node_at_the_head_before_its_launch_was_recorded_still_joins() -> None:
    # A provider whose create returns after the node joined: the next observation finds the
    # node listed and at the head at once. It is ours (launched while running), so it
    # joined, and says so; only the first observation after a start adopts silently.
    t = Tracker(config())
    t.launch_started("cpu2", 2, 100.0, "2 x {CPU: 2} queued")
    t.observe(100.0, {}, [])
    t.launch_done("cpu2", ["a"], 1, 101.0)
    t.observe(101.0, {"a": TAGS}, [head("a")])
    st = t.observe(102.5, {"a": TAGS, "b": TAGS}, [head("a"), head("b")])
    assert states(st) == {"a": "running", "b": "running"}
    joined = [e.message for e in t.take_events() if e.kind == "joined"]
    assert joined == ["node a (cpu2) joined after 0.0s", "node b (cpu2) joined after 2.5s"]
