"""Schedulers and stoppers on synthetic report sequences (no processes)."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import pytest

from nbcluster import tune
from nbcluster.tune.experiment.trial import CheckpointRecord, Trial
from nbcluster.tune.schedulers import (
    ASHAScheduler,
    HyperBandScheduler,
    MedianStoppingRule,
    PopulationBasedTraining,
    TrialScheduler,
)
from nbcluster.tune.schedulers.pbt import explore
from nbcluster.tune.stopper import (
    CombinedStopper,
    MaximumIterationStopper,
    TimeoutStopper,
    TrialPlateauStopper,
    make_stopper,
)

CONTINUE, PAUSE, STOP = TrialScheduler.CONTINUE, TrialScheduler.PAUSE, TrialScheduler.STOP


class FakeController:
    """What schedulers may call on the controller, recording what they did."""

    def __init__(self, n: int, config: dict[str, Any] | None = None) -> None:
        self.trials = [Trial("f", f"t{i}", dict(config or {})) for i in range(n)]
        for t in self.trials:
            t.set_status(Trial.RUNNING)
        self.search_alg: Any = None
        self.stopped: list[str] = []
        self.exploited: list[tuple[str, dict[str, Any], str]] = []

    def get_trials(self) -> list[Trial]:
        return self.trials

    def get_live_trials(self) -> list[Trial]:
        return [t for t in self.trials if not t.is_finished()]

    def get_trial(self, trial_id: str) -> Trial | None:
        return next((t for t in self.trials if t.trial_id == trial_id), None)

    def has_resources_for_trial(self, trial: Trial) -> bool:
        return True

    def pause_trial(self, trial: Trial, should_checkpoint: bool = True) -> None:
        trial.set_status(Trial.PAUSED)

    def stop_trial(self, trial: Trial) -> None:
        trial.set_status(Trial.TERMINATED)
        self.stopped.append(trial.trial_id)

    def checkpoint_now(self, trial: Trial) -> CheckpointRecord | None:
        return trial.latest_checkpoint

    def exploit_trial(
        self, trial: Trial, config: dict[str, Any], ckpt: CheckpointRecord, tag: str
    ) -> None:
        self.pause_trial(trial)
        trial.config = config
        trial.restore_from = ckpt
        self.exploited.append((trial.trial_id, config, ckpt.path))


def res(it: int, value: float, key: str = "acc") -> dict[str, Any]:
    return {"training_iteration": it, key: value}


def test_asha_stops_below_the_rung_cutoff() -> None:
    sched = ASHAScheduler(metric="acc", mode="max", grace_period=1, max_t=10, reduction_factor=2)
    ctrl = FakeController(4)
    a, b, c, d = ctrl.trials
    for t in ctrl.trials:
        sched.on_trial_add(ctrl, t)  # type: ignore[arg-type]
    assert [m for m, _ in sched._brackets[0].rungs] == [8, 4, 2, 1]
    assert sched.on_trial_result(ctrl, a, res(1, 10)) == CONTINUE  # first at the rung
    assert sched.on_trial_result(ctrl, b, res(1, 5)) == STOP  # below median of {10}
    assert sched.on_trial_result(ctrl, c, res(1, 20)) == CONTINUE  # above median of {10, 5}
    assert sched.on_trial_result(ctrl, a, res(2, 11)) == CONTINUE  # first at rung 2
    assert sched.on_trial_result(ctrl, c, res(2, 9)) == STOP  # below 11
    assert sched.on_trial_result(ctrl, a, res(3, 0)) == CONTINUE  # between rungs: no decision
    assert sched.on_trial_result(ctrl, d, res(10, 100)) == STOP  # max_t reached
    assert sched.num_stopped == 3


def test_asha_min_mode_and_validation() -> None:
    sched = ASHAScheduler(metric="loss", mode="min", grace_period=1, max_t=4, reduction_factor=2)
    ctrl = FakeController(2)
    for t in ctrl.trials:
        sched.on_trial_add(ctrl, t)  # type: ignore[arg-type]
    assert sched.on_trial_result(ctrl, ctrl.trials[0], res(1, 1.0, "loss")) == CONTINUE
    assert sched.on_trial_result(ctrl, ctrl.trials[1], res(1, 2.0, "loss")) == STOP
    with pytest.raises(ValueError, match="grace_period"):
        ASHAScheduler(grace_period=10, max_t=5)
    with pytest.raises(ValueError, match="reduction_factor"):
        ASHAScheduler(reduction_factor=1)
    with pytest.raises(ValueError, match="metric"):
        ASHAScheduler().on_trial_add(FakeController(1), Trial("f", "x", {}))  # type: ignore[arg-type]


def test_hyperband_brackets_pause_then_halve() -> None:
    sched = HyperBandScheduler(metric="acc", mode="max", max_t=9, reduction_factor=3)
    ctrl = FakeController(8)
    for t in ctrl.trials:
        sched.on_trial_add(ctrl, t)  # type: ignore[arg-type]
    band = sched._hyperbands[0]
    assert [b._n for b in band if b] == [3, 5] and [b._r for b in band if b] == [9, 3]
    second = ctrl.trials[3:]  # the 5 trials of the bracket with milestone 3
    scores = [1.0, 5.0, 3.0, 4.0, 2.0]
    for t, score in zip(second[:-1], scores[:-1], strict=True):
        assert sched.on_trial_result(ctrl, t, res(1, score)) == CONTINUE
        decision = sched.on_trial_result(ctrl, t, res(3, score))
        assert decision == PAUSE  # reached the milestone before the others
        t.set_status(Trial.PAUSED)
    last = second[-1]
    decision = sched.on_trial_result(ctrl, last, res(3, scores[-1]))
    # The milestone is complete: keep ceil(5/3) = 2 best (scores 5 and 4), stop the rest.
    assert decision == STOP  # the reporting trial (score 2) is among the bad ones
    assert sorted(ctrl.stopped) == sorted([second[0].trial_id, second[2].trial_id])
    bracket = band[1]
    assert bracket is not None and bracket.trials_to_unpause == {
        second[1].trial_id,
        second[3].trial_id,
    }
    chosen = sched.choose_trial_to_run(ctrl)  # type: ignore[arg-type]
    assert chosen is not None and chosen.trial_id in bracket.trials_to_unpause


def test_median_stopping_rule() -> None:
    sched = MedianStoppingRule(
        time_attr="training_iteration",
        metric="acc",
        mode="max",
        grace_period=1,
        min_samples_required=2,
    )
    ctrl = FakeController(3)
    a, b, c = ctrl.trials
    for t in ctrl.trials:
        sched.on_trial_add(ctrl, t)  # type: ignore[arg-type]
    for it in (1, 2, 3):
        assert sched.on_trial_result(ctrl, a, res(it, 10.0)) == CONTINUE  # alone: too few samples
        assert sched.on_trial_result(ctrl, b, res(it, 8.0)) == CONTINUE
    # c is worse than the median of the running means of a (10) and b (8) at t=1.
    assert sched.on_trial_result(ctrl, c, res(1, 1.0)) == STOP
    assert "num_stopped=1" in sched.debug_string()


def test_median_stopping_yields_when_samples_are_few_and_others_wait() -> None:
    sched = MedianStoppingRule(
        time_attr="training_iteration", metric="acc", mode="max", grace_period=0
    )
    ctrl = FakeController(2)
    ctrl.trials[1].set_status(Trial.PENDING)
    sched.on_trial_add(ctrl, ctrl.trials[0])  # type: ignore[arg-type]
    assert sched.on_trial_result(ctrl, ctrl.trials[0], res(1, 1.0)) == PAUSE


def test_pbt_lower_quantile_exploits_the_top_trial() -> None:
    random.seed(0)
    sched = PopulationBasedTraining(
        time_attr="training_iteration",
        metric="acc",
        mode="max",
        perturbation_interval=2,
        hyperparam_mutations={"lr": tune.uniform(0.001, 1.0)},
        quantile_fraction=0.25,
        resample_probability=0.0,
    )
    ctrl = FakeController(4)
    for i, t in enumerate(ctrl.trials):
        t.config = {"lr": 0.1 * (i + 1)}
        sched.on_trial_add(ctrl, t)  # type: ignore[arg-type]
        t.add_checkpoint(
            CheckpointRecord(0, f"/exp/{t.trial_id}/checkpoint_000000", {"training_iteration": 2})
        )
    scores = [1.0, 2.0, 3.0, 4.0]
    decisions = [
        sched.on_trial_result(ctrl, t, res(2, s)) for t, s in zip(ctrl.trials, scores, strict=True)
    ]
    assert decisions[1:] == [CONTINUE, CONTINUE, CONTINUE]
    # Trial 0 reported first: no quantiles yet. Its next interval puts it at the bottom.
    assert sched.on_trial_result(ctrl, ctrl.trials[0], res(4, 0.5)) == TrialScheduler.NOOP
    ((tid, config, path),) = ctrl.exploited
    assert tid == "t0" and path == "/exp/t3/checkpoint_000000"
    assert config["lr"] == pytest.approx(0.4 * 1.2) or config["lr"] == pytest.approx(0.4 * 0.8)
    assert ctrl.trials[0].status == Trial.PAUSED and sched.num_perturbations == 1


def test_pbt_explore_operations() -> None:
    random.seed(1)
    new, ops = explore(
        {"a": 10, "b": "x", "c": {"d": 1.0}},
        {"a": tune.randint(1, 100), "b": ["x", "y", "z"], "c": {"d": [1.0, 2.0]}},
        resample_probability=0.0,
        perturbation_factors=(2.0, 0.5),
        custom_explore_fn=None,
    )
    assert new["a"] in (20, 5) and isinstance(new["a"], int)
    assert new["b"] in ("x", "y") and ops["b"].startswith("shift")
    assert new["c"]["d"] in (1.0, 2.0)
    with pytest.raises(ValueError, match="sample_from"):
        PopulationBasedTraining(hyperparam_mutations={"a": tune.sample_from(lambda: 1)})


def test_stoppers() -> None:
    stop = make_stopper({"training_iteration": 3})
    assert stop is not None
    assert [stop("t", {"training_iteration": i}) for i in (1, 2, 3)] == [False, False, True]
    fn = make_stopper(lambda trial_id, result: result["loss"] < 0.1)
    assert fn is not None and fn("t", {"loss": 0.05}) and not fn.stop_all()
    m = MaximumIterationStopper(2)
    assert [m("t", {}), m("t", {}), m("u", {})] == [False, True, False]
    plateau = TrialPlateauStopper("loss", std=0.01, num_results=3, grace_period=3)
    assert [plateau("t", {"loss": v}) for v in (1.0, 1.0, 1.0)] == [False, False, True]
    assert CombinedStopper(m, TimeoutStopper(100)).stop_all() is False
    assert CombinedStopper(m, TimeoutStopper(0)).stop_all() is True
    with pytest.raises(ValueError, match="threshold"):
        make_stopper({"acc": "high"})
    with pytest.raises(TypeError, match="Stopper"):
        make_stopper(42)


def test_asha_bracket_spread_uses_global_numpy_seed() -> None:
    np.random.seed(0)
    sched = ASHAScheduler(metric="acc", mode="max", brackets=3, max_t=27, reduction_factor=3)
    ctrl = FakeController(30)
    for t in ctrl.trials:
        sched.on_trial_add(ctrl, t)  # type: ignore[arg-type]
    assert len({id(b) for b in sched._trial_info.values()}) > 1
