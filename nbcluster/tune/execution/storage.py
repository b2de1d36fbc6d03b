"""The experiment folder: trial folders, results, checkpoints, and the experiment state.

Layout of ``storage_path/name/``::

    experiment_state.pkl        trials, search algorithm, scheduler, stopper (cloudpickle)
    tuner.pkl                   param_space, TuneConfig, RunConfig, trainable name
    <trial dir>/params.json     the trial's config
    <trial dir>/result.json     one JSON line per result
    <trial dir>/checkpoint_NNNNNN/   checkpoints (written by the runner, atomically)
    <trial dir>/output.log      everything the trial printed
    <trial dir>/error.txt       the traceback, if the trial failed

File writes go through one background thread so the controller's loop never waits on the
disk; :meth:`ExperimentStorage.flush` waits for them. The state file is replaced
atomically (temporary file + rename), so a crash mid-write leaves the previous state.
:func:`load_experiment` also reads what the trial folders gained after the state was last
saved (results and checkpoints), so a restore loses only progress made after a trial's
last checkpoint.
"""

from __future__ import annotations

import json
import math
import os
import queue
import shutil
import threading
import time
from collections.abc import Callable
from typing import Any

import cloudpickle

from nbcluster.train._fileio import atomic_write_bytes, atomic_write_text
from nbcluster.tune._checkpoint import CHECKPOINT_PREFIX, checkpoint_index, read_metrics
from nbcluster.tune.experiment.trial import CheckpointRecord, Trial

__all__ = [
    "EXPERIMENT_STATE_FILE",
    "ExperimentStorage",
    "TUNER_FILE",
    "load_experiment",
]

EXPERIMENT_STATE_FILE = "experiment_state.pkl"
TUNER_FILE = "tuner.pkl"
RESULT_FILE = "result.json"
_SAVE_EVERY_S = 1.0
_RESULTS_EVERY_S = 0.2


class _JSONEncoder(json.JSONEncoder):
    def default(self, o: Any) -> Any:
        for attr in ("item", "tolist"):
            fn = getattr(o, attr, None)
            if callable(fn):
                try:
                    return fn()
                except (TypeError, ValueError):
                    break
        return repr(o)


def _json_line(result: dict[str, Any]) -> str:
    def clean(v: Any) -> Any:
        if isinstance(v, float) and not math.isfinite(v):
            return str(v)
        return v

    return json.dumps({k: clean(v) for k, v in result.items()}, cls=_JSONEncoder)


class ExperimentStorage:
    """Writes one experiment's folder (see the module docstring)."""

    def __init__(self, experiment_path: str) -> None:
        self.experiment_path = experiment_path
        os.makedirs(experiment_path, exist_ok=True)
        self._queue: queue.Queue[Callable[[], None] | None] = queue.Queue()
        # The writer thread runs while there is work and ends after a second of idleness
        # (a finished Tuner must not leave a thread behind for the life of the process).
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._pending_results: dict[str, list[dict[str, Any]]] = {}
        self._trial_paths: dict[str, str] = {}
        self._last_save = 0.0
        self._last_results = 0.0
        self.state_dirty = False
        self.errors: list[str] = []

    def _work(self) -> None:
        while True:
            try:
                job = self._queue.get(timeout=1.0)
            except queue.Empty:
                with self._lock:
                    if self._queue.empty():
                        self._thread = None
                        return
                continue
            try:
                if job is None:
                    with self._lock:
                        self._thread = None
                    return
                job()
            except OSError as e:  # keep going: a full disk must not kill the experiment loop
                self.errors.append(str(e))
            finally:
                self._queue.task_done()

    def _submit(self, job: Callable[[], None]) -> None:
        with self._lock:
            self._queue.put(job)
            if self._thread is None:
                self._thread = threading.Thread(target=self._work, name="tune-storage", daemon=True)
                self._thread.start()

    # ------------------------------------------------------------------ trials
    def init_trial(self, trial: Trial) -> None:
        """Create the trial's folder and write its params."""
        path = trial.local_path
        self._trial_paths[trial.trial_id] = path
        config = trial.config

        def job() -> None:
            os.makedirs(path, exist_ok=True)
            text = json.dumps(config, cls=_JSONEncoder, indent=2, sort_keys=True)
            atomic_write_text(os.path.join(path, "params.json"), text, durable=False)

        self._submit(job)

    def register_trial(self, trial: Trial) -> None:
        """Know an existing trial (after a restore): create its folder only if missing."""
        self._trial_paths[trial.trial_id] = trial.local_path
        if not os.path.isdir(trial.local_path):
            self.init_trial(trial)

    def update_params(self, trial: Trial) -> None:
        """Rewrite params.json (PBT changed the config)."""
        self.init_trial(trial)

    def add_result(self, trial: Trial, result: dict[str, Any]) -> None:
        """Queue a result line for the trial's ``result.json``."""
        self._pending_results.setdefault(trial.trial_id, []).append(result)

    def write_error(self, trial: Trial, text: str) -> None:
        """Write the trial's traceback to ``error.txt``."""
        path = trial.local_path

        def job() -> None:
            os.makedirs(path, exist_ok=True)
            with open(os.path.join(path, "error.txt"), "a") as f:
                f.write(text.rstrip() + "\n")

        self._submit(job)

    def delete_checkpoint(self, path: str) -> None:
        """Remove a checkpoint folder (only inside this experiment's folder)."""
        root = os.path.abspath(self.experiment_path)
        target = os.path.abspath(path)
        if os.path.commonpath([root, target]) != root or target == root:
            return
        self._submit(lambda: shutil.rmtree(target, ignore_errors=True))

    def flush_results(self) -> None:
        """Hand the queued result lines to the writer thread."""
        pending, self._pending_results = self._pending_results, {}
        for trial_id, results in pending.items():
            path = self._trial_paths.get(trial_id)
            if not path:
                continue

            def job(path: str = path, results: list[dict[str, Any]] = results) -> None:
                lines = "".join(_json_line(r) + "\n" for r in results)
                os.makedirs(path, exist_ok=True)
                with open(os.path.join(path, RESULT_FILE), "a") as f:
                    f.write(lines)

            self._submit(job)

    # ------------------------------------------------------------------ experiment state
    def save_tuner(self, tuner_state: dict[str, Any]) -> None:
        """Write ``tuner.pkl`` (what ``Tuner.restore`` rebuilds the Tuner from)."""
        data = cloudpickle.dumps(tuner_state)
        self._submit(lambda: _atomic_write(os.path.join(self.experiment_path, TUNER_FILE), data))

    def maybe_save_state(
        self, make_state: Callable[[], dict[str, Any]], force: bool = False
    ) -> None:
        """Save the experiment state if it changed and the last save is old enough.

        Result lines are handed to the writer more often (every ``_RESULTS_EVERY_S``)."""
        now = time.monotonic()
        if now - self._last_results >= _RESULTS_EVERY_S:
            self._last_results = now
            self.flush_results()
        if not force and (not self.state_dirty or now - self._last_save < _SAVE_EVERY_S):
            return
        self.flush_results()
        data = cloudpickle.dumps(make_state())
        self._last_save = now
        self.state_dirty = False
        path = os.path.join(self.experiment_path, EXPERIMENT_STATE_FILE)
        self._submit(lambda: _atomic_write(path, data))

    def flush(self) -> None:
        """Wait until every queued write is on disk."""
        self.flush_results()
        self._queue.join()

    def close(self) -> None:
        """Flush and stop the writer thread."""
        self.flush()
        with self._lock:
            thread = self._thread
            if thread is not None:
                self._queue.put(None)
        if thread is not None:
            thread.join(timeout=10)


def _atomic_write(path: str, data: bytes) -> None:
    atomic_write_bytes(path, data)  # a restore never reads a half-written state file


def _read_results(trial_dir: str) -> list[dict[str, Any]]:
    results = []
    try:
        with open(os.path.join(trial_dir, RESULT_FILE)) as f:
            for line in f:
                line = line.strip()
                if line:
                    try:
                        results.append(json.loads(line))
                    except json.JSONDecodeError:
                        break  # a line cut by a crash: everything before it is good
    except FileNotFoundError:
        pass
    return results


def _catch_up(trial: Trial) -> None:
    """Add what the trial's folder holds beyond the saved state (results, checkpoints)."""
    if not trial.local_path or not os.path.isdir(trial.local_path):
        return
    on_disk = _read_results(trial.local_path)
    if len(on_disk) > len(trial.results):
        for r in on_disk[len(trial.results) :]:
            r["config"] = trial.config
            trial.add_result(r)
    known = {c.path for c in trial.checkpoints}
    by_name = {
        r.get("checkpoint_dir_name"): r for r in trial.results if r.get("checkpoint_dir_name")
    }
    for name in sorted(os.listdir(trial.local_path)):
        index = checkpoint_index(name)
        path = os.path.join(trial.local_path, name)
        if index < 0 or path in known or not name.startswith(CHECKPOINT_PREFIX):
            continue
        metrics = by_name.get(name) or read_metrics(path)
        if metrics is None:
            continue  # a checkpoint without its result (cut by a crash): its iteration is unknown
        trial.add_checkpoint(
            CheckpointRecord(index, path, {k: v for k, v in metrics.items() if k != "config"})
        )


def load_experiment(experiment_path: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """Read ``(tuner_state, experiment_state)`` of a saved experiment."""
    with open(os.path.join(experiment_path, TUNER_FILE), "rb") as f:
        tuner_state = cloudpickle.load(f)
    with open(os.path.join(experiment_path, EXPERIMENT_STATE_FILE), "rb") as f:
        state = cloudpickle.load(f)
    moved = os.path.abspath(experiment_path) != os.path.abspath(state.get("experiment_path", ""))
    for trial in state["trials"]:
        if moved and trial.local_path:
            trial.local_path = os.path.join(experiment_path, os.path.basename(trial.local_path))
            for c in trial.checkpoints:
                c.path = os.path.join(trial.local_path, os.path.basename(c.path))
        _catch_up(trial)
    state["experiment_path"] = experiment_path
    return tuner_state, state
