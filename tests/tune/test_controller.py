"""The Tune controller as a state machine: events in, instructions out, no process at all."""

from __future__ import annotations

from typing import Any

import pytest

from nbcluster.tune import TuneError
from nbcluster.tune.execution.controller import ControllerSettings, TuneController
from nbcluster.tune.experiment.trial import Trial
from nbcluster.tune.schedulers import FIFOScheduler, TrialScheduler
from nbcluster.tune.search import BasicVariantGenerator
from nbcluster.tune.search.sample import grid_search, uniform
from nbcluster.tune.stopper import MaximumIterationStopper, make_stopper


def make(
    space: dict[str, Any] | None = None,
    num_samples: int = 4,
    scheduler: TrialScheduler | None = None,
    stopper: Any = None,
    **settings: Any,
) -> TuneController:
    opts: dict[str, Any] = {
        "trainable_name": "f",
        "experiment_path": "/exp",
        "resources_per_trial": {"CPU": 1.0},
        "total_resources": {"CPU": 2.0},
    }
    opts.update(settings)
    search = BasicVariantGenerator(random_state=0)
    search.setup(space if space is not None else {"x": uniform(0, 1)}, num_samples)
    return TuneController(ControllerSettings(**opts), search, scheduler, stopper, id_prefix="t")


def take(ctrl: TuneController) -> list[tuple[Any, ...]]:
    out, ctrl.outbox = ctrl.outbox, []
    return out


def sent(out: list[tuple[Any, ...]], kind: str | None = None) -> list[tuple[str, tuple[Any, ...]]]:
    """(runner_id, message) of the send instructions, optionally of one message kind."""
    return [(c[1], c[2]) for c in out if c[0] == "send" and (kind is None or c[2][0] == kind)]


def result(
    trial: Trial, seq: int, ckpt: tuple[int, str] | None = None, **metrics: Any
) -> tuple[Any, ...]:
    it = trial.iteration_at_start + seq
    return (
        "result",
        trial.trial_id,
        trial.run_seq,
        seq,
        {"training_iteration": it, **metrics},
        ckpt,
    )


def test_start_places_trials_by_resources_and_reuses_runners() -> None:
    ctrl = make(num_samples=3)
    ctrl.on_start(now=0)
    out = take(ctrl)
    creates = [c for c in out if c[0] == "create_runner"]
    starts = sent(out, "start")
    assert len(creates) == 2 and all(c[2] == {"CPU": 1.0} for c in creates)
    assert len(starts) == 2
    t0, t1, t2 = ctrl.get_trials()  # FIFO keeps one trial waiting for a free slot
    assert t0.status == t1.status == Trial.RUNNING and t2.status == Trial.PENDING
    assert not ctrl.has_resources_for_trial(Trial("f", "probe", {}))
    # The first trial ends: its runner takes the third trial, no new runner.
    runner = t0.runner_id
    ctrl.on_runner_events(runner, [result(t0, 1, loss=1.0), ("done", t0.trial_id, t0.run_seq)])
    out = take(ctrl)
    assert t0.status == Trial.TERMINATED and t0.last_result["done"] is True
    assert not [c for c in out if c[0] == "create_runner"]
    ((rid, msg),) = sent(out, "start")
    assert rid == runner and msg[1] == ctrl.get_trials()[2].trial_id
    assert msg[3]["config"] == ctrl.get_trials()[2].config


def test_without_reuse_each_trial_gets_a_fresh_runner() -> None:
    ctrl = make(num_samples=3, reuse_actors=False)
    ctrl.on_start(now=0)
    take(ctrl)
    t0 = ctrl.get_trials()[0]
    old = t0.runner_id
    ctrl.on_runner_events(old, [("done", t0.trial_id, t0.run_seq)])
    out = take(ctrl)
    assert ("end_runner", old) in out
    assert [c for c in out if c[0] == "create_runner"]


def test_results_are_acked_and_recorded_with_automatic_keys() -> None:
    ctrl = make(num_samples=1)
    ctrl.on_start(now=0)
    take(ctrl)
    (t,) = ctrl.get_trials()
    ctrl.on_runner_events(t.runner_id, [result(t, 1, loss=0.5), result(t, 2, loss=0.25)])
    out = take(ctrl)
    assert [m[3] for _, m in sent(out, "ack")] == [1, 2]
    assert [r["loss"] for r in t.results] == [0.5, 0.25]
    assert t.last_result["trial_id"] == t.trial_id and t.last_result["config"] is t.config
    assert [c[0] for c in out if c[0] == "result"] == ["result", "result"]


def test_stop_drops_results_made_after_the_decision() -> None:
    ctrl = make(num_samples=1, stopper=MaximumIterationStopper(2))
    ctrl.on_start(now=0)
    take(ctrl)
    (t,) = ctrl.get_trials()
    events = [
        result(t, 1, loss=3.0),
        result(t, 2, loss=2.0),
        result(t, 3, ckpt=(0, "/exp/t/checkpoint_000000"), loss=1.0),  # ran ahead
        ("stopped", t.trial_id, t.run_seq),
    ]
    ctrl.on_runner_events(t.runner_id, events)
    out = take(ctrl)
    assert [r["training_iteration"] for r in t.results] == [1, 2]
    assert t.status == Trial.TERMINATED and not t.checkpoints
    assert ("delete_checkpoint", "/exp/t/checkpoint_000000") in out
    assert [m for _, m in sent(out, "stop")]
    assert ctrl.is_finished()


def test_dict_stopper_names_a_missing_key() -> None:
    ctrl = make(num_samples=1, stopper=make_stopper({"acc": 0.9}))
    ctrl.on_start(now=0)
    take(ctrl)
    (t,) = ctrl.get_trials()
    ctrl.on_runner_events(t.runner_id, [result(t, 1, loss=1.0)])
    assert isinstance(ctrl.fatal_error, TuneError)
    assert "'acc'" in str(ctrl.fatal_error) and "loss" in str(ctrl.fatal_error)


def test_missing_metric_is_fatal_and_lists_what_was_reported() -> None:
    ctrl = make(num_samples=2, metric="acc", mode="max")
    ctrl.on_start(now=0)
    take(ctrl)
    t0, t1 = ctrl.get_trials()
    ctrl.on_runner_events(t0.runner_id, [result(t0, 1, loss=1.0, other=2)])
    err = ctrl.fatal_error
    assert isinstance(err, TuneError)
    assert (
        "'acc'" in str(err) and "loss, other" in str(err) and "TuneConfig(metric='acc')" in str(err)
    )
    out = take(ctrl)
    assert len(sent(out, "stop")) == 2  # every running trial is asked to stop
    for t in (t0, t1):
        ctrl.on_runner_events(t.runner_id, [("stopped", t.trial_id, t.run_seq)])
    assert ctrl.is_finished()


def test_failed_trial_retries_from_its_checkpoint_then_errors() -> None:
    ctrl = make(num_samples=1, max_failures=1)
    ctrl.on_start(now=0)
    take(ctrl)
    (t,) = ctrl.get_trials()
    runner = t.runner_id
    ctrl.on_runner_events(
        runner,
        [
            result(t, 1, ckpt=(0, "/exp/t/checkpoint_000000"), loss=1.0),
            result(t, 2, loss=0.5),
            ("error", t.trial_id, t.run_seq, "Traceback...\nValueError: boom", None),
        ],
    )
    out = take(ctrl)
    assert ("trial_retry", t) in out
    ((rid, msg),) = sent(out, "start")
    spec = msg[3]
    assert rid == runner and msg[2] == 2  # second run of the trial
    assert spec["checkpoint"] == "/exp/t/checkpoint_000000" and spec["iteration"] == 1
    assert spec["next_checkpoint_index"] == 1
    # An event of the first run arriving late is ignored.
    ctrl.on_runner_events(runner, [("result", t.trial_id, 1, 3, {"loss": 9}, None)])
    assert len(t.results) == 2
    ctrl.on_runner_events(runner, [("error", t.trial_id, t.run_seq, "ValueError: again", None)])
    assert t.status == Trial.ERROR and t.num_failures == 2 and "again" in (t.error_msg or "")
    assert ctrl.is_finished()


def test_fail_fast_stops_the_experiment() -> None:
    ctrl = make(num_samples=4, fail_fast=True)
    ctrl.on_start(now=0)
    take(ctrl)
    t0, t1, t2 = ctrl.get_trials()
    ctrl.on_runner_events(t0.runner_id, [("error", t0.trial_id, t0.run_seq, "boom", None)])
    assert ctrl.stopping and t0.status == Trial.ERROR
    assert t1.status == t2.status == Trial.TERMINATED
    assert len(ctrl.get_trials()) == 3


def test_runner_death_is_a_trial_failure() -> None:
    ctrl = make(num_samples=1, max_failures=1)
    ctrl.on_start(now=0)
    take(ctrl)
    (t,) = ctrl.get_trials()
    dead = t.runner_id
    ctrl.on_runner_died(dead, "killed by signal 9")
    out = take(ctrl)
    assert ("runner_dead", dead) in out
    assert t.status == Trial.RUNNING and t.runner_id != dead and t.num_failures == 1
    assert "killed by signal 9" in (t.error_msg or "")


def test_interrupt_pauses_running_trials_and_a_new_start_resumes_them() -> None:
    ctrl = make(num_samples=2)
    ctrl.on_start(now=0)
    take(ctrl)
    t0, t1 = ctrl.get_trials()
    ctrl.on_runner_events(
        t0.runner_id, [result(t0, 1, ckpt=(0, "/exp/a/checkpoint_000000"), loss=1)]
    )
    ctrl.on_interrupt()
    assert t0.status == t1.status == Trial.PAUSED
    for t in (t0, t1):
        ctrl.on_runner_events(t.runner_id, [("stopped", t.trial_id, t.run_seq)])
    assert ctrl.is_finished()
    take(ctrl)
    ctrl.on_start(now=10)  # fit() again
    starts = sent(take(ctrl), "start")
    assert {m[1] for _, m in starts} == {t0.trial_id, t1.trial_id}
    spec0 = next(m[3] for _, m in starts if m[1] == t0.trial_id)
    assert spec0["checkpoint"] == "/exp/a/checkpoint_000000" and spec0["iteration"] == 1


def test_time_budget_terminates_everything() -> None:
    ctrl = make(num_samples=10, time_budget_s=5)
    ctrl.on_start(now=100)
    take(ctrl)
    ctrl.on_tick(now=104)
    assert not ctrl.stopping
    ctrl.on_tick(now=105.5)
    assert "time budget" in ctrl.stopping
    assert all(t.status == Trial.TERMINATED for t in ctrl.get_trials())
    assert ctrl.search_alg.is_finished()


def test_max_concurrent_trials_and_big_trials() -> None:
    ctrl = make(num_samples=4, max_concurrent_trials=1)
    ctrl.on_start(now=0)
    assert sum(t.status == Trial.RUNNING for t in ctrl.get_trials()) == 1
    ctrl = make(num_samples=4, resources_per_trial={"CPU": 2.0})
    ctrl.on_start(now=0)
    out = take(ctrl)
    assert len([c for c in out if c[0] == "create_runner"]) == 1


def test_num_to_keep_deletes_older_checkpoints_but_keeps_the_best_and_latest() -> None:
    ctrl = make(
        num_samples=1, num_to_keep=1, checkpoint_score_attribute="acc", checkpoint_score_order="max"
    )
    ctrl.on_start(now=0)
    take(ctrl)
    (t,) = ctrl.get_trials()
    ctrl.on_runner_events(
        t.runner_id,
        [
            result(t, 1, ckpt=(0, "/exp/t/checkpoint_000000"), acc=0.9),
            result(t, 2, ckpt=(1, "/exp/t/checkpoint_000001"), acc=0.5),
            result(t, 3, ckpt=(2, "/exp/t/checkpoint_000002"), acc=0.7),
        ],
    )
    deleted = [c[1] for c in take(ctrl) if c[0] == "delete_checkpoint"]
    assert deleted == ["/exp/t/checkpoint_000001"]
    assert {c.index for c in t.checkpoints} == {0, 2}  # the best, and the latest to resume from


class _PauseAt2(FIFOScheduler):
    pauses_trials = True

    def on_trial_result(self, tune_controller: Any, trial: Trial, result: dict[str, Any]) -> str:
        return (
            TrialScheduler.PAUSE if result["training_iteration"] == 2 else TrialScheduler.CONTINUE
        )


def test_pausing_scheduler_runs_lock_step_and_resumes_from_checkpoint() -> None:
    ctrl = make(num_samples=1, scheduler=_PauseAt2())
    ctrl.on_start(now=0)
    ((_, start),) = sent(take(ctrl), "start")
    assert start[3]["max_results_ahead"] == 0
    (t,) = ctrl.get_trials()
    ctrl.on_runner_events(
        t.runner_id, [result(t, 1, loss=1), result(t, 2, ckpt=(0, "/exp/t/c0"), loss=0.5)]
    )
    out = take(ctrl)
    assert sent(out, "pause") and t.status == Trial.PAUSED
    ctrl.on_runner_events(t.runner_id, [("stopped", t.trial_id, t.run_seq)])
    ((_, again),) = sent(take(ctrl), "start")  # nothing else waits: it resumes at once
    assert again[3]["checkpoint"] == "/exp/t/c0" and again[3]["iteration"] == 2


def test_grid_times_samples_creates_every_variant() -> None:
    ctrl = make({"a": grid_search([1, 2, 3])}, num_samples=2, total_resources={"CPU": 8.0})
    ctrl.on_start(now=0)
    assert [t.config["a"] for t in ctrl.get_trials()] == [1, 2, 3, 1, 2, 3]
    assert ctrl.get_trials()[0].experiment_tag == "0_a=1"
    assert ctrl.get_trials()[0].local_path.startswith("/exp/f_t_00000_0_a=1")


@pytest.mark.parametrize("scope", ["last", "all"])
def test_metric_summary_scopes(scope: str) -> None:
    t = Trial("f", "x", {})
    for v in (3.0, 1.0, 2.0):
        t.add_result({"loss": v})
    assert t.metric_summary("loss", scope=scope, mode="min") == (2.0 if scope == "last" else 1.0)


def test_prefetch_queues_one_trial_per_busy_runner() -> None:
    ctrl = make(num_samples=6, prefetch=True)
    ctrl.on_start(now=0)
    out = take(ctrl)
    assert len([c for c in out if c[0] == "create_runner"]) == 2
    starts = sent(out, "start")
    assert len(starts) == 4  # two running, one queued behind each
    t0, t1, t2, t3 = ctrl.get_trials()[:4]
    assert t0.status == t1.status == Trial.RUNNING
    assert t2.status == t3.status == Trial.PENDING and t2.runner_id and t3.runner_id
    assert {t2.runner_id, t3.runner_id} == {t0.runner_id, t1.runner_id}
    queued_on_t0 = t2 if t2.runner_id == t0.runner_id else t3
    # t0 ends and its runner starts the queued trial by itself: no new start message for it.
    ctrl.on_runner_events(
        t0.runner_id,
        [
            ("done", t0.trial_id, t0.run_seq),
            ("started", queued_on_t0.trial_id, queued_on_t0.run_seq, {}),
        ],
    )
    out = take(ctrl)
    assert queued_on_t0.status == Trial.RUNNING
    assert [m[1] for _, m in sent(out, "start")] == [ctrl.get_trials()[4].trial_id]  # queued next
    # The runner of t1 dies: t1 fails, its queued trial just waits again (no failure).
    other = t3 if queued_on_t0 is t2 else t2
    dead = t1.runner_id
    ctrl.on_runner_died(dead, "gone")
    assert t1.status == Trial.ERROR and other.num_failures == 0 and other.error_msg is None
    assert other.runner_id not in (None, dead)  # placed again, on a new runner


def test_a_runner_whose_trial_ended_is_busy_with_its_queued_trial() -> None:
    # The runner reports the end of its trial in one batch and the start of the queued one
    # in the next: in between, the controller must not take the runner for an idle one
    # (a start sent then would run a second trial beside the queued one).
    ctrl = make(num_samples=8, prefetch=True, total_resources={"CPU": 1.0})
    ctrl.on_start(now=0)
    out = take(ctrl)
    first, queued = ctrl.get_trials()[:2]
    runner = first.runner_id
    assert [m[1] for _, m in sent(out, "start")] == [first.trial_id, queued.trial_id]
    assert queued.runner_id == runner and queued.status == Trial.PENDING

    ctrl.on_runner_events(runner, [("done", first.trial_id, first.run_seq)])
    out = take(ctrl)
    assert first.status == Trial.TERMINATED
    starts = sent(out, "start")
    assert len(starts) == 1, starts  # only the next trial, queued behind `queued`
    third = ctrl.get_trial(starts[0][1][1])
    assert third is not None and third.status == Trial.PENDING
    assert ctrl.runners[runner].trial_id == queued.trial_id
    assert ctrl.runners[runner].queued == third.trial_id
    assert not ctrl.is_finished()

    ctrl.on_runner_events(runner, [("started", queued.trial_id, queued.run_seq, {})])
    take(ctrl)
    assert queued.status == Trial.RUNNING and third.status == Trial.PENDING
    # A stop of the started trial goes to its runner; its end starts the queued one.
    ctrl.on_runner_events(runner, [("done", queued.trial_id, queued.run_seq)])
    assert ctrl.runners[runner].trial_id == third.trial_id


def test_a_failure_during_an_interrupt_stays_resumable() -> None:
    ctrl = make(num_samples=1, max_failures=2)
    ctrl.on_start(now=0)
    take(ctrl)
    (t,) = ctrl.get_trials()
    ctrl.on_interrupt()
    ctrl.on_runner_events(t.runner_id, [("error", t.trial_id, t.run_seq, "OSError: disk", None)])
    assert t.status == Trial.PAUSED and t.num_failures == 1 and ctrl.is_finished()
