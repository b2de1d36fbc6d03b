"""Pure decisions: autoscaling (Ray's default policy), routing (power of two choices,
longest prefix), request statistics. No processes, no clocks."""

from __future__ import annotations

import random

import pytest

from nbcluster.serve._autoscaling import MetricWindow, PolicyState, decide, desired_replicas
from nbcluster.serve._metrics import DeploymentStats, percentile
from nbcluster.serve._routing import ReplicaSlot, choose_replica, match_route
from nbcluster.serve.config import AutoscalingConfig

CFG = AutoscalingConfig(
    min_replicas=1,
    max_replicas=5,
    target_ongoing_requests=2,
    upscale_delay_s=3,
    downscale_delay_s=10,
)


def test_desired_replicas_follows_load_within_bounds() -> None:
    assert desired_replicas(8, 1, CFG) == 4
    assert desired_replicas(100, 1, CFG) == 5
    assert desired_replicas(0, 3, CFG) == 1
    assert desired_replicas(3, 0, CFG) == 2
    half = AutoscalingConfig(max_replicas=10, target_ongoing_requests=1, upscaling_factor=0.5)
    assert desired_replicas(9, 1, half) == 5  # 1 + 0.5 * (9 - 1)


def test_upscale_waits_for_the_delay() -> None:
    st = PolicyState()
    kw = {"current": 1, "target": 1, "config": CFG, "state": st}
    assert decide(total_ongoing=8, now=0.0, **kw) == 1
    assert decide(total_ongoing=8, now=2.0, **kw) == 1
    assert decide(total_ongoing=8, now=3.0, **kw) == 4


def test_a_dip_resets_the_pending_decision() -> None:
    st = PolicyState()
    kw = {"current": 1, "target": 1, "config": CFG, "state": st}
    decide(total_ongoing=8, now=0.0, **kw)
    decide(total_ongoing=2, now=2.0, **kw)  # back to normal
    assert decide(total_ongoing=8, now=3.5, **kw) == 1  # the delay starts again
    assert decide(total_ongoing=8, now=6.5, **kw) == 4


def test_downscale_waits_longer_and_never_below_min() -> None:
    st = PolicyState()
    kw = {"current": 4, "target": 4, "config": CFG, "state": st}
    assert decide(total_ongoing=0, now=0.0, **kw) == 4
    assert decide(total_ongoing=0, now=9.0, **kw) == 4
    assert decide(total_ongoing=0, now=10.0, **kw) == 1


def test_from_zero_scales_up_at_once_and_no_metrics_keeps_target() -> None:
    zero = AutoscalingConfig(min_replicas=0, max_replicas=3, upscale_delay_s=100)
    assert (
        decide(total_ongoing=1, current=0, target=0, config=zero, state=PolicyState(), now=0) == 1
    )
    assert (
        decide(total_ongoing=None, current=2, target=2, config=CFG, state=PolicyState(), now=0) == 2
    )


def test_metric_window_averages_the_look_back_period() -> None:
    w = MetricWindow()
    assert w.average(0, 30) is None
    for t, v in [(0, 10), (10, 2), (20, 4)]:
        w.record(t, v)
    assert w.average(20, 30) == pytest.approx(16 / 3)
    assert w.average(25, 10) == 4


def test_power_of_two_choices_prefers_the_shorter_queue() -> None:
    rng = random.Random(0)
    busy, idle = ReplicaSlot("busy", inflight=4), ReplicaSlot("idle", inflight=0)
    picks = {choose_replica([busy, idle], 5, rng=rng).replica_id for _ in range(50)}  # type: ignore[union-attr]
    assert picks == {"idle"}
    assert choose_replica([ReplicaSlot("a", 5), ReplicaSlot("b", 5)], 5) is None  # all full
    assert choose_replica([], 5) is None
    full, free = ReplicaSlot("full", 5), ReplicaSlot("free", 4)
    assert choose_replica([full, free], 5, rng=rng) is free


def test_power_of_two_choices_spreads_equal_load() -> None:
    rng = random.Random(1)
    slots = [ReplicaSlot(str(i)) for i in range(4)]
    for _ in range(400):
        s = choose_replica(slots, 1000, rng=rng)
        assert s is not None
        s.inflight += 1
    loads = sorted(s.inflight for s in slots)
    assert loads[-1] - loads[0] <= 4


def test_multiplexed_model_prefers_replicas_holding_it() -> None:
    rng = random.Random(2)
    a = ReplicaSlot("a", 3, frozenset({"m1"}))
    b = ReplicaSlot("b", 0, frozenset())
    assert choose_replica([a, b], 5, model_id="m1", rng=rng) is a
    assert (
        choose_replica([ReplicaSlot("a", 5, frozenset({"m1"})), b], 5, model_id="m1", rng=rng) is b
    )


def test_longest_prefix_on_segment_boundaries() -> None:
    routes = {"/": "root", "/api": "api", "/api/v2": "v2"}
    assert match_route("/", routes) == ("/", "root")
    assert match_route("/x", routes) == ("/", "root")
    assert match_route("/api", routes) == ("/api", "api")
    assert match_route("/api/x", routes) == ("/api", "api")
    assert match_route("/apix", routes) == ("/", "root")
    assert match_route("/api/v2/y", routes) == ("/api/v2", "v2")
    assert match_route("/x", {"/api": "api"}) is None


def test_stats_rate_percentiles_and_ongoing() -> None:
    s = DeploymentStats(window_s=10)
    s.report("r1", {"requests": 0, "errors": 0, "ongoing": 0, "latencies": []}, now=0.0)
    s.report(
        "r1",
        {"requests": 50, "errors": 2, "ongoing": 3, "latencies": [0.001] * 98 + [0.1, 0.1]},
        now=5.0,
    )
    s.report("r2", {"requests": 50, "errors": 0, "ongoing": 1, "latencies": []}, now=5.0)
    out = s.summary(now=5.0)
    assert out["requests_per_s"] == pytest.approx(100 / 5)
    assert out["p50_ms"] == pytest.approx(1.0) and out["p99_ms"] == pytest.approx(100.0)
    assert out["errors"] == 2
    assert s.total_ongoing() == 4
    s.forget("r1")
    assert s.total_ongoing() == 1
    assert s.summary(now=100.0)["p50_ms"] is None
    assert percentile([1, 2, 3], 0.5) == 2
