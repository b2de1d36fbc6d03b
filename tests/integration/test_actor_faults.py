"""Actor failures on real processes (issue 3 acceptance 4; RELIABILITY F06, F07, F08).

Actors report their PID from a method (or write it to a file under ``tmp_path`` from
``__init__``) and the test SIGKILLs exactly that PID. Every run of a constructor appends a
line to a file under ``tmp_path``, so restarts are counted exactly. Methods that must block
wait for a "go" file the test creates, with their own deadline so that a bug cannot hang the
suite. Other drivers are subprocesses joined to the module's cluster.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import cloudpickle
import pytest

import nbcluster
from nbcluster.exceptions import ActorDiedError, GetTimeoutError, TaskError
from nbcluster.testing import assert_stays, kill_process, pid_alive, poll_for, quiet_period

pytestmark = pytest.mark.integration

# Workers cannot import this test module: ship its helpers (and classes) by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


def _await_exit(pid: int, timeout: float = 20) -> None:
    poll_for(lambda: not pid_alive(pid), timeout, 0.05, f"process {pid} is still running")


def _lines(path: Path) -> list[str]:
    try:
        return path.read_text().split()
    except FileNotFoundError:
        return []


def _append(path: str, text: str) -> None:
    with open(path, "a") as fh:
        fh.write(text + "\n")


def _wait_file(path: str, timeout: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


@nbcluster.remote
class Counted:
    """A counter whose constructor runs are logged (one line each) to ``ctor_log``."""

    def __init__(self, ctor_log: str) -> None:
        _append(ctor_log, str(os.getpid()))
        self.value = 0

    def increment(self) -> int:
        time.sleep(0.005)  # keep calls in flight for a while
        self.value += 1
        return self.value

    def add(self, n: int) -> int:
        self.value += n
        return self.value

    def pid(self) -> int:
        return os.getpid()

    def wait_for(self, go: str, started: str) -> str:
        _append(started, str(os.getpid()))
        assert _wait_file(go), "never told to go"
        return "went"


def _one_reset(values: list[int]) -> int:
    """Index of the single reset to 1 in an otherwise +1 sequence (fails otherwise)."""
    resets = [i for i in range(1, len(values)) if values[i] != values[i - 1] + 1]
    assert len(resets) == 1, f"expected one reset, found {len(resets)}: {values}"
    i = resets[0]
    assert values[0] == 1 and values[i] == 1, values
    return i


# ============================================================ F06: restarts with retries


def test_f06_restart_with_task_retries_keeps_every_call_in_order(shared_cluster, tmp_path):
    ctor = tmp_path / "ctor"
    c = Counted.options(max_restarts=1, max_task_retries=-1).remote(str(ctor))
    first_pid = nbcluster.get(c.pid.remote(), timeout=30)
    refs = [c.increment.remote() for _ in range(100)]
    nbcluster.get(refs[19], timeout=30)  # some have run; the rest are in flight or queued
    kill_process(first_pid)
    values = nbcluster.get(refs, timeout=120)
    assert len(values) == 100
    reset = _one_reset(values)
    assert reset >= 20  # the calls that had finished kept their results
    # values are monotonic apart from that single reset to 1
    assert values[:reset] == list(range(1, reset + 1))
    assert values[reset:] == list(range(1, 101 - reset))
    # the restart re-ran __init__ (state reset), once, in a new process
    assert len(_lines(ctor)) == 2
    second_pid = nbcluster.get(c.pid.remote(), timeout=30)
    assert second_pid != first_pid and str(second_pid) == _lines(ctor)[1]
    assert nbcluster.get(c.increment.remote(), timeout=30) == 101 - reset

    # The second death is final: max_restarts=1 is used up.
    kill_process(second_pid)
    _await_exit(second_pid)
    with pytest.raises(ActorDiedError) as info:
        nbcluster.get(c.increment.remote(), timeout=30)
    msg = str(info.value)
    assert "process died" in msg and "after 1 restart(s)" in msg and "SIGKILL" in msg
    assert info.value.actor_init_failed is False
    assert_stays(lambda: len(_lines(ctor)) == 2, quiet_period(0.5), "a third constructor ran")


def test_restart_reruns_init_and_calls_in_flight_fail_without_retries(shared_cluster, tmp_path):
    ctor, go, started = tmp_path / "ctor", tmp_path / "go", tmp_path / "started"
    c = Counted.options(max_restarts=1).remote(str(ctor))  # max_task_retries=0
    assert nbcluster.get(c.add.remote(5), timeout=30) == 5
    pid = nbcluster.get(c.pid.remote(), timeout=30)
    blocked = c.wait_for.remote(str(go), str(started))
    poll_for(lambda: _lines(started), 20, message="the call did not start")
    kill_process(pid)
    # at-most-once: the call that was running is not retried
    with pytest.raises(ActorDiedError, match=r"process died"):
        nbcluster.get(blocked, timeout=30)
    # but the actor came back, with fresh state
    assert nbcluster.get(c.add.remote(1), timeout=30) == 1
    assert len(_lines(ctor)) == 2
    assert nbcluster.get(c.pid.remote(), timeout=30) != pid
    assert _lines(started) == [str(pid)]  # the call did not run again
    nbcluster.kill(c)


@pytest.mark.parametrize("hang_in", [0, 1], ids=["first-init", "restart-init"])
def test_a_process_that_dies_during_init_is_restarted(shared_cluster, tmp_path, hang_in):
    ctor = tmp_path / "ctor"

    @nbcluster.remote(max_restarts=3)
    class SlowInit:
        def __init__(self, ctor_log: str, hang_in: int) -> None:
            runs = len(_lines(Path(ctor_log)))
            _append(ctor_log, str(os.getpid()))
            if runs == hang_in:  # this construction hangs in __init__ (until it is killed)
                time.sleep(60)

        def pid(self) -> int:
            return os.getpid()

    a = SlowInit.remote(str(ctor), hang_in)
    try:
        if hang_in == 1:
            kill_process(nbcluster.get(a.pid.remote(), timeout=30))
        poll_for(lambda: len(_lines(ctor)) == hang_in + 1, 20, message="__init__ did not run")
        kill_process(int(_lines(ctor)[hang_in]))  # dies inside __init__
        pid = nbcluster.get(a.pid.remote(), timeout=8)
        assert len(_lines(ctor)) == hang_in + 2 and pid == int(_lines(ctor)[-1])
    finally:
        nbcluster.kill(a)


# ============================================================ F07: at-most-once default


def test_f07_default_actor_fails_its_queued_calls_and_new_calls_fast(shared_cluster, tmp_path):
    ctor, go, started = tmp_path / "ctor", tmp_path / "go", tmp_path / "started"
    c = Counted.remote(str(ctor))
    pid = nbcluster.get(c.pid.remote(), timeout=30)
    refs = [c.wait_for.remote(str(go), str(started)) for _ in range(10)]
    poll_for(lambda: _lines(started), 20, message="the first call did not start")
    kill_process(pid)
    try:
        for ref in refs:
            with pytest.raises(ActorDiedError) as info:
                nbcluster.get(ref, timeout=30)
            assert "process died" in str(info.value)
    finally:
        go.touch()
    assert _lines(started) == [str(pid)]  # only the first one ever ran
    _await_exit(pid)
    # The actor is dead for good: a new call fails (a hang would raise GetTimeoutError).
    with pytest.raises(ActorDiedError) as info:
        nbcluster.get(c.add.remote(1), timeout=10)
    msg = str(info.value)
    assert "process died" in msg and f"pid {pid}" in msg and "SIGKILL" in msg
    assert "max_restarts" in msg  # says how to survive crashes
    assert len(_lines(ctor)) == 1  # not restarted (max_restarts=0)


def test_killed_actor_says_it_was_killed(shared_cluster, tmp_path):
    ctor, go, started = tmp_path / "ctor", tmp_path / "go", tmp_path / "started"
    c = Counted.options(max_restarts=3).remote(str(ctor))
    pid = nbcluster.get(c.pid.remote(), timeout=30)
    running = c.wait_for.remote(str(go), str(started))
    poll_for(lambda: _lines(started), 20, message="the call did not start")
    try:
        nbcluster.kill(c)  # no_restart=True: restarts left do not apply
        # The running call's stream breaks before the head's news of the death arrives: it
        # still says the actor was killed (the caller knew it had asked for the kill).
        with pytest.raises(ActorDiedError, match=r"killed with nbcluster\.kill\(\)") as info:
            nbcluster.get(running, timeout=30)
        assert info.value.actor_init_failed is False
    finally:
        go.touch()
    _await_exit(pid)
    with pytest.raises(ActorDiedError, match=r"killed with nbcluster\.kill\(\)"):
        nbcluster.get(c.add.remote(1), timeout=30)
    assert len(_lines(ctor)) == 1


# ============================================================ F08: __init__ raises


@pytest.mark.parametrize("max_restarts", [0, 2])
def test_f08_init_error_fails_every_call_and_runs_the_constructor_once(
    shared_cluster, tmp_path, max_restarts
):
    ctor = tmp_path / "ctor"

    @nbcluster.remote(max_restarts=max_restarts)
    class BadInit:
        def __init__(self, ctor_log: str) -> None:
            _append(ctor_log, str(os.getpid()))
            raise RuntimeError("init-went-wrong")

        def ping(self) -> str:
            return "pong"

    h = BadInit.remote(str(ctor))  # does not raise
    assert isinstance(h, nbcluster.ActorHandle)
    with pytest.raises(ActorDiedError) as info:
        nbcluster.get(h.ping.remote(), timeout=30)
    err = info.value
    assert err.actor_init_failed is True
    msg = str(err)
    assert "creation task" in msg  # the reason: __init__ raised
    assert "init-went-wrong" in msg
    assert 'raise RuntimeError("init-went-wrong")' in msg  # the __init__ traceback
    assert "in __init__" in msg
    assert isinstance(err.cause, TaskError) and isinstance(err.cause.cause, RuntimeError)
    # every later call fails the same way, at once
    with pytest.raises(ActorDiedError) as again:
        nbcluster.get(h.ping.remote(), timeout=30)
    assert again.value.actor_init_failed is True
    # the constructor ran exactly once (no restart, however long we look)
    assert_stays(lambda: len(_lines(ctor)) == 1, quiet_period(0.5), "the actor was restarted")
    pid = int(_lines(ctor)[0])
    _await_exit(pid)  # its process was stopped
    nbcluster.kill(h)  # harmless


def test_an_init_error_frees_the_name(shared_cluster, tmp_path):
    @nbcluster.remote
    class BadInit:
        def __init__(self, fail: bool) -> None:
            if fail:
                raise RuntimeError("nope")

        def ping(self) -> str:
            return "pong"

    h = BadInit.options(name="bad-init", namespace="faults").remote(True)
    with pytest.raises(ActorDiedError):
        nbcluster.get(h.ping.remote(), timeout=30)
    with pytest.raises(ValueError):
        nbcluster.get_actor("bad-init", namespace="faults")
    ok = BadInit.options(name="bad-init", namespace="faults").remote(False)
    assert nbcluster.get(ok.ping.remote(), timeout=30) == "pong"
    nbcluster.kill(ok)


# ============================================================ callers that go away


CALLER = textwrap.dedent(
    """
    import json, os, signal, sys
    import nbcluster

    nbcluster.init(address=sys.argv[1])
    h = nbcluster.get_actor(sys.argv[2], namespace="faults")
    print("ready", flush=True)
    sys.stdin.readline()
    if sys.argv[3] == "die-mid-call":
        ref = h.wait_for.remote(sys.argv[4], sys.argv[5])
        sys.stdin.readline()  # the test saw the call start
        os.kill(os.getpid(), signal.SIGKILL)
    out = {}
    for key, x in (("first", 1), ("second", 2)):
        try:
            out[key] = nbcluster.get(h.add.remote(x), timeout=8)
        except Exception as e:
            out[key] = type(e).__name__ + ": " + str(e)[:200]
    print(json.dumps(out), flush=True)
    nbcluster.shutdown()
    """
)


@contextlib.contextmanager
def _caller(address: str, actor_name: str, *args: str):
    """A second driver (subprocess) joined to this cluster, holding a handle by name."""
    p = subprocess.Popen(
        [sys.executable, "-c", CALLER, address, actor_name, *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        line = p.stdout.readline().strip()  # type: ignore[union-attr]
        assert line == "ready", f"caller failed to start: {line} {p.stderr.read()[-2000:]}"  # type: ignore[union-attr]
        yield p
    finally:
        if p.poll() is None:
            p.kill()
        p.wait(30)


def _tell(p: subprocess.Popen[str]) -> None:
    p.stdin.write("\n")  # type: ignore[union-attr]
    p.stdin.flush()  # type: ignore[union-attr]


def test_an_actor_survives_a_caller_that_dies_mid_call(shared_cluster, tmp_path):
    ctor, go, started = tmp_path / "ctor", tmp_path / "go", tmp_path / "started"
    c = Counted.options(name="shared-svc", namespace="faults").remote(str(ctor))
    pid = nbcluster.get(c.pid.remote(), timeout=30)
    try:
        with _caller(
            shared_cluster.address, "shared-svc", "die-mid-call", str(go), str(started)
        ) as p:
            _tell(p)
            poll_for(lambda: _lines(started), 20, message="the caller's call did not start")
            _tell(p)
            assert p.wait(30) == -signal.SIGKILL
        assert_stays(lambda: pid_alive(pid), quiet_period(1.0), "the actor exited with its caller")
        go.touch()  # the orphaned call may finish now
        assert nbcluster.get(c.add.remote(1), timeout=30) == 1
        assert len(_lines(ctor)) == 1
    finally:
        go.touch()
        nbcluster.kill(c)


def test_a_call_survives_a_slow_first_connection(shared_cluster, tmp_path):
    ctor = tmp_path / "ctor"
    c = Counted.options(name="stopped-svc", namespace="faults").remote(str(ctor))
    pid = nbcluster.get(c.pid.remote(), timeout=30)
    try:
        with _caller(shared_cluster.address, "stopped-svc", "calls") as p:
            os.kill(pid, signal.SIGSTOP)  # alive, but slow to answer a new connection
            try:
                _tell(p)  # the caller connects and calls now
                time.sleep(1.0)
            finally:
                os.kill(pid, signal.SIGCONT)
            out, err = p.communicate(timeout=60)
        result = json.loads(out.strip().splitlines()[-1])
        assert result == {"first": 1, "second": 3}, result
        assert pid_alive(pid) and nbcluster.get(c.pid.remote(), timeout=30) == pid
        assert len(_lines(ctor)) == 1
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)
        nbcluster.kill(c)


def test_a_caller_that_exits_between_calls_leaves_the_actor_alone(shared_cluster, tmp_path):
    ctor = tmp_path / "ctor"
    c = Counted.options(name="visited-svc", namespace="faults").remote(str(ctor))
    pid = nbcluster.get(c.pid.remote(), timeout=30)
    try:
        with _caller(shared_cluster.address, "visited-svc", "calls") as p:
            _tell(p)
            out, err = p.communicate(timeout=60)
            assert p.returncode == 0, err[-2000:]
        assert json.loads(out.strip().splitlines()[-1]) == {"first": 1, "second": 3}
        assert_stays(lambda: pid_alive(pid), quiet_period(0.5), "the actor exited with its caller")
        assert nbcluster.get(c.add.remote(10), timeout=30) == 13
    finally:
        nbcluster.kill(c)


def test_get_with_timeout_on_a_hung_actor_call_raises_get_timeout_error(shared_cluster, tmp_path):
    ctor, go, started = tmp_path / "ctor", tmp_path / "go", tmp_path / "started"
    c = Counted.remote(str(ctor))
    try:
        ref = c.wait_for.remote(str(go), str(started))
        with pytest.raises(GetTimeoutError):
            nbcluster.get(ref, timeout=0.5)
        go.touch()
        assert nbcluster.get(ref, timeout=30) == "went"
    finally:
        go.touch()
        nbcluster.kill(c)
