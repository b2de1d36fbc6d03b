"""A task worker's main thread reads its leases' channels and runs each task where it reads
it (worker/direct.py, ``Config.direct_tasks``): real cluster, real sockets.

What the I/O loop did for those channels must still happen: tasks pipelined behind one that
blocks in ``get`` go back to the owner (the task it waits for may be one of them), a lease
goes back to its node when its owner hangs up, and a worker running a task of an owner that
died exits (it shares its owner's fate).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import cloudpickle
import pytest

import nbcluster
from nbcluster.testing import assert_cluster_healthy, pid_alive, poll_for

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # workers cannot import tests/


def _view() -> dict[str, Any]:
    """Inside a task: which thread runs it and what it came on."""
    from nbcluster._runtime import context
    from nbcluster._runtime.worker.direct import DirectStream

    executor = context.require_client().executor  # type: ignore[attr-defined]
    stream = executor.running_stream
    return {
        "main_thread": threading.current_thread() is threading.main_thread(),
        "direct": isinstance(stream, DirectStream),
        "lease": isinstance(stream, DirectStream) and bool(stream.lease),
        "pid": os.getpid(),
    }


@nbcluster.remote
def view() -> dict[str, Any]:
    return _view()


@nbcluster.remote(num_cpus=0)
def gate(path: str) -> None:
    deadline = time.monotonic() + 30
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.01)


@nbcluster.remote(num_cpus=2)  # the whole 2-CPU cluster: one lease, tasks pipelined on it
def inner(_: Any = None) -> int:
    return os.getpid()


@nbcluster.remote(num_cpus=2)
def outer(path: str, refs: list[Any]) -> tuple[int, int]:
    Path(path).write_text(str(os.getpid()))
    return nbcluster.get(refs[0], timeout=60), os.getpid()


def test_a_task_runs_on_the_main_thread_that_read_it_from_its_lease(shared_cluster: Any) -> None:
    views = nbcluster.get([view.remote() for _ in range(20)], timeout=60)
    assert all(v == {**v, "main_thread": True, "direct": True, "lease": True} for v in views), views


def test_a_task_that_blocks_on_one_pipelined_behind_it_gets_it_back(
    shared_cluster: Any, tmp_path: Path
) -> None:
    # ``outer`` blocks on ``inner``, which waits in the owner for ``gate`` and then, a fast
    # function of the same shape, is pipelined onto ``outer``'s lease: it reaches the worker
    # while ``outer`` blocks. The I/O loop, lent the channel, answers it "requeued" and the
    # owner runs it elsewhere, on the CPUs ``outer`` gave back while it blocks.
    assert len(set(nbcluster.get([inner.remote() for _ in range(20)], timeout=60))) >= 1  # fast
    started, opened = tmp_path / "started", tmp_path / "open"
    ready = gate.remote(str(opened))
    behind = inner.remote(ready)
    out = outer.remote(str(started), [behind])
    poll_for(started.exists, timeout=60)
    time.sleep(0.3)  # outer is in get
    opened.touch()
    inner_pid, outer_pid = nbcluster.get(out, timeout=60)
    assert inner_pid == nbcluster.get(behind, timeout=60) and inner_pid != outer_pid
    assert_cluster_healthy()


DRIVER = textwrap.dedent(
    """
    import os, sys, time
    import nbcluster

    nbcluster.init(address=sys.argv[1])

    @nbcluster.remote
    def long(path):
        with open(path + ".tmp", "w") as fh:
            fh.write(str(os.getpid()))
        os.rename(path + ".tmp", path)
        time.sleep(120)

    ref = long.remote(sys.argv[2])
    while not os.path.exists(sys.argv[2]):
        time.sleep(0.01)
    print("ready", flush=True)
    sys.stdin.readline()
    """
)


def test_a_worker_running_a_task_of_an_owner_that_died_exits(
    shared_cluster: Any, tmp_path: Path
) -> None:
    # The worker's main thread runs the task and does not read its channel meanwhile: the
    # I/O loop sees the owner's end hang up and the worker shares its owner's fate.
    pid_file = tmp_path / "pid"
    p = subprocess.Popen(
        [sys.executable, "-c", DRIVER, shared_cluster.address, str(pid_file)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        line = p.stdout.readline().strip()  # type: ignore[union-attr]
        assert line == "ready", f"the driver did not start: {line} {p.stderr.read()[-2000:]}"  # type: ignore[union-attr]
        worker = int(pid_file.read_text())
        assert pid_alive(worker)
        p.send_signal(signal.SIGKILL)
        p.wait(30)
        poll_for(
            lambda: not pid_alive(worker),  # (it may end between two questions)
            timeout=30,
            message="the dead owner's task kept running",
        )
    finally:
        if p.poll() is None:
            p.kill()
        p.wait(30)
    assert_cluster_healthy()


@nbcluster.remote(num_cpus=2)
def hold() -> bool:
    """Runs until a cancel for another task reaches this worker (20 s at most)."""
    from nbcluster._runtime import context

    executor = context.require_client().executor  # type: ignore[attr-defined]
    deadline = time.monotonic() + 20
    while not executor.cancelled and time.monotonic() < deadline:
        time.sleep(0.01)
    return bool(executor.cancelled)


def test_a_task_cancelled_while_it_waits_unread_behind_another_is_cancelled(
    shared_cluster: Any,
) -> None:
    # ``behind`` (fast: pipelined) waits on the lease's channel, unread, while ``hold`` runs
    # on the worker's main thread: the cancel reaches the worker first and is kept for it.
    nbcluster.get([inner.remote() for _ in range(20)], timeout=60)  # known fast
    first = hold.remote()
    time.sleep(0.3)  # hold runs: behind comes in a frame of its own, not read while it runs
    behind = inner.remote()
    time.sleep(0.3)
    nbcluster.cancel(behind)
    assert nbcluster.get(first, timeout=60), "the cancel did not reach the worker"
    with pytest.raises(nbcluster.exceptions.TaskCancelledError):
        nbcluster.get(behind, timeout=60)
    assert_cluster_healthy()


@nbcluster.remote
def sleeper(pid_file: str) -> str:
    with open(pid_file, "w") as f:
        f.write(str(os.getpid()))
    time.sleep(30)
    return "slept"


def test_a_sigint_not_from_a_cancel_fails_the_task_and_the_worker_goes_on(
    shared_cluster: Any, tmp_path: Path
) -> None:
    """A SIGINT that is no cancel (someone's ``kill -INT``) is the task's error: its reply
    goes out, and the worker and its lease stay usable (it used to vanish: a hang)."""
    pid_file = tmp_path / "pid"
    ref = sleeper.remote(str(pid_file))
    poll_for(lambda: pid_file.exists() and pid_file.read_text(), 30)
    pid = int(pid_file.read_text())
    os.kill(pid, signal.SIGINT)
    with pytest.raises(nbcluster.exceptions.TaskError) as info:
        nbcluster.get(ref, timeout=20)
    assert isinstance(info.value.cause, KeyboardInterrupt)  # (not raised as one: no Ctrl-C)
    assert not isinstance(info.value, (KeyboardInterrupt, nbcluster.exceptions.TaskCancelledError))
    # A SIGINT while no task runs does nothing: the same worker runs the next tasks.
    os.kill(pid, signal.SIGINT)
    pids = {v["pid"] for v in nbcluster.get([view.remote() for _ in range(20)], timeout=30)}
    assert pid_alive(pid), "the worker did not survive a SIGINT between tasks"
    assert pids  # (the tasks ran; on this worker or, once its lease went back, another)
    assert_cluster_healthy()


@nbcluster.remote
def quick(i: int) -> int:
    return i


def test_cancels_that_race_the_end_of_their_tasks_lose_no_reply(shared_cluster: Any) -> None:
    """Each cancel lands before, during or just after its task: every ``get`` ends with the
    value or ``TaskCancelledError`` (a SIGINT landing after the task's code ended used to
    raise where the reply was being sent: the reply was lost and the lease stuck)."""
    outcomes = {"value": 0, "cancelled": 0}
    for i in range(200):
        ref = quick.remote(i)
        if i % 2:
            time.sleep(0.0005 * (i % 7))
        nbcluster.cancel(ref)
        try:
            assert nbcluster.get(ref, timeout=30) == i
            outcomes["value"] += 1
        except nbcluster.exceptions.TaskCancelledError:
            outcomes["cancelled"] += 1
    assert sum(outcomes.values()) == 200, outcomes
    assert_cluster_healthy()


# ------------------------------------------------ own clusters (after the shared one's tests)


def test_the_off_switch_leaves_lease_channels_to_the_io_loop(
    cluster: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``NBCLUSTER_DIRECT_TASKS=0``: the loop reads every lease's channel and queues its tasks
    for the main thread. (Its own cluster: workers read the switch when they start.)"""
    monkeypatch.setenv("NBCLUSTER_DIRECT_TASKS", "0")
    cluster(num_cpus=2)
    views = nbcluster.get([view.remote() for _ in range(10)], timeout=60)
    assert all(v["main_thread"] and not v["direct"] for v in views), views
