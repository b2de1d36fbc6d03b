"""Actors, Ray-complete (issue 20 item 3), on one shared 2-CPU cluster.

Concurrency groups are proven by counting the calls in flight in each group from inside
the actor (never by timing): every call holds until the test releases it, the test polls
a method of a free group until each group has exactly its limit running, and after the
release the most ever seen at once in each group must equal its limit. The threads (or
event loops) a call ran on name its group.

Also: ``@nbcluster.method`` bare and with options; ``enable_task_events=False``;
``nbcluster.actor.exit_actor()`` and ``sys.exit()`` in a method (Ray's intended vs
unexpected exit, and restarts); cancelling actor calls; and calls on the handle of an
actor whose owner actor was killed; the per-call options through a client-mode
(``nbcluster://``) driver.
"""

from __future__ import annotations

import asyncio
import atexit
import collections
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import cloudpickle
import pytest

import nbcluster
from nbcluster import state
from nbcluster.exceptions import ActorDiedError, TaskCancelledError, TaskError
from nbcluster.testing import pid_alive, poll_for

pytestmark = pytest.mark.integration

# Workers cannot import this test module: ship its classes by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

LIMITS = {"io": 2, "compute": 4, "": 3}  # "" is the default group (max_concurrency=3)
HELD = {"io": 4, "compute": 6, "": 5}  # more calls than each limit, all at once
GROUPS = {"io": 2, "compute": 4, "admin": 1}


class _InFlight:
    """Calls in flight per key, the most seen at once, and the threads they ran on."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.active: collections.Counter[str] = collections.Counter()
        self.peak: collections.Counter[str] = collections.Counter()
        self.release = threading.Event()

    def enter(self, key: str) -> None:
        with self.lock:
            self.active[key] += 1
            self.peak[key] = max(self.peak[key], self.active[key])

    def leave(self, key: str) -> str:
        with self.lock:
            self.active[key] -= 1
        return threading.current_thread().name

    def stats(self) -> dict[str, dict[str, int]]:
        with self.lock:
            return {"active": dict(self.active), "peak": dict(self.peak)}


@nbcluster.remote(concurrency_groups=GROUPS, max_concurrency=3)
class ThreadedGroups:
    def __init__(self) -> None:
        self.calls = _InFlight()

    def _hold(self, key: str) -> str:
        self.calls.enter(key)
        self.calls.release.wait(60)
        return self.calls.leave(key)

    @nbcluster.method(concurrency_group="io")
    def io(self, key: str = "io") -> str:
        return self._hold(key)

    @nbcluster.method(concurrency_group="compute")
    def compute(self, key: str = "compute") -> str:
        return self._hold(key)

    def default(self, key: str = "") -> str:
        return self._hold(key)

    @nbcluster.method(concurrency_group="admin")
    def stats(self) -> dict[str, dict[str, int]]:
        return self.calls.stats()

    @nbcluster.method(concurrency_group="admin")
    def open(self) -> None:
        self.calls.release.set()


@nbcluster.remote(concurrency_groups=GROUPS, max_concurrency=3)
class AsyncGroups:
    def __init__(self) -> None:
        self.calls = _InFlight()

    async def _hold(self, key: str) -> str:
        self.calls.enter(key)
        while not self.calls.release.is_set():  # the groups run on different event loops
            await asyncio.sleep(0.01)
        return self.calls.leave(key)

    @nbcluster.method(concurrency_group="io")
    async def io(self, key: str = "io") -> str:
        return await self._hold(key)

    @nbcluster.method(concurrency_group="compute")
    async def compute(self, key: str = "compute") -> str:
        return await self._hold(key)

    async def default(self, key: str = "") -> str:
        return await self._hold(key)

    @nbcluster.method(concurrency_group="admin")
    async def stats(self) -> dict[str, dict[str, int]]:
        return self.calls.stats()

    @nbcluster.method(concurrency_group="admin")
    async def open(self) -> None:
        self.calls.release.set()


def _prove_limits(actor: Any, thread_prefix: str) -> None:
    refs: dict[str, list[Any]] = {"io": [], "compute": [], "": []}
    for _ in range(HELD["io"]):
        refs["io"].append(actor.io.remote())
    for _ in range(HELD["compute"] - 2):
        refs["compute"].append(actor.compute.remote())
    for _ in range(2):  # per call: a default-group method sent to "compute"
        refs["compute"].append(actor.default.options(concurrency_group="compute").remote("compute"))
    for _ in range(HELD[""]):
        refs[""].append(actor.default.remote())
    # every group fills up to its limit at the same time, and the "admin" group still answers
    poll_for(
        lambda: nbcluster.get(actor.stats.remote(), timeout=30)["active"] == LIMITS,
        timeout=60,
        interval=0.05,
        message=f"the groups never ran {LIMITS} calls at once",
    )
    assert nbcluster.get(actor.stats.remote(), timeout=30)["active"] == LIMITS  # no more start
    nbcluster.get(actor.open.remote(), timeout=30)
    threads = {group: nbcluster.get(rs, timeout=60) for group, rs in refs.items()}
    assert nbcluster.get(actor.stats.remote(), timeout=30)["peak"] == LIMITS
    for group, names in threads.items():
        label = group or "default"
        assert all(name.startswith(f"{thread_prefix}{label}") for name in names), (group, names)


def test_threaded_actor_groups_each_run_at_most_their_limit(shared_cluster: Any) -> None:
    actor = ThreadedGroups.remote()
    try:
        _prove_limits(actor, "actor-")
        # each group has its own threads: as many as its limit
        names = nbcluster.get([actor.io.remote() for _ in range(4)], timeout=30)
        assert len(set(names)) <= LIMITS["io"]
    finally:
        nbcluster.kill(actor)


def test_async_actor_groups_each_run_at_most_their_limit_on_their_own_loop(
    shared_cluster: Any,
) -> None:
    actor = AsyncGroups.remote()
    try:
        _prove_limits(actor, "actor-loop-")
    finally:
        nbcluster.kill(actor)


def test_a_call_naming_an_undefined_group_fails_in_options(shared_cluster: Any) -> None:
    actor = ThreadedGroups.remote()
    try:
        with pytest.raises(
            ValueError,
            match=r"^ThreadedGroups\.io\.options\(concurrency_group='disk'\): the actor has "
            r"no concurrency group 'disk' \(defined: 'admin', 'compute', 'io'\)",
        ):
            actor.io.options(concurrency_group="disk")
        with pytest.raises(ValueError, match=r"invalid option\(s\) for an actor method: colour"):
            actor.io.options(colour="red")
        nbcluster.get(actor.open.remote(), timeout=30)
        assert nbcluster.get(actor.io.remote(), timeout=30).startswith("actor-io")
    finally:
        nbcluster.kill(actor)


# ============================================================ @nbcluster.method


@nbcluster.remote
class Methods:
    @nbcluster.method
    def bare(self) -> str:
        return "bare"

    @nbcluster.method(num_returns=2)
    def pair(self) -> tuple[int, int]:
        return 1, 2

    @nbcluster.method(enable_task_events=False)
    def quiet(self) -> str:
        return "quiet"

    def loud(self) -> str:
        return "loud"


def test_method_bare_and_with_num_returns(shared_cluster: Any) -> None:
    m = Methods.remote()
    try:
        assert nbcluster.get(m.bare.remote(), timeout=30) == "bare"
        a, b = m.pair.remote()
        assert nbcluster.get([a, b], timeout=30) == [1, 2]
    finally:
        nbcluster.kill(m)


def test_enable_task_events_false_keeps_calls_out_of_the_state_api(shared_cluster: Any) -> None:
    m = Methods.remote()
    try:
        quiet = m.quiet.remote()
        quiet_by_option = m.loud.options(enable_task_events=False).remote()
        assert nbcluster.get([quiet, quiet_by_option], timeout=30) == ["quiet", "loud"]
        loud = m.loud.remote()  # runs after both (one caller, a sync actor): reported after
        assert nbcluster.get(loud, timeout=30) == "loud"

        def seen() -> set[str]:
            return {e.task_id for e in state.task_events()[0]}

        ids = poll_for(
            lambda: loud.task_id().hex() in seen() and seen(),
            timeout=30,
            message="the enabled call's task event never reached the head",
        )
        assert quiet.task_id().hex() not in ids
        assert quiet_by_option.task_id().hex() not in ids
    finally:
        nbcluster.kill(m)


# ============================================================ exit_actor and sys.exit


@nbcluster.remote(max_restarts=2, max_concurrency=2)
class Exiter:
    def __init__(self, marker: str) -> None:
        atexit.register(lambda: Path(marker).write_text("atexit ran"))

    def pid(self) -> int:
        return os.getpid()

    def slow(self, started: str, go: str) -> str:
        Path(started).write_text("started")
        deadline = time.monotonic() + 60
        while not os.path.exists(go) and time.monotonic() < deadline:
            time.sleep(0.01)
        return "finished"

    def stop(self) -> None:
        nbcluster.actor.exit_actor()

    def sys_exit(self, code: Any) -> None:
        if code == "none":
            sys.exit()
        sys.exit(code)


def _wait_state(actor: Any, wanted: str, restarts: int | None = None) -> dict[str, Any]:
    def check() -> dict[str, Any] | None:
        info = state.actor_info(actor)
        if info is None or info["state"] != wanted:
            return None
        if restarts is not None and info["restarts"] != restarts:
            return None
        return info

    return poll_for(check, timeout=60, interval=0.05, message=f"the actor never became {wanted}")


def test_exit_actor_finishes_running_calls_fails_the_rest_and_is_not_restarted(
    shared_cluster: Any, tmp_path: Path
) -> None:
    marker, started, go = tmp_path / "atexit", tmp_path / "started", tmp_path / "go"
    actor = Exiter.remote(str(marker))
    pid = nbcluster.get(actor.pid.remote(), timeout=30)
    running = actor.slow.remote(str(started), str(go))
    poll_for(started.exists, timeout=30, message="slow() never started")
    stopping = actor.stop.remote()  # takes the second thread
    queued = actor.pid.remote()  # waits for a thread: must fail, never run
    with pytest.raises(ActorDiedError, match=r"exit_actor\(\) was called in stop"):
        nbcluster.get(stopping, timeout=30)
    with pytest.raises(ActorDiedError):
        nbcluster.get(queued, timeout=30)
    assert pid_alive(pid)  # slow() still runs: the actor waits for it
    go.write_text("go")
    assert nbcluster.get(running, timeout=30) == "finished"  # running calls finish first
    poll_for(lambda: not pid_alive(pid), timeout=30, message="the actor's process did not exit")
    assert marker.read_text() == "atexit ran"
    info = _wait_state(actor, "DEAD")
    assert info["restarts"] == 0  # an intended exit is not restarted (max_restarts=2)
    with pytest.raises(ActorDiedError, match=r"exit_actor\(\) was called"):
        nbcluster.get(actor.pid.remote(), timeout=30)


@nbcluster.remote(max_restarts=1)
class AsyncExiter:
    async def ping(self) -> str:
        return "pong"

    async def stop(self) -> None:
        nbcluster.actor.exit_actor()


def test_exit_actor_in_an_async_actor(shared_cluster: Any) -> None:
    actor = AsyncExiter.remote()
    assert nbcluster.get(actor.ping.remote(), timeout=30) == "pong"
    with pytest.raises(ActorDiedError, match=r"ended itself .*exit_actor\(\) was called in stop"):
        nbcluster.get(actor.stop.remote(), timeout=30)
    _wait_state(actor, "DEAD")
    with pytest.raises(ActorDiedError):
        nbcluster.get(actor.ping.remote(), timeout=30)


def test_sys_exit_0_is_an_intended_exit_and_is_not_restarted(
    shared_cluster: Any, tmp_path: Path
) -> None:
    actor = Exiter.remote(str(tmp_path / "atexit"))
    pid = nbcluster.get(actor.pid.remote(), timeout=30)
    with pytest.raises(ActorDiedError, match=r"sys\.exit\(0\) was called in sys_exit"):
        nbcluster.get(actor.sys_exit.remote(0), timeout=30)
    assert _wait_state(actor, "DEAD")["restarts"] == 0
    poll_for(lambda: not pid_alive(pid), timeout=30, message="the actor's process did not exit")
    with pytest.raises(ActorDiedError):
        nbcluster.get(actor.pid.remote(), timeout=30)


@nbcluster.remote(max_restarts=1)
class Crasher:
    def pid(self) -> int:
        return os.getpid()

    def sys_exit(self, code: Any) -> None:
        if code == "none":
            sys.exit()
        sys.exit(code)


def test_sys_exit_without_code_or_nonzero_is_unexpected_and_restarts_apply(
    shared_cluster: Any,
) -> None:
    """Ray: ``sys.exit()`` and non-zero codes end the worker like a crash (SYSTEM_ERROR)."""
    actor = Crasher.remote()
    first = nbcluster.get(actor.pid.remote(), timeout=30)
    with pytest.raises(ActorDiedError):
        nbcluster.get(actor.sys_exit.remote("none"), timeout=30)
    _wait_state(actor, "ALIVE", restarts=1)  # restarted (max_restarts=1)
    second = nbcluster.get(actor.pid.remote(), timeout=30)
    assert second != first and not pid_alive(first)
    with pytest.raises(ActorDiedError):
        nbcluster.get(actor.sys_exit.remote(3), timeout=30)
    _wait_state(actor, "DEAD")  # no restarts left
    with pytest.raises(ActorDiedError):
        nbcluster.get(actor.pid.remote(), timeout=30)


# ============================================================ cancelling actor calls


@nbcluster.remote(concurrency_groups={"one": 1})
class Cancellable:
    def __init__(self) -> None:
        self.started: list[str] = []
        self.saw_cancel: list[str] = []

    async def slow(self, tag: str) -> str:
        self.started.append(tag)
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            self.saw_cancel.append(tag)
            raise
        return tag

    @nbcluster.method(concurrency_group="one")
    async def single(self, tag: str) -> str:
        return await self.slow(tag)

    async def report(self) -> dict[str, list[str]]:
        return {"started": self.started, "saw_cancel": self.saw_cancel}


def test_cancelling_a_running_async_call_raises_a_task_error_that_is_task_cancelled(
    shared_cluster: Any,
) -> None:
    actor = Cancellable.remote()
    try:
        running = actor.single.remote("running")
        waiting = actor.single.remote("waiting")  # the group runs one call at a time
        poll_for(
            lambda: nbcluster.get(actor.report.remote(), timeout=30)["started"] == ["running"],
            timeout=30,
            message="the first call never started",
        )
        nbcluster.cancel(waiting)
        with pytest.raises(TaskCancelledError):
            nbcluster.get(waiting, timeout=30)
        nbcluster.cancel(running)
        with pytest.raises(TaskCancelledError) as info:
            nbcluster.get(running, timeout=30)
        assert isinstance(info.value, TaskError)  # what Ray code catches (RayTaskError)
        report = nbcluster.get(actor.report.remote(), timeout=30)
        assert report == {"started": ["running"], "saw_cancel": ["running"]}
        # the actor lives on and its group is free again
        nbcluster.cancel(ref := actor.single.remote("again"))
        with pytest.raises(TaskCancelledError):
            nbcluster.get(ref, timeout=30)
    finally:
        nbcluster.kill(actor)


@nbcluster.remote
class Patient:
    def wait_for_cancel(self, started: str) -> str:
        Path(started).write_text("started")
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if nbcluster.get_runtime_context().is_canceled():
                return "saw is_canceled()"
            time.sleep(0.01)
        return "never cancelled"


def test_cancelling_a_running_sync_actor_call_only_sets_is_canceled(
    shared_cluster: Any, tmp_path: Path
) -> None:
    """Ray: a sync actor's running call is not interrupted (actors have state)."""
    actor = Patient.remote()
    try:
        started = tmp_path / "started"
        ref = actor.wait_for_cancel.remote(str(started))
        poll_for(started.exists, timeout=30, message="the call never started")
        with pytest.raises(ValueError, match=r"^force=True is not supported for actor tasks"):
            nbcluster.cancel(ref, force=True)
        nbcluster.cancel(ref)
        assert nbcluster.get(ref, timeout=30) == "saw is_canceled()"
    finally:
        nbcluster.kill(actor)


# ============================================================ owner actors


@nbcluster.remote
class Child:
    def ping(self) -> str:
        return "pong"

    def pid(self) -> int:
        return os.getpid()


@nbcluster.remote
class Parent:
    def __init__(self) -> None:
        self.children = [Child.remote(), Child.remote()]

    def get_children(self) -> list[Any]:
        return self.children


def test_a_call_after_the_owner_actor_was_killed_fails_at_once(shared_cluster: Any) -> None:
    parent = Parent.remote()
    used, unused = nbcluster.get(parent.get_children.remote(), timeout=30)
    assert nbcluster.get(used.ping.remote(), timeout=30) == "pong"
    pid = nbcluster.get(used.pid.remote(), timeout=30)
    nbcluster.kill(parent)
    ref = used.ping.remote()  # the child died with its owner: no race with the head's news
    with pytest.raises(ActorDiedError, match=r"created it"):  # from the head or our own news
        nbcluster.get(ref, timeout=30)
    with pytest.raises(ActorDiedError, match=r"created it"):
        nbcluster.get(unused.ping.remote(), timeout=30)
    poll_for(lambda: not pid_alive(pid), timeout=30, message="the child's process did not exit")
    assert state.actor_info(used)["state"] == "DEAD"  # type: ignore[index]


def test_a_call_after_kill_fails_at_once(shared_cluster: Any) -> None:
    child = Child.remote()
    assert nbcluster.get(child.ping.remote(), timeout=30) == "pong"
    nbcluster.kill(child)
    with pytest.raises(ActorDiedError, match=r"killed with nbcluster\.kill\(\)"):
        nbcluster.get(child.ping.remote(), timeout=30)


CLIENT_SCRIPT = """
import sys, threading
import nbcluster

nbcluster.init("nbcluster://" + sys.argv[1])

@nbcluster.remote(concurrency_groups={"io": 1})
class Svc:
    @nbcluster.method(concurrency_group="io")
    def io(self):
        return threading.current_thread().name

    def default(self):
        return threading.current_thread().name

s = Svc.remote()
got = nbcluster.get(
    [s.io.remote(), s.default.options(concurrency_group="io").remote(), s.default.remote()],
    timeout=60,
)
print(" ".join(name.rsplit("_", 1)[0] for name in got))
try:
    s.default.options(concurrency_group="disk")
except ValueError as e:
    print("refused:", e)
nbcluster.kill(s)
nbcluster.shutdown()
"""


def test_groups_and_per_call_options_work_in_client_mode(shared_cluster: Any) -> None:
    out = subprocess.run(
        [sys.executable, "-c", CLIENT_SCRIPT, shared_cluster.address],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "actor-io actor-io actor-default"
    assert lines[1].startswith("refused: Svc.default.options(concurrency_group='disk')")
