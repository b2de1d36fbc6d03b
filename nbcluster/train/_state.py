"""The decisions of a training run, as a state machine with no I/O.

:class:`RunState` takes what the workers send (reports, "my loop returned", failures)
and what the user does (interrupt) and answers with instructions: a report is complete
(every rank sent it), delete these checkpoints, restart the group from this checkpoint,
fail, finish. :class:`CheckpointBook` decides which checkpoints are kept. The controller
(``_controller.py``) is the thin shell that does the I/O; these are unit-tested without
processes (``tests/train/test_state.py``).

Reports are collected **in step**: the k-th report of the run is complete when every rank
whose loop is still running has sent its k-th report. Its metrics are rank 0's (the
lowest rank's, if rank 0 already finished), plus ``training_iteration`` (k, from 1),
``time_this_iter_s``, ``time_total_s`` and ``timestamp`` (wall-clock seconds: the
clock given as ``now`` plus ``wall_offset``). When any rank sent a checkpoint
with it, the checkpoint directory (``checkpoint_{k-1:06d}`` unless the loop named it)
is registered with those metrics.

On a failure (a rank raised, or its process died) the run restarts from the latest
checkpoint while ``max_failures`` allows (-1: always); the reports made after that
checkpoint are dropped, so the restarted loop reports those iterations again and the
history has each iteration once. Without a checkpoint the restart begins from scratch.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping
from typing import Any

from nbcluster.train._config import CheckpointConfig

__all__ = [
    "AUTO_METRICS",
    "CheckpointBook",
    "CheckpointRecord",
    "DeleteCheckpoints",
    "Fail",
    "Finished",
    "Instruction",
    "Reported",
    "Restart",
    "RunState",
    "Stopped",
    "checkpoint_dir_name",
]

#: The metrics every report gets on top of what the loop reported.
AUTO_METRICS = ("training_iteration", "time_this_iter_s", "time_total_s", "timestamp")


def checkpoint_dir_name(index: int) -> str:
    """The directory of the checkpoint reported with the ``index``-th report (from 0)."""
    return f"checkpoint_{index:06d}"


@dataclasses.dataclass(frozen=True)
class CheckpointRecord:
    """A registered checkpoint: its directory name, iteration and metrics."""

    name: str
    iteration: int
    metrics: Mapping[str, Any]

    def to_json(self) -> dict[str, Any]:
        """A JSON-friendly dict (for the run's state file)."""
        return {"name": self.name, "iteration": self.iteration, "metrics": dict(self.metrics)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> CheckpointRecord:
        """The inverse of :meth:`to_json`."""
        return cls(str(data["name"]), int(data["iteration"]), dict(data.get("metrics") or {}))


class CheckpointBook:
    """Which checkpoints to keep: all, the ``num_to_keep`` most recent, or the best by a
    metric; the latest one is kept in every case (a restart resumes from it)."""

    def __init__(self, config: CheckpointConfig, records: Iterable[CheckpointRecord] = ()) -> None:
        self.config = config
        self.records: list[CheckpointRecord] = list(records)

    @property
    def latest(self) -> CheckpointRecord | None:
        """The most recent checkpoint."""
        return self.records[-1] if self.records else None

    def score(self, record: CheckpointRecord) -> float:
        """The record's value of ``checkpoint_score_attribute`` (bigger is better)."""
        attr = self.config.checkpoint_score_attribute
        assert attr is not None
        value = float(record.metrics[attr])
        if math.isnan(value):
            return -math.inf
        return value if self.config.checkpoint_score_order == "max" else -value

    def check(self, name: str, metrics: Mapping[str, Any]) -> None:
        """Raise ``ValueError`` if ``metrics`` cannot rank a checkpoint (missing score)."""
        attr = self.config.checkpoint_score_attribute
        if attr is None:
            return
        value = metrics.get(attr)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            keys = ", ".join(sorted(metrics)) or "none"
            got = "is missing" if attr not in metrics else f"is {value!r}, not a number"
            raise ValueError(
                f"CheckpointConfig(checkpoint_score_attribute={attr!r}): the metric {got} in "
                f"the report that came with {name} (its metrics: {keys}). Report {attr!r} "
                "with every checkpoint, or choose another checkpoint_score_attribute"
            )

    def add(self, record: CheckpointRecord) -> list[str]:
        """Register ``record``; return the names of the checkpoints to delete now."""
        self.check(record.name, record.metrics)
        self.records = [r for r in self.records if r.name != record.name] + [record]
        keep = self.kept_names()
        dropped = [r.name for r in self.records if r.name not in keep]
        self.records = [r for r in self.records if r.name in keep]
        return dropped

    def kept_names(self) -> set[str]:
        """Names of the records that retention keeps."""
        n = self.config.num_to_keep
        if n is None or len(self.records) <= n:
            return {r.name for r in self.records}
        if self.config.checkpoint_score_attribute is None:
            chosen = self.records[-n:]
        else:
            order = sorted(
                range(len(self.records)),
                key=lambda i: (self.score(self.records[i]), i),
                reverse=True,
            )
            chosen = [self.records[i] for i in order[:n]]
        names = {r.name for r in chosen}
        names.add(self.records[-1].name)
        return names

    def best(self) -> CheckpointRecord | None:
        """The best kept checkpoint by the score (the latest when there is no score)."""
        if not self.records:
            return None
        if self.config.checkpoint_score_attribute is None:
            return self.records[-1]
        return max(enumerate(self.records), key=lambda p: (self.score(p[1]), p[0]))[1]


# -- instructions ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Reported:
    """A report is complete: ``metrics`` are the run's (rank 0's plus automatic fields)."""

    iteration: int
    metrics: Mapping[str, Any]
    checkpoint: CheckpointRecord | None


@dataclasses.dataclass(frozen=True)
class DeleteCheckpoints:
    """Retention dropped these checkpoint directories (names under the run directory)."""

    names: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class Restart:
    """End the worker group and start it again; the loop resumes from ``checkpoint``.

    ``checkpoint`` is None when the run has none (the loop starts from scratch, or from
    the trainer's ``resume_from_checkpoint``). ``failures``: rank -> error text.
    """

    checkpoint: CheckpointRecord | None
    failures: Mapping[int, str]
    failure_count: int


@dataclasses.dataclass(frozen=True)
class Fail:
    """The run failed for good (``failures``: rank -> error text)."""

    failures: Mapping[int, str]


@dataclasses.dataclass(frozen=True)
class Finished:
    """Every rank's loop returned; ``return_value`` is rank 0's."""

    return_value: Any


@dataclasses.dataclass(frozen=True)
class Stopped:
    """The run was stopped (interrupt, or a callback asked); ``reason`` says which."""

    reason: str


Instruction = Reported | DeleteCheckpoints | Restart | Fail | Finished | Stopped


@dataclasses.dataclass
class _Pending:
    metrics: dict[str, Any]
    checkpoint_name: str | None


class RunState:
    """One run's reports, checkpoints and failures; see the module docstring."""

    def __init__(
        self,
        num_workers: int,
        checkpoint_config: CheckpointConfig,
        max_failures: int,
        *,
        history: Iterable[Mapping[str, Any]] = (),
        checkpoints: Iterable[CheckpointRecord] = (),
        failures: int = 0,
        now: float = 0.0,
        wall_offset: float = 0.0,
    ) -> None:
        self.num_workers = num_workers
        self.max_failures = max_failures
        self.wall_offset = wall_offset  # wall-clock time minus ``now``'s clock
        self.book = CheckpointBook(checkpoint_config, checkpoints)
        self.history: list[dict[str, Any]] = [dict(h) for h in history]
        self.failures = failures
        self.failure_log: list[Mapping[int, str]] = []
        self.time_offset = 0.0
        self.started_at = now
        self.last_report_at = now
        self.attempt = 0
        self.next_index = 0
        self.pending: list[dict[int, _Pending]] = []
        self.reported: list[int] = []
        self.done: dict[int, Any] = {}
        self.stopped: set[int] = set()
        self.stop_reason: str | None = None
        self.drop_reports = False
        self.over = False
        self.worker_state: dict[int, str] = {}
        self._truncate_to_latest()

    # -- attempts ---------------------------------------------------------------------------
    def _truncate_to_latest(self) -> None:
        """Forget reports made after the latest checkpoint: the loop redoes them."""
        latest = self.book.latest
        keep = latest.iteration if latest is not None else 0
        self.history = [h for h in self.history if int(h["training_iteration"]) <= keep]
        self.time_offset = float(self.history[-1].get("time_total_s", 0.0)) if self.history else 0.0

    def start_attempt(self, now: float) -> int:
        """A (new) worker group starts; return the report index its loops start at."""
        self.attempt += 1
        self.pending = [{} for _ in range(self.num_workers)]
        self.done = {}
        self.stopped = set()
        self.over = False
        self.started_at = now
        self.last_report_at = now
        self.next_index = len(self.history)
        self.reported = [self.next_index] * self.num_workers
        self.worker_state = dict.fromkeys(range(self.num_workers), "RUNNING")
        return self.next_index

    @property
    def resume_checkpoint(self) -> CheckpointRecord | None:
        """The checkpoint a new attempt's loops get from ``get_checkpoint()``."""
        return self.book.latest

    # -- events -----------------------------------------------------------------------------
    def on_report(
        self,
        rank: int,
        index: int,
        metrics: Mapping[str, Any],
        checkpoint_name: str | None,
        now: float,
    ) -> list[Instruction]:
        """Rank ``rank`` sent its report number ``index`` (counted over the whole run)."""
        if self.over or self.drop_reports:
            return []
        if index < self.next_index:
            return []  # already complete (cannot happen unless a worker repeats itself)
        self.pending[rank][index] = _Pending(dict(metrics), checkpoint_name)
        self.reported[rank] = max(self.reported[rank], index + 1)
        self.worker_state[rank] = "RUNNING"
        return self._complete_reports(now)

    def _complete_reports(self, now: float) -> list[Instruction]:
        out: list[Instruction] = []
        # A rank that stopped at a report will not make the reports after it: those
        # cannot complete (a rank whose loop returned just reported less: no limit).
        limit = min((self.reported[r] for r in self.stopped), default=None)
        while True:
            k = self.next_index
            if limit is not None and k >= limit:
                break
            live = [r for r in range(self.num_workers) if r not in self.done]
            if live and not all(k in self.pending[r] for r in live):
                break
            got = {
                r: self.pending[r].pop(k) for r in range(self.num_workers) if k in self.pending[r]
            }
            if not got:
                break
            out.extend(self._emit(k, got, now))
            if self.over:
                break
        return out

    def _emit(self, k: int, got: dict[int, _Pending], now: float) -> list[Instruction]:
        first = got[min(got)]
        metrics = dict(first.metrics)
        total = self.time_offset + (now - self.started_at)
        auto = {
            "training_iteration": k + 1,
            "time_this_iter_s": max(0.0, now - self.last_report_at),
            "time_total_s": total,
            "timestamp": int(self.wall_offset + now),
        }
        for key, value in auto.items():
            metrics.setdefault(key, value)
        self.last_report_at = now
        self.next_index = k + 1
        names = [p.checkpoint_name for p in got.values() if p.checkpoint_name]
        record = None
        deleted: list[str] = []
        if names:
            record = CheckpointRecord(names[0], k + 1, metrics)
            try:
                deleted = self.book.add(record)
            except ValueError as err:
                self.over = True
                return [Fail({-1: str(err)})]
        self.history.append(metrics)
        out: list[Instruction] = [Reported(k + 1, metrics, record)]
        if deleted:
            out.append(DeleteCheckpoints(tuple(deleted)))
        return out

    def on_done(self, rank: int, return_value: Any, now: float) -> list[Instruction]:
        """Rank ``rank``'s loop returned ``return_value``."""
        if self.over:
            return []
        self.done[rank] = return_value
        self.worker_state[rank] = "DONE"
        out = self._complete_reports(now)
        if self.over:
            return out
        if len(self.done) == self.num_workers:
            self.over = True
            if self.stop_reason is not None and self.stopped:
                out.append(Stopped(self.stop_reason))
            else:
                out.append(Finished(self.done.get(0)))
        return out

    def on_stopped(self, rank: int, now: float) -> list[Instruction]:
        """Rank ``rank``'s loop ended at a ``report()`` because a stop was requested;
        reports other ranks made after its last one are dropped (they cannot complete)."""
        if self.over:
            return []
        self.stopped.add(rank)
        out = self.on_done(rank, None, now)
        self.worker_state[rank] = "STOPPED"
        return out

    def request_stop(self, reason: str, keep_reports: bool = True) -> None:
        """Ask the loops to stop at their next ``report()`` (interrupt, or a callback).

        With ``keep_reports=False`` (a callback decided on the latest report) the reports
        the loops made after it are dropped; after an interrupt they are kept.
        """
        if self.stop_reason is None:
            self.stop_reason = reason
            self.drop_reports = not keep_reports

    def on_killed(self) -> list[Instruction]:
        """The controller ended the group while stopping (it did not stop in time)."""
        if self.over:
            return []
        self.over = True
        for r in range(self.num_workers):
            if r not in self.done:
                self.worker_state[r] = "KILLED"
        return [Stopped(self.stop_reason or "stopped")]

    def on_failures(self, failures: Mapping[int, str]) -> list[Instruction]:
        """Ranks failed (rank -> error text): restart from the latest checkpoint, or fail."""
        if self.over or not failures:
            return []
        self.over = True
        for r in failures:
            self.worker_state[r] = "FAILED"
        self.failure_log.append(dict(failures))
        if self.stop_reason is not None:
            return [Stopped(self.stop_reason)]
        if self.max_failures == -1 or self.failures < self.max_failures:
            self.failures += 1
            self._truncate_to_latest()
            return [Restart(self.book.latest, dict(failures), self.failures)]
        return [Fail(dict(failures))]

    # -- views ------------------------------------------------------------------------------
    @property
    def metrics(self) -> dict[str, Any] | None:
        """The latest complete report's metrics."""
        return dict(self.history[-1]) if self.history else None

    def snapshot(self) -> dict[str, Any]:
        """What the run's state file holds (JSON-friendly)."""
        return {
            "version": 1,
            "history": [dict(h) for h in self.history],
            "checkpoints": [r.to_json() for r in self.book.records],
            "failures": self.failures,
        }
