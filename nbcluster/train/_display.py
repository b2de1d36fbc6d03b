"""How a run shows itself: a live widget in a notebook, lines of text elsewhere.

The controller keeps a :class:`RunView` (status, workers, reports, checkpoints, notices)
and hands it to a display after each change. :func:`make_display` picks the display: the
live widget (``_widget.py``: a plotly chart of each metric against the iteration, the
workers' states, the kept checkpoints) inside a Jupyter kernel, :class:`TextDisplay`
(one line per report at most once a second, and a line per change of status) in scripts
and terminals, nothing with ``RunConfig(verbose=0)``.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from collections.abc import Mapping, Sequence
from typing import IO, Any, Protocol

from nbcluster.train._state import AUTO_METRICS, CheckpointRecord

__all__ = [
    "Display",
    "NullDisplay",
    "RunView",
    "TextDisplay",
    "WorkerRow",
    "chart_metrics",
    "in_notebook",
    "make_display",
    "summary_line",
]

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


class Display(Protocol):
    """What the controller calls."""

    def update(self, view: RunView, force: bool = False) -> None:
        """The view changed (displays may skip updates to stay a few per second)."""

    def close(self, view: RunView) -> None:
        """The run ended: show the final state."""


class NullDisplay:
    """Shows nothing (``RunConfig(verbose=0)``, or runs inside Tune trials)."""

    def update(self, view: RunView, force: bool = False) -> None:
        """Nothing."""

    def close(self, view: RunView) -> None:
        """Nothing."""


class TextDisplay:
    """Lines of text: one per change of status, one per report at most every second."""

    def __init__(self, file: IO[str] | None = None, interval: float = 1.0) -> None:
        self._file = file
        self._interval = interval
        self._status = ""
        self._notices = 0
        self._last_report = 0
        self._last_line_at = 0.0

    def _write(self, text: str) -> None:
        out = self._file or sys.stdout
        out.write(f"[train] {text}\n")
        out.flush()

    def update(self, view: RunView, force: bool = False) -> None:
        """Print what changed."""
        new = view.notice_count - self._notices
        if new > 0:
            for text in view.notices[-new:]:
                self._write(text)
        self._notices = view.notice_count
        n = len(view.history)
        now = time.monotonic()
        due = force or now - self._last_line_at >= self._interval
        if view.status != self._status:
            self._status = view.status
            if view.status not in FINAL_STATUSES:
                self._write(summary_line(view))
                self._last_line_at, self._last_report = now, n
                return
        if n != self._last_report and due and view.status not in FINAL_STATUSES:
            self._write(summary_line(view))
            self._last_line_at, self._last_report = now, n

    def close(self, view: RunView) -> None:
        """Print the final line."""
        self.update(view, force=True)
        self._write(summary_line(view) + f"; results in {view.path}")


def in_notebook() -> bool:
    """True inside a Jupyter kernel (where widgets render)."""
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    ip = get_ipython()
    return ip is not None and getattr(ip, "kernel", None) is not None


def make_display(verbose: int | None, view: RunView, widget: bool | None = None) -> Any:
    """The display for a run: none for ``verbose=0``, the widget in a notebook, else text."""
    if verbose == 0:
        return NullDisplay()
    if widget is None:
        widget = in_notebook()
    if widget:
        from nbcluster.train._widget import TrainWidget

        return TrainWidget(view)
    return TextDisplay()
