"""The Tune controller's decisions: a state machine with no I/O.

:class:`TuneController` takes events in — a runner's batch of trial events, a runner's
death, the clock, an interrupt — and answers with instructions out: messages for runners,
runners to create or end, and records for storage and display (its ``outbox``). The I/O
shell (``execution/driver.py``) moves those between the runner actors and this object; tests
drive it with synthetic events and no process at all.

Runners are actors that host one trial at a time. The controller keeps one
:class:`RunnerRecord` per runner and accounts their resources against the cluster's, so a
trial starts only where its resources fit (``has_resources_for_trial``).

Messages to a runner (tuples, first item the kind):

- ``("start", trial_id, run_seq, spec)`` start (or resume) a trial; ``spec`` is a dict
- ``("ack", trial_id, run_seq, seq)`` results up to ``seq`` are taken: go on
- ``("stop", trial_id, run_seq)`` / ``("pause", ...)`` end the trial now (pause: a class
  ``Trainable`` saves a checkpoint first) / ``("save", ...)`` save a checkpoint now

Events from a runner: ``("started", tid, seq, info)``, ``("result", tid, seq, n, metrics,
checkpoint)``, ``("checkpoint", tid, seq, checkpoint)``, ``("done", tid, seq)``,
``("stopped", tid, seq)``, ``("error", tid, seq, traceback_text, exception)``,
``("output", tid, seq, text)``. ``seq`` is the trial's run number: events of an earlier run
are dropped. ``checkpoint`` is ``(index, path)`` or None.

Trials are created ahead of free slots up to ``max_pending_trials`` (HyperBand fills its
brackets from them). With ``prefetch`` (schedulers that never pause and pick in order), a
busy runner also holds the next trial, still PENDING, and starts it the moment the current
one ends: no round trip between two trials.

A trial may run ahead of the controller by ``max_results_ahead`` results (its ``report``
returns at once); when the controller stops it, the results it made after the one that
decided are dropped, so the recorded history is what a lock-step run gives. Schedulers
that pause trials get lock-step runs (``max_results_ahead = 0``).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

from nbcluster.tune.error import TuneError
from nbcluster.tune.experiment.trial import CheckpointRecord, Trial, trial_dirname
from nbcluster.tune.result import AUTO_RESULT_KEYS
from nbcluster.tune.schedulers.trial_scheduler import FIFOScheduler, TrialScheduler
from nbcluster.tune.search.searcher import SearchAlgorithm
from nbcluster.tune.search.variant_generator import flatten_dict, format_vars
from nbcluster.tune.stopper import Stopper

__all__ = ["ControllerSettings", "RunnerRecord", "TuneController"]

_EPS = 1e-9
#: How far a function trial may run ahead of the controller's decisions (results).
DEFAULT_RESULTS_AHEAD = 256


class ControllerSettings:
    """What the controller needs to know about the experiment (plain values)."""

    def __init__(
        self,
        *,
        trainable_name: str,
        experiment_path: str,
        resources_per_trial: dict[str, float] | Callable[[dict[str, Any]], dict[str, float]],
        total_resources: dict[str, float],
        metric: str | None = None,
        mode: str | None = None,
        max_concurrent_trials: int | None = None,
        reuse_actors: bool = True,
        is_class_trainable: bool = False,
        max_failures: int = 0,
        fail_fast: bool | str = False,
        time_budget_s: float | None = None,
        num_to_keep: int | None = None,
        checkpoint_score_attribute: str | None = None,
        checkpoint_score_order: str | None = "max",
        checkpoint_frequency: int = 0,
        checkpoint_at_end: bool = False,
        max_results_ahead: int = DEFAULT_RESULTS_AHEAD,
        strict_metric_checking: bool = True,
        trial_name_creator: Callable[[Trial], str] | None = None,
        trial_dirname_creator: Callable[[Trial], str] | None = None,
        experiment_name: str = "",
        max_pending_trials: int = 1,
        prefetch: bool = False,
    ) -> None:
        self.trainable_name = trainable_name
        self.experiment_path = experiment_path
        self.resources_per_trial = (
            resources_per_trial if callable(resources_per_trial) else dict(resources_per_trial)
        )
        self.total_resources = dict(total_resources)
        self.metric = metric
        self.mode = mode
        self.max_concurrent_trials = max_concurrent_trials or None
        self.reuse_actors = reuse_actors
        self.is_class_trainable = is_class_trainable
        self.max_failures = max_failures
        self.fail_fast = fail_fast
        self.time_budget_s = time_budget_s
        self.num_to_keep = num_to_keep
        self.checkpoint_score_attribute = checkpoint_score_attribute
        self.checkpoint_score_order = checkpoint_score_order or "max"
        self.checkpoint_frequency = checkpoint_frequency
        self.checkpoint_at_end = checkpoint_at_end
        self.max_results_ahead = max_results_ahead
        self.strict_metric_checking = strict_metric_checking
        self.trial_name_creator = trial_name_creator
        self.trial_dirname_creator = trial_dirname_creator
        self.experiment_name = experiment_name
        self.max_pending_trials = max(1, max_pending_trials)
        #: Queue one more trial on a busy runner, so it starts the moment the current one
        #: ends (no round trip between trials). Only for FIFO with reused runners.
        self.prefetch = prefetch


class RunnerRecord:
    """One runner actor as the controller sees it."""

    __slots__ = ("queued", "resources", "runner_id", "state", "trial_id", "trials_run")

    def __init__(self, runner_id: str, resources: dict[str, float]) -> None:
        self.runner_id = runner_id
        self.resources = dict(resources)
        self.trial_id: str | None = None  # the trial it hosts (until the runner confirms its end)
        self.queued: str | None = None  # the trial it starts next (prefetch), still PENDING
        self.state = "alive"  # "alive", "retiring" (end it when its trial is gone), "dead"
        self.trials_run = 0

    def __repr__(self) -> str:
        return f"RunnerRecord({self.runner_id}, trial={self.trial_id}, {self.state})"


class TuneController:
    """Decides what every trial and runner does next (see the module docstring)."""

    def __init__(
        self,
        settings: ControllerSettings,
        search_alg: SearchAlgorithm,
        scheduler: TrialScheduler | None = None,
        stopper: Stopper | None = None,
        trials: list[Trial] | None = None,
        id_prefix: str = "",
    ) -> None:
        self.settings = settings
        self.search_alg = search_alg
        self.scheduler = scheduler or FIFOScheduler()
        self.stopper = stopper
        self._trials: list[Trial] = list(trials or [])
        self._first_live = 0  # trials before this index are all finished
        self._by_id: dict[str, Trial] = {t.trial_id: t for t in self._trials}
        self._id_prefix = id_prefix or os.urandom(3).hex()[:5]
        self._next_trial_index = len(self._trials)
        self.runners: dict[str, RunnerRecord] = {}
        self._runner_counter = 0
        self.outbox: list[tuple[Any, ...]] = []
        self.start_time: float | None = None
        self.stopping = ""  # why the experiment is stopping ("" = it is not)
        self.fatal_error: BaseException | None = None
        self.pinned_checkpoints: set[str] = set()
        self.num_results = 0
        self.num_stopped_early = 0
        sync = self.scheduler.pauses_trials
        self._results_ahead = 0 if sync else settings.max_results_ahead

    # ======================================================================= queries
    def get_trials(self) -> list[Trial]:
        """Every trial of the experiment, in creation order."""
        return self._trials

    def get_live_trials(self) -> list[Trial]:
        """Trials that are not finished (in creation order)."""
        i, trials = self._first_live, self._trials
        while i < len(trials) and trials[i].is_finished():
            i += 1
        self._first_live = i
        return [t for t in trials[i:] if not t.is_finished()]

    def get_trial(self, trial_id: str) -> Trial | None:
        """The trial with this id (None if unknown)."""
        return self._by_id.get(trial_id)

    def is_finished(self) -> bool:
        """True when nothing runs and nothing more will (or the stop is complete)."""
        if any(r.trial_id or r.queued for r in self.runners.values() if r.state != "dead"):
            return False
        if self.stopping:
            return True
        if any(t.status in (Trial.PENDING, Trial.RUNNING, Trial.PAUSED) for t in self._trials):
            return False
        return self.search_alg.is_finished()

    def _fits(self, resources: dict[str, float]) -> bool:
        used: dict[str, float] = {}
        for r in self.runners.values():
            if r.state != "dead":
                for k, v in r.resources.items():
                    used[k] = used.get(k, 0.0) + v
        total = self.settings.total_resources
        for k, v in resources.items():
            if v > _EPS and used.get(k, 0.0) + v > total.get(k, 0.0) + _EPS:
                return False
        return True

    def _num_running(self) -> int:
        return sum(1 for t in self._trials if t.status == Trial.RUNNING)

    def _resources_for(self, config: dict[str, Any]) -> dict[str, float]:
        shape = self.settings.resources_per_trial
        return dict(shape(config)) if callable(shape) else dict(shape)

    def _runner_cap(self) -> int:
        shape = self.settings.resources_per_trial
        if callable(shape) or any(v > _EPS for v in shape.values()):
            return 1 << 30
        return max(1, int(self.settings.total_resources.get("CPU", 1)) * 4)

    def _idle_runner(self, resources: dict[str, float]) -> RunnerRecord | None:
        if not self.settings.reuse_actors:
            return None
        for r in self.runners.values():
            free = r.trial_id is None and r.queued is None
            if r.state == "alive" and free and r.resources == resources:
                return r
        return None

    def _prefetch_runner(self, resources: dict[str, float]) -> RunnerRecord | None:
        if not self.settings.prefetch:
            return None
        for r in self.runners.values():
            if r.state == "alive" and r.trial_id and r.queued is None and r.resources == resources:
                return r
        return None

    def _room_for_new_runner(self, resources: dict[str, float]) -> bool:
        alive = [r for r in self.runners.values() if r.state != "dead"]
        return len(alive) < self._runner_cap() and self._fits(resources)

    def has_resources_for_trial(self, trial: Trial) -> bool:
        """True if ``trial`` could start now: a free runner, room for a new one, or (with
        prefetch) a busy runner with nothing queued."""
        if trial.runner_id is not None or self.stopping:
            return False
        limit = self.settings.max_concurrent_trials
        if limit and self._num_running() >= limit:
            return False
        if self._idle_runner(trial.resources) is not None:
            return True
        if self._room_for_new_runner(trial.resources):
            return True
        return trial.status == Trial.PENDING and self._prefetch_runner(trial.resources) is not None

    # ======================================================================= events in
    def on_start(self, now: float | None = None) -> None:
        """The experiment starts (or continues after a restore or another ``fit()``)."""
        now = time.time() if now is None else now
        self.start_time = now
        self.stopping = ""
        self._first_live = 0
        for t in self._trials:
            t.runner_id = None
            t.pending_decision = ""
            if t.status == Trial.RUNNING:
                t.set_status(Trial.PAUSED)
        self._fill()

    def on_tick(self, now: float | None = None) -> None:
        """The clock moved: enforce the time budget and the stopper's ``stop_all``."""
        now = time.time() if now is None else now
        budget = self.settings.time_budget_s
        if budget and self.start_time is not None and now - self.start_time >= budget:
            self.stop_experiment(f"time budget of {budget:g} s used up", terminate=True)
        elif self.stopper is not None and not self.stopping and self.stopper.stop_all():
            self.stop_experiment("the stopper's stop_all() returned True", terminate=True)

    def on_interrupt(self) -> None:
        """The user interrupted: stop every trial; unfinished ones can resume later."""
        self.stop_experiment("interrupted", terminate=False)

    def on_runner_events(self, runner_id: str, events: list[tuple[Any, ...]]) -> None:
        """A batch of events from one runner (in the order it produced them)."""
        runner = self.runners.get(runner_id)
        for event in events:
            kind, trial_id, run_seq = event[0], event[1], event[2]
            trial = self._by_id.get(trial_id)
            if trial is None or run_seq != trial.run_seq:
                if kind == "result" and event[5] is not None:
                    self._discard_checkpoint(trial, event[5])
                continue
            if kind == "result":
                self._on_result(trial, event[3], event[4], event[5])
            elif kind == "checkpoint":
                self._add_checkpoint(trial, event[3], dict(trial.last_result))
            elif kind == "started":
                self._on_started(trial)
                self.outbox.append(("trial_started", trial, event[3]))
            elif kind == "output":
                self.outbox.append(("output", trial, event[3]))
            elif kind == "done":
                self._release(trial, runner)
                if not trial.is_finished() and trial.status != Trial.PAUSED:
                    self._complete(trial)
            elif kind == "stopped":
                self._release(trial, runner)
            elif kind == "error":
                self._release(trial, runner)
                self._on_error(trial, event[3], event[4])
        self._fill()

    def on_runner_died(self, runner_id: str, reason: str) -> None:
        """A runner's process is gone: its trial failed (and may retry)."""
        runner = self.runners.get(runner_id)
        if runner is None or runner.state == "dead":
            return
        runner.state = "dead"
        queued = self._by_id.get(runner.queued or "")
        if queued is not None and queued.runner_id == runner_id:
            queued.runner_id = None  # it never started: it just waits again
            queued.pending_decision = ""
        runner.queued = None
        trial = self._by_id.get(runner.trial_id or "")
        runner.trial_id = None
        if trial is not None and trial.runner_id == runner_id:
            trial.runner_id = None
            if trial.status == Trial.RUNNING:
                self._on_error(trial, f"The trial's worker process died: {reason}", None)
            else:
                trial.pending_decision = ""
        self.outbox.append(("runner_dead", runner_id))
        self._fill()

    def on_runner_failed_to_start(self, runner_id: str, detail: str) -> None:
        """A runner could not even load the trainable: the experiment cannot run."""
        self._fatal(
            TuneError(
                "A trial runner could not load the trainable, so no trial can run:\n"
                f"{detail.rstrip()}\nA trainable defined in a module that the workers cannot "
                "import must be importable there (or defined in the notebook / __main__)."
            )
        )
        self.on_runner_died(runner_id, "its process could not load the trainable")

    # ======================================================================= decisions
    def _on_result(
        self, trial: Trial, seq: int, metrics: dict[str, Any], checkpoint: tuple[int, str] | None
    ) -> None:
        if trial.status != Trial.RUNNING or trial.pending_decision:
            self._discard_checkpoint(trial, checkpoint)
            return  # ran ahead of a stop or pause: not part of its history
        result = metrics
        result["trial_id"] = trial.trial_id
        result["experiment_tag"] = trial.experiment_tag
        result.setdefault("done", False)
        flat = flatten_dict(result) if any(isinstance(v, dict) for v in result.values()) else result
        self._check_metric(trial, flat)
        if self.fatal_error is not None:
            return
        result["config"] = trial.config
        trial.add_result(result)
        self.num_results += 1
        self.outbox.append(("result", trial, result))
        if checkpoint is not None:
            self._add_checkpoint(trial, checkpoint, result)
        decision = TrialScheduler.CONTINUE
        try:
            if self.stopper is not None and self.stopper(trial.trial_id, flat):
                decision = TrialScheduler.STOP
            if self.stopper is not None and self.stopper.stop_all():
                self.stop_experiment("the stopper's stop_all() returned True", terminate=True)
            if decision == TrialScheduler.CONTINUE:
                decision = self.scheduler.on_trial_result(self, trial, flat)
                if decision == TrialScheduler.STOP:
                    self.num_stopped_early += 1
            if decision not in (TrialScheduler.STOP,):
                self.search_alg.on_trial_result(trial.trial_id, flat)
        except TuneError as e:
            self._fatal(e)
            return
        if trial.status != Trial.RUNNING or self.stopping:
            return  # a scheduler or the stopper acted on it already
        if decision == TrialScheduler.STOP:
            trial.stopping_reason = "stopped early"
            self._send(trial, ("stop", trial.trial_id, trial.run_seq))
            trial.pending_decision = "STOP"
            self._complete(trial)
        elif decision == TrialScheduler.PAUSE:
            self.pause_trial(trial)
        elif decision in (TrialScheduler.CONTINUE, TrialScheduler.NOOP):
            self._send(trial, ("ack", trial.trial_id, trial.run_seq, seq))

    def _check_metric(self, trial: Trial, flat: dict[str, Any]) -> None:
        if not self.settings.strict_metric_checking:
            return
        for metric, who in self._required_metrics():
            if metric not in flat:
                reported = [k for k in flat if k not in AUTO_RESULT_KEYS]
                self._fatal(
                    TuneError(
                        f"Trial {trial} reported a result without the metric {metric!r} that "
                        f"{who} expects. It reported: {', '.join(reported) or 'nothing but automatic keys'}. "
                        f"Report {metric!r} with tune.report({{{metric!r}: ...}}), or set {who} to "
                        "one of the reported metrics."
                    )
                )
                return

    def _required_metrics(self) -> list[tuple[str, str]]:
        out = []
        if self.settings.metric:
            out.append((self.settings.metric, f"TuneConfig(metric={self.settings.metric!r})"))
        sched_metric = getattr(self.scheduler, "metric", None)
        if sched_metric and sched_metric != self.settings.metric:
            out.append((sched_metric, f"{type(self.scheduler).__name__}(metric={sched_metric!r})"))
        return out

    def _complete(self, trial: Trial) -> None:
        """The trial ended normally (returned, or stopped by a stopper/scheduler)."""
        if trial.last_result:
            trial.last_result["done"] = True
        trial.set_status(Trial.TERMINATED)
        self.outbox.append(("trial_end", trial))
        last = trial.last_result
        try:
            self.scheduler.on_trial_complete(self, trial, last)
            self.search_alg.on_trial_complete(trial.trial_id, last)
        except TuneError as e:
            self._fatal(e)

    def _on_error(self, trial: Trial, traceback_text: str, exc: BaseException | None) -> None:
        trial.num_failures += 1
        trial.error_msg = traceback_text
        trial.error = exc
        trial.pending_decision = ""
        self.outbox.append(("trial_error", trial, traceback_text))
        if trial.is_finished():
            return
        max_failures = self.settings.max_failures
        retry = max_failures < 0 or trial.num_failures <= max_failures
        if retry and self.stopping in ("", "interrupted"):
            trial.restore_from = None  # resume from its latest checkpoint
            # Interrupted: it resumes with the others at the next fit() or restore.
            trial.set_status(Trial.PAUSED if self.stopping else Trial.PENDING)
            self.outbox.append(("trial_retry", trial))
            return
        trial.set_status(Trial.ERROR)
        self.outbox.append(("trial_end", trial))
        self.scheduler.on_trial_error(self, trial)
        self.search_alg.on_trial_complete(trial.trial_id, trial.last_result or None, error=True)
        if self.settings.fail_fast:
            self.stop_experiment(f"trial {trial} failed and fail_fast is on", terminate=True)

    def _fatal(self, error: BaseException) -> None:
        if self.fatal_error is None:
            self.fatal_error = error
        self.stop_experiment(str(error).split("\n")[0], terminate=False)

    # ======================================================================= actions (schedulers)
    def pause_trial(self, trial: Trial, should_checkpoint: bool = True) -> None:
        """Pause a running or pending trial; it resumes later from its checkpoint."""
        if trial.status == Trial.RUNNING and trial.runner_id is not None:
            kind = "pause" if should_checkpoint else "stop"
            self._send(trial, (kind, trial.trial_id, trial.run_seq))
            trial.pending_decision = "PAUSE"
        if trial.status in (Trial.RUNNING, Trial.PENDING):
            trial.set_status(Trial.PAUSED)
            self.outbox.append(("trial_paused", trial))
            self.search_alg_on_pause(trial)

    def search_alg_on_pause(self, trial: Trial) -> None:
        """Tell a searcher that supports it that a trial paused."""
        searcher = getattr(self.search_alg, "searcher", None)
        if searcher is not None:
            searcher.on_pause(trial.trial_id)

    def stop_trial(self, trial: Trial) -> None:
        """End a trial for good (TERMINATED), whatever its status."""
        if trial.is_finished():
            return
        last = trial.last_result
        if trial.status in (Trial.PENDING, Trial.PAUSED):
            self.scheduler.on_trial_remove(self, trial)
            self.search_alg.on_trial_complete(trial.trial_id, last or None)
        else:
            self.scheduler.on_trial_complete(self, trial, last)
            self.search_alg.on_trial_complete(trial.trial_id, last or None)
        if trial.runner_id is not None:
            self._send(trial, ("stop", trial.trial_id, trial.run_seq))
            trial.pending_decision = "STOP"
        if trial.last_result:
            trial.last_result["done"] = True
        trial.set_status(Trial.TERMINATED)
        self.outbox.append(("trial_end", trial))

    def checkpoint_now(self, trial: Trial) -> CheckpointRecord | None:
        """The trial's checkpoint at its current result, or None (a save is then requested)."""
        latest = trial.latest_checkpoint
        if (
            latest is not None
            and int(latest.metrics.get("training_iteration", -1)) >= trial.iteration
        ):
            return latest
        if not self.settings.is_class_trainable:
            return latest  # a function trial's state is the last checkpoint it reported
        if trial.status == Trial.RUNNING and trial.runner_id is not None:
            self._send(trial, ("save", trial.trial_id, trial.run_seq))
        return None

    def exploit_trial(
        self, trial: Trial, new_config: dict[str, Any], checkpoint: CheckpointRecord, new_tag: str
    ) -> None:
        """PBT: restart ``trial`` from ``checkpoint`` (another trial's) with ``new_config``."""
        if trial.status == Trial.RUNNING:
            self.pause_trial(trial, should_checkpoint=False)
        trial.config = new_config
        trial.experiment_tag = new_tag
        trial.restore_from = checkpoint
        self.pinned_checkpoints.add(checkpoint.path)
        self.outbox.append(("trial_config", trial))

    def stop_experiment(self, reason: str, *, terminate: bool) -> None:
        """Stop every trial. ``terminate``: they end TERMINATED; else PAUSED (resumable)."""
        if self.stopping:
            return
        self.stopping = reason
        self.outbox.append(("stopping", reason))
        if terminate:
            self.search_alg.set_finished()
        for trial in self._trials:
            if trial.is_finished():
                continue
            if trial.runner_id is not None and not trial.pending_decision:
                self._send(trial, ("stop", trial.trial_id, trial.run_seq))
                trial.pending_decision = "STOP"
            if terminate:
                if trial.last_result:
                    trial.last_result["done"] = True
                trial.set_status(Trial.TERMINATED)
                self.outbox.append(("trial_end", trial))
            elif trial.status == Trial.RUNNING:
                trial.set_status(Trial.PAUSED)
                self.outbox.append(("trial_paused", trial))

    # ======================================================================= placement
    def _new_trial(self) -> Trial | None:
        trial_id = f"{self._id_prefix}_{self._next_trial_index:05d}"
        suggestion = self.search_alg.next_config(trial_id)
        if suggestion is None:
            return None
        index = self._next_trial_index
        self._next_trial_index += 1
        tag = f"{index}"
        if suggestion.resolved_vars:
            tag += "_" + format_vars(suggestion.resolved_vars)
        trial = Trial(
            self.settings.trainable_name,
            trial_id,
            suggestion.config,
            experiment_tag=tag,
            evaluated_params=flatten_dict(
                {"/".join(str(k) for k in p): v for p, v in suggestion.resolved_vars.items()}
            ),
            resources=self._resources_for(suggestion.config),
        )
        if self.settings.trial_name_creator is not None:
            trial.custom_trial_name = str(self.settings.trial_name_creator(trial))
        if self.settings.trial_dirname_creator is not None:
            trial.custom_dirname = str(self.settings.trial_dirname_creator(trial))
        trial.local_path = os.path.join(self.settings.experiment_path, trial_dirname(trial))
        self._trials.append(trial)
        self._by_id[trial.trial_id] = trial
        self.outbox.append(("trial_added", trial))
        self.scheduler.on_trial_add(self, trial)
        return trial

    def _fill(self) -> None:
        """Keep enough trials waiting, and start the ones the scheduler picks while there is room."""
        if self.stopping or self.fatal_error is not None:
            return
        try:
            waiting = sum(
                1
                for t in self.get_live_trials()
                if t.status == Trial.PENDING and t.runner_id is None
            )
            for _ in range(100_000):
                while waiting < self.settings.max_pending_trials and self._new_trial() is not None:
                    waiting += 1
                trial = self.scheduler.choose_trial_to_run(self) or self._fallback_choice()
                if trial is None:
                    return
                if trial.status == Trial.PENDING:
                    waiting -= 1
                self._start(trial)
        except (TuneError, ValueError) as e:
            self._fatal(e if isinstance(e, TuneError) else TuneError(str(e)))

    def _fallback_choice(self) -> Trial | None:
        """Nothing runs and the scheduler picks nothing: run a waiting trial anyway
        (a scheduler that never resumes its paused trials must not hang the experiment)."""
        if any(r.trial_id for r in self.runners.values() if r.state != "dead"):
            return None
        for t in self.get_live_trials():
            if t.status in (Trial.PENDING, Trial.PAUSED) and self.has_resources_for_trial(t):
                return t
        return None

    def _start(self, trial: Trial) -> None:
        runner = self._idle_runner(trial.resources)
        queued = False
        if runner is None and not self._room_for_new_runner(trial.resources):
            runner = self._prefetch_runner(trial.resources)
            queued = runner is not None
        if runner is None:
            self._retire_idle_runners_for(trial.resources)
            self._runner_counter += 1
            runner = RunnerRecord(f"runner_{self._runner_counter:04d}", trial.resources)
            self.runners[runner.runner_id] = runner
            self.outbox.append(("create_runner", runner.runner_id, dict(trial.resources)))
        was_paused = trial.status == Trial.PAUSED
        if queued:
            runner.queued = trial.trial_id
        else:
            runner.trial_id = trial.trial_id
        runner.trials_run += 1
        trial.runner_id = runner.runner_id
        trial.run_seq += 1
        trial.pending_decision = ""
        checkpoint = trial.restore_from or trial.latest_checkpoint
        if trial.restart_from_scratch:
            checkpoint = None
            trial.restart_from_scratch = False
        base = dict(checkpoint.metrics) if checkpoint is not None else {}
        trial.iteration_at_start = int(base.get("training_iteration", 0) or 0)
        trial.time_at_start = float(base.get("time_total_s", 0.0) or 0.0)
        spec = {
            "config": trial.config,
            "trial_name": str(trial),
            "trial_dir": trial.local_path,
            "experiment_name": self.settings.experiment_name,
            "resources": dict(trial.resources),
            "checkpoint": checkpoint.path if checkpoint is not None else None,
            "iteration": trial.iteration_at_start,
            "time_total_s": trial.time_at_start,
            "next_checkpoint_index": trial.next_checkpoint_index,
            "max_results_ahead": self._results_ahead,
            "checkpoint_frequency": self.settings.checkpoint_frequency,
            "checkpoint_at_end": self.settings.checkpoint_at_end,
        }
        self._send(trial, ("start", trial.trial_id, trial.run_seq, spec))
        if queued:
            return  # PENDING until the runner says it started
        trial.set_status(Trial.RUNNING)
        self.outbox.append(("trial_running", trial, was_paused))
        if was_paused:
            searcher = getattr(self.search_alg, "searcher", None)
            if searcher is not None:
                searcher.on_unpause(trial.trial_id)

    def _retire_idle_runners_for(self, resources: dict[str, float]) -> None:
        """End idle runners (of other shapes, or all when not reusing) until ``resources`` fit."""
        for r in list(self.runners.values()):
            if self._fits(resources):
                return
            if r.state == "alive" and r.trial_id is None:
                self._end_runner(r)

    def _on_started(self, trial: Trial) -> None:
        """A queued (prefetched) trial began on its runner: it is RUNNING now."""
        rec = self.runners.get(trial.runner_id or "")
        if rec is None or trial.trial_id not in (rec.queued, rec.trial_id):
            return
        if rec.queued == trial.trial_id:
            rec.queued = None
        rec.trial_id = trial.trial_id
        if trial.status == Trial.PENDING:
            trial.set_status(Trial.RUNNING)
            self.outbox.append(("trial_running", trial, False))

    def _release(self, trial: Trial, runner: RunnerRecord | None) -> None:
        """The runner confirmed the trial's end: it is free (or ended, without reuse)."""
        trial.pending_decision = ""
        if trial.runner_id is None:
            return
        rec = self.runners.get(trial.runner_id)
        trial.runner_id = None
        if rec is None or rec.state == "dead":
            return
        if rec.queued == trial.trial_id:
            rec.queued = None  # dropped from the queue before it started
            return
        rec.trial_id = None
        if rec.queued is not None:
            # The runner starts its queued trial the moment this one ends, on its own: it
            # is busy with that one now (RUNNING once its "started" event arrives).
            rec.trial_id, rec.queued = rec.queued, None
            return
        if not self.settings.reuse_actors or rec.state == "retiring":
            self._end_runner(rec)

    def _end_runner(self, runner: RunnerRecord) -> None:
        runner.state = "dead"
        self.outbox.append(("end_runner", runner.runner_id))

    def end_all_runners(self) -> None:
        """The experiment is over: end every runner."""
        for r in self.runners.values():
            if r.state != "dead":
                self._end_runner(r)

    # ======================================================================= checkpoints
    def _send(self, trial: Trial, message: tuple[Any, ...]) -> None:
        if trial.runner_id is not None:
            self.outbox.append(("send", trial.runner_id, message))

    def _add_checkpoint(
        self, trial: Trial, checkpoint: tuple[int, str], metrics: dict[str, Any]
    ) -> None:
        index, path = checkpoint
        trial.add_checkpoint(CheckpointRecord(index, path, _checkpoint_metrics(metrics)))
        self.outbox.append(("checkpoint", trial, path))
        self._enforce_num_to_keep(trial)

    def _discard_checkpoint(self, trial: Trial | None, checkpoint: tuple[int, str] | None) -> None:
        if checkpoint is None:
            return
        if trial is not None and trial.next_checkpoint_index <= checkpoint[0]:
            trial.next_checkpoint_index = checkpoint[0] + 1
        self.outbox.append(("delete_checkpoint", checkpoint[1]))

    def _enforce_num_to_keep(self, trial: Trial) -> None:
        keep = self.settings.num_to_keep
        if not keep or len(trial.checkpoints) <= keep:
            return
        attr = self.settings.checkpoint_score_attribute
        latest = trial.latest_checkpoint
        sign = 1.0 if self.settings.checkpoint_score_order == "max" else -1.0

        def score(c: CheckpointRecord) -> tuple[float, int]:
            if attr is None:
                return (0.0, c.index)
            value = c.metrics.get(attr)
            ok = isinstance(value, (int, float)) and not isinstance(value, bool)
            return (sign * float(value) if ok else float("-inf"), c.index)

        ranked = sorted(trial.checkpoints, key=score, reverse=True)
        kept = ranked[:keep]
        for c in ranked[keep:]:
            # The latest is kept to resume from; pinned ones are waiting to be cloned (PBT).
            if c is latest or c.path in self.pinned_checkpoints:
                continue
            trial.checkpoints.remove(c)
            self.outbox.append(("delete_checkpoint", c.path))
        del kept


def _checkpoint_metrics(result: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in result.items() if k != "config"}
