"""Failures of tasks on real clusters (issue acceptance 6; RELIABILITY F01-F05, F15, B02,
B03, B05, B06, L07).

Every attempt of a task appends one line to a file under ``tmp_path``, so retries are
counted exactly. Tasks that must block wait for a file the test creates ("go" files), with
their own deadline so that a bug cannot hang the suite. Workers are only ever killed by the
task itself (``os._exit``, ``SIGKILL`` to its own pid, a segfault).
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import os
import signal
import socket
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import nbcluster
from nbcluster._runtime import context
from nbcluster._runtime.protocol.rpc import pb
from nbcluster._runtime.running_mark import encode as encode_mark
from nbcluster._runtime.running_mark import mark_path
from nbcluster.exceptions import (
    GetTimeoutError,
    NbclusterError,
    SerializationError,
    TaskCancelledError,
    TaskError,
    UnserializableException,
    WorkerCrashedError,
)
from nbcluster.testing import (
    assert_cluster_healthy,
    kill_process,
    pid_alive,
    poll_for,
    worker_pids,
)

pytestmark = pytest.mark.integration

MAX_TB = 64 * 1024


def _marks(path: Path) -> list[str]:
    """Lines appended to ``path`` by tasks (one per attempt)."""
    try:
        return path.read_text().split()
    except FileNotFoundError:
        return []


def _await_marks(path: Path, n: int, what: str) -> None:
    poll_for(lambda: len(_marks(path)) >= n, timeout=20, message=f"{what} did not start")


# ------------------------------------------------------------------ F01: application errors


def test_task_error_is_also_the_user_exception_and_propagates(shared_cluster, tmp_path):
    runs, dep_runs = tmp_path / "runs", tmp_path / "dep_runs"

    @nbcluster.remote
    def boom(path):
        with open(path, "a") as fh:
            fh.write("x\n")
        raise ValueError("x-marks-the-spot")

    @nbcluster.remote
    def dependent(value, path):
        with open(path, "a") as fh:
            fh.write("x\n")
        return value

    ref = boom.remote(str(runs))
    with pytest.raises(TaskError, match=r"x-marks-the-spot") as info:
        nbcluster.get(ref, timeout=30)
    err = info.value
    assert isinstance(err, ValueError) and isinstance(err, NbclusterError)
    assert isinstance(err.cause, ValueError) and err.cause.args == ("x-marks-the-spot",)
    assert err.args == ("x-marks-the-spot",)
    assert "boom" in err.function_name
    assert 'raise ValueError("x-marks-the-spot")' in err.traceback_str
    assert "in boom" in err.traceback_str
    assert "boom raised an exception" in str(err)
    assert err.pid is not None and err.pid != os.getpid()

    # A task that depends on the failed result fails with the same error, without running.
    with pytest.raises(TaskError, match=r"x-marks-the-spot") as dep_info:
        nbcluster.get(dependent.remote(ref, str(dep_runs)), timeout=30)
    assert isinstance(dep_info.value, ValueError)
    assert 'raise ValueError("x-marks-the-spot")' in dep_info.value.traceback_str
    with pytest.raises(ValueError, match=r"x-marks-the-spot"):  # catchable as the user's type
        nbcluster.get(ref, timeout=30)

    # Application errors are not retried by default (max_retries only covers crashes).
    assert nbcluster.get(dependent.remote(1, str(tmp_path / "flush")), timeout=30) == 1
    assert _marks(runs) == ["x"]
    assert _marks(dep_runs) == []


# ------------------------------------------------------------------ F02/F04: worker crashes

CRASHES = [
    pytest.param("exit", r"exited with code 1", id="os._exit"),
    pytest.param("sigkill", r"killed by SIGKILL", id="sigkill"),
    pytest.param("segfault", r"killed by SIGSEGV", id="segfault"),
]


def _crasher():
    @nbcluster.remote
    def crash(path, mode, times):
        """Crash the worker on the first ``times`` attempts (all when negative)."""
        with open(path, "a") as fh:
            fh.write(f"{os.getpid()}\n")
        with open(path) as fh:
            attempt = len(fh.read().split())
        if times < 0 or attempt <= times:
            if mode == "exit":
                os._exit(1)
            elif mode == "sigkill":
                os.kill(os.getpid(), signal.SIGKILL)
            else:
                import ctypes

                ctypes.string_at(0)
        return attempt

    return crash


@pytest.mark.parametrize(("mode", "detail"), CRASHES)
def test_crashing_task_is_retried_then_raises_worker_crashed(
    shared_cluster, tmp_path, mode, detail
):
    runs = tmp_path / "runs"
    session = shared_cluster.session_dir
    crash = _crasher()
    ref = crash.remote(str(runs), mode, -1)  # default max_retries=3
    with pytest.raises(WorkerCrashedError, match=rf"{detail}.*attempts: 4") as info:
        nbcluster.get(ref, timeout=60)
    assert "crash" in str(info.value)
    pids = [int(p) for p in _marks(runs)]
    assert len(pids) == 4, pids  # exactly max_retries + 1 attempts
    assert len(set(pids)) == 4  # each on a new worker
    # The dead workers are gone and replaced (the warm pool is refilled); the node survived.
    poll_for(
        lambda: not any(pid_alive(p) for p in pids), timeout=10, message="a crashed worker lives"
    )
    # The warm pool is back at its size, one worker per CPU. (Not the process count before
    # the test: that can include a surplus worker that was starting or leaving just then.)
    pool = int(nbcluster.cluster_resources()["CPU"])
    poll_for(
        lambda: len(set(worker_pids(session)) - set(pids)) >= pool,
        timeout=20,
        message="crashed workers were not replaced",
    )
    assert_cluster_healthy()


@pytest.mark.parametrize(("mode", "detail"), CRASHES)
def test_crash_with_no_retries_fails_at_once(shared_cluster, tmp_path, mode, detail):
    runs = tmp_path / "runs"
    crash = _crasher()
    ref = crash.options(max_retries=0).remote(str(runs), mode, -1)
    with pytest.raises(WorkerCrashedError, match=rf"{detail}.*attempts: 1"):
        nbcluster.get(ref, timeout=5)
    assert len(_marks(runs)) == 1
    assert_cluster_healthy()


def test_crash_on_first_attempt_only_is_retried_to_success(shared_cluster, tmp_path):
    runs = tmp_path / "runs"
    crash = _crasher()
    assert nbcluster.get(crash.options(max_retries=1).remote(str(runs), "exit", 1), timeout=30) == 2
    assert len(_marks(runs)) == 2
    assert_cluster_healthy()


def test_poison_task_does_not_stop_normal_tasks(shared_cluster, tmp_path):
    runs = tmp_path / "runs"
    crash = _crasher()

    @nbcluster.remote
    def double(i):
        return 2 * i

    normal = [double.remote(i) for i in range(100)]
    poison = crash.remote(str(runs), "sigkill", -1)
    normal += [double.remote(i) for i in range(100, 200)]
    assert nbcluster.get(normal, timeout=60) == [2 * i for i in range(200)]
    with pytest.raises(WorkerCrashedError, match=r"SIGKILL.*attempts: 4"):
        nbcluster.get(poison, timeout=60)
    assert len(_marks(runs)) == 4  # max_retries + 1, no crash loop
    assert_cluster_healthy()


def _pipelined():
    @nbcluster.remote(num_cpus=2)  # the whole 2-CPU cluster: one lease, tasks pipelined on it
    def step(path, mode, go):
        ctx = nbcluster.get_runtime_context()
        with open(path, "a") as fh:
            fh.write(f"{mode}:{ctx.get_task_id()}:{ctx.get_worker_id()}:{ctx.get_node_id()}\n")
        if mode == "crash":
            os.kill(os.getpid(), signal.SIGKILL)
        if mode == "gate":  # the tasks behind it reach this worker while it runs
            deadline = time.monotonic() + 20
            while not os.path.exists(go) and time.monotonic() < deadline:
                time.sleep(0.01)
        if mode == "hold" and not os.path.exists(go + ".held"):  # first run: lose its reply
            open(go + ".held", "w").close()
            # Its reply is held up until the next task has run (and killed this process):
            # lost, as when a crash comes first. Read off a task lease's channel by the main
            # thread (worker/direct.py), the two came in one read and the reply waits for the
            # rest of it; read by the I/O loop, the reply leaves from the loop, stalled here.
            context.require_client().loop.call_soon_threadsafe(time.sleep, 3.0)
        return mode

    return step


def test_a_crash_is_charged_to_the_task_that_ran_not_to_one_whose_reply_died(
    shared_cluster, tmp_path
):
    # A fast task finishes, its reply still unsent; the task queued behind it kills the worker.
    # The owner holds both without replies. The node names the one that ran last
    # (running_mark.py), so the crashing task is charged: max_retries=1 means 2 runs, not 3.
    runs, go = tmp_path / "runs", tmp_path / "go"
    step = _pipelined()
    # Known fast (the first run, which loads the function, is not): pipelined from now on.
    assert set(nbcluster.get([step.remote(str(runs), "ok", "") for _ in range(40)])) == {"ok"}
    gate = step.remote(str(runs), "gate", str(go))
    poll_for(lambda: any(m.startswith("gate") for m in _marks(runs)), timeout=20)
    hold = step.remote(str(runs), "hold", str(go))
    crash = step.options(max_retries=1).remote(str(runs), "crash", "")
    tasks = context.require_client().submitter.tasks
    poll_for(  # both sent to the gate's worker (pipelined), so they arrive while it runs
        lambda: all(
            getattr(tasks.get(r.task_id()), "lease", None) is not None for r in (hold, crash)
        ),
        timeout=20,
    )
    time.sleep(0.2)
    go.touch()
    assert nbcluster.get(gate, timeout=60) == "gate"
    with pytest.raises(WorkerCrashedError, match=r"SIGKILL.*attempts: 2"):
        nbcluster.get(crash, timeout=60)
    assert nbcluster.get(hold, timeout=60) == "hold"  # its reply was lost: run again, uncharged
    crashes = [m.split(":") for m in _marks(runs) if m.startswith("crash")]
    assert len(crashes) == 2, _marks(runs)
    # The case arose: the crash ran behind the held task, in its worker, and took its reply.
    holds = [m.split(":") for m in _marks(runs) if m.startswith("hold")]
    assert len(holds) >= 2 and holds[0][2] == crashes[0][2], _marks(runs)
    # The node of the first crash names it as the task its worker began last.
    _, task_hex, worker_hex, node_hex = crashes[0]
    node = next(n for n in nbcluster.nodes() if n["NodeID"] == node_hex)
    address = f"{node['NodeManagerAddress']}:{node['NodeManagerPort']}"
    client = context.require_client()
    info = client.run(
        lambda: client.node(address).GetWorkerExitInfo(
            pb.WorkerRef(worker_id=bytes.fromhex(worker_hex)), timeout=10
        )
    )
    assert info.found and "SIGKILL" in info.detail
    assert info.started == encode_mark(bytes.fromhex(task_hex), 0)
    assert not mark_path(shared_cluster.session_dir, bytes.fromhex(worker_hex)).exists()
    assert_cluster_healthy()


# ------------------------------------------------------------------ F03: retry_exceptions


def _flaky():
    @nbcluster.remote
    def flaky(path, exc_type, fail_times):
        """Raise ``exc_type`` on the first ``fail_times`` attempts, then return the attempt."""
        with open(path, "a") as fh:
            fh.write("x\n")
        with open(path) as fh:
            attempt = len(fh.read().split())
        if fail_times < 0 or attempt <= fail_times:
            raise exc_type(f"attempt {attempt}")
        return attempt

    return flaky


def test_retry_exceptions_list_retries_only_listed_types(shared_cluster, tmp_path):
    flaky = _flaky().options(retry_exceptions=[ValueError])
    ok = tmp_path / "ok"
    assert nbcluster.get(flaky.remote(str(ok), ValueError, 1), timeout=30) == 2
    assert len(_marks(ok)) == 2

    not_listed = tmp_path / "not_listed"
    with pytest.raises(TaskError, match=r"attempt 1") as info:
        nbcluster.get(flaky.remote(str(not_listed), KeyError, 1), timeout=30)
    assert isinstance(info.value, KeyError)
    assert len(_marks(not_listed)) == 1

    # Subclasses of a listed type are retried too; retries stop at max_retries.
    bounded = tmp_path / "bounded"
    with pytest.raises(TaskError, match=r"attempt 3"):
        nbcluster.get(
            flaky.options(max_retries=2).remote(str(bounded), UnicodeError, -1), timeout=30
        )
    assert len(_marks(bounded)) == 3


def test_retry_exceptions_true_retries_any_exception(shared_cluster, tmp_path):
    flaky = _flaky()
    any_exc = tmp_path / "any"
    assert (
        nbcluster.get(
            flaky.options(retry_exceptions=True).remote(str(any_exc), RuntimeError, 2), timeout=30
        )
        == 3
    )
    assert len(_marks(any_exc)) == 3

    never = tmp_path / "never"
    with pytest.raises(TaskError, match=r"attempt 1"):
        nbcluster.get(
            flaky.options(retry_exceptions=False).remote(str(never), RuntimeError, 1), timeout=30
        )
    assert len(_marks(never)) == 1


# ------------------------------------------------------------------ F15: cancel and timeouts


def _blocker():
    # memory=1 gives blockers a scheduling key of their own. Tasks of one key are pipelined
    # onto one worker once the key's tasks are fast on average, so two blockers sharing the
    # 1-CPU key with the fast health-check tasks would queue behind each other on a single
    # worker (see test_tasks.py::test_slow_tasks_after_fast_tasks_run_in_parallel).
    @nbcluster.remote(memory=1)
    def block(started, go, value):
        """Append this pid to ``started``, then hold the CPU until ``go`` exists."""
        with open(started, "a") as fh:
            fh.write(f"{os.getpid()}\n")
        deadline = time.monotonic() + 30
        while not os.path.exists(go):
            if time.monotonic() > deadline:
                raise TimeoutError("never released")
            time.sleep(0.005)
        return value

    return block


def test_cancel_queued_task_never_runs(shared_cluster, tmp_path):
    block = _blocker()
    started, go, queued_runs = tmp_path / "started", tmp_path / "go", tmp_path / "queued"
    try:
        blockers = [block.remote(str(started), str(go), i) for i in range(2)]
        _await_marks(started, 2, "the two blockers")  # both CPUs are busy now
        queued = block.remote(str(queued_runs), str(go), "queued")
        nbcluster.cancel(queued)
        with pytest.raises(TaskCancelledError, match=r"was cancelled"):
            nbcluster.get(queued, timeout=10)
    finally:
        go.touch()
    assert nbcluster.get(blockers, timeout=30) == [0, 1]
    assert_cluster_healthy()  # the freed CPUs ran other tasks; the cancelled one stayed dead
    assert _marks(queued_runs) == []
    with pytest.raises(TaskCancelledError):
        nbcluster.get(queued, timeout=1)


def test_cancel_running_task_interrupts_it(shared_cluster, tmp_path):
    runs = tmp_path / "runs"

    @nbcluster.remote
    def sleeper(path):
        with open(path, "a") as fh:
            fh.write("x\n")
        time.sleep(60)
        return "finished"

    ref = sleeper.remote(str(runs))
    _await_marks(runs, 1, "the sleeping task")
    nbcluster.cancel(ref)
    with pytest.raises(TaskCancelledError):
        nbcluster.get(ref, timeout=5)  # interrupted: no need to wait the 60 s out
    assert_cluster_healthy()
    assert len(_marks(runs)) == 1  # cancelled tasks are not retried


def test_force_cancel_kills_the_worker_and_is_not_retried(shared_cluster, tmp_path):
    runs = tmp_path / "runs"

    @nbcluster.remote
    def stubborn(path):
        with open(path, "a") as fh:
            fh.write(f"{os.getpid()}\n")
        while True:  # ignores KeyboardInterrupt: only force can stop it
            with contextlib.suppress(KeyboardInterrupt):
                time.sleep(60)

    ref = stubborn.remote(str(runs))  # default max_retries=3
    _await_marks(runs, 1, "the stubborn task")
    nbcluster.cancel(ref, force=True)
    with pytest.raises((TaskCancelledError, WorkerCrashedError)):
        nbcluster.get(ref, timeout=10)
    pid = int(_marks(runs)[0])
    poll_for(lambda: not pid_alive(pid), timeout=10, message="the force-cancelled worker lives")
    assert_cluster_healthy()
    assert len(_marks(runs)) == 1  # not retried although max_retries=3


@pytest.mark.parametrize("force", [False, True], ids=["cancel", "force"])
def test_dependents_of_cancelled_task_are_cancelled(shared_cluster, tmp_path, force):
    block = _blocker()
    started, go, dep_runs = tmp_path / "started", tmp_path / "go", tmp_path / "dep_runs"

    @nbcluster.remote
    def inc(x, path):
        with open(path, "a") as fh:
            fh.write("x\n")
        return x + 1

    expected = (TaskCancelledError, WorkerCrashedError) if force else TaskCancelledError
    try:
        first = block.remote(str(started), str(go), 0)
        second = inc.remote(first, str(dep_runs))
        third = inc.remote(second, str(dep_runs))
        fourth = inc.remote(third, str(dep_runs))
        _await_marks(started, 1, "the first task of the chain")
        nbcluster.cancel(first, force=force)
        for ref in (first, second, third, fourth):
            with pytest.raises(expected):
                nbcluster.get(ref, timeout=10)
    finally:
        go.touch()
    assert_cluster_healthy()
    assert _marks(dep_runs) == []
    assert len(_marks(started)) == 1


def test_get_timeout_leaves_the_task_running(shared_cluster, tmp_path):
    block = _blocker()
    started, go = tmp_path / "started", tmp_path / "go"
    try:
        ref = block.remote(str(started), str(go), "done")
        with pytest.raises(GetTimeoutError, match=r"timed out") as info:
            nbcluster.get(ref, timeout=0.1)
        assert isinstance(info.value, TimeoutError)
        _await_marks(started, 1, "the blocked task")
        with pytest.raises(TimeoutError):
            nbcluster.get([ref], timeout=0.1)
    finally:
        go.touch()
    assert nbcluster.get(ref, timeout=30) == "done"
    assert len(_marks(started)) == 1


# ------------------------------------------------------------------ B02: serialization at submit


def test_unpicklable_argument_fails_at_submit_and_nothing_is_submitted(shared_cluster, tmp_path):
    runs = tmp_path / "runs"

    @nbcluster.remote
    def take(arg, path):
        with open(path, "a") as fh:
            fh.write("x\n")
        return "ran"

    client = context.require_client()
    held = nbcluster.put("held")
    held_id = held.binary()
    with pytest.raises(
        SerializationError, match=r"argument 0\['inner'\]\['lock'\] is a _thread\.lock"
    ):
        take.remote({"a": 1, "inner": {"ref": held, "lock": threading.Lock()}}, str(runs))
    with pytest.raises(TypeError, match=r"argument arg\['lock'\]"):  # also a TypeError
        take.remote(arg={"lock": threading.Lock()}, path=str(runs))
    with pytest.raises(SerializationError, match=r"argument 1 is a _thread\.lock"):
        take.remote(held, threading.Lock())  # a ref argument next to a bad one
    # No lease is held for them. (Availability comes from heartbeats, so it is polled: leases
    # of earlier tasks may still be reported as taken for a moment.)
    poll_for(
        lambda: nbcluster.available_resources() == nbcluster.cluster_resources(),
        timeout=10,
        message="resources are held after the failed submissions",
    )
    # The failed calls kept no reference: dropping the last ref frees the object.
    del held
    gc.collect()
    poll_for(lambda: client.table.get(held_id) is None, timeout=10, message="the put ref leaked")
    # Nothing ran: the first good call is the first execution.
    assert nbcluster.get(take.remote(1, str(runs)), timeout=30) == "ran"
    assert _marks(runs) == ["x"]


def test_put_generator_is_a_serialization_error(shared_cluster):
    def gen():
        yield 1

    with pytest.raises(SerializationError, match=r"generator.*list\(\.\.\.\)"):
        nbcluster.put(gen())
    with pytest.raises(SerializationError, match=r"generator"):
        nbcluster.put({"items": (x for x in range(3))})


def test_remote_function_closing_over_socket_fails_at_submit(shared_cluster, tmp_path):
    runs = tmp_path / "runs"
    with socket.socket() as sock:

        @nbcluster.remote  # decorating works; pickling happens at the first .remote()
        def uses_socket(path):
            with open(path, "a") as fh:
                fh.write("x\n")
            return sock.fileno()

        with pytest.raises(SerializationError, match=r"closure variable 'sock'.*socket") as info:
            uses_socket.remote(str(runs))
        assert isinstance(info.value, TypeError)

    @nbcluster.remote
    def no_socket(path):
        with open(path, "a") as fh:
            fh.write("x\n")
        return "ok"

    assert nbcluster.get(no_socket.remote(str(runs)), timeout=30) == "ok"
    assert _marks(runs) == ["x"]  # the socket closure never ran


# ------------------------------------------------------------------ B03: results that do not pickle


def test_unpicklable_return_value_is_a_task_error(shared_cluster):
    @nbcluster.remote
    def returns_lock():
        return {"lock": threading.Lock()}

    with pytest.raises(
        TaskError, match=r"return value of .*returns_lock could not be serialized"
    ) as info:
        nbcluster.get(returns_lock.remote(), timeout=30)
    err = info.value
    assert isinstance(err.cause, SerializationError)
    assert not isinstance(err.cause, TaskError)  # one error layer
    assert "_thread.lock" in str(err)
    # The worker that ran it is still alive and the cluster still runs tasks.
    assert err.pid in worker_pids(shared_cluster.session_dir)
    assert_cluster_healthy()


def test_unpicklable_exception_keeps_its_traceback_text(shared_cluster):
    @nbcluster.remote
    def raises_odd():
        class Odd(Exception):  # a local class holding a lock: cannot be pickled
            def __init__(self, msg):
                super().__init__(msg)
                self.lock = threading.Lock()

        raise Odd("odd-exception-text")

    @nbcluster.remote
    def raises_two_args():
        class TwoArgs(Exception):  # __init__ args not passed on: cannot be unpickled
            def __init__(self, a, b):
                super().__init__(f"two-args {a} {b}")

        raise TwoArgs(1, 2)

    for fn, text, line in [
        (raises_odd, "odd-exception-text", 'raise Odd("odd-exception-text")'),
        (raises_two_args, "two-args 1 2", "raise TwoArgs(1, 2)"),
    ]:
        with pytest.raises(TaskError, match=r"could not be sent back") as info:
            nbcluster.get(fn.remote(), timeout=30)
        err = info.value
        assert isinstance(err.cause, UnserializableException)
        assert text in err.cause.original_stack_trace
        assert line in err.cause.original_stack_trace
        assert text in str(err) and line in err.traceback_str
        assert err.pid in worker_pids(shared_cluster.session_dir)  # the worker survived
    assert_cluster_healthy()


# ------------------------------------------------------------------ B05: recursion and depth


def test_unbounded_recursion_in_task_is_a_bounded_task_error(shared_cluster):
    @nbcluster.remote
    def recurse_forever(n):
        def down(k):
            return down(k + 1) + 1

        return down(n)

    with pytest.raises(TaskError, match=r"RecursionError") as info:
        nbcluster.get(recurse_forever.remote(0), timeout=30)
    err = info.value
    assert isinstance(err, RecursionError)
    assert len(err.traceback_str.encode()) <= MAX_TB
    assert len(str(err).encode()) <= MAX_TB + 1024
    assert "recurse_forever" in err.traceback_str and "in down" in err.traceback_str
    assert err.pid in worker_pids(shared_cluster.session_dir)  # the worker survived
    assert_cluster_healthy()


def test_deeply_nested_argument_is_a_serialization_error(shared_cluster):
    @nbcluster.remote
    def take(x):
        return type(x).__name__

    deep: list = []
    for _ in range(100_000):
        deep = [deep]
    with pytest.raises(SerializationError, match=r"nested too deeply"):
        take.remote(deep)
    with pytest.raises(SerializationError, match=r"nested too deeply"):
        nbcluster.put(deep)

    # A self-referencing value is fine for pickle: it arrives with its cycle intact.
    @nbcluster.remote
    def cycle(x):
        return x[1] is x, x[0]

    loop: list = [7]
    loop.append(loop)
    assert nbcluster.get(cycle.remote(loop), timeout=30) == (True, 7)
    assert nbcluster.get(take.remote([[1]]), timeout=30) == "list"


# ------------------------------------------------------------------ B06: imports in tasks


def test_import_of_missing_module_fails_fast_every_time(shared_cluster):
    @nbcluster.remote
    def needs_module():
        import nbcluster_no_such_module_xyz  # noqa: F401

        return "imported"

    for _ in range(3):
        start = time.monotonic()
        with pytest.raises(
            TaskError, match=r"No module named 'nbcluster_no_such_module_xyz'"
        ) as info:
            nbcluster.get(needs_module.remote(), timeout=5)
        assert isinstance(info.value, ImportError)
        assert time.monotonic() - start < 5


def test_module_only_on_driver_path_fails_fast_every_time(shared_cluster, tmp_path):
    name = "nbc_driver_only_mod"
    (tmp_path / f"{name}.py").write_text("def helper():\n    return 42\n")
    sys.path.insert(0, str(tmp_path))
    try:
        mod = importlib.import_module(name)

        @nbcluster.remote
        def use_helper():
            return mod.helper()

        for _ in range(3):
            with pytest.raises(TaskError, match=rf"No module named '{name}'") as info:
                nbcluster.get(use_helper.remote(), timeout=5)
            assert isinstance(info.value, ImportError)
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop(name, None)
    assert_cluster_healthy()


# ------------------------------------------------------------------ L07: large closures


def test_huge_closure_is_refused_at_submit_time(shared_cluster, tmp_path):
    runs = tmp_path / "runs"
    big = np.ones(150 * 10**6, dtype=np.uint8)  # 150 MB, over the 100 MiB limit

    @nbcluster.remote  # decorating is fine: the size is checked when it is submitted
    def closes_over_big(path):
        with open(path, "a") as fh:
            fh.write("x\n")
        return int(big[0])

    with pytest.raises(
        ValueError, match=r"closes_over_big pickles to 14\d\.\d MiB.*nbcluster\.put\(\)"
    ):
        closes_over_big.remote(str(runs))
    big = None  # free the 150 MB (the closure cell was its only other holder)
    # Nothing was submitted: the first call with a small closure is the first execution.

    @nbcluster.remote
    def small(path):
        with open(path, "a") as fh:
            fh.write("x\n")
        return "ok"

    assert nbcluster.get(small.remote(str(runs)), timeout=30) == "ok"
    assert _marks(runs) == ["x"]


def test_large_closure_warns_and_runs(shared_cluster):
    medium = np.ones(20 * 10**6, dtype=np.uint8)  # 20 MB: over the 10 MiB warning

    @nbcluster.remote
    def closes_over_medium():
        return int(medium.sum())

    with pytest.warns(
        UserWarning, match=r"closes_over_medium pickles to 19\.\d MiB.*nbcluster\.put\(\)"
    ):
        ref = closes_over_medium.remote()
    assert nbcluster.get(ref, timeout=60) == 20 * 10**6
    assert nbcluster.get(closes_over_medium.remote(), timeout=60) == 20 * 10**6


# ------------------------------------------------------------------ killing a worker by PID


def test_worker_killed_by_pid_from_worker_pids_is_retried(shared_cluster, tmp_path):
    block = _blocker()
    started, go = tmp_path / "started", tmp_path / "go"
    session = shared_cluster.session_dir
    try:
        ref = block.remote(str(started), str(go), "done")  # default max_retries=3
        _await_marks(started, 1, "the task")
        pid = int(_marks(started)[0])
        assert pid in worker_pids(session)
        kill_process(pid)
        _await_marks(started, 2, "the retry after the kill")
    finally:
        go.touch()
    assert nbcluster.get(ref, timeout=30) == "done"
    pids = [int(p) for p in _marks(started)]
    assert len(pids) == 2 and pids[1] != pid and pids[1] in worker_pids(session)
    assert_cluster_healthy()
