"""``ASHAScheduler`` (``AsyncHyperBandScheduler``): stop the weakest trials at each rung.

Rungs sit at ``grace_period * reduction_factor**k`` of ``time_attr``. When a trial reaches
a rung, its metric is recorded there and compared with what the other trials recorded
at the same rung: below the ``1 - 1/reduction_factor`` quantile it is stopped. Nothing
waits for a rung to fill (that is the "asynchronous" of ASHA), so trials never pause.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from nbcluster.tune.experiment.trial import Trial
from nbcluster.tune.schedulers.trial_scheduler import TrialControl, TrialScheduler, check_positive

__all__ = ["ASHAScheduler", "AsyncHyperBandScheduler"]


class _Bracket:
    """One ASHA bracket: rungs (milestone, {trial_id: score}), highest milestone first."""

    def __init__(
        self, min_t: float, max_t: float, reduction_factor: float, s: int, stop_last_trials: bool
    ) -> None:
        self.rf = reduction_factor
        max_rungs = int(np.log(max_t / min_t) / np.log(self.rf) - s + 1)
        self.rungs: list[tuple[float, dict[str, float]]] = [
            (min_t * self.rf ** (k + s), {}) for k in reversed(range(max_rungs))
        ]
        self.stop_last_trials = stop_last_trials

    def cutoff(self, recorded: dict[str, float]) -> float | None:
        """The score a trial must reach at a rung to go on."""
        if not recorded:
            return None
        return float(np.nanpercentile(list(recorded.values()), (1 - 1 / self.rf) * 100))

    def on_result(self, trial_id: str, cur_iter: float, cur_rew: float | None) -> str:
        action = TrialScheduler.CONTINUE
        for milestone, recorded in self.rungs:
            if cur_iter >= milestone and trial_id in recorded and not self.stop_last_trials:
                break
            if cur_iter < milestone or trial_id in recorded:
                continue
            cutoff = self.cutoff(recorded)
            if cutoff is not None and cur_rew is not None and cur_rew < cutoff:
                action = TrialScheduler.STOP
            if cur_rew is not None:
                recorded[trial_id] = cur_rew
            break
        return action

    def debug_str(self) -> str:
        rungs = " | ".join(f"Iter {m:.3f}: {self.cutoff(r)}" for m, r in self.rungs)
        return "Bracket: " + rungs


class AsyncHyperBandScheduler(TrialScheduler):
    """Asynchronous successive halving (Li et al., "A System for Massively Parallel
    Hyperparameter Tuning"), with Ray's arguments and defaults.

    ``time_attr``: the result key that measures progress (default ``training_iteration``).
    ``max_t``: trials stop at this much progress. ``grace_period``: no trial is stopped
    before it. ``reduction_factor``: rungs are this factor apart and keep the top
    ``1/reduction_factor``. ``brackets``: how many brackets (trials are spread over them).
    """

    def __init__(
        self,
        time_attr: str = "training_iteration",
        metric: str | None = None,
        mode: str | None = None,
        max_t: float = 100,
        grace_period: float = 1,
        reduction_factor: float = 4,
        brackets: int = 1,
        stop_last_trials: bool = True,
    ) -> None:
        super().__init__()
        check_positive("max_t", max_t)
        check_positive("grace_period", grace_period)
        if grace_period > max_t:
            raise ValueError(f"grace_period ({grace_period}) must be <= max_t ({max_t})")
        if not isinstance(reduction_factor, (int, float)) or reduction_factor <= 1:
            raise ValueError(f"reduction_factor must be a number > 1, got {reduction_factor!r}")
        if not isinstance(brackets, int) or brackets < 1:
            raise ValueError(f"brackets must be an integer >= 1, got {brackets!r}")
        if mode not in (None, "min", "max"):
            raise ValueError(f"mode must be 'min' or 'max', got {mode!r}")
        self._reduction_factor = reduction_factor
        self._max_t = max_t
        self._trial_info: dict[str, _Bracket] = {}
        self._brackets = [
            _Bracket(grace_period, max_t, reduction_factor, s, stop_last_trials)
            for s in range(brackets)
        ]
        self._num_stopped = 0
        self._metric = metric
        self._mode = mode
        self._time_attr = time_attr
        self._stop_last_trials = stop_last_trials

    @property
    def _metric_op(self) -> float:
        return 1.0 if self._mode == "max" else -1.0

    def on_trial_add(self, tune_controller: TrialControl, trial: Trial) -> None:
        self._require_metric()
        sizes = np.array([len(b.rungs) for b in self._brackets])
        probs = np.e ** (sizes - sizes.max())
        idx = int(np.random.choice(len(self._brackets), p=probs / probs.sum()))
        self._trial_info[trial.trial_id] = self._brackets[idx]

    def on_trial_result(
        self, tune_controller: TrialControl, trial: Trial, result: dict[str, Any]
    ) -> str:
        if self._time_attr not in result or self._metric not in result:
            return TrialScheduler.CONTINUE
        if result[self._time_attr] >= self._max_t and self._stop_last_trials:
            action = TrialScheduler.STOP
        else:
            bracket = self._trial_info[trial.trial_id]
            action = bracket.on_result(
                trial.trial_id, result[self._time_attr], self._metric_op * result[self._metric]
            )
        if action == TrialScheduler.STOP:
            self._num_stopped += 1
        return action

    def on_trial_complete(
        self, tune_controller: TrialControl, trial: Trial, result: dict[str, Any]
    ) -> None:
        bracket = self._trial_info.pop(trial.trial_id, None)
        if bracket is None or self._time_attr not in result or self._metric not in result:
            return
        bracket.on_result(
            trial.trial_id, result[self._time_attr], self._metric_op * result[self._metric]
        )

    def on_trial_remove(self, tune_controller: TrialControl, trial: Trial) -> None:
        self._trial_info.pop(trial.trial_id, None)

    def on_trial_error(self, tune_controller: TrialControl, trial: Trial) -> None:
        self._trial_info.pop(trial.trial_id, None)

    @property
    def num_stopped(self) -> int:
        """How many trials this scheduler stopped early."""
        return self._num_stopped

    def debug_string(self) -> str:
        out = f"Using AsyncHyperBand: num_stopped={self._num_stopped}"
        return out + "\n" + "\n".join(b.debug_str() for b in self._brackets)


ASHAScheduler = AsyncHyperBandScheduler
