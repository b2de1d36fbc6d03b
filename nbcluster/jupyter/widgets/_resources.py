"""``Resources``: CPU, GPU, memory and custom resources in use vs total, per node, live."""

from __future__ import annotations

from typing import Any

from nbcluster.jupyter.widgets._base import LiveWidget, format_bytes, node_label
from nbcluster.jupyter.widgets._feed import Feed, FeedUpdate
from nbcluster.state import NodeStats

__all__ = ["Resources"]

_FIRST = ("CPU", "GPU", "memory")
_HOVER = (
    "%{customdata[0]}<br>%{customdata[1]} of %{customdata[2]} in use (%{x:.0f}%)<extra></extra>"
)


def _resource_order(name: str) -> tuple[int, str]:
    return (_FIRST.index(name), "") if name in _FIRST else (len(_FIRST), name)


def _amount(name: str, value: float) -> str:
    if name == "memory":
        return format_bytes(value)
    return f"{value:g}"


class Resources(LiveWidget):
    """Live bar chart of resource use per node (plotly ``FigureWidget``).

    One row per (node, resource) with a total above zero: ``CPU``, ``GPU``, ``memory`` and
    any custom resource the node declares. The grey bar is the total (100 %), the coloured
    bar the part held by running tasks and actors, so a full row means that resource is
    saturated on that node; the text on the bar reads ``used / total``. Values come from
    the nodes' heartbeats, so they lag by up to one heartbeat.

    :attr:`usage` has the latest numbers: ``{node: {resource: (used, total)}}``.
    """

    _wants_events = False

    def __init__(self, *, feed: Feed | None = None) -> None:
        self.usage: dict[str, dict[str, tuple[float, float]]] = {}
        super().__init__(feed)

    def _build(self) -> Any:
        import plotly.graph_objects as go

        common = {"orientation": "h", "hovertemplate": _HOVER}
        return go.FigureWidget(
            data=[
                go.Bar(name="total", marker={"color": "rgba(150,150,150,0.35)"}, **common),
                go.Bar(name="in use", marker={"color": "#1f77b4"}, textposition="inside", **common),
            ],
            layout=go.Layout(
                title={"text": "Resources: waiting for the first heartbeat", "font": {"size": 13}},
                barmode="overlay",
                height=220,
                margin={"l": 10, "r": 10, "t": 50, "b": 40},
                xaxis={"range": [0, 100], "title": {"text": "% of the node's total"}},
                yaxis={"type": "category", "automargin": True, "autorange": "reversed"},
                showlegend=False,
            ),
        )

    @property
    def figure(self) -> Any:
        """The plotly ``FigureWidget``."""
        return self.widget

    def _apply(self, update: FeedUpdate) -> None:
        if update.nodes is not None:
            self.set_nodes(update.nodes)

    def set_nodes(self, nodes: list[NodeStats] | tuple[NodeStats, ...] | Any) -> None:
        """Redraw from a list of :class:`~nbcluster.state.NodeStats` (what the feed calls)."""
        with self._lock:
            usage: dict[str, dict[str, tuple[float, float]]] = {}
            for n in sorted(nodes, key=lambda n: (n.name, n.node_id)):
                if not n.alive:
                    continue
                rows = {}
                for name in sorted(n.total, key=_resource_order):
                    total = float(n.total[name])
                    if total <= 0:
                        continue
                    used = max(total - float(n.available.get(name, 0.0)), 0.0)
                    rows[name] = (used, total)
                usage[node_label(n, n.node_id)] = rows
            if usage == self.usage and self.widget.data[0].y:
                return
            self.usage = usage
            labels, pct, custom, text = [], [], [], []
            for node, rows in usage.items():
                for name, (used, total) in rows.items():
                    label = f"{node} · {name}" if len(usage) > 1 else name
                    labels.append(label)
                    pct.append(100.0 * used / total)
                    custom.append([f"{node}: {name}", _amount(name, used), _amount(name, total)])
                    text.append(f"{_amount(name, used)} / {_amount(name, total)}")
            fig = self.widget
            with fig.batch_update():
                fig.data[0].y, fig.data[0].x = labels, [100.0] * len(labels)
                fig.data[0].customdata = custom
                fig.data[1].y, fig.data[1].x = labels, pct
                fig.data[1].customdata = custom
                fig.data[1].text = text
                fig.layout.height = 90 + 28 * max(len(labels), 2)
                fig.layout.title.text = self._title()

    def totals(self) -> dict[str, float]:
        """Cluster-wide totals per resource (sum over nodes)."""
        out: dict[str, float] = {}
        for rows in self.usage.values():
            for name, (_, total) in rows.items():
                out[name] = out.get(name, 0.0) + total
        return out

    def _title(self) -> str:
        totals = self.totals()
        used: dict[str, float] = {}
        for rows in self.usage.values():
            for name, (u, _) in rows.items():
                used[name] = used.get(name, 0.0) + u
        parts = [
            f"{name} {_amount(name, used[name])}/{_amount(name, t)}" for name, t in totals.items()
        ]
        return f"Resources in use on {len(self.usage)} node(s): " + ", ".join(parts)

    def _disconnected(self) -> None:
        with self.widget.batch_update():
            self.widget.layout.title.text = self._title() + " (disconnected)"

    def _text(self) -> str:
        with self._lock:
            if not self.usage:
                return "Resources: waiting for the first heartbeat"
            lines = [f"Resources ({len(self.usage)} node(s), used / total):"]
            for node, rows in self.usage.items():
                cells = ", ".join(
                    f"{k} {_amount(k, u)}/{_amount(k, t)}" for k, (u, t) in rows.items()
                )
                lines.append(f"  {node}: {cells}")
            return "\n".join(lines)
