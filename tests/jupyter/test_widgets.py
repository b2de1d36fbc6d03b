"""Live widgets, kernel side: a real 2-CPU cluster in this process, the feed driven by hand.

Every widget here gets its own ``Feed(autostart=False)``, so no background thread races
the test: ``poll(feed, predicate)`` runs feed ticks until the predicate holds or the
deadline passes. Workers report finished tasks to the head about once a second, so
conditions on task events are polled for, never slept for.
"""

from __future__ import annotations

import dataclasses
import io
import json
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import nbcluster
from nbcluster import state
from nbcluster._timeline import timeline
from nbcluster.jupyter.widgets import (
    DAGView,
    ObjectStore,
    Progress,
    Resources,
    Timeline,
    dashboard,
    find_ref_names,
)
from nbcluster.jupyter.widgets._feed import Feed, FeedUpdate
from nbcluster.state import TaskEvent
from nbcluster.testing import assert_no_processes, poll_for

pytestmark = pytest.mark.integration

DEADLINE_S = 30.0
N_TASKS = 50


@pytest.fixture(scope="module")
def cluster2() -> Iterator[Any]:
    """One 2-CPU cluster for this module, shut down (and leak-checked) by the finalizer."""
    if nbcluster.is_initialized():
        nbcluster.shutdown()
    info = nbcluster.init(num_cpus=2)
    yield info
    nbcluster.shutdown()
    assert_no_processes(info.session_dir, timeout=15)


@nbcluster.remote
def square(x: int) -> int:
    time.sleep(0.01)
    return x * x


@nbcluster.remote
def cube(x: int) -> int:
    return x * x * x


@nbcluster.remote
def slow(x: int) -> int:
    time.sleep(0.2)
    return x


@nbcluster.remote
def boom(x: int) -> int:
    raise ValueError(f"boom {x}")


def ring() -> list[TaskEvent]:
    """Every finished attempt the head knows of."""
    return state.task_events()[0]


def wait_for_events(name: str, n: int) -> list[TaskEvent]:
    """Wait until the head has ``n`` finished attempts of ``name``; return the whole ring."""
    poll_for(
        lambda: sum(e.name == name for e in ring()) >= n,
        DEADLINE_S,
        0.1,
        f"the head did not report {n} finished {name!r} attempts",
    )
    return ring()


@pytest.fixture(scope="module")
def fifty(cluster2: Any) -> list[TaskEvent]:
    """50 ``square`` tasks, finished and reported to the head."""
    refs = [square.remote(i) for i in range(N_TASKS)]
    assert nbcluster.get(refs, timeout=DEADLINE_S) == [i * i for i in range(N_TASKS)]
    return wait_for_events("square", N_TASKS)


def poll(feed: Feed, predicate: Callable[[], Any], what: str) -> None:
    """Run feed ticks until ``predicate()`` holds (deadline: DEADLINE_S)."""

    def tick() -> Any:
        feed.poll_once()
        return predicate()

    poll_for(tick, DEADLINE_S, 0.1, f"widget never showed {what}")


def bars(tl: Timeline) -> int:
    return sum(len(t.x or ()) for t in tl.figure.data)


def drawn_attempts(tl: Timeline) -> list[tuple[str, int]]:
    """(task id, attempt) of every bar drawn, from the figure's hover data."""
    return [(c[0], int(c[5])) for t in tl.figure.data for c in (t.customdata or ())]


@pytest.fixture
def feed() -> Iterator[Feed]:
    f = Feed(autostart=False)
    yield f
    f.stop()


# ---------------------------------------------------------------------------- Timeline


def test_timeline_one_bar_per_attempt(fifty: list[TaskEvent], feed: Feed) -> None:
    tl = Timeline(feed=feed)
    # Poll until the figure has caught up with the head (tasks of other tests may still arrive).
    poll(feed, lambda: len(fifty) <= bars(tl) == len(ring()), "every attempt the head has")
    events = ring()

    assert bars(tl) == len(events) == tl.total
    attempts = drawn_attempts(tl)
    assert len(set(attempts)) == len(attempts), "an attempt was drawn twice"
    assert set(attempts) == {(e.task_id, e.attempt) for e in events}
    by_trace = {t.name: len(t.x) for t in tl.figure.data}
    assert by_trace["square"] == N_TASKS
    assert set(by_trace) == {e.name for e in events}
    lanes = {y for t in tl.figure.data for y in t.y}
    pids = {e.worker_pid for e in events}
    assert len(lanes) == len(pids) == len(tl.lanes)
    assert all(any(f"pid {pid}" == lane.split(" · ")[-1] for lane in lanes) for pid in pids)
    assert tl.summary["square"].count == N_TASKS
    text = repr(tl)
    assert text.startswith(f"Timeline: {len(events)} attempts on {len(pids)} workers")
    assert "square: 50 attempts" in text
    tl.close()
    assert feed.subscribers == 0


def test_timeline_incremental_updates_add_only_new_attempts(fifty: list[TaskEvent]) -> None:
    feed = Feed(autostart=False)
    tl = Timeline(feed=feed)
    poll(feed, lambda: tl.total >= len(fifty), "the backfill")
    before = tl.total
    refs = [cube.remote(i) for i in range(12)]
    nbcluster.get(refs, timeout=DEADLINE_S)
    poll(
        feed,
        lambda: "cube" in tl.summary and tl.summary["cube"].count >= 12 and tl.total == len(ring()),
        "12 cube bars",
    )
    events = ring()
    assert tl.summary["cube"].count == 12
    assert tl.total == len(events) >= before + 12
    attempts = drawn_attempts(tl)
    assert len(set(attempts)) == len(attempts) == len(events)
    late = Timeline(feed=feed)  # joins later: gets the whole ring once
    feed.poll_once()
    assert late.total == tl.total == len(ring())
    tl.close()
    late.close()


def test_timeline_100k_synthetic_events_keeps_a_window(cluster2: Any, feed: Feed) -> None:
    tl = Timeline(feed=feed)
    names = ["load", "transform", "train", "evaluate", "save"]
    t0 = 1_700_000_000.0
    events = [
        TaskEvent(
            task_id=f"{i:032x}",
            job_id="ab" * 4,
            name=names[i % 5],
            node_id="cd" * 14,
            worker_id=f"{i % 8:032x}",
            worker_pid=1000 + i % 8,
            state="FAILED" if i % 1000 == 0 else "FINISHED",
            start_time=t0 + i * 0.001,
            end_time=t0 + i * 0.001 + 0.004,
            parent_task_id="",
            attempt=0,
        )
        for i in range(100_000)
    ]
    started = time.monotonic()
    for k in range(0, len(events), 10_000):  # the way the feed delivers them: in batches
        tl.add_events(events[k : k + 10_000])
    elapsed = time.monotonic() - started

    assert bars(tl) == tl.shown == tl.window == 2000
    assert tl.total == 100_000
    assert sum(s.count for s in tl.summary.values()) == 100_000
    assert {n: s.count for n, s in tl.summary.items()} == dict.fromkeys(names, 20_000)
    assert sum(s.failed for s in tl.summary.values()) == 100
    assert tl.summary["load"].total_s == pytest.approx(20_000 * 0.004, rel=1e-3)
    drawn = {tid for tid, _ in drawn_attempts(tl)}
    assert drawn == {e.task_id for e in events[-2000:]}, "the window is not the latest 2,000"
    title = tl.figure.layout.title.text
    assert "100,000 attempts" in title and "98,000 summarised" in title
    assert len(tl.lanes) == 8
    assert elapsed < 60, f"100,000 events took {elapsed:.1f}s"  # a deadline, not a benchmark
    tl.close()


def test_timeline_cell_picker_lists_cells_as_they_finish(
    cluster2: Any, feed: Feed, monkeypatch: pytest.MonkeyPatch
) -> None:
    from nbcluster.jupyter import cells

    tracker = cells.CellTracker()
    monkeypatch.setattr(cells, "_current", tracker)  # as %load_ext nbcluster makes it

    def attempt(task: str, name: str) -> TaskEvent:
        return TaskEvent(task, "ab" * 4, name, "cd" * 14, "w", 7, "FINISHED", 1.0, 1.5, "", 0)

    tl = Timeline(feed=feed)
    assert tl.cell_picker.layout.display == "none", "no cell submitted work yet"
    # In [4] submits two tasks, which finish (and reach the timeline) while it runs.
    tracker.cell_started({"msg_id": "m4"}, None)
    for task in ("a" * 32, "b" * 32):
        tracker.observe(task, "f", {"msg_id": "m4"})
    tl.add_events([attempt("a" * 32, "f"), attempt("b" * 32, "f"), attempt("c" * 32, "g")])
    assert tl.cells == [] and tl.total == 3
    tracker.cell_finished(4)
    assert [label for label, _ in tl.cell_picker.options] == ["all cells", "In [4]"]
    assert tl.cell_picker.layout.display == ""
    tl.cell_picker.value = 4  # what choosing it in the front end does
    assert tl.cell == 4 and bars(tl) == 2 and tl.total == 2
    assert [t.name for t in tl.figure.data] == ["f"]
    assert tl.figure.layout.title.text.startswith("Task timeline of In [4]: 2 attempts")
    assert repr(tl).startswith("Timeline of In [4]: 2 attempts")
    tl.cell = None
    assert tl.cell_picker.value == 0 and bars(tl) == 3
    tl.cell = 9  # a cell with no work (yet): listed, drawn empty
    assert [v for _, v in tl.cell_picker.options] == [0, 4, 9] and bars(tl) == 0
    with pytest.raises(ValueError, match=r"cell is a cell's number In \[n\] \(n >= 1\)"):
        tl.cell = 0
    tl.close()
    tracker.cell_finished(5)
    assert not tracker._listeners, "a closed timeline stops listening"


# ---------------------------------------------------------------------------- timeline()


def test_chrome_trace_file(fifty: list[TaskEvent], tmp_path: Any) -> None:
    path = tmp_path / "trace.json"
    returned = timeline(path)
    loaded = json.loads(path.read_text())
    assert loaded == returned
    complete = [e for e in loaded if e["ph"] == "X"]
    squares = [e for e in complete if e["name"] == "square"]
    assert len(squares) == N_TASKS
    assert len(complete) == len(ring())
    for e in squares:
        assert set(e) >= {"name", "cat", "ph", "ts", "dur", "pid", "tid", "args"}
        assert isinstance(e["pid"], int) and isinstance(e["tid"], int)
        assert e["dur"] >= 0 and e["ts"] > 1e15  # microseconds since the epoch
        assert e["args"]["state"] == "FINISHED"
    assert {e["tid"] for e in squares} <= {e.worker_pid for e in fifty}
    meta = [e for e in loaded if e["ph"] == "M"]
    assert {e["name"] for e in meta} == {"process_name", "thread_name"}


# ---------------------------------------------------------------------------- Resources


def test_resources_show_total_cpu(cluster2: Any, feed: Feed) -> None:
    res = Resources(feed=feed)
    poll(feed, lambda: res.usage, "a heartbeat")
    assert res.totals()["CPU"] == 2
    [node] = res.usage.values()
    assert node["CPU"][1] == 2 and 0 <= node["CPU"][0] <= 2
    fig = res.figure
    rows = list(fig.data[1].y)
    cpu_text = fig.data[1].text[rows.index("CPU")]
    assert cpu_text.endswith("/ 2")
    assert "CPU" in repr(res) and "/2" in repr(res)
    res.close()


# ---------------------------------------------------------------------------- ObjectStore


def test_object_store_names_the_variables_holding_a_ref(cluster2: Any, feed: Feed) -> None:
    big = nbcluster.put(b"x" * 3_000_000)
    small = nbcluster.put(1)
    ns = {
        "big_ref": big,
        "pair": (small, big),
        "by_key": {"<b>k</b>": big},
        "Out": {7: big},
        "_7": big,
        "_": big,  # IPython's last-output alias: not a name worth showing
        "_i7": "big_ref",
        "unrelated": [1, 2, 3],
    }
    store = ObjectStore(user_ns=ns, feed=feed)
    poll(feed, lambda: store.rows and store.rows[0].object_id == big.hex(), "the big object first")
    top = store.rows[0]
    assert top.size >= 3_000_000
    assert set(top.names) == {"big_ref", "pair[1]", "by_key['<b>k</b>']", "Out[7]", "_7"}
    html = store.table.value
    assert "big_ref" in html
    assert "&lt;b&gt;k&lt;/b&gt;" in html and "<b>k</b>" not in html
    poll(
        feed,
        lambda: any(
            t.name.endswith(" used") and max(t.y or (0,)) >= 3_000_000 for t in store.figure.data
        ),
        "the store use of the big object",
    )
    assert "big_ref" in repr(store)
    store.close()


def test_find_ref_names_one_level_deep(cluster2: Any) -> None:
    ref = nbcluster.put("v")
    ns = {"a": ref, "nested": [[ref]], "t": (0, ref), "Out": {2: [ref]}, "__": ref}
    assert find_ref_names(ns) == {ref.hex(): ["a", "t[1]", "Out[2][0]"]}
    assert find_ref_names(ns, {"0" * 40}) == {}


# ---------------------------------------------------------------------------- progress


def test_progress_text_reaches_n_of_n(cluster2: Any, feed: Feed) -> None:
    refs = [slow.remote(i) for i in range(8)]
    out = io.StringIO()
    p = Progress(refs, widget=False, file=out, feed=feed)
    assert p.total == 8
    poll(feed, lambda: p.complete, "8/8")
    assert (p.done, p.failed) == (8, 0)
    assert out.getvalue().splitlines()[-1] == "[" + "#" * 30 + "] 8/8"
    assert repr(p) == "Progress(8/8 done)"
    assert feed.subscribers == 0, "a finished progress bar must leave the feed"
    assert p.wait(timeout=0)


def test_progress_widget_counts_failures(cluster2: Any, feed: Feed) -> None:
    refs = [slow.remote(1), boom.remote(2), slow.remote(3)]
    p = Progress(refs, widget=True, display=False, feed=feed)
    assert p.wait(timeout=DEADLINE_S)
    assert p._bar.value == 3 and p._bar.max == 3
    assert p._label.value == "3/3 done, 1 failed"
    assert p._bar.bar_style == "danger"


# ---------------------------------------------------------------------------- DAGView


def test_dag_view_layout_and_live_states(cluster2: Any, feed: Feed) -> None:
    a = nbcluster.put(2)
    b = slow.remote(a)
    c = square.remote(b)
    d = boom.remote(0)
    dag = DAGView([a, b, c, d], edges=[(a, b), (b, c)], feed=feed)
    depth = {
        name: dag.nodes[r.task_id().hex()].depth
        for name, r in zip("abcd", [a, b, c, d], strict=True)
    }
    assert depth == {"a": 0, "b": 1, "c": 2, "d": 0}
    poll(
        feed, lambda: dag.counts()["finished"] == 3 and dag.counts()["failed"] == 1, "final states"
    )
    drawn = {t.name: len(t.x) for t in dag.figure.data[1:]}
    assert drawn == {"pending": 0, "running": 0, "finished": 3, "failed": 1}
    poll(feed, lambda: dag.nodes[c.task_id().hex()].name == "square", "task names from events")
    assert "3 finished, 1 failed" in repr(dag)
    dag.close()


# ---------------------------------------------------------------------------- feed, dashboard


def test_dashboard_tabs_and_close(cluster2: Any, feed: Feed) -> None:
    dash = dashboard(feed=feed)
    assert dash.widget.titles == ("Timeline", "Resources", "Object store")
    assert feed.subscribers == 3
    feed.poll_once()
    bundle = dash._repr_mimebundle_()
    assert "application/vnd.jupyter.widget-view+json" in bundle
    assert bundle["text/plain"].startswith("Timeline")
    dash.close()
    assert feed.subscribers == 0


def test_text_plain_fallbacks(cluster2: Any, feed: Feed) -> None:
    widgets = [Timeline(feed=feed), Resources(feed=feed), ObjectStore(user_ns={}, feed=feed)]
    feed.poll_once()
    for w in widgets:
        bundle = w._repr_mimebundle_()
        assert bundle["text/plain"] == repr(w) and bundle["text/plain"]
        w.close()
        assert w._repr_mimebundle_() == {"text/plain": repr(w)}


def test_feed_pushes_changes_and_stays_quiet_when_idle(cluster2: Any) -> None:
    feed = Feed(interval=0.1)
    got: list[FeedUpdate] = []
    feed.subscribe(got.append)
    poll_for(lambda: got, DEADLINE_S, 0.05, "the first update")
    first = got[0]
    assert first.backfill and first.nodes, "a new subscriber gets the nodes and the ring at once"
    assert feed.subscribed and feed.running

    def settled() -> bool:  # nothing new for a second (late heartbeats of earlier tests)
        n = len(got)
        time.sleep(1.0)
        return len(got) == n

    poll_for(settled, DEADLINE_S, 0, "the feed to settle")
    idle_at, requests = len(got), feed.requests
    time.sleep(2.0)
    assert len(got) == idle_at, "an idle cluster must not produce updates"

    assert nbcluster.get([cube.remote(i) for i in range(4)], timeout=DEADLINE_S) == [0, 1, 8, 27]
    poll_for(
        lambda: sum(e.name == "cube" for u in got[idle_at:] for e in u.events) >= 4,
        DEADLINE_S,
        0.05,
        "the cube attempts, pushed",
    )
    assert any(u.nodes for u in got[idle_at:]), "the busy node was pushed too"
    assert feed.requests == requests, "the feed asked the head for something: it polled"
    feed.unsubscribe(got.append)
    poll_for(lambda: not feed.running and not feed.subscribed, DEADLINE_S, 0.05, "the feed to stop")


class FakeStream:
    """A subscription whose batches the test pushes by hand."""

    def __init__(self, callback: Callable[[Any], None]) -> None:
        self.push = callback
        self.error = None
        self.closed = False

    def wait_ready(self, timeout: float) -> bool:
        return True

    def close(self) -> None:
        self.closed = True


def test_feed_reports_what_the_stream_dropped_and_dedupes_the_backfill(cluster2: Any) -> None:
    streams: list[FakeStream] = []

    def subscribe(callback: Callable[[Any], None], **kw: Any) -> FakeStream:
        streams.append(FakeStream(callback))
        callback(state.EventBatch((), snapshot=True))
        return streams[-1]

    feed = Feed(autostart=False, subscribe=subscribe)
    tl = Timeline(feed=feed)
    feed.poll_once()
    ring_total = tl.total
    assert ring_total == len(ring())
    (stream,) = streams
    old = ring()[-1]  # pushed again although the backfill already had it
    new = dataclasses.replace(old, task_id="f" * 32, name="pushed")
    stream.push(
        state.EventBatch(
            (
                state.ClusterEvent(10, time.time(), "task", old),
                state.ClusterEvent(50, time.time(), "dropped", 39),
                state.ClusterEvent(51, time.time(), "task", new),
            )
        )
    )
    feed.poll_once()
    assert tl.total == ring_total + 1 and tl.summary["pushed"].count == 1
    assert "39 events were dropped before they reached it" in tl.figure.layout.title.text
    tl.close()
    feed.stop()
    assert stream.closed


def test_feed_drops_subscribers_of_another_connection(cluster2: Any, feed: Feed) -> None:
    got: list[FeedUpdate] = []
    sub = feed.subscribe(got.append)
    sub.session = "0" * 16  # as if subscribed before a shutdown() + init()
    feed.poll_once()
    assert [u.connected for u in got] == [False]
    assert feed.subscribers == 0


def test_importing_widgets_does_not_import_plotly() -> None:
    code = (
        "import sys, nbcluster, nbcluster.jupyter.widgets, nbcluster._timeline\n"
        "heavy = [m for m in ('plotly', 'ipywidgets', 'anywidget') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=DEADLINE_S)
