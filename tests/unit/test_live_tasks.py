"""Live task attempts for the state API, without processes (issue 17, item 3).

The head's table of running attempts and owners' pending snapshots (``LiveTasks``), how
the head routes reported events (``HeadState.add_task_events``), a worker's registry of
running attempts (``RunningAttempts``) and an owner's snapshot of waiting tasks
(``pending_events``).
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from nbcluster._runtime.core.pending_tasks import pending_events, pending_state
from nbcluster._runtime.head.live_tasks import LiveTasks
from nbcluster._runtime.head.state import HeadState
from nbcluster._runtime.protocol.rpc import pb
from nbcluster._runtime.task_events import RunningAttempts

W1, W2 = b"w1" * 8, b"w2" * 8
N1, N2 = b"n1" * 8, b"n2" * 8


def ev(task: bytes, state: str, attempt: int = 0, worker: bytes = W1, node: bytes = N1) -> Any:
    return pb.TaskEvent(
        task_id=task, attempt=attempt, state=state, worker_id=worker, node_id=node, job_id=b"j1"
    )


def states(table: LiveTasks, now: float = 0.0, job: bytes = b"") -> dict[tuple[bytes, int], str]:
    tasks, _ = table.live(now, job)
    return {(e.task_id, e.attempt): e.state for e in tasks}


# ------------------------------------------------------------------- running attempts


def test_running_until_its_terminal_event() -> None:
    live = LiveTasks()
    assert live.report([ev(b"a", "RUNNING"), ev(b"b", "RUNNING")]) == []
    assert states(live) == {(b"a", 0): "RUNNING", (b"b", 0): "RUNNING"}
    ended = live.report([ev(b"a", "FINISHED")])
    assert [e.task_id for e in ended] == [b"a"]
    assert states(live) == {(b"b", 0): "RUNNING"}
    live.report([ev(b"b", "FAILED")])
    assert states(live) == {}


def test_attempts_are_kept_apart() -> None:
    live = LiveTasks()
    live.report([ev(b"a", "RUNNING", attempt=0)])
    live.report([ev(b"a", "FAILED", attempt=1)])  # another attempt's end
    assert states(live) == {(b"a", 0): "RUNNING"}
    live.report([ev(b"a", "FAILED", attempt=0, worker=b"")])  # the owner records the crash
    assert states(live) == {}


def test_a_dead_workers_attempts_end_and_late_reports_are_ignored() -> None:
    live = LiveTasks()
    live.report([ev(b"a", "RUNNING", worker=W1), ev(b"b", "RUNNING", worker=W2)])
    live.worker_died(W1, "127.0.0.1:1")
    assert states(live) == {(b"b", 0): "RUNNING"}
    live.report([ev(b"c", "RUNNING", worker=W1)])  # sent before it died, arrived after
    assert states(live) == {(b"b", 0): "RUNNING"}


def test_a_dead_nodes_attempts_end() -> None:
    live = LiveTasks()
    live.report([ev(b"a", "RUNNING", node=N1), ev(b"b", "RUNNING", worker=W2, node=N2)])
    live.node_died(N1)
    assert states(live) == {(b"b", 0): "RUNNING"}


def test_the_dead_worker_memory_is_bounded() -> None:
    live = LiveTasks(dead_workers_memory=2)
    for w in (b"x", b"y", b"z"):
        live.worker_died(w)
    live.report([ev(b"a", "RUNNING", worker=b"x")])  # x was forgotten: accepted
    live.report([ev(b"b", "RUNNING", worker=b"z")])
    assert states(live) == {(b"a", 0): "RUNNING"}


def test_the_running_table_is_bounded() -> None:
    live = LiveTasks(max_running=2)
    live.report([ev(bytes([i]), "RUNNING") for i in range(5)])
    assert len(live.running) == 2


def test_a_job_filter() -> None:
    live = LiveTasks()
    other = ev(b"b", "RUNNING")
    other.job_id = b"j2"
    live.report([ev(b"a", "RUNNING"), other])
    assert states(live, job=b"j2") == {(b"b", 0): "RUNNING"}


# ------------------------------------------------------------------- pending snapshots


def test_a_snapshot_replaces_the_owners_previous_one() -> None:
    live = LiveTasks()
    live.report_pending("o1", [ev(b"a", "PENDING_NODE_ASSIGNMENT")], 0, now=0.0)
    live.report_pending("o2", [ev(b"x", "PENDING_ARGS_AVAIL")], 0, now=0.0)
    live.report_pending("o1", [ev(b"b", "SUBMITTED_TO_WORKER")], 0, now=1.0)
    assert states(live, 1.0) == {(b"b", 0): "SUBMITTED_TO_WORKER", (b"x", 0): "PENDING_ARGS_AVAIL"}
    live.report_pending("o1", [], 0, now=2.0)  # none left: withdrawn
    assert states(live, 2.0) == {(b"x", 0): "PENDING_ARGS_AVAIL"}


def test_a_snapshot_that_is_not_renewed_expires() -> None:
    live = LiveTasks(pending_ttl_s=5.0)
    live.report_pending("o1", [ev(b"a", "PENDING_NODE_ASSIGNMENT")], 0, now=0.0)
    assert states(live, 5.0) == {(b"a", 0): "PENDING_NODE_ASSIGNMENT"}
    assert states(live, 5.5) == {}
    assert live.pending == {}


def test_an_owners_death_withdraws_its_snapshot() -> None:
    live = LiveTasks()
    live.report_pending("127.0.0.1:1", [ev(b"a", "PENDING_NODE_ASSIGNMENT")], 0, now=0.0)
    live.report_pending("127.0.0.1:2", [ev(b"b", "PENDING_NODE_ASSIGNMENT")], 0, now=0.0)
    live.worker_died(W1, "127.0.0.1:1")  # a worker that owned tasks
    live.owner_gone("127.0.0.1:2")  # a driver that detached
    assert states(live) == {}


def test_a_pending_task_a_worker_runs_shows_once_as_running() -> None:
    live = LiveTasks()
    live.report_pending("o1", [ev(b"a", "SUBMITTED_TO_WORKER")], 0, now=0.0)
    live.report([ev(b"a", "RUNNING")])
    tasks, _ = live.live(0.0)
    assert [(e.task_id, e.state) for e in tasks] == [(b"a", "RUNNING")]


def test_tasks_the_owners_did_not_list_are_counted() -> None:
    live = LiveTasks()
    live.report_pending("o1", [ev(b"a", "PENDING_NODE_ASSIGNMENT")], 7, now=0.0)
    live.report_pending("o2", [], 3, now=0.0)
    assert live.live(0.0)[1] == 10


# ------------------------------------------------------------------- the head's routing


def test_the_head_keeps_running_attempts_out_of_its_ring() -> None:
    head = HeadState(30.0, task_events_capacity=10)
    ended = head.add_task_events([ev(b"a", "RUNNING"), ev(b"b", "FINISHED")])
    assert [e.task_id for e in ended] == [b"b"]  # what the event stream publishes
    assert [e.task_id for e in head.task_events] == [b"b"]
    assert states(head.live_tasks) == {(b"a", 0): "RUNNING"}
    head.add_task_events([ev(b"a", "FAILED")])
    assert [e.task_id for e in head.task_events] == [b"b", b"a"]
    assert states(head.live_tasks) == {}


# ------------------------------------------------------------------- a worker's registry


def spec(task: bytes, attempt: int = 0) -> pb.TaskSpec:
    return pb.TaskSpec(task_id=task, attempt=attempt, function_name="f", job_id=b"j1")


def test_a_worker_reports_running_once_and_only_while_it_runs() -> None:
    running = RunningAttempts()
    running.started(spec(b"short"), 1.0)
    running.ended(b"short")  # ended before the flush: never reported running
    running.started(spec(b"long"), 2.0)
    due = running.due(N1, W1, 99)
    assert [(e.task_id, e.state, e.start_time, e.worker_pid) for e in due] == [
        (b"long", "RUNNING", 2.0, 99)
    ]
    assert running.due(N1, W1, 99) == []  # once
    running.ended(b"long")
    assert len(running) == 0
    running.started(spec(b"long", attempt=1), 3.0)  # a retry on the same worker
    assert [e.attempt for e in running.due(N1, W1, 99)] == [1]


# ------------------------------------------------------------------- an owner's snapshot


def rec(task: bytes, submitted: float, **kw: Any) -> Any:
    fields = {
        "task_id": task,
        "spec": spec(task),
        "name": "f",  # the owner's name (unused: events carry the spec's)
        "done": False,
        "pending_deps": 0,
        "actor": False,
        "lease": None,
        "submitted_at": submitted,
    }
    fields.update(kw)
    return SimpleNamespace(**fields)


def never(_: Any) -> bool:
    return False


@pytest.mark.parametrize(
    ("kw", "inflight", "state"),
    [
        ({"pending_deps": 1}, False, "PENDING_ARGS_AVAIL"),
        ({}, False, "PENDING_NODE_ASSIGNMENT"),
        ({"lease": SimpleNamespace(dead=False, inflight={b"t": 1})}, False, "SUBMITTED_TO_WORKER"),
        (
            {"lease": SimpleNamespace(dead=True, inflight={b"t": 1})},
            False,
            "PENDING_NODE_ASSIGNMENT",
        ),
        ({"actor": True}, False, "PENDING_ACTOR_TASK_ORDERING_OR_CONCURRENCY"),
        ({"actor": True}, True, "SUBMITTED_TO_WORKER"),
        ({"actor": True, "pending_deps": 2}, True, "PENDING_ARGS_AVAIL"),
    ],
)
def test_pending_state(kw: dict[str, Any], inflight: bool, state: str) -> None:
    assert pending_state(rec(b"t", 0.0, **kw), lambda _: inflight) == state


def test_only_tasks_older_than_a_flush_are_listed() -> None:
    records = [rec(b"a", 0.0), rec(b"b", 0.5, done=True), rec(b"c", 1.0), rec(b"d", 9.5)]
    events, more = pending_events(records, now=10.0, min_age=1.0, limit=100, actor_inflight=never)
    assert [e.task_id for e in events] == [b"a", b"c"] and not more


def test_an_owner_lists_at_most_its_cap() -> None:
    records = [rec(bytes([i]), 0.0) for i in range(5)]
    events, more = pending_events(records, now=10.0, min_age=1.0, limit=3, actor_inflight=never)
    assert len(events) == 3 and more
    events, more = pending_events(records, now=10.0, min_age=1.0, limit=5, actor_inflight=never)
    assert len(events) == 5 and not more
