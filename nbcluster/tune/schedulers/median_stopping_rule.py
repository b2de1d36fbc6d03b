"""``MedianStoppingRule``: stop a trial whose best result is worse than the median of the
others' running averages at the same point (Golovin et al., "Google Vizier")."""

from __future__ import annotations

import collections
from typing import Any

import numpy as np

from nbcluster.tune.experiment.trial import Trial
from nbcluster.tune.schedulers.trial_scheduler import TrialControl, TrialScheduler, check_positive

__all__ = ["MedianStoppingRule"]


class MedianStoppingRule(TrialScheduler):
    """Ray's median stopping rule, with its arguments and defaults.

    After ``grace_period`` of ``time_attr``, a trial is stopped (paused if not
    ``hard_stop``) when its best ``metric`` so far is worse than the median of the running
    means of the trials that got at least as far. With fewer than ``min_samples_required``
    such trials it yields its slot to waiting trials (a pause) if it ran at least
    ``min_time_slice`` since its last pause and some trial is waiting.
    """

    pauses_trials = True

    def __init__(
        self,
        time_attr: str = "time_total_s",
        metric: str | None = None,
        mode: str | None = None,
        grace_period: float = 60.0,
        min_samples_required: int = 3,
        min_time_slice: float = 0,
        hard_stop: bool = True,
    ) -> None:
        super().__init__()
        check_positive("grace_period", grace_period, allow_zero=True)
        check_positive("min_time_slice", min_time_slice, allow_zero=True)
        if not isinstance(min_samples_required, int) or min_samples_required < 1:
            raise ValueError(
                f"min_samples_required must be an integer >= 1, got {min_samples_required!r}"
            )
        if mode not in (None, "min", "max"):
            raise ValueError(f"mode must be 'min' or 'max', got {mode!r}")
        self._stopped_trials: set[str] = set()
        self._grace_period = grace_period
        self._min_samples_required = min_samples_required
        self._min_time_slice = min_time_slice
        self._metric = metric
        self._mode = mode
        self._time_attr = time_attr
        self._hard_stop = hard_stop
        self._last_pause: dict[str, float] = {}
        self._results: dict[str, list[dict[str, Any]]] = collections.defaultdict(list)

    def _better(self, a: float, b: float) -> float:
        return max(a, b) if self._mode == "max" else min(a, b)

    def on_trial_add(self, tune_controller: TrialControl, trial: Trial) -> None:
        self._require_metric()

    def on_trial_result(
        self, tune_controller: TrialControl, trial: Trial, result: dict[str, Any]
    ) -> str:
        if self._time_attr not in result or self._metric not in result:
            return TrialScheduler.CONTINUE
        if trial.trial_id in self._stopped_trials:
            return TrialScheduler.CONTINUE
        time = result[self._time_attr]
        self._results[trial.trial_id].append(result)
        if time < self._grace_period:
            return TrialScheduler.CONTINUE
        others = [t for t in self._trials_beyond_time(time) if t != trial.trial_id]
        running_means = [m for m in (self._running_mean(t, time) for t in others) if np.isfinite(m)]
        if len(running_means) < self._min_samples_required:
            action = self._on_insufficient_samples(tune_controller, trial, time)
            if action == TrialScheduler.PAUSE:
                self._last_pause[trial.trial_id] = time
            return action
        median = float(np.median(running_means))
        best = self._best_result(trial.trial_id)
        if self._better(median, best) != best:
            self._stopped_trials.add(trial.trial_id)
            return TrialScheduler.STOP if self._hard_stop else TrialScheduler.PAUSE
        return TrialScheduler.CONTINUE

    def on_trial_complete(
        self, tune_controller: TrialControl, trial: Trial, result: dict[str, Any]
    ) -> None:
        if result and self._time_attr in result and self._metric in result:
            self._results[trial.trial_id].append(result)

    def _on_insufficient_samples(
        self, tune_controller: TrialControl, trial: Trial, time: float
    ) -> str:
        if time - self._last_pause.get(trial.trial_id, float("-inf")) <= self._min_time_slice:
            return TrialScheduler.CONTINUE
        waiting = [
            t
            for t in tune_controller.get_live_trials()
            if t.status in (Trial.PENDING, Trial.PAUSED) and t is not trial
        ]
        return TrialScheduler.PAUSE if waiting else TrialScheduler.CONTINUE

    def _trials_beyond_time(self, time: float) -> list[str]:
        return [t for t, rs in self._results.items() if rs and rs[-1][self._time_attr] >= time]

    def _running_mean(self, trial_id: str, time: float) -> float:
        scoped = [
            r[self._metric]
            for r in self._results[trial_id]
            if self._grace_period <= r[self._time_attr] <= time
        ]
        return float(np.mean(scoped)) if scoped else float("nan")

    def _best_result(self, trial_id: str) -> float:
        values = [r[self._metric] for r in self._results[trial_id]]
        return max(values) if self._mode == "max" else min(values)

    def debug_string(self) -> str:
        return f"Using MedianStoppingRule: num_stopped={len(self._stopped_trials)}."
