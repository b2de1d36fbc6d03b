"""Per-cell log areas without a kernel: levels, folding, which cell gets an area and when."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from typing import Any

import pytest

from nbcluster.jupyter.log_area import (
    DISPLAY_LEVEL,
    CellLogState,
    LogAreas,
    line_level,
    source_kind,
)
from nbcluster.jupyter.output import DISPLAY_STREAM, OutputRouter
from nbcluster.state import OutputRecord


@pytest.mark.parametrize(
    ("stream", "line", "level"),
    [
        ("stdout", "WARNING:x:y\n", "stdout"),
        ("stderr", "WARNING:flood:done\n", "WARNING"),
        ("stderr", "ERROR:root:bad\n", "ERROR"),
        ("stderr", "CRITICAL:a:b\n", "CRITICAL"),
        ("stderr", "INFO:a:b\n", "INFO"),
        ("stderr", "(f pid=3) DEBUG:a:b\n", "DEBUG"),
        ("stderr", "Traceback (most recent call last):\n", "stderr"),
        ("stderr", "WARNINGS are not a level\n", "stderr"),
    ],
)
def test_line_levels(stream: str, line: str, level: str) -> None:
    assert line_level(stream, line) == level


def test_source_kinds() -> None:
    assert source_kind("square") == "task"
    assert source_kind("Counter.incr") == "actor"


def test_state_keeps_the_last_lines_and_counts_the_rest() -> None:
    s = CellLogState(max_lines=3)
    s.add("f", "stdout", "a\nb", "(f pid=1) ")
    assert [line[4] for line in s.lines] == ["(f pid=1) a\n", "(f pid=1) b\n"]
    s.add("Counter.incr", "stderr", "ERROR:x:boom\nc\n", "(Counter.incr pid=2) ", dropped=10)
    assert [line[1:4] for line in s.lines] == [
        ["f", "task", "stdout"],
        ["Counter.incr", "actor", "ERROR"],
        ["Counter.incr", "actor", "stderr"],
    ]
    assert (s.total, s.folded) == (14, 11)  # 4 lines + 10 folded by the worker; 1 scrolled out
    assert s.sources == {"f": "task", "Counter.incr": "actor"}
    assert [line[0] for line in s.lines] == [2, 3, 4]
    assert s.text().endswith("[... 11 lines folded ...]\n")


class FakeWidget:
    made: list[FakeWidget] = []

    def __init__(self) -> None:
        self.model_id = f"w{len(FakeWidget.made)}"
        self.lines: list[Any] = []
        self.total = self.folded = 0
        self.sources: list[Any] = []
        self.closed = False
        self.syncs = 0
        FakeWidget.made.append(self)

    @contextlib.contextmanager
    def hold_sync(self) -> Iterator[None]:
        yield
        self.syncs += 1

    def close(self) -> None:
        self.closed = True


@pytest.fixture
def areas() -> tuple[LogAreas, list[tuple[str, Any, Any]]]:
    FakeWidget.made = []
    sent: list[tuple[str, Any, Any]] = []
    return LogAreas(lambda t, c, p: sent.append((t, c, p)), FakeWidget), sent


def test_running_cell_gets_an_area_at_its_first_output(areas: Any) -> None:
    la, sent = areas
    cell = {"msg_id": "c1"}
    la.cell_started("c1")
    assert la.add(cell, "f", "stdout", "hi\n", "(f) ", 0)
    ((kind, content, parent),) = sent
    assert kind == "display_data" and parent is cell
    assert content["data"]["application/vnd.jupyter.widget-view+json"]["model_id"] == "w0"
    la.flush()
    w = la.area("c1")
    assert [line[4] for line in w.lines] == ["(f) hi\n"] and w.syncs == 1
    la.flush()
    assert w.syncs == 1, "nothing new: nothing sent"
    # After the cell finished, output still lands in its area (late output).
    la.cell_finished(cell)
    la.cell_started("c2")
    assert la.add(cell, "f", "stdout", "late\n", "(f) ", 0)
    la.flush()
    assert [line[4] for line in w.lines][-1] == "(f) late\n"
    assert len(sent) == 1


def test_a_cell_that_submitted_gets_its_area_when_it_ends(areas: Any) -> None:
    la, sent = areas
    la.cell_started("c1")
    la.submitted("c1")
    la.cell_finished({"msg_id": "c1"})
    assert la.area("c1") is not None and len(sent) == 1
    la.cell_started("c2")
    la.cell_finished({"msg_id": "c2"})  # submitted nothing
    assert la.area("c2") is None and len(sent) == 1


def test_a_finished_cell_without_an_area_falls_back(areas: Any) -> None:
    la, sent = areas
    la.cell_started("c2")
    assert not la.add({"msg_id": "c1"}, "f", "stdout", "x\n", "", 0)
    assert not la.add({}, "f", "stdout", "x\n", "", 0)
    la.enabled = False
    assert not la.add({"msg_id": "c2"}, "f", "stdout", "x\n", "", 0)
    assert sent == []


def test_old_areas_are_closed(areas: Any, monkeypatch: Any) -> None:
    import nbcluster.jupyter.log_area as mod

    monkeypatch.setattr(mod, "MAX_AREAS", 2)
    la, _ = areas
    for i in range(3):
        la.cell_started(f"c{i}")
        la.add({"msg_id": f"c{i}"}, "f", "stdout", "x\n", "", 0)
    assert [w.closed for w in FakeWidget.made] == [True, False, False]
    assert la.area("c0") is None
    la.close()
    assert all(w.closed for w in FakeWidget.made)


HTML_BUNDLE = {"data": {"text/html": "<b>x</b>", "text/plain": "X()"}, "metadata": {}}


def test_a_display_output_is_one_line_with_its_bundle_beside() -> None:
    s = CellLogState(max_lines=3)
    s.add("f", "stdout", "before\n", "(f) ")
    s.add_display("f", HTML_BUNDLE, "(f) ")
    s.add_display("f", {"data": {"text/plain": "just text"}, "metadata": {}}, "(f) ")
    s.add_display("f", None, "(f) ", dropped=4)  # only a count of folded displays
    assert [line[3:] for line in s.lines] == [
        ["stdout", "(f) before\n"],
        [DISPLAY_LEVEL, "(f) X()\n"],
        [DISPLAY_LEVEL, "(f) just text\n"],
    ]
    assert dict(s.rich) == {2: {"data": {"text/html": "<b>x</b>"}, "metadata": {}}}
    assert (s.total, s.folded) == (7, 4)
    version = s.rich_version
    s.add("f", "stdout", "a\nb\n", "(f) ")  # the display line scrolls out, and its bundle
    assert not s.rich and s.rich_version > version


def test_only_the_latest_bundles_are_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    import nbcluster.jupyter.log_area as mod

    monkeypatch.setattr(mod, "MAX_RICH", 2)
    s = CellLogState()
    for i in range(4):
        s.add_display("Actor.m", {"data": {"image/png": f"P{i}", "text/plain": "img"}}, "")
    assert list(s.rich) == [3, 4] and len(s.lines) == 4
    assert s.sources == {"Actor.m": "actor"}
    monkeypatch.setattr(mod, "MAX_RICH_CHARS", 5)
    s.add_display("Actor.m", {"data": {"text/html": "x" * 10}}, "")
    assert not s.rich, "a bundle over the size budget shows as its text"


class RichWidget(FakeWidget):
    def __init__(self) -> None:
        super().__init__()
        self.rich_sets: list[dict[str, Any]] = []

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "rich":
            self.rich_sets.append(value)
        super().__setattr__(name, value)


def test_the_area_sends_its_bundles_only_when_they_change() -> None:
    la = LogAreas(lambda t, c, p: None, RichWidget)
    cell = {"msg_id": "c1"}
    la.cell_started("c1")
    assert la.add_display(cell, "f", HTML_BUNDLE, "(f) ", 0)
    la.flush()
    w = la.area("c1")
    assert w.rich_sets == [{"1": {"data": {"text/html": "<b>x</b>"}, "metadata": {}}}]
    la.add(cell, "f", "stdout", "text\n", "(f) ", 0)
    la.flush()
    assert len(w.rich_sets) == 1 and w.syncs == 2
    assert not la.add_display({"msg_id": "other"}, "f", HTML_BUNDLE, "", 0)


class FakeSession:
    def __init__(self) -> None:
        self.sent: list[tuple[str, dict[str, Any], str]] = []

    def send(self, socket: Any, msg_type: str, content: Any, parent: Any, ident: Any) -> None:
        self.sent.append((msg_type, content, parent.get("msg_id")))


class FakeKernel:
    def __init__(self) -> None:
        self.session = FakeSession()
        self.iopub_socket = object()
        self.shell = None


def test_in_stream_mode_a_display_follows_the_text_written_before_it() -> None:
    kernel = FakeKernel()
    router = OutputRouter(kernel, interval=60.0, mode="stream")  # the thread never sends
    try:
        cell = {"msg_id": "c1"}
        router.handle(cell, OutputRecord("f", "stdout", "before\n", 0, 7))
        router.handle(cell, OutputRecord("f", DISPLAY_STREAM, json.dumps(HTML_BUNDLE), 0, 7))
        router.handle(cell, OutputRecord("f", DISPLAY_STREAM, "", 3, 7))
        router.handle(cell, OutputRecord("f", DISPLAY_STREAM, "not json", 0, 7))
        assert kernel.session.sent == [
            ("stream", {"name": "stdout", "text": "(f pid=7) before\n"}, "c1"),
            ("display_data", {**HTML_BUNDLE, "transient": {}}, "c1"),
            (
                "stream",
                {
                    "name": "stdout",
                    "text": "(f pid=7) [... 3 more display outputs folded by the output "
                    "rate limit ...]\n",
                },
                "c1",
            ),
        ]
    finally:
        router.close()
