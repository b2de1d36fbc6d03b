"""What the Timeline shows, per cell: a pure model of task attempts (no widgets, no I/O).

:class:`TimelineData` takes finished task attempts (:class:`~nbcluster.state.TaskEvent`)
and keeps, for every attempt seen and for each cell that submitted work, the latest
``window`` attempts and a per-function summary (count, run time, failures). Which cell
submitted an attempt is asked of ``cell_of(task_id)``; an attempt whose cell is still
running (``pending(task_id)``: its ``In [n]`` is known only when it finishes) waits and
is placed by :meth:`TimelineData.resolve`. A view (:meth:`TimelineData.view`) is what
the figure draws for one cell, or for all of them.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Callable, Iterable

from nbcluster.state import TaskEvent

__all__ = ["MAX_CELLS", "FunctionSummary", "TimelineData", "TimelineView"]

#: Cells whose attempts are kept apart (the oldest cells' views are dropped beyond this).
MAX_CELLS = 100


@dataclasses.dataclass
class FunctionSummary:
    """Every attempt of one function seen so far: how many, total run time, how many failed."""

    count: int = 0
    total_s: float = 0.0
    failed: int = 0


@dataclasses.dataclass
class TimelineView:
    """The attempts of one cell (or of every cell): the latest ``window`` of them, all of
    them summarised per function, and the earliest start seen."""

    recent: collections.deque[TaskEvent]
    summary: dict[str, FunctionSummary] = dataclasses.field(default_factory=dict)
    total: int = 0
    t0: float | None = None

    def add(self, e: TaskEvent) -> None:
        """Count ``e`` and keep it among the latest."""
        s = self.summary.get(e.name)
        if s is None:
            s = self.summary[e.name] = FunctionSummary()
        s.count += 1
        s.total_s += max(e.end_time - e.start_time, 0.0)
        if e.state == "FAILED":
            s.failed += 1
        if self.t0 is None or e.start_time < self.t0:
            self.t0 = e.start_time
        self.recent.append(e)
        self.total += 1


class TimelineData:
    """Task attempts by cell (see the module docstring). Not thread-safe: the widget locks.

    ``job_id``: keep only that job's attempts. ``cell_of(task_id)``: the ``In [n]`` of the
    cell that submitted the task, or None; ``pending(task_id)``: its cell still runs.
    """

    def __init__(
        self,
        window: int,
        *,
        job_id: str | None = None,
        cell_of: Callable[[str], int | None] = lambda _: None,
        pending: Callable[[str], bool] = lambda _: False,
    ) -> None:
        if window < 1:
            raise ValueError(f"window must be at least 1 bar, got {window}")
        self.window = window
        self.job_id = job_id
        self._cell_of = cell_of
        self._pending = pending
        self.all = self._new_view()
        self._cells: collections.OrderedDict[int, TimelineView] = collections.OrderedDict()
        self._waiting: collections.deque[TaskEvent] = collections.deque(maxlen=window)

    def _new_view(self) -> TimelineView:
        return TimelineView(collections.deque(maxlen=self.window))

    def add(self, events: Iterable[TaskEvent]) -> int:
        """Add finished attempts (oldest first); return how many were kept (job filter)."""
        n = 0
        job = self.job_id
        for e in events:
            if job is not None and e.job_id != job:
                continue
            self.all.add(e)
            self._place(e)
            n += 1
        return n

    def _place(self, e: TaskEvent) -> bool:
        """Put ``e`` in its cell's view; False when its cell is not known (yet)."""
        cell = self._cell_of(e.task_id)
        if cell is None:
            if self._pending(e.task_id):
                self._waiting.append(e)
            return False
        view = self._cells.get(cell)
        if view is None:
            view = self._cells[cell] = self._new_view()
            while len(self._cells) > MAX_CELLS:
                self._cells.popitem(last=False)
        view.add(e)
        return True

    def resolve(self) -> bool:
        """Place the attempts whose cells have finished since; True when any was placed."""
        if not self._waiting:
            return False
        waiting, self._waiting = self._waiting, collections.deque(maxlen=self.window)
        placed = False
        for e in waiting:
            placed = self._place(e) or placed
        return placed

    @property
    def cells(self) -> list[int]:
        """The cells (``In [n]``) whose attempts were seen, in order."""
        return sorted(self._cells)

    def view(self, cell: int | None) -> TimelineView:
        """What to draw for ``cell`` (None: every attempt; a cell with none: an empty view)."""
        if cell is None:
            return self.all
        return self._cells.get(cell) or self._new_view()
