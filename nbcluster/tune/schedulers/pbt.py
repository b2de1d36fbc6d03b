"""``PopulationBasedTraining``: exploit the best trials' checkpoints, explore their configs.

Every ``perturbation_interval`` of ``time_attr``, a trial in the bottom
``quantile_fraction`` of the population is paused, takes the latest checkpoint of a
trial in the top quantile, perturbs that trial's config (``hyperparam_mutations``:
resample with ``resample_probability``, else multiply by one of
``perturbation_factors`` or shift to a neighbouring list value) and resumes from the
checkpoint with the new config. Trials must report checkpoints (function trainables) or
implement ``save_checkpoint``/``load_checkpoint`` (``Trainable`` classes).
"""

from __future__ import annotations

import copy
import math
import random
from collections.abc import Callable
from typing import Any

from nbcluster.tune.error import TuneError
from nbcluster.tune.experiment.trial import CheckpointRecord, Trial
from nbcluster.tune.schedulers.trial_scheduler import TrialControl, TrialScheduler
from nbcluster.tune.search.sample import Domain, Function
from nbcluster.tune.search.searcher import SearchGenerator
from nbcluster.tune.search.variant_generator import format_vars

__all__ = ["PopulationBasedTraining", "explore"]


def explore(
    config: dict[str, Any],
    mutations: dict[str, Any],
    resample_probability: float,
    perturbation_factors: tuple[float, ...],
    custom_explore_fn: Callable[[dict[str, Any]], dict[str, Any]] | None,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """A perturbed copy of ``config`` and what was done to each key (Ray's ``_explore``)."""
    operations: dict[str, Any] = {}
    new_config = copy.deepcopy(config)
    for key, distribution in mutations.items():
        if isinstance(distribution, dict):
            nested, ops = explore(
                config[key], distribution, resample_probability, perturbation_factors, None
            )
            new_config[key] = nested
            operations[key] = ops
        elif isinstance(distribution, (list, tuple)):
            if random.random() < resample_probability or config[key] not in distribution:
                new_config[key] = random.choice(distribution)
                operations[key] = "resample"
            else:
                shift = random.choice([-1, 1])
                old_idx = list(distribution).index(config[key])
                new_idx = min(max(old_idx + shift, 0), len(distribution) - 1)
                new_config[key] = distribution[new_idx]
                side = "left" if shift == -1 else "right"
                operations[key] = f"shift {side}{' (noop)' if old_idx == new_idx else ''}"
        elif isinstance(distribution, Domain) or callable(distribution):
            if random.random() < resample_probability:
                new_config[key] = (
                    distribution.sample(None)
                    if isinstance(distribution, Domain)
                    else distribution()
                )
                operations[key] = "resample"
            else:
                factor = random.choice(perturbation_factors)
                new_config[key] = config[key] * factor
                operations[key] = f"* {factor}"
            if isinstance(config[key], bool):
                new_config[key] = bool(new_config[key])
            elif isinstance(config[key], int):
                new_config[key] = int(round(new_config[key]))
        else:
            raise TypeError(f"unsupported hyperparam_mutations value for {key!r}: {distribution!r}")
    if custom_explore_fn:
        new_config = custom_explore_fn(new_config)
        if new_config is None:
            raise TuneError("custom_explore_fn returned None; it must return the new config")
    return new_config, operations


def _fill_config(config: dict[str, Any], attr: str, space: Any) -> None:
    if isinstance(space, Domain):
        config[attr] = space.sample(None)
    elif isinstance(space, (list, tuple)):
        config[attr] = random.choice(space)
    elif isinstance(space, dict):
        config[attr] = {}
        for k, v in space.items():
            _fill_config(config[attr], k, v)
    elif callable(space):
        config[attr] = space()


class _PBTTrialState:
    """What PBT remembers of one trial."""

    def __init__(self, trial: Trial) -> None:
        self.orig_tag = trial.experiment_tag
        self.last_score: float | None = None
        self.last_checkpoint: CheckpointRecord | None = None
        self.wants_checkpoint_at: int | None = None
        self.last_perturbation_time = 0.0
        self.last_train_time = 0.0
        self.last_result: dict[str, Any] | None = None


class PopulationBasedTraining(TrialScheduler):
    """Population based training (Jaderberg et al. 2017) with Ray's arguments and defaults."""

    pauses_trials = True

    def __init__(
        self,
        time_attr: str = "time_total_s",
        metric: str | None = None,
        mode: str | None = None,
        perturbation_interval: float = 60.0,
        burn_in_period: float = 0.0,
        hyperparam_mutations: dict[str, Any] | None = None,
        quantile_fraction: float = 0.25,
        resample_probability: float = 0.25,
        perturbation_factors: tuple[float, float] = (1.2, 0.8),
        custom_explore_fn: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
        log_config: bool = True,
        require_attrs: bool = True,
        synch: bool = False,
    ) -> None:
        super().__init__()
        hyperparam_mutations = hyperparam_mutations or {}
        for key, value in hyperparam_mutations.items():
            if isinstance(value, Function):
                raise ValueError(
                    f"hyperparam_mutations[{key!r}]: tune.sample_from is not supported; "
                    "use tune.uniform, tune.loguniform, a list, or a function"
                )
            if not isinstance(value, (dict, list, tuple, Domain)) and not callable(value):
                raise TypeError(
                    f"hyperparam_mutations[{key!r}] must be a list, a dict, a search space "
                    f"(tune.uniform...) or a function, got {type(value).__name__}"
                )
        if not hyperparam_mutations and not custom_explore_fn:
            raise TuneError(
                "You must specify at least one of `hyperparam_mutations` or `custom_explore_fn` to use PBT."
            )
        if not 0 <= quantile_fraction <= 0.5:
            raise ValueError(
                f"quantile_fraction must be between 0 and 0.5, got {quantile_fraction}"
            )
        if not perturbation_interval > 0:
            raise ValueError(f"perturbation_interval must be > 0, got {perturbation_interval}")
        if mode not in (None, "min", "max"):
            raise ValueError(f"mode must be 'min' or 'max', got {mode!r}")
        self._metric = metric
        self._mode = mode
        self._time_attr = time_attr
        self._perturbation_interval = perturbation_interval
        self._burn_in_period = burn_in_period
        self._hyperparam_mutations = hyperparam_mutations
        self._quantile_fraction = quantile_fraction
        self._resample_probability = resample_probability
        self._perturbation_factors = perturbation_factors
        self._custom_explore_fn = custom_explore_fn
        self._log_config = log_config
        self._require_attrs = require_attrs
        self._synch = synch
        self._trial_state: dict[str, _PBTTrialState] = {}
        self._next_perturbation_sync = max(perturbation_interval, burn_in_period)
        self._num_checkpoints = 0
        self._num_perturbations = 0

    @property
    def _metric_op(self) -> float:
        return 1.0 if self._mode == "max" else -1.0

    def on_trial_add(self, tune_controller: TrialControl, trial: Trial) -> None:
        if isinstance(tune_controller.search_alg, SearchGenerator):
            raise ValueError(
                f"Search algorithms cannot be used with {type(self).__name__} schedulers. "
                f"Please remove {tune_controller.search_alg.searcher!r}."
            )
        self._require_metric()
        self._trial_state[trial.trial_id] = _PBTTrialState(trial)
        for attr, space in self._hyperparam_mutations.items():
            if attr not in trial.config:
                _fill_config(trial.config, attr, space)
                trial.evaluated_params[attr] = trial.config[attr]

    def on_trial_result(
        self, tune_controller: TrialControl, trial: Trial, result: dict[str, Any]
    ) -> str:
        for key in (self._time_attr, self._metric):
            if key not in result and self._require_attrs:
                raise RuntimeError(
                    f"Cannot find {key!r} in trial result {sorted(result)}. Make sure the trainable "
                    "reports it, or set PopulationBasedTraining(require_attrs=False)."
                )
        if self._metric not in result or self._time_attr not in result:
            return TrialScheduler.CONTINUE
        time = result[self._time_attr]
        state = self._trial_state[trial.trial_id]
        if time < self._burn_in_period:
            return TrialScheduler.CONTINUE
        if time - state.last_perturbation_time < self._perturbation_interval:
            return TrialScheduler.CONTINUE
        state.last_score = self._metric_op * result[self._metric]
        state.last_train_time = time
        state.last_result = result
        if not self._synch:
            state.last_perturbation_time = time
            lower, upper = self._quantiles(tune_controller)
            decision = TrialScheduler.CONTINUE
            for other in tune_controller.get_trials():
                if other.status in (Trial.PENDING, Trial.PAUSED):
                    decision = TrialScheduler.PAUSE
                    break
            self._checkpoint_or_exploit(trial, tune_controller, upper, lower)
            return TrialScheduler.NOOP if trial.status == Trial.PAUSED else decision
        if not any(
            self._trial_state[t.trial_id].last_train_time < self._next_perturbation_sync
            and t is not trial
            for t in tune_controller.get_live_trials()
        ):
            lower, upper = self._quantiles(tune_controller)
            middle = [t for t in tune_controller.get_trials() if t not in lower and t not in upper]
            for t in upper + middle + lower:
                if t.trial_id in self._trial_state:
                    self._trial_state[t.trial_id].last_perturbation_time = time
                    self._checkpoint_or_exploit(t, tune_controller, upper, lower)
            times = [s.last_train_time for s in self._trial_state.values()]
            self._next_perturbation_sync = max(
                self._next_perturbation_sync + self._perturbation_interval, max(times)
            )
        return TrialScheduler.NOOP if trial.status == Trial.PAUSED else TrialScheduler.PAUSE

    def _checkpoint_or_exploit(
        self,
        trial: Trial,
        tune_controller: TrialControl,
        upper: list[Trial],
        lower: list[Trial],
    ) -> None:
        state = self._trial_state[trial.trial_id]
        if trial in upper:
            state.last_checkpoint = tune_controller.checkpoint_now(trial)
            if state.last_checkpoint is None:
                state.wants_checkpoint_at = trial.iteration
            self._num_checkpoints += 1
        else:
            state.last_checkpoint = None
            state.wants_checkpoint_at = None
        if trial not in lower or not upper:
            return
        clone = random.choice(upper)
        clone_state = self._trial_state[clone.trial_id]
        checkpoint = clone_state.last_checkpoint
        if checkpoint is None and clone_state.wants_checkpoint_at is not None:
            latest = clone.latest_checkpoint
            if latest is not None and int(latest.metrics.get("training_iteration", 0)) >= (
                clone_state.wants_checkpoint_at
            ):
                checkpoint = clone_state.last_checkpoint = latest
        if checkpoint is None:
            return  # nothing to exploit yet (Ray: "no checkpoint for trial ... Skip exploit")
        self._exploit(tune_controller, trial, clone, checkpoint)

    def _exploit(
        self,
        tune_controller: TrialControl,
        trial: Trial,
        clone: Trial,
        checkpoint: CheckpointRecord,
    ) -> None:
        trial_state = self._trial_state[trial.trial_id]
        clone_state = self._trial_state[clone.trial_id]
        new_config, _ = explore(
            clone.config,
            self._hyperparam_mutations,
            self._resample_probability,
            self._perturbation_factors,
            self._custom_explore_fn,
        )
        resolved = {(k,): new_config[k] for k in self._hyperparam_mutations if k in new_config}
        new_tag = f"{trial_state.orig_tag}@perturbed[{format_vars(resolved)}]"
        tune_controller.exploit_trial(trial, new_config, checkpoint, new_tag)
        self._num_perturbations += 1
        trial_state.last_perturbation_time = clone_state.last_perturbation_time
        trial_state.last_train_time = clone_state.last_train_time

    def _quantiles(self, tune_controller: TrialControl) -> tuple[list[Trial], list[Trial]]:
        trials = []
        for tid, state in self._trial_state.items():
            t = tune_controller.get_trial(tid)
            if (
                t is not None
                and state.last_score is not None
                and not math.isnan(state.last_score)
                and not t.is_finished()
            ):
                trials.append(t)
        trials.sort(key=lambda t: self._trial_state[t.trial_id].last_score or 0.0)
        if len(trials) <= 1:
            return [], []
        n = int(math.ceil(len(trials) * self._quantile_fraction))
        if n > len(trials) / 2:
            n = int(math.floor(len(trials) / 2))
        return trials[:n], trials[len(trials) - n :]

    def choose_trial_to_run(self, tune_controller: TrialControl) -> Trial | None:
        candidates = []
        for trial in tune_controller.get_trials():
            if trial.status not in (Trial.PENDING, Trial.PAUSED):
                continue
            if not tune_controller.has_resources_for_trial(trial):
                continue
            state = self._trial_state.get(trial.trial_id)
            if state is None:
                continue
            if not self._synch or state.last_train_time < self._next_perturbation_sync:
                candidates.append(trial)
        candidates.sort(key=lambda t: self._trial_state[t.trial_id].last_train_time)
        return candidates[0] if candidates else None

    def on_trial_complete(
        self, tune_controller: TrialControl, trial: Trial, result: dict[str, Any]
    ) -> None:
        """Finished trials drop out of the quantiles (they stay known, to be cloned)."""

    def reset_stats(self) -> None:
        """Zero the perturbation and checkpoint counters."""
        self._num_perturbations = 0
        self._num_checkpoints = 0

    @property
    def num_perturbations(self) -> int:
        """How many exploits happened."""
        return self._num_perturbations

    def debug_string(self) -> str:
        return (
            f"PopulationBasedTraining: {self._num_checkpoints} checkpoints, "
            f"{self._num_perturbations} perturbs"
        )
