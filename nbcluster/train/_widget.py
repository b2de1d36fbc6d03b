"""The live widget of one ``fit()``: one plotly chart per metric against the iteration,
the workers' states and the kept checkpoints, updated in place a few times a second.

It is imported only when a run is shown in a notebook (ipywidgets and plotly load here,
never on ``import nbcluster.train``). All metrics share one ``FigureWidget`` (one axis
pair per metric, laid out in a grid as metrics appear), so the front end gets one
message per update however many metrics there are. Displaying it also carries a
``text/plain`` summary, which is what shows where widgets do not render; the display is
refreshed with the final summary when the run ends.
"""

from __future__ import annotations

import html
import math
import threading
import time
from typing import Any

from nbcluster.train._result import format_value, render_template
from nbcluster.train._view import FINAL_STATUSES, RunView, chart_metrics, summary_line

__all__ = ["TrainWidget"]

#: Updates sent to the front end, at most this often (seconds apart).
MIN_INTERVAL_S = 0.25
#: Points per metric sent to the chart (longer histories are thinned evenly).
MAX_POINTS = 1000
_COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b")
_STATE_COLORS = {
    "RUNNING": "#292",
    "DONE": "#666",
    "STOPPED": "#b80",
    "FAILED": "#b22",
    "KILLED": "#b22",
    "STARTING": "#888",
}


def _thin(xs: list[Any], ys: list[Any]) -> tuple[list[Any], list[Any]]:
    if len(xs) <= MAX_POINTS:
        return xs, ys
    step = math.ceil(len(xs) / MAX_POINTS)
    idx = list(range(0, len(xs), step))
    if idx[-1] != len(xs) - 1:
        idx.append(len(xs) - 1)
    return [xs[i] for i in idx], [ys[i] for i in idx]


class TrainWidget:
    """The widget (``.widget``: an ipywidgets ``VBox``) for one run."""

    def __init__(self, view: RunView, show: bool = True) -> None:
        import ipywidgets as w
        import plotly.graph_objects as go

        self._lock = threading.Lock()
        self._view = view
        self._last = 0.0
        self._pending = False
        self.metrics: list[str] = []
        self._chart_key: tuple[Any, ...] = ()
        self.header = w.HTML()
        self.fig = go.FigureWidget(
            layout={
                "height": 260,
                "margin": {"l": 50, "r": 20, "t": 30, "b": 40},
                "showlegend": False,
                "template": "plotly_white",
                "annotations": [
                    {
                        "text": "waiting for the first report",
                        "showarrow": False,
                        "xref": "paper",
                        "yref": "paper",
                        "x": 0.5,
                        "y": 0.5,
                    }
                ],
                "xaxis": {"visible": False},
                "yaxis": {"visible": False},
            }
        )
        self.workers_html = w.HTML()
        self.checkpoints_html = w.HTML()
        self.widget = w.VBox(
            [
                self.header,
                self.fig,
                w.HBox(
                    [self.workers_html, self.checkpoints_html],
                    layout=w.Layout(justify_content="space-between"),
                ),
            ]
        )
        self._handle: Any = None
        self._render(view)
        if show:
            from IPython.display import display

            self._handle = display(self, display_id=True)

    # -- Display protocol ---------------------------------------------------------------------
    def update(self, view: RunView, force: bool = False) -> None:
        """Render ``view`` now, or soon (at most every :data:`MIN_INTERVAL_S`)."""
        now = time.monotonic()
        with self._lock:
            self._view = view
            if not force and now - self._last < MIN_INTERVAL_S:
                self._pending = True
                return
            self._last = now
            self._pending = False
        self._render(view)

    def close(self, view: RunView) -> None:
        """Render the final state and refresh the text fallback."""
        self.update(view, force=True)
        if self._handle is not None:
            self._handle.update(self)

    # -- rendering ----------------------------------------------------------------------------
    def _render(self, view: RunView) -> None:
        self.header.value = self._header_html(view)
        self._render_chart(view)
        self.workers_html.value = self._workers_html(view)
        self.checkpoints_html.value = self._checkpoints_html(view)

    def _header_html(self, view: RunView) -> str:
        color = {"FAILED": "#b22", "INTERRUPTED": "#b80", "FINISHED": "#292"}.get(
            view.status, "#36c"
        )
        iteration = (
            view.history[-1].get("training_iteration", len(view.history)) if view.history else 0
        )
        limit = "∞" if view.max_failures == -1 else str(view.max_failures)
        notes = "".join(f"<div>{html.escape(n)}</div>" for n in view.notices[-3:])
        return render_template(
            "widget_header.html",
            raw=("notes",),
            trainer=view.trainer,
            name=view.name,
            status=view.status,
            color=color,
            workers=view.num_workers,
            iteration=iteration,
            elapsed=f"{view.elapsed():.1f} s",
            failures=f"{view.failures}/{limit}",
            notes=notes,
        )

    def _layout_axes(self, n: int) -> dict[str, Any]:
        cols = 1 if n == 1 else 2 if n <= 4 else 3
        rows = math.ceil(n / cols)
        gap_x, gap_y = 0.08, 0.18 / max(rows, 1)
        layout: dict[str, Any] = {"height": 240 * rows + 20, "annotations": []}
        for i, name in enumerate(self.metrics):
            r, c = divmod(i, cols)
            x0 = c / cols + (gap_x / 2 if c else 0)
            x1 = (c + 1) / cols - (gap_x / 2 if c < cols - 1 else 0)
            y1 = 1 - r / rows - (gap_y / 2 if r else 0)
            y0 = 1 - (r + 1) / rows + (gap_y / 2 if r < rows - 1 else 0)
            suffix = "" if i == 0 else str(i + 1)
            layout[f"xaxis{suffix}"] = {
                "domain": [x0, x1],
                "anchor": f"y{suffix}",
                "title": {"text": "iteration"} if r == rows - 1 else {},
                "visible": True,
            }
            layout[f"yaxis{suffix}"] = {"domain": [y0, y1], "anchor": f"x{suffix}", "visible": True}
            layout["annotations"].append(
                {
                    "text": f"<b>{html.escape(name)}</b>",
                    "showarrow": False,
                    "xref": "paper",
                    "yref": "paper",
                    "x": (x0 + x1) / 2,
                    "y": y1,
                    "yanchor": "bottom",
                    "xanchor": "center",
                }
            )
        return layout

    def _render_chart(self, view: RunView) -> None:
        last = view.history[-1].get("training_iteration") if view.history else None
        key = (len(view.history), last, view.failures)
        if key == self._chart_key:
            return
        self._chart_key = key
        names = chart_metrics(view.history)
        added = [n for n in names if n not in self.metrics]
        with self.fig.batch_update():
            if added:
                for name in added:
                    i = len(self.metrics)
                    self.metrics.append(name)
                    suffix = "" if i == 0 else str(i + 1)
                    self.fig.add_scatter(
                        x=[],
                        y=[],
                        name=name,
                        mode="lines+markers",
                        marker={"size": 5},
                        line={"color": _COLORS[i % len(_COLORS)]},
                        xaxis=f"x{suffix}",
                        yaxis=f"y{suffix}",
                    )
                self.fig.update_layout(self._layout_axes(len(self.metrics)))
            for trace, name in zip(self.fig.data, self.metrics, strict=False):
                xs, ys = [], []
                for row in view.history:
                    value = row.get(name)
                    if isinstance(value, (int, float)) and not isinstance(value, bool):
                        xs.append(row.get("training_iteration", len(xs) + 1))
                        ys.append(value if math.isfinite(value) else None)
                xs, ys = _thin(xs, ys)
                trace.x, trace.y = xs, ys

    def _workers_html(self, view: RunView) -> str:
        rows = "".join(
            "<tr>"
            f"<td>{row.rank}</td><td>{html.escape(row.node[:8])}</td><td>{row.pid or ''}</td>"
            f"<td style='color:{_STATE_COLORS.get(row.state, '#333')}'>{html.escape(row.state)}</td>"
            f"<td>{row.iteration}</td></tr>"
            for row in view.workers
        )
        return render_template("widget_workers.html", raw=("rows",), rows=rows)

    def _checkpoints_html(self, view: RunView) -> str:
        latest = view.checkpoints[-1].name if view.checkpoints else None
        rows = []
        for rec in view.checkpoints:
            shown = [k for k in rec.metrics if k in self.metrics][:2]
            score = ", ".join(
                f"{html.escape(k)}={html.escape(format_value(rec.metrics[k]))}" for k in shown
            )
            mark = " (latest)" if rec.name == latest else ""
            rows.append(
                f"<tr><td><code>{html.escape(rec.name)}</code>{mark}</td>"
                f"<td>{rec.iteration}</td><td>{score}</td></tr>"
            )
        body = "".join(rows) or "<tr><td colspan='3' style='color:#666'>none yet</td></tr>"
        return render_template("widget_checkpoints.html", raw=("rows",), rows=body)

    # -- display ----------------------------------------------------------------------------
    def text(self) -> str:
        """The text summary (what shows where widgets do not render)."""
        return summary_line(self._view)

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, Any]:
        data: dict[str, Any] = dict(
            self.widget._repr_mimebundle_(include=include, exclude=exclude) or {}
        )
        data["text/plain"] = self.text()
        return data

    def __repr__(self) -> str:
        return self.text()

    @property
    def final(self) -> bool:
        """True once the run ended."""
        return self._view.status in FINAL_STATUSES

    def flush(self) -> None:
        """Render a pending (throttled) update now."""
        with self._lock:
            pending, self._pending = self._pending, False
            self._last = time.monotonic()
        if pending:
            self._render(self._view)
