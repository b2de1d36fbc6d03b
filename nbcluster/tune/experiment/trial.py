"""``Trial``: one configuration's run, as the controller, schedulers and searchers see it.

A trial is plain data held by the driver: its config, its status (PENDING, RUNNING,
PAUSED, TERMINATED, ERROR), the results it reported, its checkpoints and its error. The
process that runs it (a runner actor) knows it only by id. Everything here pickles, so
the experiment state that ``Tuner.restore`` reads is just the list of trials.
"""

from __future__ import annotations

import math
import os
import re
import time
from typing import Any

from nbcluster.tune._checkpoint import Checkpoint
from nbcluster.tune.result import AUTO_RESULT_KEYS

__all__ = ["CheckpointRecord", "Trial", "trial_dirname"]


class CheckpointRecord:
    """A checkpoint a trial reported: its index, where it is, and the result it came with."""

    __slots__ = ("index", "metrics", "path")

    def __init__(self, index: int, path: str, metrics: dict[str, Any]) -> None:
        self.index = index
        self.path = path
        self.metrics = metrics

    @property
    def checkpoint(self) -> Checkpoint:
        """The :class:`Checkpoint` object."""
        return Checkpoint(self.path)

    def __repr__(self) -> str:
        return f"CheckpointRecord({self.index}, {self.path!r})"


def _numeric(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


class Trial:
    """One trial of an experiment (Ray's ``Trial``, reduced to what the public API reads)."""

    PENDING = "PENDING"
    RUNNING = "RUNNING"
    PAUSED = "PAUSED"
    TERMINATED = "TERMINATED"
    ERROR = "ERROR"

    def __init__(
        self,
        trainable_name: str,
        trial_id: str,
        config: dict[str, Any],
        *,
        experiment_tag: str = "",
        evaluated_params: dict[str, Any] | None = None,
        resources: dict[str, float] | None = None,
    ) -> None:
        self.trainable_name = trainable_name
        self.trial_id = trial_id
        self.config = config
        self.experiment_tag = experiment_tag
        self.evaluated_params = dict(evaluated_params or {})
        self.resources = dict(resources or {"CPU": 1.0})
        self.status = Trial.PENDING
        self.custom_trial_name: str | None = None
        self.custom_dirname: str | None = None
        self.local_path = ""
        self.results: list[dict[str, Any]] = []
        self.last_result: dict[str, Any] = {}
        self.checkpoints: list[CheckpointRecord] = []
        self.next_checkpoint_index = 0
        # Where the next start resumes from: None = the latest checkpoint (if any).
        self.restore_from: CheckpointRecord | None = None
        self.restart_from_scratch = False
        self.num_failures = 0
        self.error_msg: str | None = None
        self.error: BaseException | None = None
        self.start_time: float | None = None
        self.end_time: float | None = None
        self.status_time = time.time()
        self.stopping_reason = ""
        # Execution bookkeeping (set by the controller).
        self.runner_id: str | None = None
        self.run_seq = 0
        self.pending_decision = ""  # "STOP" / "PAUSE" once asked, until the runner confirms
        self.iteration_at_start = 0
        self.time_at_start = 0.0

    # -- names ------------------------------------------------------------------------------
    def __str__(self) -> str:
        if self.custom_trial_name:
            return self.custom_trial_name
        return f"{self.trainable_name}_{self.trial_id}"

    def __repr__(self) -> str:
        return str(self)

    @property
    def trial_name(self) -> str:
        """The trial's display name (``<trainable>_<trial_id>`` unless customized)."""
        return str(self)

    @property
    def path(self) -> str:
        """The trial's folder under ``storage_path/name``."""
        return self.local_path

    # -- status -----------------------------------------------------------------------------
    def is_finished(self) -> bool:
        """TERMINATED or ERROR."""
        return self.status in (Trial.TERMINATED, Trial.ERROR)

    def set_status(self, status: str) -> None:
        """Change the status (and note when)."""
        if status not in (
            Trial.PENDING,
            Trial.RUNNING,
            Trial.PAUSED,
            Trial.TERMINATED,
            Trial.ERROR,
        ):
            raise ValueError(f"unknown trial status {status!r}")
        now = time.time()
        if status == Trial.RUNNING and self.start_time is None:
            self.start_time = now
        if status in (Trial.TERMINATED, Trial.ERROR):
            self.end_time = now
        self.status = status
        self.status_time = now

    # -- results and checkpoints ------------------------------------------------------------
    @property
    def iteration(self) -> int:
        """The latest ``training_iteration`` reported."""
        return int(self.last_result.get("training_iteration", 0) or 0)

    def add_result(self, result: dict[str, Any]) -> None:
        """Record a result (the controller has filled in the automatic keys)."""
        self.results.append(result)
        self.last_result = result

    def add_checkpoint(self, record: CheckpointRecord) -> None:
        """Record a persisted checkpoint."""
        self.checkpoints.append(record)
        self.next_checkpoint_index = max(self.next_checkpoint_index, record.index + 1)

    @property
    def latest_checkpoint(self) -> CheckpointRecord | None:
        """The newest checkpoint still kept, or None."""
        return max(self.checkpoints, key=lambda c: c.index) if self.checkpoints else None

    @property
    def checkpoint(self) -> Checkpoint | None:
        """The newest checkpoint as a :class:`Checkpoint` (Ray's ``trial.checkpoint``)."""
        latest = self.latest_checkpoint
        return latest.checkpoint if latest else None

    def metric_values(self, metric: str) -> list[float]:
        """Every numeric value of ``metric`` the trial reported, in order."""
        return [r[metric] for r in self.results if _numeric(r.get(metric))]

    def metric_summary(self, metric: str, scope: str = "last", mode: str = "max") -> float | None:
        """``metric`` under ``scope`` (last, avg, last-5-avg, last-10-avg, all), or None."""
        values = self.metric_values(metric)
        if not values:
            return None
        if scope == "all":
            finite = [v for v in values if not math.isnan(v)]
            if not finite:
                return math.nan
            return max(finite) if mode == "max" else min(finite)
        if scope == "last":
            return values[-1]
        if scope == "avg":
            return sum(values) / len(values)
        if scope in ("last-5-avg", "last-10-avg"):
            n = 5 if scope == "last-5-avg" else 10
            tail = values[-n:]
            return sum(tail) / len(tail)
        raise ValueError(
            f"scope must be one of 'last', 'avg', 'last-5-avg', 'last-10-avg', 'all'; got {scope!r}"
        )

    def reported_keys(self) -> list[str]:
        """The metric names this trial reported (automatic keys excluded)."""
        keys: dict[str, None] = {}
        for r in self.results:
            for k in r:
                if k not in AUTO_RESULT_KEYS:
                    keys[k] = None
        return list(keys)


def trial_dirname(trial: Trial) -> str:
    """``<trainable>_<id>_<tag>`` with unsafe characters replaced, at most 120 characters."""
    name = trial.custom_dirname or f"{trial.trainable_name}_{trial.trial_id}_{trial.experiment_tag}"
    if os.sep in name or name in (".", ".."):
        raise ValueError(f"trial_dirname_creator returned {name!r}, which is not a folder name")
    return re.sub(r"[^A-Za-z0-9_.=,@+-]", "_", name)[:120]
