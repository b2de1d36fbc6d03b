"""``Timeline``: a live Gantt chart of task attempts, a lane per worker, a colour per function."""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Iterable
from typing import Any

from nbcluster.jupyter.cells import cell_of
from nbcluster.jupyter.widgets._base import LiveWidget, format_seconds, node_label
from nbcluster.jupyter.widgets._feed import Feed, FeedUpdate
from nbcluster.state import NodeStats, TaskEvent

__all__ = ["FunctionSummary", "Timeline"]

_HOVER = (
    "<b>%{customdata[1]}</b><br>task %{customdata[0]}<br>duration %{customdata[2]}"
    "<br>node %{customdata[3]} · pid %{customdata[6]}"
    "<br>%{customdata[4]} (attempt %{customdata[5]})"
    "<extra></extra>"
)
_FAILED_OUTLINE = "#d62728"


@dataclasses.dataclass
class FunctionSummary:
    """Every attempt of one function seen so far: how many, total run time, how many failed."""

    count: int = 0
    total_s: float = 0.0
    failed: int = 0


class Timeline(LiveWidget):
    """A live timeline of finished task attempts (plotly ``FigureWidget``).

    Each worker process gets a lane (y axis: ``<node> · pid <pid>``), each task attempt a
    horizontal bar from its start to its end (x axis: seconds since the first attempt
    seen), with one trace, so one colour, per function name. Hovering a bar shows the
    task id, function, duration, node, worker pid, state and attempt; failed attempts have
    a red outline.

    **Large runs.** To stay responsive at 100,000 tasks the figure draws at most
    ``window`` bars (default 2,000): the most recently reported attempts. Every attempt
    ever seen, drawn or not, is counted in :attr:`summary` (per function: count, total run
    time, failures), which the title shows with how many attempts are not drawn. The head
    itself keeps a bounded ring of events (``task_events_capacity``), and pushes new ones
    to the kernel's feed through a bounded buffer; attempts dropped by either before this
    widget saw them are counted in the title too.

    ``job_id``: show only that job's tasks (hex id; default: every job on the cluster).
    ``cell``: show only the tasks and actor calls submitted by the cell ``In [cell]`` of
    this notebook (``%load_ext nbcluster`` records which cell submitted what).
    ``feed``: the feed to subscribe to (default: the kernel's). Call :meth:`close` to
    stop updating. :meth:`add_events` feeds events directly (tests, replays).
    """

    def __init__(
        self,
        *,
        window: int = 2000,
        job_id: str | None = None,
        cell: int | None = None,
        feed: Feed | None = None,
    ) -> None:
        if window < 1:
            raise ValueError(f"window must be at least 1 bar, got {window}")
        self.window = window
        self.job_id = job_id
        self.cell = cell
        self._recent: collections.deque[TaskEvent] = collections.deque(maxlen=window)
        self.summary: dict[str, FunctionSummary] = {}
        self.total = 0
        self._head_dropped = 0
        self._t0: float | None = None
        self._nodes: dict[str, NodeStats] = {}
        self._colors: dict[str, str] = {}
        super().__init__(feed)

    # -- widget -----------------------------------------------------------------------------
    def _build(self) -> Any:
        import plotly.graph_objects as go

        fig = go.FigureWidget(
            layout=go.Layout(
                title={"text": "Task timeline: no finished tasks yet", "font": {"size": 13}},
                barmode="overlay",
                height=260,
                margin={"l": 10, "r": 10, "t": 60, "b": 40},
                xaxis={"title": {"text": "seconds since the first task"}, "zeroline": False},
                yaxis={"type": "category", "automargin": True, "title": {"text": "worker"}},
                showlegend=True,
                legend={"title": {"text": "function"}},
                hoverlabel={"align": "left"},
            )
        )
        return fig

    @property
    def figure(self) -> Any:
        """The plotly ``FigureWidget``."""
        return self.widget

    def _apply(self, update: FeedUpdate) -> None:
        changed = False
        if update.nodes is not None:
            nodes = {n.node_id: n for n in update.nodes}
            if {k: v.name for k, v in nodes.items()} != {k: v.name for k, v in self._nodes.items()}:
                changed = True
            self._nodes.update(nodes)
        if update.dropped != self._head_dropped:
            self._head_dropped = update.dropped
            changed = True
        if self._ingest(update.events) or changed:
            self._redraw()

    def _disconnected(self) -> None:
        with self.widget.batch_update():
            self.widget.layout.title.text = self._title() + "<br>(disconnected: no more updates)"

    # -- data -------------------------------------------------------------------------------
    def add_events(self, events: Iterable[TaskEvent]) -> None:
        """Add finished task attempts (oldest first) and redraw once."""
        with self._lock:
            if self._ingest(events):
                self._redraw()

    def _ingest(self, events: Iterable[TaskEvent]) -> int:
        n = 0
        recent, summary, job, cell = self._recent, self.summary, self.job_id, self.cell
        t0 = self._t0
        for e in events:
            if job is not None and e.job_id != job:
                continue
            if cell is not None and cell_of(e.task_id) != cell:
                continue
            s = summary.get(e.name)
            if s is None:
                s = summary[e.name] = FunctionSummary()
            s.count += 1
            s.total_s += max(e.end_time - e.start_time, 0.0)
            if e.state == "FAILED":
                s.failed += 1
            if t0 is None or e.start_time < t0:
                t0 = e.start_time
            recent.append(e)
            n += 1
        self._t0 = t0
        self.total += n
        return n

    @property
    def shown(self) -> int:
        """How many bars the figure draws (at most ``window``)."""
        return len(self._recent)

    def _lane(self, e: TaskEvent) -> str:
        return f"{node_label(self._nodes.get(e.node_id), e.node_id)} · pid {e.worker_pid}"

    @property
    def lanes(self) -> list[str]:
        """The y-axis lanes currently drawn (one per worker process)."""
        with self._lock:
            return sorted({self._lane(e) for e in self._recent})

    def _color(self, name: str) -> str:
        color = self._colors.get(name)
        if color is None:
            from plotly.colors import qualitative

            palette = qualitative.Plotly + qualitative.D3 + qualitative.Set3
            color = self._colors[name] = palette[len(self._colors) % len(palette)]
        return color

    def _redraw(self) -> None:
        import plotly.graph_objects as go

        fig = self.widget
        t0 = self._t0 or 0.0
        cols: dict[str, dict[str, list[Any]]] = {}
        lanes: set[str] = set()
        for e in self._recent:
            c = cols.get(e.name)
            if c is None:
                c = cols[e.name] = {"base": [], "x": [], "y": [], "customdata": [], "line": []}
            dur = max(e.end_time - e.start_time, 0.0)
            lane = self._lane(e)
            lanes.add(lane)
            c["base"].append(e.start_time - t0)
            c["x"].append(dur)
            c["y"].append(lane)
            node = node_label(self._nodes.get(e.node_id), e.node_id)
            c["customdata"].append(
                [e.task_id, e.name, format_seconds(dur), node, e.state, e.attempt, e.worker_pid]
            )
            c["line"].append(_FAILED_OUTLINE if e.state == "FAILED" else "rgba(0,0,0,0)")
        names = [n for n in self.summary if n in cols]  # order of first appearance: stable colours
        if [t.name for t in fig.data] != names:
            fig.data = [t for t in fig.data if t.name in cols]
            have = {t.name for t in fig.data}
            for name in names:
                if name not in have:
                    fig.add_trace(
                        go.Bar(
                            name=name,
                            orientation="h",
                            marker={"color": self._color(name), "line": {"width": 1.5}},
                            hovertemplate=_HOVER,
                        )
                    )
        lane_order = sorted(lanes)
        with fig.batch_update():
            for trace in fig.data:
                c = cols[trace.name]
                trace.base = c["base"]
                trace.x = c["x"]
                trace.y = c["y"]
                trace.customdata = c["customdata"]
                trace.marker.line.color = c["line"]
            fig.layout.yaxis.categoryorder = "array"
            fig.layout.yaxis.categoryarray = lane_order
            fig.layout.height = min(900, 140 + 26 * max(len(lane_order), 3))
            fig.layout.title.text = self._title()

    def _title(self) -> str:
        if not self.total:
            return "Task timeline: no finished tasks yet"
        head = f"Task timeline: {_attempts(self.total)}"
        if self.shown < self.total:
            head += f" (latest {self.shown:,} drawn, {self.total - self.shown:,} summarised)"
        if self._head_dropped:
            head += f"; {self._head_dropped:,} events were dropped before they reached it"
        by_time = sorted(self.summary.items(), key=lambda kv: kv[1].total_s, reverse=True)
        parts = [
            f"{name} ×{s.count:,} {format_seconds(s.total_s)}"
            + (f" ({s.failed:,} failed)" if s.failed else "")
            for name, s in by_time[:5]
        ]
        if len(by_time) > 5:
            parts.append(f"+{len(by_time) - 5} more")
        return head + "<br><sup>" + " · ".join(parts) + "</sup>"

    def _text(self) -> str:
        with self._lock:
            if not self.total:
                return "Timeline: no finished tasks yet"
            workers = len({(e.node_id, e.worker_pid) for e in self._recent})
            where = f"on {workers} worker{'' if workers == 1 else 's'}"
            if self.shown < self.total:
                where = f"(latest {self.shown:,} {where} drawn)"
            lines = [f"Timeline: {_attempts(self.total)} {where}"]
            by_time = sorted(self.summary.items(), key=lambda kv: kv[1].total_s, reverse=True)
            for name, s in by_time[:10]:
                failed = f", {s.failed:,} failed" if s.failed else ""
                lines.append(
                    f"  {name}: {_attempts(s.count)}, {format_seconds(s.total_s)} total{failed}"
                )
            return "\n".join(lines)


def _attempts(n: int) -> str:
    return f"{n:,} attempt" if n == 1 else f"{n:,} attempts"
