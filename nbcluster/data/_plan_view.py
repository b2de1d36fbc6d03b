"""``Dataset.plan_view()``: the physical plan as a live graph (a plotly ``FigureWidget``).

Operators are drawn left to right (sources first, a column per depth), each a marker
labelled with its name and, while the dataset runs, its throughput (rows/s), its bytes in
flight and queued input, and — when the scheduler holds it back — which limit holds it
(``operator budget``, ``total budget``, ``CPUs busy``, ``actors busy``...). Colours: grey
not started, blue running, orange held back, green done. The view listens to the
executor's progress ticks for this dataset's plan, so it updates a few times a second
while ``ds.materialize()``, ``ds.iter_batches()``... run in the same kernel. Outside
Jupyter it shows the same as text.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from nbcluster.data._logical import LogicalOp
from nbcluster.data._optimizer import optimize, to_physical
from nbcluster.data._progress import add_listener, in_notebook
from nbcluster.data._stats import OpSnapshot, format_bytes, format_count
from nbcluster.data.context import DataContext

__all__ = ["PlanView", "node_state"]

STATE_COLORS = {"waiting": "#bbbbbb", "running": "#1f77b4", "held": "#ff7f0e", "done": "#2ca02c"}


def node_state(s: OpSnapshot) -> str:
    """``waiting``, ``running``, ``held`` or ``done``."""
    if s.done:
        return "done"
    if s.held and s.held not in ("waiting for input",):
        return "held"
    if s.tasks_running or s.blocks_out:
        return "running"
    return "waiting"


def _label(s: OpSnapshot) -> str:
    lines = [s.name if len(s.name) <= 32 else s.name[:31] + "…"]
    lines.append(f"{format_count(s.rows_per_s)} rows/s · {format_count(s.rows_out)} rows")
    lines.append(f"{format_bytes(s.usage_bytes)} in flight · {format_bytes(s.queued_bytes)} queued")
    if s.held and not s.done:
        lines.append(f"held: {s.held}")
    return "<br>".join(lines)


class PlanView:
    """A live drawing of a dataset's physical plan (see the module docstring)."""

    def __init__(self, plan: LogicalOp, context: DataContext) -> None:
        self._key = id(plan)
        phys = to_physical(optimize(plan))
        self.names = [p.name for p in phys]
        self.inputs = [p.inputs for p in phys]
        self.snapshots = [OpSnapshot(p.name, p.kind) for p in phys]
        self.depth: list[int] = []
        for ins in self.inputs:
            self.depth.append(1 + max((self.depth[j] for j in ins), default=-1))
        self.row: list[float] = []
        per_depth: dict[int, int] = {}
        for d in self.depth:
            self.row.append(float(per_depth.get(d, 0)))
            per_depth[d] = per_depth.get(d, 0) + 1
        self.updates = 0
        self._lock = threading.Lock()
        self.widget: Any = self._build() if in_notebook() else None
        self._remove = add_listener(self._on_tick)

    def _build(self) -> Any:
        try:
            import plotly.graph_objects as go
        except ImportError:
            return None
        ex: list[float | None] = []
        ey: list[float | None] = []
        for i, ins in enumerate(self.inputs):
            for j in ins:
                ex += [self.depth[j], self.depth[i], None]
                ey += [-self.row[j], -self.row[i], None]
        fig = go.FigureWidget(
            data=[
                go.Scatter(
                    x=ex,
                    y=ey,
                    mode="lines",
                    line={"color": "#999"},
                    hoverinfo="skip",
                    showlegend=False,
                ),
                go.Scatter(
                    x=self.depth,
                    y=[-r for r in self.row],
                    mode="markers+text",
                    text=[_label(s) for s in self.snapshots],
                    textposition="bottom center",
                    marker={
                        "size": 22,
                        "color": [STATE_COLORS[node_state(s)] for s in self.snapshots],
                        "line": {"width": 1, "color": "#444"},
                    },
                    hoverinfo="text",
                    showlegend=False,
                ),
            ],
            layout=go.Layout(
                title={"text": "Dataset plan", "font": {"size": 13}},
                height=200 + 90 * max(int(max(self.row, default=0)), 0),
                margin={"l": 30, "r": 30, "t": 40, "b": 10},
                xaxis={"visible": False, "range": [-0.6, max(self.depth, default=0) + 0.6]},
                yaxis={"visible": False, "range": [-max(self.row, default=0) - 1.2, 0.5]},
            ),
        )
        return fig

    def _on_tick(self, key: int, snaps: Sequence[OpSnapshot], finished: bool) -> None:
        if key != self._key or len(snaps) != len(self.snapshots):
            return
        with self._lock:
            self.snapshots = list(snaps)
            self.updates += 1
            fig = self.widget
            if fig is None:
                return
            with fig.batch_update():
                fig.data[1].text = [_label(s) for s in self.snapshots]
                fig.data[1].marker.color = [STATE_COLORS[node_state(s)] for s in self.snapshots]

    def close(self) -> None:
        """Stop listening (and close the widget)."""
        self._remove()
        if self.widget is not None:
            self.widget.close()

    def text(self) -> str:
        """The plan as text, an operator per line with its numbers."""
        lines = ["Dataset plan:"]
        for i, s in enumerate(self.snapshots):
            src = f" <- {', '.join(str(j) for j in self.inputs[i])}" if self.inputs[i] else ""
            lines.append(f"  {i}{src} [{node_state(s)}] {s.line()}")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return self.text()

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, Any]:
        data: dict[str, Any] = {}
        if self.widget is not None:
            data.update(self.widget._repr_mimebundle_(include=include, exclude=exclude) or {})
        data["text/plain"] = self.text()
        return data
