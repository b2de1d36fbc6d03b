"""Placement groups as pure logic: ``place_bundles``, bundle resource naming, NodeState bundles.

``place_bundles`` is checked on synthetic cluster views (strategies, feasibility with
``use_total``, dead nodes), and against a brute-force oracle on small random views: every
answer it gives must be a valid placement. ``NodeState``'s two-phase bundle operations
(prepare, commit, cancel) are driven as the state machine they are: events in,
instructions out. No processes, no sockets, no clocks.
"""

from __future__ import annotations

import itertools
import random
from collections import Counter
from collections.abc import Callable, Mapping, Sequence

import pytest

from nbcluster._runtime.node.state import (
    Grant,
    Instruction,
    KillWorker,
    NodeState,
    Redirect,
    StartWorker,
)
from nbcluster._runtime.scheduling.policy import (
    PG_STRATEGIES,
    NodeView,
    bundle_resource_names,
    fits,
    pg_request,
    place_bundles,
)

PG = bytes.fromhex("aa" * 16)
PG_HEX = PG.hex()
OTHER_PG = bytes.fromhex("bb" * 16)
OWNER = "10.0.0.9:5000"
JOB = b"job-1"


# --------------------------------------------------------------------------- helpers


def node(
    name: str,
    total: dict[str, float],
    available: dict[str, float] | None = None,
    *,
    alive: bool = True,
) -> NodeView:
    return NodeView(
        name.encode(),
        f"{name}:7000",
        total,
        dict(total) if available is None else available,
        alive,
    )


def names(placed: Sequence[NodeView] | None) -> list[str]:
    assert placed is not None
    return [n.node_id.decode() for n in placed]


def valid(
    bundles: Sequence[Mapping[str, float]],
    nodes: Sequence[NodeView],
    strategy: str,
    placed: Sequence[NodeView],
    use_total: bool = False,
) -> bool:
    """``placed`` is a placement that respects room, liveness and the strategy's hard rules."""
    if len(placed) != len(bundles):
        return False
    by_id = {n.node_id: n for n in nodes}
    need: dict[bytes, dict[str, float]] = {}
    for b, n in zip(bundles, placed, strict=True):
        if n.node_id not in by_id or not by_id[n.node_id].alive:
            return False
        acc = need.setdefault(n.node_id, {})
        for k, v in b.items():
            acc[k] = acc.get(k, 0.0) + v
    for nid, acc in need.items():
        room = by_id[nid].total if use_total else by_id[nid].available
        if not fits(acc, room):
            return False
    used = [n.node_id for n in placed]
    if strategy == "STRICT_PACK" and len(set(used)) != 1:
        return False
    return not (strategy == "STRICT_SPREAD" and len(set(used)) != len(used))


def oracle(
    bundles: Sequence[Mapping[str, float]], nodes: Sequence[NodeView], strategy: str
) -> bool:
    """Brute force: does any valid placement exist?"""
    live = [n for n in nodes if n.alive]
    return any(
        valid(bundles, nodes, strategy, list(choice))
        for choice in itertools.product(live, repeat=len(bundles))
    )


def counter_ids() -> Callable[[], bytes]:
    n = itertools.count(1)
    return lambda: f"id{next(n):03d}".encode()


def warm_node(total: dict[str, float], *, prestart: int = 2) -> NodeState:
    """A node whose ``prestart`` workers have registered and are idle."""
    ns = NodeState(b"local", "local:7000", total, prestart=prestart, new_id=counter_ids())
    started = [i.worker_id for i in ns.start() if isinstance(i, StartWorker)]
    for k, wid in enumerate(started):
        assert ns.worker_registered(wid, 1000 + k, f"127.0.0.1:{9000 + k}") == []
    return ns


def grants(out: Sequence[Instruction]) -> list[Grant]:
    return [i for i in out if isinstance(i, Grant)]


def only_grant(out: Sequence[Instruction]) -> Grant:
    assert len(out) == 1 and isinstance(out[0], Grant), out
    return out[0]


def group_keys(resources: Mapping[str, float]) -> list[str]:
    return sorted(k for k in resources if "_group_" in k)


THREE = [node("a", {"CPU": 2}), node("b", {"CPU": 2}), node("c", {"CPU": 2})]


# --------------------------------------------------------------------------- place_bundles: PACK


def test_pack_puts_bundles_that_fit_together_on_one_node() -> None:
    placed = place_bundles([{"CPU": 1}, {"CPU": 1}], THREE, "PACK")
    assert len(set(names(placed))) == 1


def test_pack_is_best_effort_and_uses_as_few_nodes_as_it_needs() -> None:
    placed = place_bundles([{"CPU": 1}] * 5, THREE, "PACK")
    assert placed is not None and valid([{"CPU": 1}] * 5, THREE, "PACK", placed)
    assert sorted(Counter(names(placed)).values()) == [1, 2, 2]  # 3 nodes are needed for 5


def test_pack_fills_a_used_node_before_opening_another() -> None:
    placed = place_bundles([{"CPU": 1}] * 3, THREE, "PACK")
    assert sorted(Counter(names(placed)).values()) == [1, 2]


def test_pack_respects_available_not_total() -> None:
    nodes = [node("busy", {"CPU": 4}, {"CPU": 0}), node("free", {"CPU": 2})]
    assert names(place_bundles([{"CPU": 1}, {"CPU": 1}], nodes, "PACK")) == ["free", "free"]


def test_pack_uses_one_node_whenever_one_node_can_hold_the_whole_group() -> None:
    nodes = [node("small", {"CPU": 2}), node("big", {"CPU": 4})]
    assert names(place_bundles([{"CPU": 1}] * 4, nodes, "PACK")) == ["big"] * 4


# --------------------------------------------------------------------------- SPREAD


def test_spread_uses_distinct_nodes_first() -> None:
    assert sorted(names(place_bundles([{"CPU": 1}] * 3, THREE, "SPREAD"))) == ["a", "b", "c"]


def test_spread_is_best_effort_when_bundles_outnumber_nodes() -> None:
    placed = place_bundles([{"CPU": 1}] * 5, THREE, "SPREAD")
    assert sorted(Counter(names(placed)).values()) == [1, 2, 2]
    one = [node("only", {"CPU": 4})]
    assert names(place_bundles([{"CPU": 1}] * 3, one, "SPREAD")) == ["only"] * 3


def test_spread_skips_nodes_without_room() -> None:
    nodes = [*THREE[:2], node("c", {"CPU": 2}, {"CPU": 0.5})]
    assert sorted(names(place_bundles([{"CPU": 1}] * 2, nodes, "SPREAD"))) == ["a", "b"]


# --------------------------------------------------------------------------- STRICT_PACK


def test_strict_pack_puts_every_bundle_on_one_node() -> None:
    nodes = [node("a", {"CPU": 2}), node("b", {"CPU": 4, "GPU": 1})]
    bundles = [{"CPU": 1}, {"CPU": 2}, {"GPU": 1}]
    assert names(place_bundles(bundles, nodes, "STRICT_PACK")) == ["b", "b", "b"]


def test_strict_pack_is_none_when_no_single_node_holds_the_sum() -> None:
    # 4 CPUs free in the cluster, but no node has 4
    assert place_bundles([{"CPU": 2}, {"CPU": 2}], THREE, "STRICT_PACK") is None
    assert place_bundles([{"CPU": 2}, {"CPU": 2}], THREE, "PACK") is not None


# --------------------------------------------------------------------------- STRICT_SPREAD


def test_strict_spread_puts_one_bundle_per_node() -> None:
    placed = place_bundles([{"CPU": 2}] * 3, THREE, "STRICT_SPREAD")
    assert sorted(names(placed)) == ["a", "b", "c"]


def test_strict_spread_is_none_with_more_bundles_than_nodes() -> None:
    assert place_bundles([{"CPU": 0.1}] * 4, THREE, "STRICT_SPREAD") is None
    assert place_bundles([{"CPU": 0.1}] * 4, THREE, "SPREAD") is not None


def test_strict_spread_is_none_when_too_few_nodes_have_room() -> None:
    nodes = [*THREE[:2], node("c", {"CPU": 2}, {"CPU": 0})]
    assert place_bundles([{"CPU": 1}] * 3, nodes, "STRICT_SPREAD") is None


def test_strict_spread_matches_bundles_to_the_nodes_that_have_their_resources() -> None:
    nodes = [node("gpu", {"CPU": 1, "GPU": 1}), node("cpu", {"CPU": 4})]
    assert names(place_bundles([{"GPU": 1}, {"CPU": 2}], nodes, "STRICT_SPREAD")) == ["gpu", "cpu"]


# --------------------------------------------------------------------------- feasibility


@pytest.mark.parametrize("strategy", PG_STRATEGIES)
def test_use_total_answers_could_it_ever_fit(strategy: str) -> None:
    busy = [node(n, {"CPU": 2}, {"CPU": 0}) for n in "abc"]
    bundles = [{"CPU": 1}, {"CPU": 1}]
    assert place_bundles(bundles, busy, strategy) is None
    placed = place_bundles(bundles, busy, strategy, use_total=True)
    assert placed is not None and valid(bundles, busy, strategy, placed, use_total=True)


@pytest.mark.parametrize("strategy", PG_STRATEGIES)
def test_a_bundle_bigger_than_every_node_never_fits(strategy: str) -> None:
    assert place_bundles([{"CPU": 3}], THREE, strategy, use_total=True) is None
    assert place_bundles([{"CPU": 1}, {"GPU": 1}], THREE, strategy, use_total=True) is None


@pytest.mark.parametrize("strategy", PG_STRATEGIES)
def test_dead_nodes_are_ignored(strategy: str) -> None:
    dead = node("dead", {"CPU": 64}, alive=False)
    nodes = [dead, *THREE]
    for _ in range(3):
        placed = place_bundles([{"CPU": 1}, {"CPU": 1}], nodes, strategy)
        assert placed is not None and "dead" not in names(placed)
    assert place_bundles([{"CPU": 8}], nodes, strategy, use_total=True) is None
    assert place_bundles([{"CPU": 1}], [dead], strategy) is None


def test_strict_spread_counts_only_live_nodes() -> None:
    nodes = [*THREE, node("dead", {"CPU": 2}, alive=False)]
    assert place_bundles([{"CPU": 1}] * 4, nodes, "STRICT_SPREAD", use_total=True) is None


@pytest.mark.parametrize("strategy", ["pack", "BEST", "", "DEFAULT", "SPREAD "])
def test_unknown_strategy_raises_value_error(strategy: str) -> None:
    with pytest.raises(ValueError, match="unknown placement strategy"):
        place_bundles([{"CPU": 1}], THREE, strategy)


def _random_case(rng: random.Random) -> tuple[list[dict[str, float]], list[NodeView]]:
    nodes = []
    for i in range(rng.randint(1, 4)):
        total = {"CPU": float(rng.randint(1, 4))}
        if rng.random() < 0.3:
            total["GPU"] = float(rng.randint(1, 2))
        avail = {k: float(rng.randint(0, int(v))) for k, v in total.items()}
        nodes.append(node(f"n{i}", total, avail, alive=rng.random() > 0.15))
    bundles = []
    for _ in range(rng.randint(1, 4)):
        b = {"CPU": float(rng.randint(1, 2))}
        if rng.random() < 0.2:
            b = {"GPU": 1.0} if rng.random() < 0.5 else {"CPU": 1.0, "GPU": 1.0}
        bundles.append(b)
    return bundles, nodes


@pytest.mark.parametrize("strategy", PG_STRATEGIES)
def test_every_placement_returned_is_valid(strategy: str) -> None:
    rng = random.Random(f"valid-{strategy}")
    answered = 0
    for _ in range(400):
        bundles, nodes = _random_case(rng)
        placed = place_bundles(bundles, nodes, strategy)
        if placed is not None:
            answered += 1
            assert valid(bundles, nodes, strategy, placed), (bundles, nodes, names(placed))
            assert oracle(bundles, nodes, strategy)
    assert answered > 40  # the cases are not all trivially infeasible


# Feasible groups that the greedy, non-backtracking placement reports as unplaceable. The
# head then keeps them PENDING forever, with the message "infeasible" (use_total fails the
# same way): a first-fit choice for an early bundle takes the only node a later bundle fits.
GREEDY_MISSES = [
    ("PACK", [node("a", {"CPU": 2}), node("b", {"CPU": 1})], [{"CPU": 1}, {"CPU": 2}]),
    ("SPREAD", [node("a", {"CPU": 2}), node("b", {"CPU": 1})], [{"CPU": 1}, {"CPU": 2}]),
    (
        "STRICT_SPREAD",
        [node("a", {"CPU": 1, "GPU": 1}), node("b", {"CPU": 1})],
        [{"CPU": 1}, {"GPU": 1}],
    ),
]


@pytest.mark.parametrize(
    ("strategy", "nodes", "bundles"), GREEDY_MISSES, ids=[s for s, _, _ in GREEDY_MISSES]
)
def test_a_feasible_group_is_always_placed(
    strategy: str, nodes: list[NodeView], bundles: list[dict[str, float]]
) -> None:
    assert oracle(bundles, nodes, strategy)  # a placement exists
    placed = place_bundles(bundles, nodes, strategy)
    assert placed is not None and valid(bundles, nodes, strategy, placed)


# --------------------------------------------------------------------------- resource naming


def test_bundle_resource_names_are_indexed_and_wildcard_with_a_marker() -> None:
    assert bundle_resource_names("abc", 1, {"CPU": 2, "GPU": 0, "memory": 5}) == {
        "CPU_group_1_abc": 2.0,
        "CPU_group_abc": 2.0,
        "memory_group_1_abc": 5.0,
        "memory_group_abc": 5.0,
        "bundle_group_1_abc": 1000.0,
        "bundle_group_abc": 1000.0,
    }


def test_pg_request_for_any_bundle_uses_wildcard_names() -> None:
    assert pg_request({"CPU": 1, "GPU": 0.5}, "abc", -1) == {
        "CPU_group_abc": 1.0,
        "GPU_group_abc": 0.5,
    }


def test_pg_request_for_one_bundle_uses_its_indexed_names_and_no_plain_ones() -> None:
    req = pg_request({"CPU": 1, "custom": 2}, "abc", 3)
    assert req["CPU_group_3_abc"] == 1.0 and req["custom_group_3_abc"] == 2.0
    assert "CPU" not in req and "custom" not in req
    assert not any(k.startswith(("CPU_group_0", "CPU_group_1", "CPU_group_2")) for k in req)


@pytest.mark.parametrize(
    ("shape", "index", "expected"),
    [
        ({}, -1, {"bundle_group_abc": 0.001}),
        ({"CPU": 0}, 2, {"bundle_group_2_abc": 0.001}),
        ({"CPU": 0, "GPU": 0}, 0, {"bundle_group_0_abc": 0.001}),
    ],
)
def test_zero_resource_request_targets_the_bundle_marker(
    shape: dict[str, float], index: int, expected: dict[str, float]
) -> None:
    assert pg_request(shape, "abc", index) == expected


@pytest.mark.parametrize("shape", [{"CPU": 1}, {}, {"CPU": 0.5, "GPU": 1}])
def test_a_request_fits_its_own_bundle_only(shape: dict[str, float]) -> None:
    bundle = {"CPU": 1, "GPU": 1}
    mine = bundle_resource_names(PG_HEX, 0, bundle)
    other_index = bundle_resource_names(PG_HEX, 1, bundle)
    other_group = bundle_resource_names(OTHER_PG.hex(), 0, bundle)
    for index in (0, -1):
        req = pg_request(shape, PG_HEX, index)
        assert fits(req, mine)
        assert not fits(req, other_group)
        assert not fits(req, {"CPU": 64, "GPU": 8})  # plain resources do not satisfy it
    assert not fits(pg_request(shape, PG_HEX, 0), other_index)


# --------------------------------------------------------------------------- NodeState bundles


def test_prepare_reserves_the_resources_without_naming_them_yet() -> None:
    ns = warm_node({"CPU": 2})
    assert ns.prepare_bundle(PG, 0, {"CPU": 1}) is True
    assert ns.available == {"CPU": 1.0}
    assert ns.total == {"CPU": 2.0}
    assert group_keys(ns.available) == [] and group_keys(ns.total) == []
    # the reserved CPU is not leasable as a plain CPU
    assert len(grants(ns.request_lease(b"r1", {"CPU": 1}, OWNER, JOB))) == 1
    assert ns.request_lease(b"r2", {"CPU": 1}, OWNER, JOB) == []
    assert list(ns.pending) == [b"r2"]


def test_prepare_fails_when_resources_are_busy_and_reserves_nothing() -> None:
    ns = warm_node({"CPU": 2, "GPU": 1})
    only_grant(ns.request_lease(b"r1", {"CPU": 1, "GPU": 1}, OWNER, JOB))
    before = dict(ns.available)
    assert ns.prepare_bundle(PG, 0, {"CPU": 2}) is False  # 1 CPU free
    assert ns.prepare_bundle(PG, 1, {"CPU": 1, "GPU": 1}) is False  # CPU free, GPU not
    assert ns.available == before
    assert ns.bundles == {}
    assert ns.commit_bundle(PG, 0) == [] and ns.commit_bundle(PG, 1) == []
    assert ns.total == {"CPU": 2.0, "GPU": 1.0} and ns.available == before


def test_prepare_of_the_same_bundle_twice_reserves_once() -> None:
    ns = warm_node({"CPU": 2})
    assert ns.prepare_bundle(PG, 0, {"CPU": 1})
    assert ns.prepare_bundle(PG, 0, {"CPU": 1})
    assert ns.available == {"CPU": 1.0}


def test_commit_adds_indexed_and_wildcard_resources() -> None:
    ns = warm_node({"CPU": 2})
    ns.prepare_bundle(PG, 0, {"CPU": 1})
    assert ns.commit_bundle(PG, 0) == []
    for res in (ns.total, ns.available):
        assert res[f"CPU_group_0_{PG_HEX}"] == 1.0
        assert res[f"CPU_group_{PG_HEX}"] == 1.0
        assert res[f"bundle_group_0_{PG_HEX}"] > 0
    assert ns.total["CPU"] == 2.0 and ns.available["CPU"] == 1.0
    # a second commit changes nothing; an unknown bundle commits nothing
    snapshot = (dict(ns.total), dict(ns.available))
    assert ns.commit_bundle(PG, 0) == []
    assert ns.commit_bundle(PG, 7) == []
    assert (ns.total, ns.available) == snapshot


def test_two_bundles_of_a_group_on_one_node_add_up_in_the_wildcard() -> None:
    ns = warm_node({"CPU": 4})
    for i in (0, 1):
        assert ns.prepare_bundle(PG, i, {"CPU": 1.5})
        ns.commit_bundle(PG, i)
    assert ns.total[f"CPU_group_{PG_HEX}"] == 3.0
    assert ns.total[f"CPU_group_0_{PG_HEX}"] == 1.5 and ns.total[f"CPU_group_1_{PG_HEX}"] == 1.5
    assert ns.available["CPU"] == 1.0


def test_a_lease_on_bundle_resources_is_granted_from_the_bundle() -> None:
    ns = warm_node({"CPU": 2})
    ns.prepare_bundle(PG, 0, {"CPU": 1})
    ns.commit_bundle(PG, 0)
    g = only_grant(ns.request_lease(b"r1", pg_request({"CPU": 1}, PG_HEX, 0), OWNER, JOB))
    # an indexed request also draws on the group-wide (wildcard) resource, as in Ray
    assert g.lease.resources == {f"CPU_group_0_{PG_HEX}": 1.0, f"CPU_group_{PG_HEX}": 1.0}
    assert ns.available[f"CPU_group_0_{PG_HEX}"] == 0.0
    assert ns.available["CPU"] == 1.0  # the plain CPU outside the bundle is untouched
    # the bundle is full: a second request for it waits
    assert ns.request_lease(b"r2", pg_request({"CPU": 1}, PG_HEX, 0), OWNER, JOB) == []
    assert list(ns.pending) == [b"r2"]


def test_a_zero_cpu_task_can_target_a_bundle() -> None:
    ns = warm_node({"CPU": 2})
    ns.prepare_bundle(PG, 0, {"CPU": 2})
    ns.commit_bundle(PG, 0)
    only_grant(ns.request_lease(b"r1", pg_request({}, PG_HEX, 0), OWNER, JOB))


def test_indexed_and_any_bundle_requests_share_the_bundle_capacity() -> None:
    ns = warm_node({"CPU": 2}, prestart=3)
    ns.prepare_bundle(PG, 0, {"CPU": 1})
    ns.commit_bundle(PG, 0)
    only_grant(ns.request_lease(b"r1", pg_request({"CPU": 1}, PG_HEX, 0), OWNER, JOB))
    out = ns.request_lease(b"r2", pg_request({"CPU": 1}, PG_HEX, -1), OWNER, JOB)
    assert grants(out) == []  # the bundle's one CPU is taken


def test_a_lease_on_a_gpu_bundle_gets_gpu_ids() -> None:
    ns = warm_node({"CPU": 2, "GPU": 2})
    ns.prepare_bundle(PG, 0, {"GPU": 1})
    ns.commit_bundle(PG, 0)
    g = only_grant(ns.request_lease(b"r1", pg_request({"GPU": 1}, PG_HEX, 0), OWNER, JOB))
    assert len(g.lease.gpu_ids) == 1
    # and a plain GPU task then gets the other GPU, not the bundle's
    g2 = only_grant(ns.request_lease(b"r2", {"GPU": 1}, OWNER, JOB))
    assert g2.lease.gpu_ids and set(g2.lease.gpu_ids).isdisjoint(g.lease.gpu_ids)


def test_cancel_of_a_prepared_bundle_returns_its_resources() -> None:
    ns = warm_node({"CPU": 2})
    ns.prepare_bundle(PG, 0, {"CPU": 2})
    assert ns.cancel_bundle(PG, 0) == []
    assert ns.available == {"CPU": 2.0} and ns.total == {"CPU": 2.0}
    assert ns.bundles == {}
    assert ns.commit_bundle(PG, 0) == []  # a commit after the cancel does nothing
    assert ns.available == {"CPU": 2.0}
    assert ns.cancel_bundle(PG, 0) == []  # nor a second cancel


def test_cancel_of_an_unknown_bundle_does_nothing() -> None:
    ns = warm_node({"CPU": 2})
    assert ns.cancel_bundle(PG, 3) == []
    assert ns.available == {"CPU": 2.0}


def test_cancel_of_a_committed_bundle_ends_the_work_in_it() -> None:
    ns = warm_node({"CPU": 4}, prestart=3)
    ns.prepare_bundle(PG, 0, {"CPU": 2})
    ns.commit_bundle(PG, 0)
    inside = only_grant(ns.request_lease(b"in", pg_request({"CPU": 2}, PG_HEX, 0), OWNER, JOB))
    outside = only_grant(ns.request_lease(b"out", {"CPU": 1}, OWNER, JOB))
    assert ns.request_lease(b"wait", pg_request({"CPU": 1}, PG_HEX, 0), OWNER, JOB) == []
    assert ns.request_lease(b"plain", {"CPU": 2}, OWNER, JOB) == []  # 1 plain CPU free

    out = ns.cancel_bundle(PG, 0)
    assert KillWorker(inside.lease.worker_id, "its placement group was removed") in out
    assert not any(
        isinstance(i, KillWorker) and i.worker_id == outside.lease.worker_id for i in out
    )
    assert Redirect(b"wait", "INFEASIBLE", message="its placement group was removed") in out
    assert b"wait" not in ns.pending
    # the bundle's 2 CPUs are plain CPUs again: the waiting plain request gets them
    assert [g.request_id for g in grants(out)] == [b"plain"]
    assert group_keys(ns.total) == [] and group_keys(ns.available) == []
    assert ns.available["CPU"] == 1.0  # 4 - 1 (outside) - 2 (plain); the killed one held none
    assert ns.total == {"CPU": 4.0}


def test_cancel_leaves_other_groups_alone() -> None:
    ns = warm_node({"CPU": 4}, prestart=3)
    for pg in (PG, OTHER_PG):
        ns.prepare_bundle(pg, 0, {"CPU": 1})
        ns.commit_bundle(pg, 0)
    keep = only_grant(ns.request_lease(b"k", pg_request({"CPU": 1}, OTHER_PG.hex(), 0), OWNER, JOB))
    out = ns.cancel_bundle(PG, 0)
    assert not any(isinstance(i, KillWorker) for i in out)
    assert keep.lease.lease_id in ns.leases
    assert all(OTHER_PG.hex() in k for k in group_keys(ns.total))
    assert ns.total[f"CPU_group_0_{OTHER_PG.hex()}"] == 1.0


@pytest.mark.parametrize("how", ["return_lease", "worker_exited", "failed_return"])
def test_a_lease_released_after_its_bundle_was_cancelled_does_not_resurrect_it(how: str) -> None:
    ns = warm_node({"CPU": 2})
    ns.prepare_bundle(PG, 0, {"CPU": 1})
    ns.commit_bundle(PG, 0)
    g = only_grant(ns.request_lease(b"r1", pg_request({"CPU": 1}, PG_HEX, -1), OWNER, JOB))
    out = ns.cancel_bundle(PG, 0)
    assert KillWorker(g.lease.worker_id, "its placement group was removed") in out
    assert ns.available["CPU"] == 2.0
    if how == "return_lease":
        ns.return_lease(g.lease.lease_id)
    elif how == "failed_return":
        ns.return_lease(g.lease.lease_id, worker_failed=True)
    else:
        ns.worker_exited(g.lease.worker_id)
    assert group_keys(ns.available) == [] and group_keys(ns.total) == []
    assert ns.available["CPU"] == 2.0 and ns.total == {"CPU": 2.0}
    assert ns.leases == {}


def test_requests_for_a_removed_bundle_are_infeasible_afterwards() -> None:
    ns = warm_node({"CPU": 2})
    ns.prepare_bundle(PG, 0, {"CPU": 1})
    ns.commit_bundle(PG, 0)
    ns.cancel_bundle(PG, 0)
    [r] = ns.request_lease(b"late", pg_request({"CPU": 1}, PG_HEX, 0), OWNER, JOB)
    assert isinstance(r, Redirect) and r.status == "INFEASIBLE"


# --------------------------------------------------------------------------- DEFAULT spillback


def test_a_burst_of_spilled_requests_is_shared_among_the_free_nodes() -> None:
    ns = warm_node({"CPU": 2})
    b = NodeView(b"b", "b:7000", {"CPU": 2}, {"CPU": 2})
    c = NodeView(b"c", "c:7000", {"CPU": 2}, {"CPU": 2})
    ns.update_cluster_view([b, c])
    out: list[Instruction] = []
    for rid in (b"1", b"2", b"3", b"4", b"5", b"6"):
        out += ns.request_lease(rid, {"CPU": 1}, OWNER, JOB)
    assert len(grants(out)) == 2
    spills = Counter(i.address for i in out if isinstance(i, Redirect) and i.status == "SPILLBACK")
    assert spills == {"b:7000": 2, "c:7000": 2}
