"""The scheduling policy: ``fits``, ``load`` and ``pick_node`` as pure functions of a view."""

from __future__ import annotations

import pytest

from nbcluster._runtime.scheduling.policy import (
    EPS,
    Action,
    Decision,
    NodeView,
    fits,
    infeasible_message,
    load,
    pick_node,
)


def node(
    name: str, total: dict[str, float], available: dict[str, float] | None = None, **kw: bool
) -> NodeView:
    return NodeView(
        name.encode(), f"{name}:7000", total, dict(total) if available is None else available, **kw
    )


LOCAL_FREE = node("local", {"CPU": 4})
LOCAL_BUSY = node("local", {"CPU": 4}, {"CPU": 0})


# --------------------------------------------------------------------------- fits


@pytest.mark.parametrize(
    ("request_", "resources", "expected"),
    [
        ({}, {}, True),
        ({"CPU": 1}, {"CPU": 1}, True),
        ({"CPU": 1}, {"CPU": 0.5}, False),
        ({"CPU": 0}, {}, True),  # zero amounts are not requested
        ({"CPU": -1}, {}, True),
        ({"GPU": 1}, {"CPU": 8}, False),  # a missing name counts as zero
        ({"CPU": 1, "GPU": 1}, {"CPU": 2}, False),  # every name must fit
        ({"CPU": 1, "GPU": 1}, {"CPU": 2, "GPU": 1}, True),
        ({"CPU": 1}, {"CPU": 1 - EPS / 10}, True),  # rounding error is forgiven
        ({"CPU": 1}, {"CPU": 1 - 1e-6}, False),  # a real shortfall is not
        ({"CPU": 0.1 + 0.2}, {"CPU": 0.3}, True),
    ],
)
def test_fits(request_: dict[str, float], resources: dict[str, float], expected: bool) -> None:
    assert fits(request_, resources) is expected


# --------------------------------------------------------------------------- load


@pytest.mark.parametrize(
    ("total", "available", "expected"),
    [
        ({}, {}, 0.0),
        ({"CPU": 4}, {"CPU": 4}, 0.0),
        ({"CPU": 4}, {"CPU": 1}, 0.75),
        ({"CPU": 4}, {"CPU": 0}, 1.0),
        ({"CPU": 4}, {}, 1.0),  # nothing available recorded means all in use
        ({"CPU": 4, "GPU": 2}, {"CPU": 4, "GPU": 1}, 0.5),  # max over kinds
        ({"CPU": 4, "GPU": 0}, {"CPU": 2}, 0.5),  # kinds with zero total are ignored
        ({"CPU": 2}, {"CPU": -2}, 2.0),  # oversubscribed (blocked workers resumed)
    ],
)
def test_load(total: dict[str, float], available: dict[str, float], expected: float) -> None:
    assert load(NodeView(b"n", "n:1", total, available)) == pytest.approx(expected)


# --------------------------------------------------------------------------- DEFAULT


def test_default_local_while_it_fits() -> None:
    remote = node("r", {"CPU": 64})  # emptier and bigger, but local still fits
    d = pick_node({"CPU": 4}, LOCAL_FREE, [remote])
    assert d == Decision(Action.LOCAL, LOCAL_FREE, "fits on the local node")


def test_default_least_loaded_remote_when_local_busy() -> None:
    a = node("a", {"CPU": 4}, {"CPU": 2})  # load 0.5
    b = node("b", {"CPU": 4}, {"CPU": 3})  # load 0.25
    c = node("c", {"CPU": 4}, {"CPU": 0})  # full
    d = pick_node({"CPU": 1}, LOCAL_BUSY, [a, c, b])
    assert d == Decision(Action.SPILL, b, "local node busy; least-loaded node with room")


def test_default_tie_between_remotes_broken_by_order() -> None:
    a = node("a", {"CPU": 4}, {"CPU": 2})
    b = node("b", {"CPU": 4}, {"CPU": 2})
    assert pick_node({"CPU": 1}, LOCAL_BUSY, [a, b]).node is a
    assert pick_node({"CPU": 1}, LOCAL_BUSY, [b, a]).node is b


def test_default_only_remotes_where_it_fits_now() -> None:
    small = node("small", {"CPU": 1}, {"CPU": 1})  # load 0 but too small
    big = node("big", {"CPU": 8}, {"CPU": 3})  # load 0.625
    d = pick_node({"CPU": 2}, LOCAL_BUSY, [small, big])
    assert (d.action, d.node) == (Action.SPILL, big)


def test_default_queues_locally_when_local_could_ever_fit() -> None:
    busy_remote = node("r", {"CPU": 4}, {"CPU": 0})
    d = pick_node({"CPU": 4}, LOCAL_BUSY, [busy_remote])
    assert d == Decision(Action.LOCAL, LOCAL_BUSY, "queued until the local node has room")


def test_default_spills_to_node_that_could_ever_fit() -> None:
    gpu_a = node("a", {"CPU": 4, "GPU": 2}, {"CPU": 4, "GPU": 0})  # load 1.0
    gpu_b = node("b", {"CPU": 4, "GPU": 2}, {"CPU": 2, "GPU": 0})  # load 1.0
    gpu_c = node("c", {"CPU": 4, "GPU": 4}, {"CPU": 4, "GPU": 1})  # load 0.75
    d = pick_node({"GPU": 2}, LOCAL_FREE, [gpu_a, gpu_b, gpu_c])
    assert d == Decision(Action.SPILL, gpu_c, "only other nodes can fit this request")


def test_default_infeasible_names_request_and_cluster() -> None:
    r = node("r", {"CPU": 8, "GPU": 1})
    d = pick_node({"CPU": 16, "GPU": 0.5}, LOCAL_FREE, [r])
    assert d.action is Action.INFEASIBLE
    assert d.node is None
    assert d.reason == (
        "no node can ever fit {CPU: 16, GPU: 0.5}; the largest node has {CPU: 8, GPU: 1}. "
        "It stays pending in case a node that fits joins; lower the request or add a node."
    )


def test_dead_nodes_are_ignored() -> None:
    dead = node("dead", {"CPU": 8}, alive=False)
    assert pick_node({"CPU": 1}, LOCAL_BUSY, [dead]).action is Action.LOCAL
    d = pick_node({"CPU": 8}, LOCAL_FREE, [dead])
    assert d.action is Action.INFEASIBLE
    assert "the largest node has {CPU: 4}" in d.reason


def test_local_node_listed_among_others_is_not_a_remote() -> None:
    stale_local = NodeView(b"local", "local:7000", {"CPU": 4}, {"CPU": 4})
    d = pick_node({"CPU": 1}, LOCAL_BUSY, [stale_local])
    assert d == Decision(Action.LOCAL, LOCAL_BUSY, "queued until the local node has room")


def test_allow_spill_false_never_leaves_the_local_node() -> None:
    free_remote = node("r", {"CPU": 8, "GPU": 1})
    d = pick_node({"CPU": 1}, LOCAL_BUSY, [free_remote], allow_spill=False)
    assert (d.action, d.node) == (Action.LOCAL, LOCAL_BUSY)
    d = pick_node({"GPU": 1}, LOCAL_FREE, [free_remote], allow_spill=False)
    assert d.action is Action.INFEASIBLE
    assert d.reason.startswith(
        "no node can ever fit {GPU: 1}; the largest node has {CPU: 8, GPU: 1}. "
    )


def test_zero_request_fits_a_full_node() -> None:
    d = pick_node({"CPU": 0}, LOCAL_BUSY, [])
    assert (d.action, d.reason) == (Action.LOCAL, "fits on the local node")


# --------------------------------------------------------------------------- SPREAD


def test_spread_picks_least_loaded_even_when_local_fits() -> None:
    local = node("local", {"CPU": 4}, {"CPU": 2})  # load 0.5
    a = node("a", {"CPU": 4}, {"CPU": 3})  # load 0.25
    b = node("b", {"CPU": 4}, {"CPU": 4})  # load 0.0
    d = pick_node({"CPU": 1}, local, [a, b], "SPREAD")
    assert d == Decision(Action.SPILL, b, "least loaded node (SPREAD)")


def test_spread_stays_local_on_a_tie() -> None:
    a = node("a", {"CPU": 4})
    d = pick_node({"CPU": 1}, LOCAL_FREE, [a], "SPREAD")
    assert d == Decision(Action.LOCAL, LOCAL_FREE, "least loaded node (SPREAD)")


def test_spread_stays_local_when_remote_is_more_loaded() -> None:
    local = node("local", {"CPU": 4}, {"CPU": 3})
    a = node("a", {"CPU": 4}, {"CPU": 1})
    d = pick_node({"CPU": 1}, local, [a], "SPREAD")
    assert (d.action, d.node) == (Action.LOCAL, local)


def test_spread_remote_tie_broken_by_order() -> None:
    a = node("a", {"CPU": 4}, {"CPU": 4})
    b = node("b", {"CPU": 4}, {"CPU": 4})
    assert pick_node({"CPU": 1}, LOCAL_BUSY, [a, b], "SPREAD").node is a
    assert pick_node({"CPU": 1}, LOCAL_BUSY, [b, a], "SPREAD").node is b


def test_spread_with_nothing_free_falls_back_to_default() -> None:
    busy = node("r", {"CPU": 4}, {"CPU": 0})
    d = pick_node({"CPU": 1}, LOCAL_BUSY, [busy], "SPREAD")
    assert d == Decision(Action.LOCAL, LOCAL_BUSY, "queued until the local node has room")


def test_spread_without_spill_is_local() -> None:
    local = node("local", {"CPU": 4}, {"CPU": 1})
    empty = node("a", {"CPU": 4})
    d = pick_node({"CPU": 1}, local, [empty], "SPREAD", allow_spill=False)
    assert d == Decision(Action.LOCAL, local, "least loaded node (SPREAD)")


# --------------------------------------------------------------------------- messages


def test_infeasible_message_with_nothing() -> None:
    assert infeasible_message({}, []).startswith(
        "no node can ever fit {nothing}; the largest node has {no resources}. "
    )


def test_infeasible_message_takes_largest_per_kind_and_sorts() -> None:
    nodes = [node("a", {"memory": 1e9, "CPU": 2}), node("b", {"CPU": 16, "GPU": 0.25})]
    msg = infeasible_message({"memory": 2e9, "CPU": 0}, nodes)
    assert msg.startswith(
        "no node can ever fit {memory: 2e+09}; "
        "the largest node has {CPU: 16, GPU: 0.25, memory: 1e+09}. "
    )
