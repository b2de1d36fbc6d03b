"""DeploymentState: the controller's decisions for one deployment, without processes.

Events in (deploys, replicas started / failed / died / stopped), instructions out
(Start, Stop, Reconfigure), and the status Ray would report.
"""

from __future__ import annotations

import dataclasses
import itertools

from nbcluster.serve._reconcile import (
    STALL_S,
    DeploymentState,
    Reconfigure,
    Start,
    Stop,
    Target,
    app_status,
)
from nbcluster.serve.config import DeploymentConfig
from nbcluster.serve.schema import (
    ApplicationStatus,
    DeploymentStatus,
    DeploymentStatusTrigger,
    ReplicaState,
)


def make(num: int = 1, version: str = "v1", **options: object) -> tuple[DeploymentState, Target]:
    ids = (f"r{i}" for i in itertools.count())
    ds = DeploymentState("app", "Model", lambda: next(ids))
    config = DeploymentConfig.build({"num_replicas": num, **options})
    target = Target(version, config, 0, num)
    ds.set_target(target)
    return ds, target


def starts(actions: list) -> list[Start]:
    return [a for a in actions if isinstance(a, Start)]


def stops(actions: list) -> list[Stop]:
    return [a for a in actions if isinstance(a, Stop)]


def run_all(ds: DeploymentState, actions: list, now: float) -> None:
    for a in starts(actions):
        ds.on_started(a.replica_id, now)


def test_first_deploy_starts_the_replicas_and_becomes_healthy() -> None:
    ds, _ = make(2)
    actions = ds.step(0.0)
    assert [type(a) for a in actions] == [Start, Start]
    assert ds.status()[0] == DeploymentStatus.UPDATING
    assert ds.routable() == []
    run_all(ds, actions, 0.1)
    assert ds.step(0.2) == []
    assert ds.status()[0] == DeploymentStatus.HEALTHY
    assert ds.status()[1] == DeploymentStatusTrigger.CONFIG_UPDATE_COMPLETED
    assert sorted(ds.routable()) == ["r0", "r1"]


def test_rolling_update_with_room_starts_new_before_retiring_old() -> None:
    ds, t = make(2)
    run_all(ds, ds.step(0.0), 0.1)
    ds.set_target(dataclasses.replace(t, version="v2"))
    actions = ds.step(1.0, spare=5)
    assert len(starts(actions)) == 2 and not stops(actions)
    assert sorted(ds.routable()) == ["r0", "r1"]  # old ones serve meanwhile
    new = starts(actions)
    ds.on_started(new[0].replica_id, 1.1)
    actions = ds.step(1.2, spare=5)
    assert [s.graceful for s in stops(actions)] == [True]  # one old one drains
    assert len(ds.routable()) == 2  # never fewer than the target
    ds.on_started(new[1].replica_id, 1.3)
    actions = ds.step(1.4, spare=5)
    assert len(stops(actions)) == 1
    assert sorted(ds.routable()) == sorted(a.replica_id for a in new)
    assert ds.status()[0] == DeploymentStatus.HEALTHY  # draining ones do not count
    for r in list(ds.replicas.values()):
        if r.state == ReplicaState.STOPPING:
            ds.on_stopped(r.replica_id)
    assert len(ds.replicas) == 2


def test_rolling_update_without_room_replaces_one_at_a_time() -> None:
    ds, t = make(2)
    run_all(ds, ds.step(0.0), 0.1)
    ds.set_target(dataclasses.replace(t, version="v2"))
    actions = ds.step(1.0, spare=0)
    assert len(stops(actions)) == 1 and len(starts(actions)) == 1
    assert len(ds.routable()) == 1
    assert ds.step(1.1, spare=0) == []  # waits for the new one
    ds.on_started(starts(actions)[0].replica_id, 1.2)
    actions = ds.step(1.3, spare=0)
    assert len(stops(actions)) == 1 and len(starts(actions)) == 1


def test_a_stalled_new_replica_makes_room_by_retiring_an_old_one() -> None:
    ds, t = make(1)
    run_all(ds, ds.step(0.0), 0.1)
    ds.set_target(dataclasses.replace(t, version="v2"))
    actions = ds.step(1.0, spare=1)  # the controller thought there was room
    assert len(starts(actions)) == 1 and not stops(actions)
    assert ds.step(1.0 + STALL_S / 2, spare=0) == []
    actions = ds.step(1.0 + STALL_S + 0.1, spare=0)
    assert [s.replica_id for s in stops(actions)] == ["r0"]


def test_constructor_failures_end_in_deploy_failed_with_nothing_left() -> None:
    ds, _ = make(1)
    now = 0.0
    for attempt in range(3):
        actions = ds.step(now + 10 * attempt)
        assert len(starts(actions)) == 1, attempt
        ds.on_start_failed(starts(actions)[0].replica_id, "Traceback...\nValueError: boom", now)
    assert ds.failed
    status, trigger, message = ds.status()
    assert status == DeploymentStatus.DEPLOY_FAILED
    assert trigger == DeploymentStatusTrigger.REPLICA_STARTUP_FAILED
    assert "ValueError: boom" in message
    assert ds.step(100.0) == []
    assert ds.replicas == {}


def test_a_failed_deploy_stops_the_replicas_still_starting_before_it_is_settled() -> None:
    # Two replicas: the failures of one reach the limit while the other is still starting.
    ds, _ = make(2, max_constructor_retry_count=3)
    actions = ds.step(0.0)
    slow, failing = (a.replica_id for a in starts(actions))
    ds.on_start_failed(failing, "ValueError: boom", 0.0)
    for now in (10.0, 20.0):
        (again,) = starts(ds.step(now))
        ds.on_start_failed(again.replica_id, "ValueError: boom", now)
    assert ds.failed and ds.status()[0] == DeploymentStatus.DEPLOY_FAILED
    assert ds.has_target_replicas()  # `slow` is still starting: not settled yet
    assert [(s.replica_id, s.graceful) for s in stops(ds.step(30.0))] == [(slow, False)]
    assert ds.has_target_replicas()  # stopping: its actor is not known to be gone yet
    ds.on_started(slow, 30.5)  # its constructor returned meanwhile: it stays stopping
    assert ds.replicas[slow].state == ReplicaState.STOPPING and ds.routable() == []
    ds.on_stopped(slow)
    assert not ds.has_target_replicas() and ds.replicas == {}


def test_failures_retry_with_backoff() -> None:
    ds, _ = make(1)
    actions = ds.step(0.0)
    ds.on_start_failed(starts(actions)[0].replica_id, "boom", 0.0)
    assert ds.step(0.01) == []  # backing off
    assert len(starts(ds.step(1.0))) == 1


def test_failed_update_keeps_the_old_version_serving() -> None:
    ds, t = make(1)
    run_all(ds, ds.step(0.0), 0.1)
    ds.set_target(dataclasses.replace(t, version="v2"))
    for i in range(3):
        a = starts(ds.step(10.0 * (i + 1), spare=1))
        ds.on_start_failed(a[0].replica_id, "boom", 10.0 * (i + 1))
    assert ds.status()[0] == DeploymentStatus.DEPLOY_FAILED
    assert ds.routable() == ["r0"]


def test_a_replica_stopped_while_starting_is_not_a_failure() -> None:
    ds, t = make(2)
    actions = ds.step(0.0)
    ds.set_target(dataclasses.replace(t, num_replicas=1))
    assert len(stops(ds.step(0.1))) == 1
    stopped = next(r for r in ds.replicas.values() if r.state == ReplicaState.STOPPING)
    ds.on_start_failed(stopped.replica_id, "killed", 0.2)
    assert ds.start_failures == 0
    del actions


def test_a_dead_replica_is_replaced_and_unhealthy_meanwhile() -> None:
    ds, _ = make(2)
    run_all(ds, ds.step(0.0), 0.1)
    ds.on_died("r0", "replica r0 died")
    assert ds.routable() == ["r1"]
    status, trigger, message = ds.status()
    assert status == DeploymentStatus.UNHEALTHY and "r0 died" in message
    assert trigger == DeploymentStatusTrigger.HEALTH_CHECK_FAILED
    actions = ds.step(0.2)
    assert len(starts(actions)) == 1
    ds.on_stopped("r0")
    run_all(ds, actions, 0.3)
    assert ds.status()[0] == DeploymentStatus.HEALTHY


def test_scale_down_drains_starting_replicas_first_then_the_newest() -> None:
    ds, t = make(3)
    actions = ds.step(0.0)
    ds.on_started("r0", 1.0)
    ds.on_started("r1", 2.0)
    ds.set_target(dataclasses.replace(t, num_replicas=1))
    out = stops(ds.step(3.0))
    assert {s.replica_id: s.graceful for s in out} == {"r2": False, "r1": True}
    del actions


def test_user_config_change_reconfigures_in_place() -> None:
    ds, t = make(2)
    run_all(ds, ds.step(0.0), 0.1)
    ds.set_target(dataclasses.replace(t, config_version=1))
    actions = ds.step(1.0)
    assert sorted(type(a).__name__ for a in actions) == ["Reconfigure", "Reconfigure"]
    assert all(isinstance(a, Reconfigure) and a.config_version == 1 for a in actions)
    assert sorted(ds.routable()) == ["r0", "r1"]  # UPDATING replicas keep serving
    assert ds.status()[0] == DeploymentStatus.UPDATING
    for a in actions:
        ds.on_reconfigured(a.replica_id, a.config_version)
    assert ds.status()[0] == DeploymentStatus.HEALTHY


def test_autoscaling_states() -> None:
    ds, _ = make(1)
    run_all(ds, ds.step(0.0), 0.1)
    ds.scale_to(3)
    assert ds.status()[0] == DeploymentStatus.UPSCALING
    run_all(ds, ds.step(1.0), 1.1)
    status, trigger, _ = ds.status()
    assert (
        status == DeploymentStatus.HEALTHY and trigger == DeploymentStatusTrigger.UPSCALE_COMPLETED
    )
    ds.scale_to(1)
    assert ds.status()[0] == DeploymentStatus.DOWNSCALING
    assert len(stops(ds.step(2.0))) == 2


def test_delete_drains_everything_then_is_gone() -> None:
    ds, _ = make(2)
    actions = ds.step(0.0)
    ds.on_started("r0", 0.1)
    ds.delete()
    out = stops(ds.step(1.0))
    assert {s.replica_id: s.graceful for s in out} == {"r0": True, "r1": False}
    assert not ds.gone
    for s in out:
        ds.on_stopped(s.replica_id)
    assert ds.gone
    del actions


def test_recovery_after_a_controller_restart() -> None:
    ds, _ = make(2)
    from nbcluster.serve._reconcile import ReplicaRecord

    for rid in ("a", "b"):
        ds.adopt(ReplicaRecord(rid, "v1", ReplicaState.RUNNING, 0, 0.0))
    assert sorted(ds.routable()) == ["a", "b"]  # routers keep sending while we check
    ds.on_recovered("a", True, 1.0)
    ds.on_recovered("b", False, 1.0)
    assert ds.routable() == ["a"]
    assert len(starts(ds.step(1.1))) == 1


def test_app_status_precedence() -> None:
    ok = (DeploymentStatus.HEALTHY, "")
    assert app_status({"a": ok}, False) == (ApplicationStatus.RUNNING, "")
    assert app_status({"a": ok, "b": (DeploymentStatus.UPDATING, "1/2")}, False)[0] == (
        ApplicationStatus.DEPLOYING
    )
    failed = app_status({"a": ok, "b": (DeploymentStatus.DEPLOY_FAILED, "boom")}, False)
    assert failed[0] == ApplicationStatus.DEPLOY_FAILED and "boom" in failed[1]
    assert app_status({"a": (DeploymentStatus.UNHEALTHY, "x")}, False)[0] == (
        ApplicationStatus.UNHEALTHY
    )
    assert app_status({"a": ok}, True)[0] == ApplicationStatus.DELETING
    assert (
        app_status({"a": (DeploymentStatus.UPSCALING, "")}, False)[0] == ApplicationStatus.RUNNING
    )
