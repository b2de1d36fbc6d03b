"""The trial runner without a cluster: one trial at a time, each with its own session.

The runner's class is used directly (no actor): ``_start`` and ``step`` are what the
actor's ``step``/``notify`` calls run.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Any

import pytest

from nbcluster import train
from nbcluster.tune.execution import runner as runner_module
from nbcluster.tune.execution.runner import TrialRunner


def _spec(name: str) -> dict[str, Any]:
    return {"config": {"name": name}, "trial_name": name, "max_results_ahead": 256}


def _collect(runner: TrialRunner, ends: int, timeout: float = 30.0) -> list[tuple[Any, ...]]:
    """Events until ``ends`` trials have ended (done, stopped or error)."""
    events: list[tuple[Any, ...]] = []
    deadline = time.monotonic() + timeout
    while sum(e[0] in ("done", "stopped", "error") for e in events) < ends:
        assert time.monotonic() < deadline, f"trials did not end: {events}"
        events += runner.step([], timeout=0.5)
    return events


@pytest.fixture
def runner_streams(monkeypatch: pytest.MonkeyPatch) -> None:
    """The runner wraps sys.stdout/sys.stderr: put them back after the test."""
    monkeypatch.setattr(sys, "stdout", sys.stdout)
    monkeypatch.setattr(sys, "stderr", sys.stderr)


def test_a_start_during_the_hand_over_to_the_queued_trial_waits_its_turn(
    monkeypatch: pytest.MonkeyPatch, runner_streams: None
) -> None:
    lock = threading.Lock()
    running: list[str] = []
    overlaps: list[list[str]] = []
    release_a = threading.Event()

    def trainable(config: dict[str, Any]) -> None:
        name = config["name"]
        with lock:
            running.append(name)
            if len(running) > 1:
                overlaps.append(list(running))
        if name == "a":
            release_a.wait(10)
        for step in range(3):
            time.sleep(0.02)
            train.report({"step": step, "name": name})  # Train's report, as the loops use
        with lock:
            running.remove(name)

    runner = TrialRunner(trainable, "function", "runner_0001")
    original = runner_module._RunnerSession._first_free_checkpoint_index

    def slow_index(self: Any, start: int) -> int:
        if self.trial_id == "b":
            # The runner is handing over from "a" to the queued "b": a start for "c"
            # arrives right now (the controller saw "a" end and took the runner for idle).
            threading.Thread(target=runner._start, args=("c", 1, _spec("c"))).start()
            time.sleep(0.3)
        return original(self, start)

    monkeypatch.setattr(runner_module._RunnerSession, "_first_free_checkpoint_index", slow_index)
    runner._start("a", 1, _spec("a"))
    runner._start("b", 1, _spec("b"))  # prefetched: queued behind "a"
    release_a.set()
    events = _collect(runner, ends=3)
    assert overlaps == []  # one trial at a time
    ends = [(e[0], e[1]) for e in events if e[0] in ("done", "stopped", "error")]
    assert ends == [("done", "a"), ("done", "b"), ("done", "c")], [
        e[3] for e in events if e[0] == "error"
    ]
    for name in "abc":
        steps = [e[4]["step"] for e in events if e[0] == "result" and e[1] == name]
        assert steps == [0, 1, 2]
        assert all(e[4]["name"] == name for e in events if e[0] == "result" and e[1] == name)


def test_each_trial_reports_to_its_own_session_while_another_ends(
    runner_streams: None,
) -> None:
    # A trial that ends (its session leaves) while another one is already running in the
    # same process must not take the other's session with it.
    second_started = threading.Event()
    first_may_end = threading.Event()

    def trainable(config: dict[str, Any]) -> None:
        if config["name"] == "first":
            first_may_end.wait(10)
            return
        second_started.set()
        time.sleep(0.3)  # meanwhile "first" ends
        train.report({"ok": 1})
        assert train.get_checkpoint() is None

    one = TrialRunner(trainable, "function", "runner_0001")
    two = TrialRunner(trainable, "function", "runner_0002")  # two runners, one process
    one._start("first", 1, _spec("first"))
    two._start("second", 1, _spec("second"))
    assert second_started.wait(10)
    first_may_end.set()
    assert [e[0] for e in _collect(one, ends=1) if e[0] != "started"] == ["done"]
    events = _collect(two, ends=1)
    kinds = [e[0] for e in events if e[0] != "started"]
    assert kinds == ["result", "done"], [e[3] for e in events if e[0] == "error"]


def test_outside_a_trial_report_says_where_it_belongs() -> None:
    with pytest.raises(RuntimeError, match=r"can only be called inside a training function"):
        train.report({"x": 1})
