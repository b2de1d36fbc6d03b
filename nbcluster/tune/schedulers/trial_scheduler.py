"""``TrialScheduler``: the interface the controller consults at each result, and FIFO.

A scheduler is a pure object in the driver. The controller calls ``on_trial_add`` when a
trial is created, ``on_trial_result`` at each result (the answer is CONTINUE, PAUSE or
STOP for that trial), ``on_trial_complete``/``on_trial_error`` when it ends, and
``choose_trial_to_run`` whenever a slot is free. Schedulers that act on other trials
(HyperBand, PBT) call ``stop_trial`` and friends on the controller they are handed: a
:class:`TrialControl` (the controller, ``execution/controller.py``, implements it and imports
this module; schedulers never import the controller).
"""

from __future__ import annotations

import pickle
from typing import Any, Protocol

from nbcluster.tune.experiment.trial import CheckpointRecord, Trial
from nbcluster.tune.search.searcher import SearchAlgorithm

__all__ = ["FIFOScheduler", "TrialControl", "TrialScheduler"]


class TrialControl(Protocol):
    """What a scheduler may ask of the controller that consults it (``TuneController``)."""

    @property
    def search_alg(self) -> SearchAlgorithm:
        """The experiment's search algorithm."""

    def get_trials(self) -> list[Trial]:
        """Every trial of the experiment, in creation order."""

    def get_live_trials(self) -> list[Trial]:
        """Trials that are not finished (in creation order)."""

    def get_trial(self, trial_id: str) -> Trial | None:
        """The trial with this id (None if unknown)."""

    def has_resources_for_trial(self, trial: Trial) -> bool:
        """True if ``trial`` could start now."""

    def stop_trial(self, trial: Trial) -> None:
        """End a trial for good (TERMINATED), whatever its status."""

    def checkpoint_now(self, trial: Trial) -> CheckpointRecord | None:
        """The trial's checkpoint at its current result, or None (a save is then requested)."""

    def exploit_trial(
        self, trial: Trial, new_config: dict[str, Any], checkpoint: CheckpointRecord, new_tag: str
    ) -> None:
        """PBT: restart ``trial`` from ``checkpoint`` (another trial's) with ``new_config``."""


class TrialScheduler:
    """Base class of trial schedulers (Ray's ``TrialScheduler``)."""

    CONTINUE = "CONTINUE"  #: keep the trial running
    PAUSE = "PAUSE"  #: pause the trial (it resumes from its checkpoint later)
    STOP = "STOP"  #: stop the trial (it ends TERMINATED)
    NOOP = "NOOP"  #: the scheduler already acted on the trial itself

    #: Whether the scheduler may pause trials. A pausing scheduler must see every result
    #: before the trial goes on (its checkpoint must match the result it paused at), so
    #: the controller then runs trials in lock-step with their results.
    pauses_trials = False

    def __init__(self) -> None:
        self._metric: str | None = None
        self._mode: str | None = None

    @property
    def metric(self) -> str | None:
        """The metric the scheduler compares."""
        return self._metric

    @property
    def mode(self) -> str | None:
        """``'min'`` or ``'max'``."""
        return self._mode

    def set_search_properties(self, metric: str | None, mode: str | None, **spec: Any) -> bool:
        """Take metric and mode from ``TuneConfig`` (False if they clash with its own)."""
        if self._metric and metric and self._metric != metric:
            return False
        if self._mode and mode and self._mode != mode:
            return False
        if metric:
            self._metric = metric
        if mode:
            self._mode = mode
        return True

    def on_trial_add(self, tune_controller: TrialControl, trial: Trial) -> None:
        """A new trial was created."""

    def on_trial_error(self, tune_controller: TrialControl, trial: Trial) -> None:
        """A trial failed for good."""

    def on_trial_result(
        self, tune_controller: TrialControl, trial: Trial, result: dict[str, Any]
    ) -> str:
        """A result of a running trial: return CONTINUE, PAUSE, STOP or NOOP."""
        return TrialScheduler.CONTINUE

    def on_trial_complete(
        self, tune_controller: TrialControl, trial: Trial, result: dict[str, Any]
    ) -> None:
        """A trial finished normally; ``result`` is its last one."""

    def on_trial_remove(self, tune_controller: TrialControl, trial: Trial) -> None:
        """A paused or pending trial was stopped."""

    def choose_trial_to_run(self, tune_controller: TrialControl) -> Trial | None:
        """A PENDING or PAUSED trial to start now, or None (must be idempotent)."""
        live = tune_controller.get_live_trials()
        for trial in live:
            if trial.status == Trial.PENDING and tune_controller.has_resources_for_trial(trial):
                return trial
        for trial in live:
            if trial.status == Trial.PAUSED and tune_controller.has_resources_for_trial(trial):
                return trial
        return None

    def debug_string(self) -> str:
        """A one-line status of the scheduler."""
        return f"Using {type(self).__name__}."

    def save(self, checkpoint_path: str) -> None:
        """Pickle the scheduler's state to a file."""
        with open(checkpoint_path, "wb") as f:
            pickle.dump(self.__dict__, f)

    def restore(self, checkpoint_path: str) -> None:
        """Load what :meth:`save` wrote."""
        with open(checkpoint_path, "rb") as f:
            self.__dict__.update(pickle.load(f))

    def _require_metric(self) -> None:
        if not self._metric or not self._mode:
            raise ValueError(
                f"{type(self).__name__} has no metric/mode (metric={self._metric!r}, "
                f"mode={self._mode!r}): pass metric= and mode= to the scheduler or to "
                "tune.TuneConfig()"
            )


class FIFOScheduler(TrialScheduler):
    """Run trials in the order they were created, never stopping one early (the default)."""


def check_positive(name: str, value: Any, *, allow_zero: bool = False) -> None:
    """Raise ``ValueError`` unless ``value`` is a number > 0 (>= 0 with ``allow_zero``)."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not ok or value < 0 or (value == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise ValueError(f"{name} must be a number {bound}, got {value!r}")
