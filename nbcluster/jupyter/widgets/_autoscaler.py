"""``Autoscaler``: the cluster growing under load and shrinking when idle, live.

A plotly ``FigureWidget`` with, over time, the number of live nodes and the pending
demand (queued requests the autoscaler saw), and a marker for every scaling event
(launch, joined, removed, failed launch, infeasible request) whose hover text is the
event's message. A line above it summarizes the autoscaler. Everything comes from the
head through :func:`nbcluster.state.autoscaler_status`, asking only for events after the
last one seen, when the head pushes news: a node changed, or the autoscaler reported
events or new demand (never while the cluster is idle).
"""

from __future__ import annotations

import time
from typing import Any

from nbcluster import state
from nbcluster.jupyter.widgets._base import LiveWidget
from nbcluster.jupyter.widgets._feed import Feed, FeedUpdate

__all__ = ["Autoscaler"]

#: Points kept per series (10 minutes at the feed's default 2 Hz).
MAX_POINTS = 1200
_COLORS = {
    "launch": "#2ca02c",
    "joined": "#1f77b4",
    "terminate": "#ff7f0e",
    "removed": "#7f7f7f",
    "launch-failed": "#d62728",
    "terminate-failed": "#d62728",
    "infeasible": "#9467bd",
}


class Autoscaler(LiveWidget):
    """Live view of the autoscaler: nodes and pending demand over time, and its events.

    :attr:`status` is the latest :class:`nbcluster.autoscaler.AutoscalerStatus`;
    :attr:`events` every scaling event seen since the widget was made (oldest first);
    :attr:`nodes` and :attr:`pending` are the plotted series as (time, value) pairs.
    """

    _wants_events = False

    def __init__(self, *, feed: Feed | None = None) -> None:
        self.status: Any = None
        self.events: list[Any] = []
        self.nodes: list[tuple[float, int]] = []
        self.pending: list[tuple[float, int]] = []
        self._seq = 0
        self._t0 = time.time()
        super().__init__(feed)

    def _build(self) -> Any:
        import ipywidgets
        import plotly.graph_objects as go

        self._label = ipywidgets.Label(value="Autoscaler: waiting for its first report")
        self._figure = go.FigureWidget(
            data=[
                go.Scatter(name="nodes", mode="lines", line={"shape": "hv", "color": "#1f77b4"}),
                go.Scatter(
                    name="pending requests",
                    mode="lines",
                    line={"shape": "hv", "color": "#ff7f0e", "dash": "dot"},
                    yaxis="y2",
                ),
                go.Scatter(
                    name="events",
                    mode="markers",
                    marker={"size": 10, "symbol": "diamond"},
                    hovertemplate="%{text}<extra></extra>",
                ),
            ],
            layout=go.Layout(
                height=280,
                margin={"l": 40, "r": 40, "t": 30, "b": 40},
                xaxis={"title": {"text": "seconds"}},
                yaxis={"title": {"text": "nodes"}, "rangemode": "tozero", "dtick": 1},
                yaxis2={
                    "title": {"text": "pending"},
                    "overlaying": "y",
                    "side": "right",
                    "rangemode": "tozero",
                },
                legend={"orientation": "h", "y": 1.15},
            ),
        )
        return ipywidgets.VBox([self._label, self._figure])

    @property
    def figure(self) -> Any:
        """The plotly ``FigureWidget``."""
        return self._figure

    def _apply(self, update: FeedUpdate) -> None:
        if update.nodes is None and not update.autoscaler:
            return  # the head pushed nothing the autoscaler view shows
        try:
            st = state.autoscaler_status(after_seq=self._seq)
        except Exception:  # noqa: BLE001 - a head restart: the next tick tries again
            return
        live = sum(1 for n in update.nodes or () if n.alive) if update.nodes is not None else None
        self.record(st, update.time, live)

    def record(self, st: Any, now: float, live_nodes: int | None) -> None:
        """Add one status reading (what the feed calls; tests call it directly)."""
        with self._lock:
            self.status = st
            if st.events:
                self.events.extend(st.events)
                self._seq = max(self._seq, st.last_seq)
            t = now - self._t0
            if live_nodes is not None:
                self.nodes.append((t, live_nodes))
            self.pending.append((t, sum(n for _, n in st.pending)))
            del self.nodes[:-MAX_POINTS], self.pending[:-MAX_POINTS]
            shown = [e for e in self.events if e.time >= self._t0 - 1][-200:]
            fig = self._figure
            with fig.batch_update():
                fig.data[0].x, fig.data[0].y = (
                    [p[0] for p in self.nodes],
                    [p[1] for p in self.nodes],
                )
                fig.data[1].x = [p[0] for p in self.pending]
                fig.data[1].y = [p[1] for p in self.pending]
                fig.data[2].x = [max(0.0, e.time - self._t0) for e in shown]
                fig.data[2].y = [self._nodes_at(e.time - self._t0) for e in shown]
                fig.data[2].text = [f"{e.kind}: {e.message}" for e in shown]
                fig.data[2].marker.color = [_COLORS.get(e.kind, "#444") for e in shown]
            self._label.value = st.summary() if st.enabled else "Autoscaler: off for this cluster"

    def _nodes_at(self, t: float) -> int:
        value = self.nodes[0][1] if self.nodes else 0
        for at, n in self.nodes:
            if at > t:
                break
            value = n
        return value

    def _disconnected(self) -> None:
        self._label.value = self._label.value + " (disconnected)"

    def _text(self) -> str:
        with self._lock:
            if self.status is None:
                return "Autoscaler: waiting for its first report"
            lines = [self.status.summary()]
            for e in self.events[-8:]:
                stamp = time.strftime("%H:%M:%S", time.localtime(e.time))
                lines.append(f"  {stamp} {e.kind}: {e.message}")
            return "\n".join(lines)


def has_autoscaler() -> bool:
    """True when the connected cluster has an autoscaler (started here, or reporting)."""
    cluster = state.local_cluster()
    if cluster is not None and getattr(cluster, "monitor", None) is not None:
        return True
    try:
        return bool(state.autoscaler_status().enabled)
    except Exception:  # noqa: BLE001
        return False
