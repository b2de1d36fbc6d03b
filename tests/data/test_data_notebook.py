"""The notebook face of a dataset: rich repr, one progress display per execution updated
in place (widget in Jupyter, tqdm on a terminal, silent elsewhere), the live plan graph,
and ``preview()``."""

from __future__ import annotations

import io
import sys
import time
from typing import Any

import cloudpickle
import pytest

from nbcluster import data
from nbcluster.data import _progress
from nbcluster.data._plan_view import PlanView

pytestmark = pytest.mark.integration
cloudpickle.register_pickle_by_value(sys.modules[__name__])


def _slow(batch: dict) -> dict:
    time.sleep(0.05)
    return batch


def test_rich_repr_shows_schema_plan_blocks_and_escapes(shared_cluster: object) -> None:
    ds = data.from_items([{"<b>col</b>": i, "y": str(i)} for i in range(10)])
    bundle = ds._repr_mimebundle_()
    assert bundle["text/plain"].startswith(
        "MaterializedDataset(num_blocks=1, num_rows=10, schema={<b>col</b>: int64, y: string})"
    )
    html = bundle["text/html"]
    assert "&lt;b&gt;col&lt;/b&gt;" in html and "<b>col</b>" not in html.replace(
        "<b>MaterializedDataset</b>", ""
    )
    assert "10 rows" in html and "1 blocks" in html and "FromItems" in html
    lazy = ds.map_batches(lambda b: b)
    assert "num_rows=?" in repr(lazy) and "plan: FromItems -> MapBatches(<lambda>)" in repr(lazy)
    assert "unknown until it runs" in lazy._repr_mimebundle_()["text/html"]
    assert data.range(5).columns() == ["id"]


class _FakeDisplay:
    def __init__(self) -> None:
        self.shown: list[Any] = []

    def __call__(self, obj: Any) -> None:
        self.shown.append(obj)


def test_one_widget_per_execution_updated_in_place(
    shared_cluster: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("ipywidgets")
    import IPython.display

    shown = _FakeDisplay()
    monkeypatch.setattr(_progress, "in_notebook", lambda: True)
    monkeypatch.setattr(IPython.display, "display", shown)
    updates: list[str] = []
    real_update = _progress.WidgetProgress.update

    def spy(self: Any, snaps: Any, used: int, budget: int) -> None:
        real_update(self, snaps, used, budget)
        updates.append(self._table.value)

    monkeypatch.setattr(_progress.WidgetProgress, "update", spy)
    ds = data.range(400, override_num_blocks=40).map_batches(_slow).map(lambda r: r)
    started = time.monotonic()
    assert ds.count() == 400
    elapsed = time.monotonic() - started
    assert len(shown.shown) == 1  # one widget for the whole execution
    display = shown.shown[0]
    assert display._repr_mimebundle_()["text/plain"].endswith(
        ": ReadRange->MapBatches(_slow)->Map(<lambda>)"
    )
    widget = display.widget
    # A few updates a second at most (interval 0.3 s), each replacing the table in place.
    assert 1 <= len(updates) <= elapsed / 0.3 + 2
    final = widget.children[1].value
    assert "ReadRange-&gt;MapBatches(_slow)" in final and "400" in final and "done" in final
    assert "finished in" in widget.children[0].value and "budget" in widget.children[0].value


def test_tqdm_on_a_terminal_and_silence_elsewhere(
    shared_cluster: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    tty = Tty()
    monkeypatch.setattr(sys, "stderr", tty)
    data.range(100, override_num_blocks=10).map_batches(_slow).materialize()
    text = tty.getvalue()
    assert "ReadRange->MapBatches(_slow)" in text and "100" in text and "\r" in text
    plain = io.StringIO()
    monkeypatch.setattr(sys, "stderr", plain)
    data.range(100, override_num_blocks=10).materialize()
    assert plain.getvalue() == ""


def test_plan_view_follows_the_execution(shared_cluster: object) -> None:
    ds = data.range(200, override_num_blocks=20).map_batches(_slow).random_shuffle(seed=1)
    view = ds.plan_view()
    assert isinstance(view, PlanView)
    assert "[waiting]" in view.text()
    ds.materialize()
    assert view.updates >= 1
    text = view.text()
    assert "0 [done] ReadRange->MapBatches(_slow)->ShuffleMap: 200 rows" in text
    assert "1 <- 0 [done] RandomShuffle: 200 rows" in text
    assert "rows/s" in text and "in flight" in text
    view.close()


def test_plan_view_shows_which_limit_holds_an_operator(shared_cluster: object) -> None:
    ctx = data.DataContext.get_current()
    old = ctx.execution_options.resource_limits.object_store_memory
    ctx.execution_options.resource_limits.object_store_memory = 1  # every estimate is over
    try:
        ds = data.range(60, override_num_blocks=30).map_batches(_slow)
        seen: set[str] = set()
        remove = _progress.add_listener(lambda key, snaps, fin: seen.update(s.held for s in snaps))
        ds.materialize()
        remove()
    finally:
        ctx.execution_options.resource_limits.object_store_memory = old
    assert "operator budget" in seen or "total budget" in seen


def test_preview_pushes_one_block_through_every_operator(shared_cluster: object) -> None:
    ds = (
        data.range(100, override_num_blocks=4)
        .map(lambda r: {"id": r["id"], "sq": r["id"] ** 2})
        .filter(lambda r: r["id"] % 2 == 0)
        .sort("sq", descending=True)
    )
    p = ds.preview(3)
    assert [s.name for s in p.steps] == ["ReadRange", "Map(<lambda>)", "Filter(<lambda>)", "Sort"]
    assert [s.rows for s in p.steps] == [25, 25, 13, 13]
    assert p.steps[1].schema == "id: int64, sq: int64"
    assert p.steps[3].sample.column("id").to_pylist() == [24, 22, 20]
    assert "sorted within this block only" in p.steps[3].note
    assert "<table" in p._repr_html_() and "3. Sort -> 13 rows" in repr(p)
    broken = data.range(10).map(lambda r: {"x": 1 / 0})
    steps = broken.preview().steps
    assert steps[-1].note.startswith("raised ZeroDivisionError")
