"""The Tune controller in a detached actor: a search that outlives its driver.

``Tuner.fit_detached()`` pickles the Tuner and starts :class:`TuneControllerActor` with
``lifetime="detached"``, 0 CPUs, and a name derived from the experiment
(:func:`controller_actor_name`, in :data:`NAMESPACE`). The actor's ``run`` call is the
same ``fit()`` as in a driver (the same :class:`~nbcluster.tune.execution.controller.TuneController`
and :class:`~nbcluster.tune.execution.driver.ExperimentDriver`), with a
:class:`RecordingReporter` instead of the widget: it keeps what watchers need (a pickled
snapshot of the trials a few times a second, notes, trials' output) for ``snapshot``
calls. ``stop`` is an interrupt: trials stop gracefully and end PAUSED, so
``Tuner.restore`` can continue them. When the run is over the actor writes
:data:`STATUS_FILE` (how it ended) next to the experiment state and kills itself: no
detached actor outlives its run.

The runners it creates are ordinary (non-detached) actors owned by the controller actor:
they end with it, not with the driver that started the run.
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import threading
import time
import traceback
from typing import Any

import cloudpickle

import nbcluster
from nbcluster.exceptions import NbclusterError
from nbcluster.train._fileio import atomic_write_text
from nbcluster.tune._display import REFRESH_S, Reporter
from nbcluster.tune.experiment.trial import Trial
from nbcluster.tune.trainable.util import _WithParameters

__all__ = [
    "NAMESPACE",
    "STATUS_FILE",
    "ControllerActor",
    "RecordingReporter",
    "TuneControllerActor",
    "controller_actor_name",
    "read_status",
    "write_status",
]

#: The namespace of every detached Tune controller (so any driver finds them by name).
NAMESPACE = "nbcluster.tune"
#: Written in the experiment folder by a detached controller: its name and how the run ended.
STATUS_FILE = "detached_run.json"
_MAX_EVENTS = 2000
_START_TIMEOUT_S = 120.0


def controller_actor_name(experiment_name: str) -> str:
    """The detached controller's actor name for the experiment ``experiment_name``."""
    return f"tune-controller:{experiment_name}"


def write_status(folder: str, /, **fields: Any) -> None:
    """Replace :data:`STATUS_FILE` in the experiment folder ``folder`` (atomically)."""
    atomic_write_text(
        os.path.join(folder, STATUS_FILE), json.dumps(fields, indent=1), durable=False
    )


def read_status(experiment_path: str) -> dict[str, Any] | None:
    """The detached run's status file in ``experiment_path``, or None if there is none."""
    try:
        with open(os.path.join(experiment_path, STATUS_FILE)) as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


class RecordingReporter(Reporter):
    """A reporter that shows nothing and keeps what a remote watcher needs.

    The controller's loop (one thread) calls it; ``snapshot`` (another thread) reads it.
    The trials are pickled in the loop's thread, at most every ``REFRESH_S``, so a
    snapshot is always consistent.
    """

    def __init__(self, metric: str | None, mode: str | None, experiment_path: str) -> None:
        super().__init__(metric, mode, verbose=0, experiment_path=experiment_path)
        self._lock = threading.Lock()
        self._events: collections.deque[tuple[int, str, tuple[Any, ...]]] = collections.deque(
            maxlen=_MAX_EVENTS
        )
        self._seq = 0
        self._blob = cloudpickle.dumps([])
        self._blob_at = 0.0
        self.finished = False

    def _add(self, kind: str, *payload: Any) -> None:
        with self._lock:
            self._seq += 1
            self._events.append((self._seq, kind, payload))

    def start(self, trials: list[Trial]) -> None:
        super().start(trials)
        self.update(trials, force=True)

    def note(self, text: str) -> None:
        self._note = text
        self._add("note", text)

    def update(self, trials: list[Trial], force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._blob_at < REFRESH_S:
            return
        blob = cloudpickle.dumps(list(trials))
        with self._lock:
            self._blob, self._blob_at = blob, now

    def output(self, trial: Trial, text: str) -> None:
        self._add("output", trial.trial_id, text)

    def trial_failed(self, trial: Trial, retrying: bool) -> None:
        self._add("failed", trial.trial_id, retrying)

    def trial_ended(self, trial: Trial) -> None:
        return None

    def finish(self, trials: list[Trial]) -> None:
        self.update(trials, force=True)
        self.finished = True

    def snapshot(self, since: int) -> dict[str, Any]:
        """The latest trials (pickled) and the events after ``since``."""
        with self._lock:
            events = [e for e in self._events if e[0] > since]
            return {"trials": self._blob, "events": events, "seq": self._seq, "note": self._note}


def _own_parameters(trainable: Any) -> None:
    """Re-put the objects of ``tune.with_parameters`` from this actor.

    The driver that called ``with_parameters`` owns them, and they go when it exits; it is
    alive while this actor is being created (``fit_detached`` waits for it), so the values
    are fetched now and put again, owned by the controller, which outlives the driver.
    """
    refs = getattr(trainable, "_tune_parameter_refs", None)
    if refs is None and isinstance(trainable, _WithParameters):
        refs = trainable.refs
    if not refs:
        return
    values = nbcluster.get(list(refs.values()))
    # In place: the wrapper's closure and its attribute share this dict.
    refs.update({name: nbcluster.put(v) for name, v in zip(list(refs), values, strict=True)})


class TuneControllerActor:
    """Runs one Tuner's ``fit()`` inside a detached actor (see the module docstring)."""

    def __init__(self, payload: bytes, actor_name: str) -> None:
        self._tuner = cloudpickle.loads(payload)
        _own_parameters(self._tuner._info.trainable)
        self._name = actor_name
        self._path: str = self._tuner._experiment_path
        self._reporter = RecordingReporter(
            self._tuner._metric, self._tuner._mode, self._tuner._experiment_path
        )
        self._driver: Any = None
        self._stop_requested = False
        self._lock = threading.Lock()
        self._state = "RUNNING"
        self._started = time.time()
        self._running = threading.Event()
        # A driver that dies between creating this actor and calling run() must not leave
        # it behind: without a run() call it ends itself.
        self._idle_timer = threading.Timer(_START_TIMEOUT_S, self._exit_if_never_run)
        self._idle_timer.daemon = True
        self._idle_timer.start()

    def _exit_if_never_run(self) -> None:
        if not self._running.is_set():
            self._exit()

    def wait_running(self, timeout: float) -> bool:
        """True once ``run`` has begun (``Tuner.fit_detached`` returns only then)."""
        return self._running.wait(timeout)

    def info(self) -> dict[str, Any]:
        """What a watcher needs to know about this run."""
        return {
            "actor_name": self._name,
            "experiment_path": self._path,
            "metric": self._tuner._metric,
            "mode": self._tuner._mode,
            "state": self._state,
            "started": self._started,
            "pid": os.getpid(),
        }

    def _status(self, **extra: Any) -> None:
        fields = {k: v for k, v in self.info().items() if k != "pid"}
        fields.update(namespace=NAMESPACE, **extra)
        with contextlib.suppress(OSError):
            os.makedirs(self._path, exist_ok=True)
            write_status(self._path, **fields)

    def _on_driver(self, driver: Any) -> None:
        with self._lock:
            self._driver = driver
            if self._stop_requested:
                driver.interrupts += 1

    def run(self) -> None:
        """Run the experiment to its end, record how it ended, then end this actor."""
        if self._running.is_set():
            return
        self._running.set()
        self._idle_timer.cancel()
        ending: dict[str, str] = {}
        try:
            self._status()
            self._tuner._fit(reporter=self._reporter, on_driver=self._on_driver)
            ctrl = self._tuner._controller
            stopping = ctrl.stopping if ctrl is not None else ""
            self._state = "STOPPED" if stopping == "interrupted" else "FINISHED"
            ending["stop_reason"] = "stopped" if stopping == "interrupted" else stopping
        except BaseException as e:  # the run's error goes to the watchers, then the actor ends
            self._state = "ERROR"
            ending = {
                "error_type": type(e).__name__,
                "error": str(e),
                "traceback": "".join(traceback.format_exception(e)),
            }
        finally:
            try:
                self._status(ended=time.time(), **ending)
            finally:
                self._reporter.finished = True
                self._exit()

    def _exit(self) -> None:
        """End this (detached) actor: nothing else will."""
        with contextlib.suppress(NbclusterError, ValueError):
            nbcluster.kill(nbcluster.get_actor(self._name, namespace=NAMESPACE))

    def snapshot(self, since: int = 0) -> dict[str, Any]:
        """The trials and what happened since event ``since`` (see :class:`RecordingReporter`)."""
        snap = self._reporter.snapshot(since)
        snap["state"] = self._state
        snap["finished"] = self._reporter.finished
        return snap

    def stop(self) -> bool:
        """Stop the run like an interrupt: trials end PAUSED (``Tuner.restore`` resumes them)."""
        with self._lock:
            if self._stop_requested:
                return False
            self._stop_requested = True
            if self._driver is not None:
                self._driver.interrupts += 1
        return True


#: The actor class: ``run`` holds one thread; the other calls share the rest.
ControllerActor = nbcluster.remote(max_concurrency=4)(TuneControllerActor)
