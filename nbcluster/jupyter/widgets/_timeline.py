"""``Timeline``: a live Gantt chart of task attempts, a lane per worker, a colour per function."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from nbcluster.jupyter import cells as _cells
from nbcluster.jupyter.widgets._base import LiveWidget, format_seconds, node_label
from nbcluster.jupyter.widgets._feed import Feed, FeedUpdate
from nbcluster.jupyter.widgets._timeline_data import FunctionSummary, TimelineData, TimelineView
from nbcluster.state import NodeStats, TaskEvent

__all__ = ["ALL_CELLS", "FunctionSummary", "Timeline"]

_HOVER = (
    "<b>%{customdata[1]}</b><br>task %{customdata[0]}<br>duration %{customdata[2]}"
    "<br>node %{customdata[3]} · pid %{customdata[6]}"
    "<br>%{customdata[4]} (attempt %{customdata[5]})"
    "<extra></extra>"
)
_FAILED_OUTLINE = "#d62728"
#: The cell picker's value for "every cell" (cells are numbered from 1).
ALL_CELLS = 0


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
    this notebook (``%load_ext nbcluster`` records which cell submitted what). The widget
    has a cell picker above the figure (:attr:`cell_picker`, listing the cells that
    submitted work, updated live); choosing a cell there, or setting :attr:`cell`,
    redraws the figure for that cell (its own latest ``window`` attempts and summary).
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
        _check_cell(cell)
        self.window = window
        self.job_id = job_id
        self._cell = cell
        self._data = TimelineData(
            window, job_id=job_id, cell_of=_cells.cell_of, pending=_cells.cell_pending
        )
        self._head_dropped = 0
        self._nodes: dict[str, NodeStats] = {}
        self._colors: dict[str, str] = {}
        self._picker_cells: list[int] = []
        self._syncing_picker = False
        self._tracker = _cells.current_tracker()
        super().__init__(feed)
        if self._tracker is not None:
            self._tracker.add_listener(self._cell_finished)

    # -- widget -----------------------------------------------------------------------------
    def _build(self) -> Any:
        import ipywidgets
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
        self._figure = fig
        self.cell_picker = ipywidgets.Dropdown(
            options=[("all cells", ALL_CELLS)],
            value=ALL_CELLS,
            description="cell",
            layout=ipywidgets.Layout(width="max-content"),
        )
        self._sync_picker()
        self.cell_picker.observe(self._picked, names="value")
        return ipywidgets.VBox([self.cell_picker, fig])

    @property
    def figure(self) -> Any:
        """The plotly ``FigureWidget``."""
        return self._figure

    @property
    def cell(self) -> int | None:
        """The cell (``In [n]``) whose work is shown, or None for every cell."""
        return self._cell

    @cell.setter
    def cell(self, value: int | None) -> None:
        _check_cell(value)
        with self._lock:
            if value == self._cell:
                return
            self._cell = value
            self._sync_picker()
            self._redraw()

    @property
    def cells(self) -> list[int]:
        """The cells whose work this timeline has seen (what the cell picker lists)."""
        with self._lock:
            return self._data.cells

    def _picked(self, change: dict[str, Any]) -> None:
        if self._syncing_picker:
            return
        new = change.get("new")
        self.cell = None if not new else int(new)

    def _sync_picker(self) -> None:
        """List the cells seen (and the chosen one) in the picker; select the chosen one."""
        picker = self.cell_picker
        cells = self._data.cells
        if self._cell is not None and self._cell not in cells:
            cells = sorted([*cells, self._cell])
        value = ALL_CELLS if self._cell is None else self._cell
        self._syncing_picker = True
        try:
            if cells != self._picker_cells:
                self._picker_cells = cells
                picker.options = [("all cells", ALL_CELLS)] + [(f"In [{c}]", c) for c in cells]
            if picker.value != value:
                picker.value = value
            # Nothing to choose from (no cell submitted work yet, or no %load_ext): hidden.
            picker.layout.display = "" if cells else "none"
        finally:
            self._syncing_picker = False

    def _cell_finished(self, execution_count: int | None) -> None:
        """A cell finished (main thread): place its attempts, list it, redraw if needed."""
        if self._closed or not self.live:  # closed, or its views were
            if self._tracker is not None:
                self._tracker.remove_listener(self._cell_finished)
            return
        with self._lock:
            if not self._data.resolve():
                return
            self._sync_picker()
            self._redraw()

    def close(self) -> None:
        """Stop updating and close the ipywidgets (their views disappear)."""
        if self._tracker is not None:
            self._tracker.remove_listener(self._cell_finished)
        super().close()
        self.cell_picker.close()
        self._figure.close()

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
        added = self._data.add(update.events)
        if self._data.resolve() or added or changed:
            self._sync_picker()
            self._redraw()

    def _disconnected(self) -> None:
        with self._figure.batch_update():
            self._figure.layout.title.text = self._title() + "<br>(disconnected: no more updates)"

    # -- data -------------------------------------------------------------------------------
    def add_events(self, events: Iterable[TaskEvent]) -> None:
        """Add finished task attempts (oldest first) and redraw once."""
        with self._lock:
            if self._data.add(events):
                self._sync_picker()
                self._redraw()

    @property
    def _view(self) -> TimelineView:
        return self._data.view(self._cell)

    @property
    def summary(self) -> dict[str, FunctionSummary]:
        """Per function: every attempt shown (of the chosen cell), drawn or not."""
        return self._view.summary

    @property
    def total(self) -> int:
        """How many attempts are shown (of the chosen cell), drawn or summarised."""
        return self._view.total

    @property
    def shown(self) -> int:
        """How many bars the figure draws (at most ``window``)."""
        return len(self._view.recent)

    def _lane(self, e: TaskEvent) -> str:
        return f"{node_label(self._nodes.get(e.node_id), e.node_id)} · pid {e.worker_pid}"

    @property
    def lanes(self) -> list[str]:
        """The y-axis lanes currently drawn (one per worker process)."""
        with self._lock:
            return sorted({self._lane(e) for e in self._view.recent})

    def _color(self, name: str) -> str:
        color = self._colors.get(name)
        if color is None:
            from plotly.colors import qualitative

            palette = qualitative.Plotly + qualitative.D3 + qualitative.Set3
            color = self._colors[name] = palette[len(self._colors) % len(palette)]
        return color

    def _redraw(self) -> None:
        import plotly.graph_objects as go

        fig = self._figure
        view = self._view
        t0 = view.t0 or 0.0
        cols: dict[str, dict[str, list[Any]]] = {}
        lanes: set[str] = set()
        for e in view.recent:
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
        names = [n for n in view.summary if n in cols]  # order of first appearance: stable colours
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
        of = "" if self._cell is None else f" of In [{self._cell}]"
        if not self.total:
            return f"Task timeline{of}: no finished tasks yet"
        head = f"Task timeline{of}: {_attempts(self.total)}"
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
            of = "" if self._cell is None else f" of In [{self._cell}]"
            if not self.total:
                return f"Timeline{of}: no finished tasks yet"
            workers = len({(e.node_id, e.worker_pid) for e in self._view.recent})
            where = f"on {workers} worker{'' if workers == 1 else 's'}"
            if self.shown < self.total:
                where = f"(latest {self.shown:,} {where} drawn)"
            lines = [f"Timeline{of}: {_attempts(self.total)} {where}"]
            by_time = sorted(self.summary.items(), key=lambda kv: kv[1].total_s, reverse=True)
            for name, s in by_time[:10]:
                failed = f", {s.failed:,} failed" if s.failed else ""
                lines.append(
                    f"  {name}: {_attempts(s.count)}, {format_seconds(s.total_s)} total{failed}"
                )
            return "\n".join(lines)


def _check_cell(cell: Any) -> None:
    if cell is not None and (not isinstance(cell, int) or isinstance(cell, bool) or cell < 1):
        raise ValueError(f"cell is a cell's number In [n] (n >= 1) or None, got {cell!r}")


def _attempts(n: int) -> str:
    return f"{n:,} attempt" if n == 1 else f"{n:,} attempts"
