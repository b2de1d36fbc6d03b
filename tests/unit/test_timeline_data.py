"""The Timeline's model without widgets or processes: attempts by cell, placed when known."""

from __future__ import annotations

import pytest

from nbcluster.jupyter.widgets import _timeline_data
from nbcluster.jupyter.widgets._timeline_data import TimelineData
from nbcluster.state import TaskEvent


def event(
    task: str, name: str = "f", start: float = 10.0, job: str = "j1", state: str = "FINISHED"
) -> TaskEvent:
    return TaskEvent(
        task_id=task,
        job_id=job,
        name=name,
        node_id="n1",
        worker_id="w1",
        worker_pid=1,
        state=state,
        start_time=start,
        end_time=start + 0.5,
        parent_task_id="",
        attempt=0,
    )


class Cells:
    """A stand-in for the kernel's CellTracker: task -> cell, and the cell running now."""

    def __init__(self) -> None:
        self.of: dict[str, int | None] = {}
        self.running: set[str] = set()

    def cell_of(self, task: str) -> int | None:
        return self.of.get(task)

    def pending(self, task: str) -> bool:
        return task in self.running


def data(window: int = 100, **kw: object) -> tuple[TimelineData, Cells]:
    cells = Cells()
    return TimelineData(window, cell_of=cells.cell_of, pending=cells.pending, **kw), cells  # type: ignore[arg-type]


def test_attempts_are_kept_per_cell_and_for_all() -> None:
    d, cells = data()
    cells.of.update({"a1": 3, "a2": 3, "b1": 5})
    assert (
        d.add(
            [
                event("a1", "square", 12.0),
                event("b1", "cube", 11.0),
                event("a2", "square", 13.0, state="FAILED"),
                event("x", "other"),
            ]
        )
        == 4
    )
    assert d.cells == [3, 5]
    three = d.view(3)
    assert [e.task_id for e in three.recent] == ["a1", "a2"]
    assert (three.total, three.t0) == (2, 12.0)
    assert (three.summary["square"].count, three.summary["square"].failed) == (2, 1)
    assert three.summary["square"].total_s == pytest.approx(1.0)
    assert d.view(None).total == 4 and d.view(None).t0 == 10.0
    assert set(d.view(None).summary) == {"square", "cube", "other"}
    assert d.view(9).total == 0 and not d.view(9).recent  # a cell with no work


def test_attempts_of_a_running_cell_wait_until_it_finishes() -> None:
    d, cells = data()
    cells.running = {"r1", "r2"}  # submitted by the cell that runs now: no In [n] yet
    d.add([event("r1"), event("r2"), event("nobody")])
    assert d.cells == [] and d.view(None).total == 3
    assert d.resolve() is False, "still running"
    cells.running = set()
    cells.of.update({"r1": 7})  # r2's cell finished without a number (store_history off)
    assert d.resolve() is True
    assert d.cells == [7] and [e.task_id for e in d.view(7).recent] == ["r1"]
    assert d.resolve() is False, "nothing left waiting"


def test_windows_jobs_and_the_number_of_cells_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_timeline_data, "MAX_CELLS", 2)
    d, cells = data(window=2, job_id="j1")
    cells.of.update({f"t{i}": i // 3 + 1 for i in range(9)})  # 3 tasks each of In [1..3]
    d.add([event(f"t{i}") for i in range(9)] + [event("other-job", job="j2")])
    assert d.view(None).total == 9 and len(d.view(None).recent) == 2
    assert d.cells == [2, 3], "the oldest cell's view was dropped"
    assert d.view(3).total == 3 and len(d.view(3).recent) == 2
    with pytest.raises(ValueError, match="window must be at least 1 bar"):
        TimelineData(0)
