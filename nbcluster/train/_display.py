"""How a run shows itself: a live widget in a notebook, lines of text elsewhere.

The controller keeps a :class:`RunView` (``_view.py``: status, workers, reports,
checkpoints, notices) and hands it to a display after each change. :func:`make_display` picks the display: the
live widget (``_widget.py``: a plotly chart of each metric against the iteration, the
workers' states, the kept checkpoints) inside a Jupyter kernel, :class:`TextDisplay`
(one line per report at most once a second, and a line per change of status) in scripts
and terminals, nothing with ``RunConfig(verbose=0)``.
"""

from __future__ import annotations

import sys
import time
from typing import IO, Any, Protocol

from nbcluster.train._view import FINAL_STATUSES, RunView, WorkerRow, chart_metrics, summary_line

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
