"""``Tuner``: configure a search, run it with ``fit()``, continue it, restore it (Ray's API).

``Tuner(...)`` checks everything it can before anything runs: the trainable, the param
space (an invalid one fails here, naming its key), the configs, and whether the scheduler
and search algorithm know their metric and mode. ``fit()`` runs the trials on the
cluster (``nbcluster.init()`` is called if needed) and returns a :class:`ResultGrid`.

Calling ``fit()`` again on the same Tuner continues the experiment: unfinished trials
resume from their checkpoints, and raising ``tune_config.num_samples`` adds trials.
``Tuner.restore(path, trainable)`` does the same for an experiment saved on disk, e.g.
after the kernel died.
"""

from __future__ import annotations

import copy
import datetime
import os
import sys
from collections.abc import Callable
from typing import Any

import nbcluster
from nbcluster.tune._config import RunConfig, TuneConfig
from nbcluster.tune._display import Reporter, make_reporter
from nbcluster.tune.detached import DetachedRun, find_live_run, start_detached
from nbcluster.tune.error import TuneError
from nbcluster.tune.execution.controller import ControllerSettings, TuneController
from nbcluster.tune.execution.driver import ExperimentDriver
from nbcluster.tune.execution.storage import (
    EXPERIMENT_STATE_FILE,
    TUNER_FILE,
    ExperimentStorage,
    load_experiment,
)
from nbcluster.tune.experiment.trial import Trial
from nbcluster.tune.result_grid import ResultGrid
from nbcluster.tune.schedulers.trial_scheduler import FIFOScheduler, TrialScheduler
from nbcluster.tune.search.basic_variant import BasicVariantGenerator
from nbcluster.tune.search.searcher import (
    ConcurrencyLimiter,
    SearchAlgorithm,
    Searcher,
    SearchGenerator,
)
from nbcluster.tune.search.variant_generator import validate_space
from nbcluster.tune.stopper import make_stopper
from nbcluster.tune.trainable.util import TrainableInfo, inspect_trainable

__all__ = ["Tuner"]

_EPS = 1e-9


def _search_alg(tune_config: TuneConfig) -> SearchAlgorithm:
    alg = tune_config.search_alg
    limit = tune_config.max_concurrent_trials
    if alg is None:
        return BasicVariantGenerator(max_concurrent=limit or 0)
    if isinstance(alg, Searcher):
        if limit:
            if isinstance(alg, ConcurrencyLimiter):
                raise ValueError(
                    "TuneConfig(max_concurrent_trials=) cannot be combined with a search_alg that is "
                    "already a ConcurrencyLimiter; set the limit in one place"
                )
            alg = ConcurrencyLimiter(alg, max_concurrent=limit)
        return SearchGenerator(alg)
    if isinstance(alg, SearchAlgorithm):
        return alg
    raise TypeError(
        "TuneConfig(search_alg=) must be a Searcher (e.g. OptunaSearch) or a SearchAlgorithm, "
        f"got {type(alg).__name__}"
    )


class Tuner:
    """Tune a trainable over a param space (Ray's ``tune.Tuner``).

    ``trainable``: a function ``fn(config)`` that calls ``tune.report``, a
    ``tune.Trainable`` subclass, or a trainer such as ``TorchTrainer``; wrap it with
    ``tune.with_resources`` / ``tune.with_parameters`` as needed. ``param_space``: a dict
    of values and search spaces (``tune.uniform``, ``tune.grid_search``...).
    """

    def __init__(
        self,
        trainable: Any = None,
        *,
        param_space: dict[str, Any] | None = None,
        tune_config: TuneConfig | None = None,
        run_config: RunConfig | None = None,
    ) -> None:
        if trainable is None:
            raise TypeError(
                "Tuner() needs a trainable: a function fn(config), a Trainable class or a trainer"
            )
        self._info: TrainableInfo = inspect_trainable(trainable)
        if param_space is not None and not isinstance(param_space, dict):
            raise TypeError(f"Tuner(param_space=) must be a dict, got {type(param_space).__name__}")
        validate_space(param_space)
        if tune_config is not None and not isinstance(tune_config, TuneConfig):
            raise TypeError(
                f"Tuner(tune_config=) must be a tune.TuneConfig, got {type(tune_config).__name__}"
            )
        if run_config is not None and not isinstance(run_config, RunConfig):
            raise TypeError(
                f"Tuner(run_config=) must be a tune.RunConfig, got {type(run_config).__name__}"
            )
        self._param_space: dict[str, Any] = copy.deepcopy(param_space or {})
        self._tune_config = tune_config or TuneConfig()
        # A copy: the Tuner fills in the name, which must not leak into another Tuner.
        self._run_config = copy.copy(run_config) if run_config is not None else RunConfig()
        self._stopper = make_stopper(self._run_config.stop)
        self._scheduler: TrialScheduler = self._tune_config.scheduler or FIFOScheduler()
        if not isinstance(self._scheduler, TrialScheduler):
            raise TypeError(
                f"TuneConfig(scheduler=) must be a TrialScheduler, got {type(self._scheduler).__name__}"
            )
        self._search_alg = _search_alg(self._tune_config)
        self._configure_search(self._tune_config.metric, self._tune_config.mode)
        self._controller: TuneController | None = None
        self._storage: ExperimentStorage | None = None
        self._experiment_path = ""
        self._last_grid: ResultGrid | None = None
        self._restored_state: dict[str, Any] | None = None

    # ------------------------------------------------------------------ setup
    def _configure_search(self, metric: str | None, mode: str | None) -> None:
        if not self._scheduler.set_search_properties(metric, mode):
            raise ValueError(
                "You passed a `metric` or `mode` argument to `tune.TuneConfig()`, but the scheduler "
                f"{type(self._scheduler).__name__} was already instantiated with a different `metric` "
                "and `mode`. Either remove the arguments from your scheduler or from `tune.TuneConfig()`."
            )
        searcher = getattr(self._search_alg, "searcher", None)
        if searcher is not None and searcher.metric and metric and searcher.metric != metric:
            raise ValueError(
                f"TuneConfig(metric={metric!r}) differs from the metric {searcher.metric!r} that "
                f"{type(searcher).__name__} was created with; set it in one place"
            )
        accepted = self._search_alg.set_search_properties(metric, mode, self._param_space)
        if (
            not accepted
            and searcher is not None
            and self._param_space
            and getattr(searcher, "_space", None)
        ):
            raise ValueError(
                f"{type(searcher).__name__} was created with its own search space and the Tuner "
                "got a param_space too; pass the space in one place"
            )
        self._search_alg.setup(self._param_space, self._tune_config.num_samples)
        needs = getattr(self._scheduler, "_require_metric", None)
        if needs is not None and not isinstance(self._scheduler, FIFOScheduler):
            needs()

    @property
    def _metric(self) -> str | None:
        return (
            self._tune_config.metric
            or self._scheduler.metric
            or getattr(self._search_alg, "metric", None)
            or getattr(getattr(self._search_alg, "searcher", None), "metric", None)
        )

    @property
    def _mode(self) -> str | None:
        return (
            self._tune_config.mode
            or self._scheduler.mode
            or getattr(getattr(self._search_alg, "searcher", None), "mode", None)
        )

    def _resolve_experiment_path(self) -> str:
        """``storage_path/name``; without a name, ``<trainable>_<time>`` (Ray's default),
        with ``_2``, ``_3``... when another experiment took that folder in the same second."""
        rc = self._run_config
        root = rc.resolved_storage_path()
        if rc.name is None:
            base = f"{self._info.name}_{datetime.datetime.now():%Y-%m-%d_%H-%M-%S}"
            name, n = base, 1
            while os.path.exists(os.path.join(root, name)):
                n += 1
                name = f"{base}_{n}"
            rc.name = name
        return os.path.join(root, rc.name)

    def _settings(self, total: dict[str, float]) -> ControllerSettings:
        tc, rc = self._tune_config, self._run_config
        ckpt, fail = rc.checkpoint_config, rc.failure_config
        assert ckpt is not None and fail is not None
        reuse = tc.reuse_actors if tc.reuse_actors is not None else self._info.kind != "class"
        strict = not os.environ.get("TUNE_DISABLE_STRICT_METRIC_CHECKING")
        return ControllerSettings(
            trainable_name=self._info.name,
            experiment_path=self._experiment_path,
            resources_per_trial=self._info.resources,
            total_resources=total,
            metric=tc.metric,
            mode=tc.mode,
            max_concurrent_trials=tc.max_concurrent_trials,
            reuse_actors=reuse,
            is_class_trainable=self._info.kind == "class",
            max_failures=fail.max_failures,
            fail_fast=fail.fail_fast,
            time_budget_s=tc.time_budget_s,  # type: ignore[arg-type]
            num_to_keep=ckpt.num_to_keep,
            checkpoint_score_attribute=ckpt.checkpoint_score_attribute,
            checkpoint_score_order=ckpt.checkpoint_score_order,
            checkpoint_frequency=ckpt.checkpoint_frequency or 0,
            checkpoint_at_end=bool(ckpt.checkpoint_at_end),
            strict_metric_checking=strict,
            trial_name_creator=tc.trial_name_creator,
            trial_dirname_creator=tc.trial_dirname_creator,
            experiment_name=rc.name or "",
            max_pending_trials=self._max_pending_trials(total),
            # Queue the next trial on a busy runner when that cannot change a decision: the
            # scheduler never pauses and picks trials in order (FIFO, ASHA).
            prefetch=reuse
            and self._info.kind == "function"
            and not self._scheduler.pauses_trials
            and type(self._scheduler).choose_trial_to_run is TrialScheduler.choose_trial_to_run,
        )

    def _max_pending_trials(self, total: dict[str, float]) -> int:
        """Trials created ahead of a free slot (Ray's ``TUNE_MAX_PENDING_TRIALS_PG``).

        FIFO needs none waiting; other schedulers see every trial of the variant generator
        early (HyperBand fills its brackets with them); a searcher gets a few, so it does
        not suggest much without feedback."""
        env = os.environ.get("TUNE_MAX_PENDING_TRIALS_PG", "auto")
        if env.isdigit():
            return max(1, int(env))
        if type(self._scheduler) is FIFOScheduler:
            return 1
        if isinstance(self._search_alg, BasicVariantGenerator):
            return 1000
        return max(16, int(total.get("CPU", 1)))

    def _check_fits(self, total: dict[str, float]) -> None:
        shape = self._info.resources
        if callable(shape):
            return
        over = {k: v for k, v in shape.items() if v > total.get(k, 0.0) + _EPS}
        if over:
            raise TuneError(
                f"Each trial needs {shape}, but the cluster has only "
                f"{ {k: total.get(k, 0.0) for k in over} }. Ask for less with "
                "tune.with_resources(trainable, {...}), or add nodes (%cluster scale)."
            )

    def _tuner_state(self) -> dict[str, Any]:
        return {
            "param_space": self._param_space,
            "tune_config": self._tune_config,
            "run_config": self._run_config,
            "trainable_name": self._info.name,
            "kind": self._info.kind,
        }

    def _experiment_state(self) -> dict[str, Any]:
        ctrl = self._controller
        assert ctrl is not None
        return {
            "trials": ctrl.get_trials(),
            "search_alg": ctrl.search_alg,
            "scheduler": ctrl.scheduler,
            "stopper": ctrl.stopper,
            "id_prefix": ctrl._id_prefix,
            "next_trial_index": ctrl._next_trial_index,
            "pinned_checkpoints": ctrl.pinned_checkpoints,
            "experiment_path": self._experiment_path,
            "timestamp": datetime.datetime.now().timestamp(),
        }

    # ------------------------------------------------------------------ fit
    def fit(self) -> ResultGrid:
        """Run (or continue) the experiment and return its :class:`ResultGrid`.

        Raises :class:`TuneError` if the experiment cannot run, if a result lacks the
        metric, or if every trial failed (its ``result_grid`` holds what ran).

        On a Tuner from :meth:`restore` whose experiment a detached controller is still
        running (:meth:`fit_detached`), ``fit()`` attaches to that run instead: it shows
        its progress and returns its :class:`ResultGrid` when it ends.
        """
        if not nbcluster.is_initialized():
            nbcluster.init()
        live = self._live_detached_run()
        if live is not None:
            return live.get_results()
        return self._fit()

    def fit_detached(self) -> DetachedRun:
        """Start the experiment in a detached controller actor and return a handle to it.

        The controller (the same one ``fit()`` runs in the driver) runs in an actor with
        ``lifetime="detached"`` and 0 CPUs, named after the experiment
        (``RunConfig(name=)``), so the search goes on when the notebook's kernel restarts
        or this driver exits. Trials, storage and ``Tuner.restore`` are as with ``fit()``.
        The returned :class:`~nbcluster.tune.DetachedRun` shows the live widget and
        returns the :class:`ResultGrid` (``get_results()``), or stops the run (``stop()``);
        from another driver or after a restart, ``tune.attach(name)`` gives the same
        handle. The actor ends itself when the run ends. Objects passed with
        ``tune.with_parameters`` are put again by the controller, so they outlive this
        driver too.

        Ray Tune has no such method (a detached search there is a job:
        ``ray job submit``); ``fit()`` is unchanged.
        """
        if not nbcluster.is_initialized():
            nbcluster.init()
        live = self._live_detached_run()
        if live is not None:
            return live
        if self._controller is not None:
            raise TuneError(
                "Tuner.fit_detached(): this Tuner already ran fit() in this process; continue it "
                "detached with Tuner.restore(path, trainable).fit_detached()"
            )
        self._check_fits(nbcluster.cluster_resources())
        self._experiment_path = self._experiment_path or self._resolve_experiment_path()
        return start_detached(self, self._run_config.name or "", self._experiment_path)

    def _live_detached_run(self) -> DetachedRun | None:
        """The detached run of this experiment, if its controller is alive.

        A restored Tuner attaches to it; a new Tuner on the same folder is an error (two
        controllers would write one experiment)."""
        name = self._run_config.name
        if not name:
            return None
        path = self._experiment_path or os.path.join(self._run_config.resolved_storage_path(), name)
        live = find_live_run(name)
        if live is None or os.path.abspath(live.experiment_path) != os.path.abspath(path):
            return None
        if self._restored_state is None:
            raise TuneError(
                f"The experiment {path} is being run by a detached controller; watch it with "
                f"tune.attach({name!r}) (its .stop() ends it), or name this Tuner differently "
                "(RunConfig(name=))"
            )
        return live

    def _fit(
        self,
        reporter: Reporter | None = None,
        on_driver: Callable[[ExperimentDriver], None] | None = None,
    ) -> ResultGrid:
        """``fit()`` here, showing progress with ``reporter`` (default: the widget or text);
        ``on_driver`` gets the driver before it runs (the detached controller's stop hook)."""
        if not nbcluster.is_initialized():
            nbcluster.init()
        total = nbcluster.cluster_resources()
        self._check_fits(total)
        if self._controller is None:
            self._experiment_path = self._experiment_path or self._resolve_experiment_path()
            state = self._restored_state or {}
            self._controller = TuneController(
                self._settings(total),
                state.get("search_alg", self._search_alg),
                state.get("scheduler", self._scheduler),
                state.get("stopper", self._stopper),
                trials=state.get("trials", []),
                id_prefix=state.get("id_prefix", ""),
            )
            if state:
                self._controller._next_trial_index = state.get(
                    "next_trial_index", len(state["trials"])
                )
                self._controller.pinned_checkpoints = set(state.get("pinned_checkpoints", ()))
                self._search_alg = self._controller.search_alg
            self._storage = ExperimentStorage(self._experiment_path)
            for trial in self._controller.get_trials():
                self._storage.register_trial(trial)
        else:
            self._controller.settings.total_resources = total
            self._controller.settings.time_budget_s = self._tune_config.time_budget_s  # type: ignore[assignment]
        set_n = getattr(self._controller.search_alg, "set_num_samples", None)
        if set_n is not None:
            set_n(self._tune_config.num_samples)
        assert self._storage is not None
        self._storage.save_tuner(self._tuner_state())
        rc = self._run_config
        verbose = 1 if rc.verbose is None else rc.verbose
        if reporter is None:
            reporter = make_reporter(verbose, self._metric, self._mode, self._experiment_path)
        trainable_ref = nbcluster.put(self._info.trainable)
        driver = ExperimentDriver(
            self._controller,
            trainable_ref,
            "class" if self._info.kind == "class" else "function",
            self._storage,
            reporter,
            self._experiment_state,
            callbacks=rc.callbacks,
            actor_resources=self._info.actor_resources,
        )
        if on_driver is not None:
            on_driver(driver)
        driver.run()
        ctrl = self._controller
        grid = ResultGrid(
            ctrl.get_trials(), self._experiment_path, self._metric, self._mode, ctrl.stopping
        )
        self._last_grid = grid
        if ctrl.fatal_error is not None:
            error, ctrl.fatal_error = ctrl.fatal_error, None
            if isinstance(error, TuneError):
                error.result_grid = grid
            raise error
        if ctrl.stopping == "interrupted":
            print(
                f"[tune] Interrupted. Finished trials are in the returned ResultGrid; call fit() again, "
                f"or Tuner.restore({self._experiment_path!r}, trainable) later, to continue the others.",
                file=sys.stderr,
            )
            return grid
        self._raise_on_failures(grid)
        return grid

    def _raise_on_failures(self, grid: ResultGrid) -> None:
        trials = self._controller.get_trials() if self._controller else []
        failed = [t for t in trials if t.status == Trial.ERROR]
        if not failed:
            return
        fail_fast = (
            self._run_config.failure_config.fail_fast if self._run_config.failure_config else False
        )
        if fail_fast == "raise":
            raise grid.errors[0]
        if len(failed) < len(trials):
            return
        kinds: dict[str, list[str]] = {}
        for t in failed:
            last = (t.error_msg or "error").strip().splitlines()[-1]
            kind, _, message = last.partition(": ")
            kinds.setdefault(kind, []).append(message)
        summary = "; ".join(
            f"{len(msgs)}× {kind}" + (f" (e.g. {msgs[0]!r})" if msgs[0] else "")
            for kind, msgs in kinds.items()
        )
        first = failed[0]
        raise TuneError(
            f"All {len(trials)} trials failed: {summary}. First traceback ({first}):\n"
            f"{(first.error_msg or '').rstrip()}\nEach trial's error.txt is under {self._experiment_path}; "
            "the exception's .result_grid has every trial.",
            result_grid=grid,
        )

    def get_results(self) -> ResultGrid:
        """The results of the last ``fit()`` (or of a restored experiment, without running it)."""
        if self._last_grid is not None:
            return self._last_grid
        if self._restored_state is not None:
            return ResultGrid(
                self._restored_state["trials"], self._experiment_path, self._metric, self._mode
            )
        raise RuntimeError("Tuner.get_results(): call fit() first, or restore an experiment")

    # ------------------------------------------------------------------ restore
    @classmethod
    def can_restore(cls, path: str | os.PathLike[str], storage_filesystem: Any = None) -> bool:
        """True if ``path`` holds an experiment that :meth:`restore` can continue."""
        path = os.fspath(path)
        return os.path.isfile(os.path.join(path, EXPERIMENT_STATE_FILE)) and os.path.isfile(
            os.path.join(path, TUNER_FILE)
        )

    @classmethod
    def restore(
        cls,
        path: str | os.PathLike[str],
        trainable: Any,
        resume_unfinished: bool = True,
        resume_errored: bool = False,
        restart_errored: bool = False,
        param_space: dict[str, Any] | None = None,
        storage_filesystem: Any = None,
    ) -> Tuner:
        """Load an experiment saved at ``path``; ``fit()`` then continues it.

        Unfinished trials resume from their latest checkpoint (``resume_unfinished``);
        errored ones stay errored unless ``resume_errored`` (from their checkpoint) or
        ``restart_errored`` (from scratch). Pass the same ``trainable`` as the first run.
        """
        path = os.path.abspath(os.fspath(path))
        if not cls.can_restore(path):
            raise ValueError(
                f"Tuner.restore: {path} holds no experiment ({EXPERIMENT_STATE_FILE} and {TUNER_FILE} "
                "are missing); pass the folder Tuner.fit() printed (storage_path/name)"
            )
        tuner_state, state = load_experiment(path)
        tuner = cls.__new__(cls)
        tuner._info = inspect_trainable(trainable)
        tuner._param_space = param_space if param_space is not None else tuner_state["param_space"]
        tuner._tune_config = tuner_state["tune_config"]
        rc: RunConfig = tuner_state["run_config"]
        rc.storage_path, rc.name = os.path.dirname(path), os.path.basename(path)
        tuner._run_config = rc
        tuner._stopper = state.get("stopper")
        tuner._scheduler = state["scheduler"]
        tuner._search_alg = state["search_alg"]
        tuner._controller = None
        tuner._storage = None
        tuner._experiment_path = path
        tuner._last_grid = None
        for trial in state["trials"]:
            if trial.status in (Trial.RUNNING, Trial.PENDING, Trial.PAUSED):
                if not resume_unfinished:
                    trial.set_status(Trial.TERMINATED)
                elif trial.status == Trial.RUNNING:
                    trial.set_status(Trial.PAUSED)
            elif trial.status == Trial.ERROR and (resume_errored or restart_errored):
                trial.num_failures = 0
                trial.error, trial.error_msg = None, None
                trial.restart_from_scratch = restart_errored
                trial.set_status(Trial.PAUSED if resume_errored else Trial.PENDING)
        tuner._restored_state = state
        return tuner
