"""The run's decisions without processes: reports in step, checkpoint retention, failures,
restarts, stopping (``nbcluster/train/_state.py``)."""

from __future__ import annotations

import pytest

from nbcluster.train import CheckpointConfig
from nbcluster.train._state import (
    CheckpointBook,
    CheckpointRecord,
    DeleteCheckpoints,
    Fail,
    Finished,
    Reported,
    Restart,
    RunState,
    Stopped,
    checkpoint_dir_name,
)


def rec(i: int, **metrics: float) -> CheckpointRecord:
    return CheckpointRecord(checkpoint_dir_name(i), i + 1, metrics)


def run(n: int = 2, max_failures: int = 0, **cc: object) -> RunState:
    state = RunState(n, CheckpointConfig(**cc), max_failures, now=100.0, wall_offset=1e9)
    assert state.start_attempt(100.0) == 0
    return state


# -- checkpoint retention ---------------------------------------------------------------------


def test_book_keeps_everything_by_default():
    book = CheckpointBook(CheckpointConfig())
    for i in range(5):
        assert book.add(rec(i)) == []
    assert [r.name for r in book.records] == [checkpoint_dir_name(i) for i in range(5)]


def test_book_keeps_the_most_recent_without_a_score():
    book = CheckpointBook(CheckpointConfig(num_to_keep=2))
    dropped = [book.add(rec(i)) for i in range(4)]
    assert dropped == [[], [], ["checkpoint_000000"], ["checkpoint_000001"]]
    assert [r.name for r in book.records] == ["checkpoint_000002", "checkpoint_000003"]


@pytest.mark.parametrize(
    ("order", "scores", "kept"),
    [
        ("max", [0.5, 0.9, 0.1, 0.7], {"checkpoint_000001", "checkpoint_000003"}),
        ("min", [0.5, 0.9, 0.1, 0.7], {"checkpoint_000002", "checkpoint_000003"}),
    ],
)
def test_book_keeps_the_best_and_always_the_latest(order, scores, kept):
    book = CheckpointBook(
        CheckpointConfig(
            num_to_keep=1, checkpoint_score_attribute="acc", checkpoint_score_order=order
        )
    )
    for i, s in enumerate(scores):
        book.add(rec(i, acc=s))
    assert {r.name for r in book.records} == kept
    assert book.latest.name == "checkpoint_000003"
    best = max(scores) if order == "max" else min(scores)
    assert book.best().metrics["acc"] == best


def test_book_ties_keep_the_newer():
    book = CheckpointBook(CheckpointConfig(num_to_keep=2, checkpoint_score_attribute="acc"))
    for i in range(4):
        book.add(rec(i, acc=1.0))
    assert [r.name for r in book.records] == ["checkpoint_000002", "checkpoint_000003"]


def test_book_refuses_a_checkpoint_without_its_score():
    book = CheckpointBook(CheckpointConfig(num_to_keep=1, checkpoint_score_attribute="acc"))
    with pytest.raises(ValueError, match=r"checkpoint_score_attribute='acc'.*missing.*loss"):
        book.add(rec(0, loss=1.0))


# -- reports in step --------------------------------------------------------------------------


def test_a_report_completes_when_every_rank_sent_it():
    state = run(2)
    assert state.on_report(1, 0, {"loss": 9.0}, None, 101.0) == []
    out = state.on_report(0, 0, {"loss": 1.0}, None, 102.0)
    assert len(out) == 1 and isinstance(out[0], Reported)
    m = out[0].metrics
    assert m["loss"] == 1.0  # rank 0's metrics are the run's
    assert m["training_iteration"] == 1
    assert m["time_this_iter_s"] == pytest.approx(2.0)
    assert m["time_total_s"] == pytest.approx(2.0)
    assert m["timestamp"] == int(1e9 + 102)
    assert out[0].checkpoint is None
    assert state.metrics == m


def test_reports_of_a_rank_ahead_wait_for_the_others():
    state = run(2)
    for k in range(3):
        assert state.on_report(0, k, {"k": k}, None, 101.0) == []
    out = state.on_report(1, 0, {"k": 0}, None, 102.0)
    assert [o.iteration for o in out] == [1]
    out = state.on_report(1, 1, {"k": 1}, None, 103.0) + state.on_report(
        1, 2, {"k": 2}, None, 104.0
    )
    assert [o.iteration for o in out] == [2, 3]
    assert [h["k"] for h in state.history] == [0, 1, 2]


def test_a_checkpoint_from_any_rank_is_registered_with_rank_0_metrics():
    state = run(2, num_to_keep=1)
    state.on_report(0, 0, {"loss": 3.0}, None, 101.0)
    out = state.on_report(1, 0, {"loss": 7.0}, "checkpoint_000000", 101.0)
    assert out[0].checkpoint == CheckpointRecord("checkpoint_000000", 1, out[0].metrics)
    assert out[0].checkpoint.metrics["loss"] == 3.0
    state.on_report(0, 1, {"loss": 2.0}, "checkpoint_000001", 102.0)
    out = state.on_report(1, 1, {"loss": 2.0}, "checkpoint_000001", 102.0)
    assert out[1] == DeleteCheckpoints(("checkpoint_000000",))


def test_finished_when_every_loop_returned_with_rank_0_value():
    state = run(2)
    for r in (0, 1):
        state.on_report(r, 0, {"x": r}, None, 101.0)
    assert state.on_done(1, None, 102.0) == []
    assert state.on_done(0, "model", 102.0) == [Finished("model")]
    assert state.worker_state == {0: "DONE", 1: "DONE"}
    assert state.on_report(0, 1, {}, None, 103.0) == []  # nothing after the end


def test_a_rank_that_finished_early_does_not_block_the_others():
    state = run(2)
    state.on_done(1, None, 101.0)
    out = state.on_report(0, 0, {"x": 1}, None, 102.0)
    assert [o.iteration for o in out] == [1]
    assert state.on_done(0, None, 103.0) == [Finished(None)]


def test_a_missing_score_fails_the_run_as_a_controller_error():
    state = run(1, checkpoint_score_attribute="acc")
    out = state.on_report(0, 0, {"loss": 1.0}, "checkpoint_000000", 101.0)
    assert isinstance(out[0], Fail) and -1 in out[0].failures
    assert "acc" in out[0].failures[-1]


# -- failures and restarts --------------------------------------------------------------------


def test_failure_without_budget_fails_naming_the_rank():
    state = run(2)
    out = state.on_failures({1: "[Rank 1] ValueError: x"})
    assert out == [Fail({1: "[Rank 1] ValueError: x"})]
    assert state.worker_state[1] == "FAILED"
    assert state.on_failures({0: "late"}) == []  # the attempt is over


def test_failure_restarts_from_the_latest_checkpoint_and_drops_later_reports():
    state = run(2, max_failures=1)
    for k in range(3):
        name = checkpoint_dir_name(k) if k == 1 else None
        for r in (0, 1):
            state.on_report(r, k, {"epoch": k}, name, 100.0 + k)
    assert [h["epoch"] for h in state.history] == [0, 1, 2]
    out = state.on_failures({1: "died"})
    assert len(out) == 1 and isinstance(out[0], Restart)
    assert out[0].checkpoint.name == "checkpoint_000001" and out[0].failure_count == 1
    # The report after the checkpoint is dropped: the restarted loop makes it again.
    assert [h["epoch"] for h in state.history] == [0, 1]
    assert state.start_attempt(200.0) == 2
    for k in (2, 3):
        for r in (0, 1):
            state.on_report(r, k, {"epoch": k}, None, 200.0 + k)
    assert [h["training_iteration"] for h in state.history] == [1, 2, 3, 4]
    assert [h["epoch"] for h in state.history] == [0, 1, 2, 3]
    assert state.history[2]["time_total_s"] == pytest.approx(state.history[1]["time_total_s"] + 2)
    # The budget is spent now.
    assert state.on_failures({0: "again"}) == [Fail({0: "again"})]


def test_failure_without_a_checkpoint_restarts_from_scratch():
    state = run(1, max_failures=-1)
    state.on_report(0, 0, {"x": 1}, None, 101.0)
    for i in range(5):  # -1: no limit
        out = state.on_failures({0: "boom"})
        assert isinstance(out[0], Restart) and out[0].checkpoint is None
        assert state.history == []
        assert state.start_attempt(102.0 + i) == 0
    assert state.failures == 5


# -- stopping ---------------------------------------------------------------------------------


def test_stop_ends_when_every_rank_stopped_at_a_report():
    state = run(2)
    for r in (0, 1):
        state.on_report(r, 0, {"x": 1}, "checkpoint_000000", 101.0)
    state.request_stop("interrupted")
    assert state.on_stopped(0, 102.0) == []
    assert state.on_stopped(1, 102.0) == [Stopped("interrupted")]
    assert state.worker_state == {0: "STOPPED", 1: "STOPPED"}
    assert state.book.latest.name == "checkpoint_000000"


def test_a_loop_that_returned_before_seeing_the_stop_finishes():
    state = run(1)
    state.request_stop("interrupted")
    assert state.on_done(0, 5, 101.0) == [Finished(5)]


def test_killed_while_stopping_and_failures_after_a_stop_are_stops():
    state = run(2)
    state.request_stop("interrupted")
    assert state.on_killed() == [Stopped("interrupted")]
    assert state.worker_state == {0: "KILLED", 1: "KILLED"}
    state = run(2, max_failures=3)
    state.request_stop("interrupted")
    assert state.on_failures({0: "killed"}) == [Stopped("interrupted")]
    assert state.failures == 0


# -- resuming a saved run ---------------------------------------------------------------------


def test_a_saved_run_resumes_after_its_latest_checkpoint():
    history = [
        {"training_iteration": i, "time_total_s": float(i), "epoch": i - 1} for i in (1, 2, 3)
    ]
    state = RunState(
        1,
        CheckpointConfig(),
        0,
        history=history,
        checkpoints=[CheckpointRecord("checkpoint_000001", 2, history[1])],
    )
    assert [h["epoch"] for h in state.history] == [0, 1]
    assert state.start_attempt(0.0) == 2
    out = state.on_report(0, 2, {"epoch": 2}, None, 1.0)
    assert out[0].metrics["training_iteration"] == 3
    assert out[0].metrics["time_total_s"] == pytest.approx(3.0)
    snap = state.snapshot()
    assert snap["checkpoints"] == [
        {"name": "checkpoint_000001", "iteration": 2, "metrics": history[1]}
    ]
    assert len(snap["history"]) == 3


def test_a_stop_decided_on_a_report_drops_the_reports_made_after_it():
    state = run(1)
    state.on_report(0, 0, {"x": 0}, None, 101.0)
    state.request_stop("stopped by on_report", keep_reports=False)
    assert state.on_report(0, 1, {"x": 1}, "checkpoint_000001", 102.0) == []
    assert state.on_stopped(0, 103.0) == [Stopped("stopped by on_report")]
    assert len(state.history) == 1 and state.book.latest is None


def test_reports_a_stopped_rank_never_made_are_dropped():
    state = run(2)
    for r in (0, 1):
        state.on_report(r, 0, {"r": r}, None, 101.0)
    state.request_stop("interrupted")
    state.on_report(1, 1, {"r": 1}, None, 102.0)  # rank 1 got one report further
    assert state.on_stopped(0, 103.0) == []  # rank 0 stopped at its second report
    assert state.on_stopped(1, 103.0) == [Stopped("interrupted")]
    assert [h["training_iteration"] for h in state.history] == [1]
