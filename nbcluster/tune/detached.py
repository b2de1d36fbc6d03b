"""Detached runs: a Tune search whose controller lives in a detached actor.

::

    run = tuner.fit_detached()   # returns once the controller actor runs
    run.get_results()            # the live widget, then the ResultGrid
    # ... the kernel restarts, or this driver exits: the search goes on ...
    run = tune.attach("my_experiment")   # from any driver of the cluster
    run.get_results()            # or run.stop()

Ray Tune runs a search detached only as a job (``ray job submit -- python tune.py``);
here the opt-in is :meth:`Tuner.fit_detached`, and ``Tuner.fit()`` is unchanged. A
detached run's experiment is saved to ``storage_path/name`` exactly as ``fit()`` saves
it, so ``Tuner.restore(path, trainable)`` continues a stopped one; on a run that is still
going, the restored Tuner's ``fit()`` attaches to it instead of starting a second
controller.
"""

from __future__ import annotations

import contextlib
import io
import os
import sys
import time
from typing import Any

import cloudpickle

import nbcluster
from nbcluster.exceptions import ActorError, GetTimeoutError, NbclusterError
from nbcluster.tune._config import RunConfig
from nbcluster.tune._display import REFRESH_S, Reporter, make_reporter
from nbcluster.tune.error import TuneError
from nbcluster.tune.execution.detached import (
    NAMESPACE,
    ControllerActor,
    controller_actor_name,
    read_status,
)
from nbcluster.tune.execution.storage import EXPERIMENT_STATE_FILE, load_experiment
from nbcluster.tune.experiment.trial import Trial
from nbcluster.tune.result_grid import ResultGrid

__all__ = ["DetachedRun", "attach", "find_live_run", "start_detached"]

_CALL_TIMEOUT_S = 60.0
_END_TIMEOUT_S = 60.0


class DetachedRun:
    """A handle to a detached Tune run (from ``Tuner.fit_detached()`` or ``tune.attach``).

    ``get_results()`` watches it (the same live widget as ``fit()``) and returns its
    :class:`ResultGrid`; ``stop()`` ends it; ``is_running()`` says whether its controller
    is alive. A handle of a run that already ended reads the saved experiment.
    """

    def __init__(
        self,
        name: str,
        experiment_path: str,
        handle: Any = None,
        metric: str | None = None,
        mode: str | None = None,
    ) -> None:
        self.name = name
        self.experiment_path = experiment_path
        self.actor_name = controller_actor_name(name)
        self._handle = handle
        self._metric = metric
        self._mode = mode
        self._trials: list[Trial] = []
        self._run_ref: Any = None

    def __repr__(self) -> str:
        state = "running" if self.is_running() else "ended"
        return f"DetachedRun(name={self.name!r}, {state}, experiment_path={self.experiment_path!r})"

    # ------------------------------------------------------------------ state
    def is_running(self) -> bool:
        """True while the run's controller actor is alive."""
        if self._handle is None:
            return False
        try:
            nbcluster.get(self._handle.info.remote(), timeout=_CALL_TIMEOUT_S)
        except (ActorError, GetTimeoutError):
            self._handle = None
            return False
        return True

    def status(self) -> dict[str, Any]:
        """How the run is doing: ``state`` (RUNNING; when it ended: FINISHED, STOPPED,
        ERROR, or DIED if its controller died first) and the number of trials by status."""
        trials = self._fetch_trials()
        counts: dict[str, int] = {}
        for t in trials:
            counts[t.status] = counts.get(t.status, 0) + 1
        state = "RUNNING" if self._handle is not None else self._ended_state()
        return {"state": state, "trials": counts, "experiment_path": self.experiment_path}

    def _ended_state(self) -> str:
        status = read_status(self.experiment_path) or {}
        state = str(status.get("state", "UNKNOWN"))
        # RUNNING on disk with no live controller: the actor died without recording its end.
        return "DIED" if state == "RUNNING" else state

    def _fetch_trials(self) -> list[Trial]:
        if self._handle is not None:
            try:
                snap = nbcluster.get(self._handle.snapshot.remote(0), timeout=_CALL_TIMEOUT_S)
            except (ActorError, GetTimeoutError):
                self._handle = None
            else:
                self._trials = cloudpickle.loads(snap["trials"])
                return self._trials
        return self._saved_trials()

    def _saved_trials(self) -> list[Trial]:
        if not os.path.isfile(os.path.join(self.experiment_path, EXPERIMENT_STATE_FILE)):
            return list(self._trials)
        _, state = load_experiment(self.experiment_path)
        return list(state["trials"])

    # ------------------------------------------------------------------ watching
    def get_results(self, timeout: float | None = None, verbose: int = 1) -> ResultGrid:
        """Watch the run until it ends (the live widget in a notebook, status lines
        elsewhere) and return its :class:`ResultGrid`.

        Interrupting (or ``timeout`` seconds passing) stops watching, not the run: the
        grid of the trials so far is returned and the run goes on. Raises the run's
        :class:`TuneError` if it failed (e.g. every trial failed).
        """
        if timeout is not None and (isinstance(timeout, bool) or timeout < 0):
            raise ValueError(
                f"DetachedRun.get_results(timeout=) must be >= 0 or None, got {timeout!r}"
            )
        reporter = make_reporter(verbose, self._metric, self._mode, self.experiment_path)
        reporter.start(self._trials)
        try:
            ended = self._watch(reporter, timeout)
        except KeyboardInterrupt:
            ended = False
        if not ended:
            reporter.update(self._trials, force=True)
            print(
                f"[tune] Stopped watching; the detached run goes on. tune.attach({self.name!r}) "
                "watches it again, .stop() ends it.",
                file=sys.stderr,
            )
            return self._grid(self._trials)
        return self._final_grid(reporter)

    def _watch(self, reporter: Reporter, timeout: float | None) -> bool:
        """Show the run's progress; True once its controller has ended."""
        deadline = None if timeout is None else time.monotonic() + timeout
        seq = 0
        while self._handle is not None:
            try:
                snap = nbcluster.get(self._handle.snapshot.remote(seq), timeout=_CALL_TIMEOUT_S)
            except (ActorError, GetTimeoutError):
                self._await_end()  # it died: its name is released once the head knows
                break
            self._trials = cloudpickle.loads(snap["trials"])
            by_id = {t.trial_id: t for t in self._trials}
            for s, kind, payload in snap["events"]:
                seq = max(seq, s)
                if kind == "note":
                    reporter.note(payload[0])
                elif payload[0] in by_id and kind == "output":
                    reporter.output(by_id[payload[0]], payload[1])
                elif payload[0] in by_id and kind == "failed":
                    reporter.trial_failed(by_id[payload[0]], payload[1])
            reporter.update(self._trials)
            if snap["finished"]:
                self._await_end()
                break
            if deadline is not None and time.monotonic() >= deadline:
                return False
            time.sleep(REFRESH_S)
        return True

    def _await_end(self) -> None:
        """The run is over: wait until its actor has ended (it saves the state first) and
        its name is free again."""
        deadline = time.monotonic() + _END_TIMEOUT_S
        while time.monotonic() < deadline:
            try:
                nbcluster.get_actor(self.actor_name, namespace=NAMESPACE)
            except ValueError:
                break
            time.sleep(0.05)
        self._handle = None

    def _grid(self, trials: list[Trial]) -> ResultGrid:
        return ResultGrid(trials, self.experiment_path, self._metric, self._mode)

    def _final_grid(self, reporter: Reporter | None = None) -> ResultGrid:
        trials = self._saved_trials()
        self._trials = trials
        if reporter is not None:
            reporter.finish(trials)
        status = read_status(self.experiment_path) or {}
        grid = ResultGrid(
            trials, self.experiment_path, self._metric, self._mode, status.get("stop_reason", "")
        )
        if status.get("state") == "ERROR":
            raise TuneError(
                f"The detached run {self.name!r} failed: {status.get('error_type')}: "
                f"{status.get('error')}",
                result_grid=grid,
            )
        if status.get("state") == "RUNNING":
            raise TuneError(
                f"The detached controller of {self.name!r} died before the run ended; "
                f"continue it with Tuner.restore({self.experiment_path!r}, trainable).fit()",
                result_grid=grid,
            )
        return grid

    # ------------------------------------------------------------------ stopping
    def stop(self, timeout: float = 120.0) -> ResultGrid:
        """Stop the run and return its :class:`ResultGrid` once its controller has ended.

        Like interrupting ``fit()``: running trials stop gracefully (those that do not
        within 10 s are killed) and end PAUSED, finished ones stay, and
        ``Tuner.restore(experiment_path, trainable)`` continues the rest. The controller
        actor and every runner end. Stopping a run that already ended just returns its grid.
        """
        if self._handle is not None:
            try:
                nbcluster.get(self._handle.stop.remote(), timeout=_CALL_TIMEOUT_S)
            except (ActorError, GetTimeoutError):
                self._await_end()
        if self._handle is not None:
            reporter = Reporter(self._metric, self._mode, verbose=0, file=io.StringIO())
            if not self._watch(reporter, timeout):
                raise TuneError(
                    f"DetachedRun.stop(): the run {self.name!r} did not end within {timeout:g} s"
                )
        try:
            return self._final_grid()
        except TuneError as e:
            if e.result_grid is None or read_status(self.experiment_path) is None:
                raise
            return e.result_grid


def find_live_run(name: str) -> DetachedRun | None:
    """The running detached run of the experiment ``name``, or None."""
    try:
        handle = nbcluster.get_actor(controller_actor_name(name), namespace=NAMESPACE)
        info = nbcluster.get(handle.info.remote(), timeout=_CALL_TIMEOUT_S)
    except (ValueError, ActorError, GetTimeoutError):
        return None
    return DetachedRun(name, info["experiment_path"], handle, info["metric"], info["mode"])


def attach(name: str | os.PathLike[str], *, storage_path: str | None = None) -> DetachedRun:
    """A handle to the detached run ``name`` (``RunConfig(name=)``) or of the experiment
    folder ``name``, started by ``Tuner.fit_detached()`` in this or another driver.

    A run that already ended is found in ``storage_path`` (default: ``RunConfig``'s) and
    its handle returns the saved results.
    """
    if not isinstance(name, (str, os.PathLike)) or not os.fspath(name):
        raise TypeError(
            f"tune.attach() needs the experiment's name (RunConfig(name=)) or its folder, got {name!r}"
        )
    if not nbcluster.is_initialized():
        nbcluster.init()
    text = os.fspath(name)
    path: str | None = None
    if os.path.isdir(text):
        path = os.path.abspath(text)
        text = os.path.basename(path.rstrip(os.sep))
    live = find_live_run(text)
    if live is not None and (path is None or os.path.abspath(live.experiment_path) == path):
        return live
    if path is None:
        root = RunConfig(storage_path=storage_path).resolved_storage_path()
        path = os.path.join(root, text)
    status = read_status(path)
    if status is None:
        raise ValueError(
            f"tune.attach({os.fspath(name)!r}): no detached Tune run of that name is running, and "
            f"{path} holds no detached run; pass the name given to RunConfig(name=) (or the "
            "experiment folder) of a run started with Tuner.fit_detached()"
        )
    return DetachedRun(text, path, None, status.get("metric"), status.get("mode"))


def start_detached(tuner: Any, name: str, experiment_path: str) -> DetachedRun:
    """Start ``tuner``'s experiment in a detached controller actor (``Tuner.fit_detached``)."""
    actor_name = controller_actor_name(name)
    if find_live_run(name) is not None:
        raise TuneError(
            f"A detached Tune run named {name!r} is already running; watch it with "
            f"tune.attach({name!r}), or name this one differently (RunConfig(name=))"
        )
    try:
        payload = cloudpickle.dumps(tuner)
    except Exception as e:
        raise TuneError(
            f"Tuner.fit_detached(): the Tuner cannot be sent to its controller actor "
            f"({type(e).__name__}: {e}); the trainable, param_space, search algorithm and "
            "scheduler must be picklable"
        ) from e
    handle = ControllerActor.options(
        name=actor_name, namespace=NAMESPACE, lifetime="detached", num_cpus=0
    ).remote(payload, actor_name)
    try:
        info = nbcluster.get(handle.info.remote(), timeout=_CALL_TIMEOUT_S)
    except (NbclusterError, GetTimeoutError) as e:
        with contextlib.suppress(NbclusterError):
            nbcluster.kill(handle)
        raise TuneError(f"Tuner.fit_detached(): the controller actor did not start: {e}") from e
    run = DetachedRun(name, experiment_path, handle, info["metric"], info["mode"])
    run._run_ref = handle.run.remote()  # held while this driver lives; nothing waits on it
    try:
        running = nbcluster.get(handle.wait_running.remote(_CALL_TIMEOUT_S))
    except (NbclusterError, GetTimeoutError) as e:
        raise TuneError(f"Tuner.fit_detached(): the controller actor failed: {e}") from e
    if not running:
        with contextlib.suppress(NbclusterError):
            nbcluster.kill(handle)
        raise TuneError(
            f"Tuner.fit_detached(): the controller actor did not start the run within "
            f"{_CALL_TIMEOUT_S:g} s"
        )
    return run
