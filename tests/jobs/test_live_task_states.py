"""``list_tasks`` shows live tasks: RUNNING, and pending ones by Ray's names (issue 17 item 3).

A worker reports an attempt RUNNING when it is still running at the worker's next flush
(once a second); an owner reports its tasks that waited longer than a second. Tasks here
wait for a file the test creates (each one inlines the loop: module-level helpers are not
importable on the workers), so what runs and what waits is decided by the test, not by
timing.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import nbcluster
from nbcluster.testing import assert_no_processes, kill_process, poll_for
from nbcluster.util import state

pytestmark = pytest.mark.integration

LIVE = {
    "RUNNING",
    "SUBMITTED_TO_WORKER",
    "PENDING_ARGS_AVAIL",
    "PENDING_NODE_ASSIGNMENT",
    "PENDING_ACTOR_TASK_ORDERING_OR_CONCURRENCY",
}


@pytest.fixture(scope="module")
def driver() -> Iterator[Any]:
    if nbcluster.is_initialized():
        nbcluster.shutdown()
    info = nbcluster.init(num_cpus=2)
    yield info
    nbcluster.shutdown()
    assert_no_processes(info.session_dir, timeout=15)


@nbcluster.remote(num_cpus=1)
def hold(path: str, tag: int) -> int:
    deadline = time.monotonic() + 120  # a guard against hangs, never reached when green
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.05)
    return tag


@nbcluster.remote(num_cpus=1, max_retries=0)
def hold_once(path: str) -> None:
    deadline = time.monotonic() + 120  # a guard against hangs, never reached when green
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.05)


@nbcluster.remote(num_cpus=0)
def after(value: int) -> int:
    return value + 1


@nbcluster.remote(num_cpus=0)
class Holder:
    def wait_here(self, path: str) -> str:
        deadline = time.monotonic() + 120  # a guard against hangs, never reached when green
        while not os.path.exists(path) and time.monotonic() < deadline:
            time.sleep(0.05)
        return "held"


def tasks_of(name: str) -> list[Any]:
    return state.list_tasks(filters=[("name", "=", name)], detail=True, limit=1000)


def states_of(refs: list[Any]) -> dict[str, int]:
    ids = {r.task_id().hex() for r in refs}
    counts: dict[str, int] = {}
    for t in state.list_tasks(limit=10_000):
        if t.task_id in ids:
            counts[t.state] = counts.get(t.state, 0) + 1
    return counts


def poll(predicate: Any, message: str = "") -> Any:
    return poll_for(predicate, timeout=30, interval=0.2, message=message)


def test_a_waiting_task_is_running_then_finished(driver: Any, tmp_path: Path) -> None:
    streamed: list[Any] = []  # the head's task event stream (what the widgets consume)
    sub = nbcluster.state.subscribe_events(
        lambda batch: streamed.extend(e.data for e in batch.events if e.kind == "task"),
        kinds=("task",),
    )
    assert sub.wait_ready(10)  # its (empty) snapshot came: subscribed
    go = str(tmp_path / "go")
    ref = hold.remote(go, 1)
    task_id = ref.task_id().hex()
    # the owner may list it SUBMITTED_TO_WORKER first; its worker reports it RUNNING
    running = poll(
        lambda: [t for t in tasks_of("hold") if t.task_id == task_id and t.state == "RUNNING"]
    )
    assert [t.state for t in tasks_of("hold") if t.task_id == task_id] == ["RUNNING"]
    row = running[0]
    assert row.worker_pid and row.node_id and row.worker_id and row.type == "NORMAL_TASK"
    assert row.start_time_ms and row.end_time_ms is None  # detail=True
    brief = state.list_tasks(filters=[("task_id", "=", task_id)])[0]
    assert brief.state == "RUNNING" and brief.start_time_ms is None  # detail-only field
    got = state.get_task(task_id)
    assert got is not None and got.state == "RUNNING"
    Path(go).touch()
    assert nbcluster.get(ref, timeout=60) == 1
    poll(lambda: state.get_task(task_id).state == "FINISHED")
    assert [t.state for t in tasks_of("hold") if t.task_id == task_id] == ["FINISHED"]
    # the stream still carries finished attempts only: RUNNING rows are polled, not pushed
    poll(lambda: any(e.task_id == task_id for e in streamed))
    sub.close()
    assert [e.state for e in streamed if e.task_id == task_id] == ["FINISHED"]


def test_a_killed_workers_task_ends_failed_not_running(driver: Any, tmp_path: Path) -> None:
    ref = hold_once.remote(str(tmp_path / "never"))
    task_id = ref.task_id().hex()
    row = poll(
        lambda: next(
            (t for t in tasks_of("hold_once") if t.task_id == task_id and t.state == "RUNNING"),
            None,
        )
    )
    kill_process(row.worker_pid)
    with pytest.raises(nbcluster.exceptions.WorkerCrashedError):
        nbcluster.get(ref, timeout=60)
    final = poll(lambda: state.get_task(task_id).state == "FAILED" and state.get_task(task_id))
    assert final.error_type == "WORKER_DIED"
    assert "killed by SIGKILL" in (final.error_message or "")
    rows = [t for t in tasks_of("hold_once") if t.task_id == task_id]
    assert [t.state for t in rows] == ["FAILED"]  # no RUNNING row is left behind
    running = state.list_tasks(filters=[("state", "=", "RUNNING")], limit=1000)
    assert task_id not in {t.task_id for t in running}


def _cli(driver: Any, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "nbcluster.cli", *args],
        capture_output=True,
        text=True,
        env={**os.environ, "NBCLUSTER_ADDRESS": driver.address},
        timeout=120,
    )


def test_tasks_beyond_the_cpus_are_pending(driver: Any, tmp_path: Path) -> None:
    go = str(tmp_path / "go")
    refs = [hold.remote(go, i) for i in range(3)]  # 2 CPUs: one of them waits for a lease
    dependent = after.remote(refs[2])  # waits for an argument
    want = {"RUNNING": 2, "PENDING_NODE_ASSIGNMENT": 1}
    poll(lambda: states_of(refs) == want, message=f"the tasks never were {want}")
    poll(lambda: states_of([dependent]) == {"PENDING_ARGS_AVAIL": 1})
    pending = [t for t in tasks_of("hold") if t.state == "PENDING_NODE_ASSIGNMENT"][0]
    assert pending.worker_id is None and pending.node_id is None
    assert pending.task_id == refs[2].task_id().hex()  # the last submitted waits
    running = state.list_tasks(filters=[("state", "=", "running"), ("name", "=", "hold")])
    assert len(running) == 2 and all(t.worker_pid for t in running)

    summary = state.summarize_tasks()["cluster"]["summary"]
    assert summary["hold"]["state_counts"].items() >= want.items()  # + earlier tests' FINISHED
    assert summary["after"]["state_counts"] == {"PENDING_ARGS_AVAIL": 1}

    r = _cli(driver, "list", "tasks", "--filter", "state=PENDING_NODE_ASSIGNMENT")
    assert r.returncode == 0, r.stderr
    assert "hold" in r.stdout and "PENDING_NODE_ASSIGNMENT" in r.stdout
    r = _cli(driver, "summary", "tasks")
    assert r.returncode == 0, r.stderr
    assert "PENDING_NODE_ASSIGNMENT: 1" in r.stdout and "RUNNING: 2" in r.stdout
    assert "PENDING_ARGS_AVAIL: 1" in r.stdout

    Path(go).touch()
    assert nbcluster.get([*refs, dependent], timeout=60) == [0, 1, 2, 3]
    poll(lambda: states_of([*refs, dependent]) == {"FINISHED": 4})
    assert not [t for t in state.list_tasks(limit=1000) if t.state in LIVE]


def test_actor_calls_running_and_queued(driver: Any, tmp_path: Path) -> None:
    go = str(tmp_path / "go")
    holder = Holder.remote()
    first, second = holder.wait_here.remote(go), holder.wait_here.remote(go)
    want = {first.task_id().hex(): "RUNNING", second.task_id().hex(): "SUBMITTED_TO_WORKER"}
    poll(lambda: {t.task_id: t.state for t in tasks_of("wait_here")} == want)
    assert {t.type for t in tasks_of("wait_here")} == {"ACTOR_TASK"}
    Path(go).touch()
    assert nbcluster.get([first, second], timeout=60) == ["held", "held"]
    poll(lambda: states_of([first, second]) == {"FINISHED": 2})
    nbcluster.kill(holder)
