"""What a run shows: the view the controller keeps, and how it reads as text (a leaf module).

The controller fills a :class:`RunView`; the displays (``_display.py``: text, and the
widget in ``_widget.py``) render it. Both import this module, not each other.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping, Sequence
from typing import Any

from nbcluster.train._state import AUTO_METRICS, CheckpointRecord

__all__ = ["FINAL_STATUSES", "RunView", "WorkerRow", "chart_metrics", "summary_line"]

#: Statuses after which nothing changes any more.
FINAL_STATUSES = ("FINISHED", "FAILED", "INTERRUPTED", "STOPPED")


@dataclasses.dataclass
class WorkerRow:
    """One worker, as displayed."""

    rank: int
    node: str = ""
    pid: int = 0
    state: str = "STARTING"
    iteration: int = 0


@dataclasses.dataclass
class RunView:
    """Everything a display shows about a run."""

    trainer: str
    name: str
    path: str
    num_workers: int
    max_failures: int
    status: str = "STARTING"
    started: float = dataclasses.field(default_factory=time.monotonic)
    ended: float | None = None
    history: Sequence[Mapping[str, Any]] = ()
    workers: list[WorkerRow] = dataclasses.field(default_factory=list)
    checkpoints: Sequence[CheckpointRecord] = ()
    failures: int = 0
    notices: list[str] = dataclasses.field(default_factory=list)
    notice_count: int = 0

    def elapsed(self) -> float:
        """Seconds since the run started (until it ended)."""
        return (self.ended if self.ended is not None else time.monotonic()) - self.started

    def notice(self, text: str) -> None:
        """Add a line to the run's notes (kept short)."""
        self.notices.append(text)
        del self.notices[:-6]
        self.notice_count += 1


def chart_metrics(history: Sequence[Mapping[str, Any]], limit: int = 6) -> list[str]:
    """The numeric metrics worth a chart, in the order they were first reported."""
    names: list[str] = []
    for row in history:
        for key, value in row.items():
            if key in AUTO_METRICS or key in names:
                continue
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                names.append(key)
    return names[:limit]


def _fmt(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def summary_line(view: RunView) -> str:
    """``TorchTrainer x: RUNNING, iteration 3, loss=0.41, 2 workers, 4.2 s``."""
    parts = [f"{view.trainer} {view.name}: {view.status}"]
    if view.history:
        last = view.history[-1]
        parts.append(f"iteration {last.get('training_iteration', len(view.history))}")
        shown = [k for k in last if k not in AUTO_METRICS][:4]
        parts.extend(f"{k}={_fmt(last[k])}" for k in shown)
    parts.append(f"{view.num_workers} worker{'s' * (view.num_workers != 1)}")
    if view.checkpoints:
        parts.append(
            f"{len(view.checkpoints)} checkpoint(s) kept, latest {view.checkpoints[-1].name}"
        )
    if view.failures:
        limit = "∞" if view.max_failures == -1 else str(view.max_failures)
        parts.append(f"failures {view.failures}/{limit}")
    parts.append(f"{view.elapsed():.1f} s")
    return ", ".join(parts)
