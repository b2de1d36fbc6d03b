"""``HyperBandScheduler``: synchronous HyperBand (Li et al. 2016), as Ray implements it.

Trials are grouped into brackets; a bracket runs its trials to a milestone of
``time_attr``, pausing those that get there first, then keeps the best ``1/eta`` and stops
the rest, and so on until ``max_t``. Bracket bookkeeping is keyed by trial id, so the
scheduler pickles with the experiment state independently of the trial objects.
"""

from __future__ import annotations

import collections
from typing import Any

import numpy as np

from nbcluster.tune.error import TuneError
from nbcluster.tune.experiment.trial import Trial
from nbcluster.tune.schedulers.trial_scheduler import TrialControl, TrialScheduler, check_positive

__all__ = ["HyperBandScheduler"]


def _is_saving(trial: Trial) -> bool:
    return trial.pending_decision == "PAUSE"


class _Bracket:
    """Progress of one HyperBand bracket (trial ids -> their latest result)."""

    def __init__(
        self,
        time_attr: str,
        max_trials: int,
        init_t_attr: int,
        max_t_attr: float,
        eta: float,
        s: int,
        stop_last_trials: bool = True,
    ) -> None:
        self._live_trials: dict[str, dict[str, Any] | None] = {}
        self._all_trials: list[str] = []
        self._time_attr = time_attr
        self._n = self._n0 = max_trials
        self._r = self._r0 = init_t_attr
        self._max_t_attr = max_t_attr
        self._cumul_r = self._r0
        self._eta = eta
        self._halves = s
        self._total_work = self._calculate_total_work(self._n0, self._r0, s)
        self._completed_progress = 0.0
        self.stop_last_trials = stop_last_trials
        self.is_being_processed = False
        self.trials_to_unpause: set[str] = set()

    def add_trial(self, trial_id: str) -> None:
        assert not self.filled(), "Cannot add trial to filled bracket!"
        self._live_trials[trial_id] = None
        self._all_trials.append(trial_id)

    def cur_iter_done(self) -> bool:
        return all(self._time(r) >= self._cumul_r for r in self._live_trials.values())

    def finished(self) -> bool:
        if not self.stop_last_trials:
            return False
        return self._halves == 0 and self.cur_iter_done()

    def current_trials(self) -> list[str]:
        return list(self._live_trials)

    def continue_trial(self, trial_id: str) -> bool:
        result = self._live_trials[trial_id]
        if not self.stop_last_trials and self._halves == 0:
            return True
        return self._time(result) < self._cumul_r

    def filled(self) -> bool:
        return len(self._live_trials) == self._n

    def successive_halving(self, metric: str, metric_op: float) -> tuple[list[str], list[str]]:
        if self._halves == 0 and not self.stop_last_trials:
            return list(self._live_trials), []
        assert self._halves > 0
        self._halves -= 1
        self._n = int(np.ceil(self._n / self._eta))
        self._r = int(min(self._r * self._eta, self._max_t_attr))
        self._cumul_r = self._r
        ranked = sorted(
            self._live_trials,
            key=lambda t: metric_op * (self._live_trials[t] or {}).get(metric, float("-inf")),
        )
        return ranked[-self._n :], ranked[: -self._n]

    def update_trial_stats(self, trial_id: str, result: dict[str, Any]) -> None:
        observed = self._time(result)
        delta = observed - self._time(self._live_trials[trial_id])
        self._completed_progress += delta
        self._live_trials[trial_id] = result
        self.trials_to_unpause.discard(trial_id)

    def cleanup_trial(self, trial_id: str) -> None:
        self._live_trials.pop(trial_id, None)

    def completion_percentage(self) -> float:
        if self.finished():
            return 1.0
        return min(self._completed_progress / max(self._total_work, 1), 1.0)

    def _time(self, result: dict[str, Any] | None) -> float:
        return 0 if result is None else result[self._time_attr]

    def _calculate_total_work(self, n: int, r: float, s: int) -> int:
        work = 0
        cumulative_r = r
        for _ in range(s + 1):
            work += int(n) * int(r)
            n = int(np.ceil(n / self._eta))
            r = int(min(r * self._eta, self._max_t_attr - cumulative_r))
        return work

    def __repr__(self) -> str:
        return (
            f"Bracket(Max Size (n)={self._n}, Milestone (r)={self._cumul_r}, "
            f"completed={self.completion_percentage():.1%}, trials={len(self._all_trials)})"
        )


class HyperBandScheduler(TrialScheduler):
    """Synchronous HyperBand with Ray's arguments and defaults (``max_t=81``, ``eta=3``).

    Trials that reach a bracket's milestone are PAUSED (their state is their latest
    checkpoint) until the bracket's other trials get there; then the best ``1/eta`` go on
    and the others are stopped. Function trainables must report checkpoints (and resume
    from ``tune.get_checkpoint()``) to continue where they paused.
    """

    pauses_trials = True

    def __init__(
        self,
        time_attr: str = "training_iteration",
        metric: str | None = None,
        mode: str | None = None,
        max_t: float = 81,
        reduction_factor: float = 3,
        stop_last_trials: bool = True,
    ) -> None:
        super().__init__()
        check_positive("max_t", max_t)
        if not isinstance(reduction_factor, (int, float)) or reduction_factor <= 1:
            raise ValueError(f"reduction_factor must be a number > 1, got {reduction_factor!r}")
        if mode not in (None, "min", "max"):
            raise ValueError(f"mode must be 'min' or 'max', got {mode!r}")
        self._eta = reduction_factor
        self._s_max_1 = int(np.round(np.log(max_t) / np.log(reduction_factor))) + 1
        self._max_t_attr = max_t
        self._hyperbands: list[list[_Bracket | None]] = [[]]
        self._trial_info: dict[str, tuple[_Bracket, int]] = {}
        self._state: dict[str, Any] = {"bracket": None, "band_idx": 0}
        self._num_stopped = 0
        self._metric = metric
        self._mode = mode
        self._time_attr = time_attr
        self._stop_last_trials = stop_last_trials

    @property
    def _metric_op(self) -> float:
        return 1.0 if self._mode == "max" else -1.0

    def _get_n0(self, s: int) -> int:
        return int(np.ceil(self._s_max_1 / (s + 1) * self._eta**s))

    def _get_r0(self, s: int) -> int:
        return int(self._max_t_attr * self._eta ** (-s))

    def _cur_band_filled(self) -> bool:
        return len(self._hyperbands[self._state["band_idx"]]) == self._s_max_1

    def on_trial_add(self, tune_controller: TrialControl, trial: Trial) -> None:
        self._require_metric()
        cur_bracket = self._state["bracket"]
        cur_band = self._hyperbands[self._state["band_idx"]]
        if cur_bracket is None or cur_bracket.filled():
            while True:
                if self._cur_band_filled():
                    cur_band = []
                    self._hyperbands.append(cur_band)
                    self._state["band_idx"] += 1
                s = len(cur_band)
                if self._get_r0(s) == 0:
                    cur_band.append(None)  # bracket too small: try the next size
                    continue
                cur_bracket = _Bracket(
                    self._time_attr,
                    self._get_n0(s),
                    self._get_r0(s),
                    self._max_t_attr,
                    self._eta,
                    s,
                    self._stop_last_trials,
                )
                cur_band.append(cur_bracket)
                self._state["bracket"] = cur_bracket
                break
        self._state["bracket"].add_trial(trial.trial_id)
        self._trial_info[trial.trial_id] = (self._state["bracket"], self._state["band_idx"])

    def on_trial_result(
        self, tune_controller: TrialControl, trial: Trial, result: dict[str, Any]
    ) -> str:
        bracket, _ = self._trial_info[trial.trial_id]
        bracket.update_trial_stats(trial.trial_id, result)
        if bracket.continue_trial(trial.trial_id):
            return TrialScheduler.CONTINUE
        return self._process_bracket(tune_controller, bracket)

    def _process_bracket(self, tune_controller: TrialControl, bracket: _Bracket) -> str:
        action = TrialScheduler.PAUSE
        if not bracket.cur_iter_done():
            return action
        if bracket.finished():
            for tid in bracket.current_trials():
                t = tune_controller.get_trial(tid)
                if t is not None and t.status == Trial.PAUSED:
                    tune_controller.stop_trial(t)
            return TrialScheduler.STOP
        bracket.is_being_processed = True
        good, bad = bracket.successive_halving(self._metric or "", self._metric_op)
        self._num_stopped += len(bad)
        for tid in bad:
            t = tune_controller.get_trial(tid)
            if t is None:
                continue
            if t.status == Trial.PAUSED or _is_saving(t):
                tune_controller.stop_trial(t)
            elif t.status == Trial.RUNNING:
                bracket.cleanup_trial(tid)
                action = TrialScheduler.STOP
            else:
                raise TuneError(f"HyperBand: trial {t} is {t.status}, expected PAUSED or RUNNING")
        for tid in good:
            t = tune_controller.get_trial(tid)
            if t is None:
                continue
            if bracket.continue_trial(tid):
                if t.status == Trial.PAUSED or _is_saving(t):
                    bracket.trials_to_unpause.add(tid)
                elif t.status == Trial.RUNNING:
                    action = TrialScheduler.CONTINUE
            elif bracket.finished() and bracket.stop_last_trials:
                if t.status == Trial.PAUSED or _is_saving(t):
                    tune_controller.stop_trial(t)
                elif t.status == Trial.RUNNING:
                    bracket.cleanup_trial(tid)
                    action = TrialScheduler.STOP
        bracket.is_being_processed = False
        return action

    def on_trial_remove(self, tune_controller: TrialControl, trial: Trial) -> None:
        info = self._trial_info.get(trial.trial_id)
        if info is None:
            return
        bracket, _ = info
        bracket.cleanup_trial(trial.trial_id)
        if not bracket.finished() and not bracket.is_being_processed:
            self._process_bracket(tune_controller, bracket)

    def on_trial_complete(
        self, tune_controller: TrialControl, trial: Trial, result: dict[str, Any]
    ) -> None:
        self.on_trial_remove(tune_controller, trial)

    def on_trial_error(self, tune_controller: TrialControl, trial: Trial) -> None:
        self.on_trial_remove(tune_controller, trial)

    def choose_trial_to_run(self, tune_controller: TrialControl) -> Trial | None:
        for band in self._hyperbands:
            brackets = [b for b in band if b is not None]
            for bracket in sorted(brackets, key=lambda b: b.completion_percentage()):
                for tid in bracket.current_trials():
                    t = tune_controller.get_trial(tid)
                    if t is None or not tune_controller.has_resources_for_trial(t):
                        continue
                    if t.status == Trial.PENDING or (
                        t.status == Trial.PAUSED and tid in bracket.trials_to_unpause
                    ):
                        return t
        return None

    def debug_string(self) -> str:
        out = (
            f"Using HyperBand: num_stopped={self._num_stopped} "
            f"total_brackets={sum(len(b) for b in self._hyperbands)}"
        )
        for i, band in enumerate(self._hyperbands):
            out += f"\nRound #{i}:"
            for bracket in band:
                if bracket:
                    counts = collections.Counter(bracket._all_trials)
                    out += f"\n  {bracket} ({len(counts)} trials)"
        return out

    def state(self) -> dict[str, int]:
        """Number of brackets and of trials stopped."""
        return {
            "num_brackets": sum(len(b) for b in self._hyperbands),
            "num_stopped": self._num_stopped,
        }
