"""Actors on real clusters (issue 3 acceptance 1, 2, 3, 5, 7; RELIABILITY L05, L06).

Most tests share one 2-CPU cluster per module (``shared_cluster``, health-checked after each
test). Tests that need their own cluster (GPUs and custom resources) come last in the file,
because the ``cluster`` fixture shuts the shared one down. Driver-lifetime tests run other
drivers as subprocesses against a cluster started by the CLI or ``LocalCluster(detached=True)``
and end every process of that cluster by PID in ``finally``.

Whether an actor's process has ended is checked by PID with psutil (the PID comes from a
method of the actor, or from the head's actor table), and for L06 also against
``nbcluster.testing.worker_pids``.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
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
import psutil
import pytest

import nbcluster
from nbcluster.exceptions import (
    ActorDiedError,
    NbclusterError,
    PendingCallsLimitExceeded,
    TaskError,
)
from nbcluster.testing import (
    assert_stays,
    cluster_processes,
    pid_alive,
    poll_for,
    quiet_period,
    worker_pids,
)
from nbcluster.util.scheduling_strategies import NodeAffinitySchedulingStrategy

pytestmark = pytest.mark.integration

# Workers cannot import this test module: ship its helpers (and classes) by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

CLI = [sys.executable, "-m", "nbcluster.cli"]


def _await_exit(pid: int, timeout: float = 20, what: str = "the actor's process") -> None:
    poll_for(lambda: not pid_alive(pid), timeout, 0.05, f"{what} (pid {pid}) is still running")


def _wait_file(path: str, timeout: float = 30.0) -> bool:
    """Block (inside an actor) until ``path`` exists; False at the deadline."""
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


@nbcluster.remote
class Counter:
    def __init__(self, start: int = 0) -> None:
        self.value = start

    def add(self, n: int = 1) -> int:
        self.value += n
        return self.value

    def get(self) -> int:
        return self.value

    def pid(self) -> int:
        return os.getpid()


# ============================================================ 1. actor classes and handles


def test_actor_lives_in_its_own_process_and_calls_run_in_order(shared_cluster):
    assert isinstance(Counter, nbcluster.ActorClass)

    @nbcluster.remote
    def task_pid() -> int:
        return os.getpid()

    c = Counter.remote(10)
    assert isinstance(c, nbcluster.ActorHandle)
    assert isinstance(c.add, nbcluster.ActorMethod)
    refs = [c.add.remote() for _ in range(100)]
    assert all(isinstance(r, nbcluster.ObjectRef) for r in refs)
    values = nbcluster.get(refs, timeout=60)
    assert values == list(range(11, 111))  # strictly increasing, in submission order
    assert nbcluster.get(c.get.remote(), timeout=30) == 110

    pid = nbcluster.get(c.pid.remote(), timeout=30)
    assert pid != os.getpid()
    task_pids = set(nbcluster.get([task_pid.remote() for _ in range(20)], timeout=30))
    assert pid not in task_pids
    # one process per actor
    other = Counter.remote()
    assert nbcluster.get(other.pid.remote(), timeout=30) not in task_pids | {pid}
    nbcluster.kill(other)
    nbcluster.kill(c)


def test_handles_work_in_tasks_and_in_other_actors(shared_cluster):
    c = Counter.remote()

    @nbcluster.remote
    def bump(counter, n: int) -> list[int]:
        return nbcluster.get([counter.add.remote() for _ in range(n)], timeout=60)

    @nbcluster.remote
    def bump_nested(box: dict) -> int:
        return nbcluster.get(box["counters"][0].add.remote(1000), timeout=60)

    @nbcluster.remote
    class User:
        def __init__(self, counter) -> None:
            self.counter = counter

        def via_constructor(self) -> int:
            return nbcluster.get(self.counter.add.remote(100), timeout=60)

        def via_argument(self, counter) -> int:
            return nbcluster.get(counter.add.remote(10_000), timeout=60)

    from_task = nbcluster.get(bump.remote(c, 50), timeout=60)
    assert from_task == list(range(1, 51))  # ordered from the task's side too
    assert nbcluster.get(bump_nested.remote({"counters": [c]}), timeout=60) == 1050
    u = User.remote(c)
    assert nbcluster.get(u.via_constructor.remote(), timeout=60) == 1150
    assert nbcluster.get(u.via_argument.remote(c), timeout=60) == 11150
    assert nbcluster.get(c.get.remote(), timeout=30) == 11150
    nbcluster.kill(u)
    nbcluster.kill(c)


def test_calling_an_actor_class_or_method_directly_raises_type_error(shared_cluster):
    with pytest.raises(TypeError, match=r"Counter\.remote\(\)"):
        Counter()
    with pytest.raises(TypeError, match=r"Counter\.remote\(\)"):
        Counter(5)
    c = Counter.remote()
    with pytest.raises(TypeError, match=r"add\.remote\(\)"):
        c.add()
    with pytest.raises(TypeError, match=r"add\.remote\(\)"):
        c.add(1)
    # the handle still works after the mistakes
    assert nbcluster.get(c.add.remote(2), timeout=30) == 2
    nbcluster.kill(c)


@pytest.mark.filterwarnings("error::pytest.PytestUnraisableExceptionWarning")
def test_a_failed_direct_handle_construction_leaves_no_error_behind():
    with pytest.raises(TypeError, match=r"use Cls\.remote\(\) or nbcluster\.get_actor"):
        nbcluster.ActorHandle()
    gc.collect()


@pytest.mark.parametrize(
    ("args", "kwargs", "match"),
    [
        ((1, 2, 3), {}, r"too many positional arguments"),
        ((1, 2), {"begin": 1}, r"unexpected keyword argument 'begin'"),
        ((1,), {}, r"missing a required argument: 'b'"),
    ],
    ids=["too-many", "unknown-kw", "missing"],
)
def test_wrong_constructor_arity_raises_type_error_at_remote(
    shared_cluster, tmp_path, args, kwargs, match
):
    runs = tmp_path / "ctor_runs"

    @nbcluster.remote
    class Pair:
        def __init__(self, a, b) -> None:
            with open(runs, "a") as fh:
                fh.write("x\n")

    with pytest.raises(TypeError, match=match) as info:
        Pair.remote(*args, **kwargs)
    assert "Pair.remote()" in str(info.value)
    assert not runs.exists()  # no constructor ran anywhere


def test_missing_method_raises_attribute_error_listing_the_methods(shared_cluster):
    c = Counter.remote()
    with pytest.raises(AttributeError, match=r"has no method 'nope'") as info:
        c.nope.remote()
    assert "add, get, pid" in str(info.value)
    with pytest.raises(AttributeError):
        c._private_not_there  # noqa: B018
    nbcluster.kill(c)


def test_method_num_returns(shared_cluster):
    @nbcluster.remote
    class Multi:
        @nbcluster.method(num_returns=2)
        def two(self):
            return "a", "b"

        @nbcluster.method(num_returns=0)
        def none(self):
            return None

        def pair(self):
            return 1, 2

        @nbcluster.method(num_returns=3)
        def wrong(self):
            return 1, 2

    m = Multi.remote()
    refs = m.two.remote()
    assert isinstance(refs, list) and len(refs) == 2
    assert nbcluster.get(refs, timeout=30) == ["a", "b"]
    assert m.none.remote() is None
    one = m.pair.remote()
    assert isinstance(one, nbcluster.ObjectRef)
    assert nbcluster.get(one, timeout=30) == (1, 2)
    split = m.pair.options(num_returns=2).remote()
    assert nbcluster.get(split, timeout=30) == [1, 2]
    whole = m.two.options(num_returns=1).remote()
    assert nbcluster.get(whole, timeout=30) == ("a", "b")
    bad = m.wrong.remote()
    with pytest.raises(TaskError, match=r"num_returns=3"):
        nbcluster.get(bad[0], timeout=30)
    with pytest.raises(ValueError, match=r"num_returns"):
        nbcluster.method(num_returns=-1)
    with pytest.raises(ValueError, match=r"valid: num_returns"):
        m.pair.options(num_cpus=1)
    nbcluster.kill(m)


def test_actor_errors_come_back_as_task_errors_and_the_actor_lives_on(shared_cluster):
    @nbcluster.remote
    class Fragile:
        def __init__(self) -> None:
            self.calls = 0

        def fail(self):
            self.calls += 1
            raise KeyError("no-such-key")

        def count(self):
            self.calls += 1
            return self.calls

    f = Fragile.remote()
    with pytest.raises(TaskError, match=r"no-such-key") as info:
        nbcluster.get(f.fail.remote(), timeout=30)
    assert isinstance(info.value, KeyError)
    assert "Fragile" in str(info.value) or "fail" in info.value.function_name
    assert nbcluster.get(f.count.remote(), timeout=30) == 2  # state kept, not restarted
    nbcluster.kill(f)


def test_actor_constructor_takes_refs_and_resolves_them(shared_cluster):
    @nbcluster.remote
    def make(n: int) -> int:
        return n * 2

    big = nbcluster.put(list(range(100_000)))
    c = Counter.remote(make.remote(21))
    assert nbcluster.get(c.get.remote(), timeout=30) == 42

    @nbcluster.remote
    class Summer:
        def __init__(self, data) -> None:
            self.total = sum(data)

        def total_plus(self, more) -> int:
            return self.total + sum(more)

    s = Summer.remote(big)
    assert nbcluster.get(s.total_plus.remote(big), timeout=30) == 2 * sum(range(100_000))
    nbcluster.kill(c)
    nbcluster.kill(s)


# ============================================================ 2. options


ACCEPTED = [
    pytest.param({"num_cpus": 0.5}, id="num_cpus"),
    pytest.param({"num_gpus": 0}, id="num_gpus"),
    pytest.param({"resources": {}}, id="resources"),
    pytest.param({"memory": 2**20}, id="memory"),
    pytest.param({"name": "opt-actor"}, id="name"),
    pytest.param({"name": "opt-actor", "namespace": "opt-ns"}, id="namespace"),
    pytest.param({"lifetime": "detached"}, id="lifetime"),
    pytest.param({"name": "opt-actor", "get_if_exists": True}, id="get_if_exists"),
    pytest.param({"max_restarts": -1}, id="max_restarts"),
    pytest.param({"max_task_retries": 3}, id="max_task_retries"),
    pytest.param({"max_concurrency": 3}, id="max_concurrency"),
    pytest.param({"max_pending_calls": 5}, id="max_pending_calls"),
    pytest.param({"scheduling_strategy": "SPREAD"}, id="scheduling_strategy"),
    pytest.param({"concurrency_groups": {"io": 2}}, id="concurrency_groups"),
]


@pytest.mark.parametrize("opts", ACCEPTED)
@pytest.mark.parametrize("where", ["decorator", "options"])
def test_every_actor_option_is_accepted_on_the_decorator_and_in_options(
    shared_cluster, opts, where
):
    class Plain:
        def ping(self, x):
            return x

    if where == "decorator":
        handle = nbcluster.remote(**opts)(Plain).remote()
    else:
        handle = nbcluster.remote(Plain).options(**opts).remote()
    try:
        assert nbcluster.get(handle.ping.remote(where), timeout=30) == where
        if "name" in opts:
            found = nbcluster.get_actor(opts["name"], namespace=opts.get("namespace"))
            assert found == handle
    finally:
        nbcluster.kill(handle)


BAD_ACTOR_OPTIONS = [
    pytest.param(
        {"max_restarts": -2},
        ValueError,
        r"max_restarts must be an integer >= -1 \(-1 means",
        id="max_restarts=-2",
    ),
    pytest.param(
        {"lifetime": "forever"},
        ValueError,
        r"lifetime must be None or 'detached', got 'forever'",
        id="lifetime=forever",
    ),
    pytest.param(
        {"colour": "red"},
        ValueError,
        r"Invalid option 'colour' for an actor class\. Valid options: concurrency_groups, "
        r"get_if_exists, lifetime, "
        r"max_concurrency, max_pending_calls, max_restarts, max_task_retries, memory, name, "
        r"namespace, num_cpus, num_gpus, resources, runtime_env, scheduling_strategy\.",
        id="unknown-key",
    ),
    pytest.param(
        {"max_restart": 1},
        ValueError,
        r"Did you mean 'max_restarts'\?",
        id="typo",
    ),
    pytest.param(
        {"num_returns": 2},
        ValueError,
        r"Invalid option 'num_returns' for an actor class",
        id="task-only-option",
    ),
    pytest.param(
        {"max_task_retries": -5},
        ValueError,
        r"max_task_retries must be an integer >= -1",
        id="max_task_retries=-5",
    ),
    pytest.param(
        {"max_concurrency": 0},
        ValueError,
        r"max_concurrency must be an integer >= 1",
        id="max_concurrency=0",
    ),
    pytest.param(
        {"max_pending_calls": 0},
        ValueError,
        r"-1 \(unlimited\) or a positive integer",
        id="max_pending_calls=0",
    ),
    pytest.param({"num_cpus": -1}, ValueError, r"num_cpus must be a non-negative", id="cpus<0"),
    pytest.param({"num_gpus": "1"}, TypeError, r"num_gpus must be a non-negative", id="gpus-str"),
    pytest.param(
        {"resources": {"CPU": 1}},
        ValueError,
        r"Use the num_cpus option",
        id="resources-CPU",
    ),
    pytest.param({"name": ""}, ValueError, r"name must be a non-empty string", id="name=''"),
    pytest.param({"namespace": 3}, TypeError, r"namespace must be a string", id="namespace=3"),
    pytest.param(
        {"get_if_exists": "yes"},
        TypeError,
        r"get_if_exists must be True or False",
        id="get_if_exists-str",
    ),
    pytest.param(
        {"scheduling_strategy": "spread"},
        ValueError,
        r"did you mean 'SPREAD'",
        id="strategy-case",
    ),
    pytest.param(
        {"max_restarts": True},
        TypeError,
        r"max_restarts must be an integer",
        id="bool",
    ),
]


@pytest.mark.parametrize(("opts", "error", "match"), BAD_ACTOR_OPTIONS)
def test_invalid_actor_options_are_rejected_before_reaching_the_cluster(opts, error, match):
    """No cluster fixture: nothing may be started or contacted (``init`` is not called)."""
    was_initialized = nbcluster.is_initialized()

    class Plain:
        def ping(self):
            return 1

    with pytest.raises(error, match=match):
        nbcluster.remote(**opts)(Plain)
    ok = nbcluster.remote(Plain)
    with pytest.raises(error, match=match):
        ok.options(**opts)  # raises in .options(), before any .remote()
    with pytest.raises(error, match=match):
        ok.options(num_cpus=1).options(**opts)
    assert nbcluster.is_initialized() == was_initialized


def test_unknown_keys_on_a_class_decorator_list_the_actor_options():
    class Plain:
        pass

    with pytest.raises(ValueError) as info:
        nbcluster.remote(max_restart=1)(Plain)
    assert "for an actor class" in str(info.value)
    assert "Did you mean 'max_restarts'" in str(info.value)


def test_get_if_exists_without_a_name_is_refused_before_reaching_the_cluster(shared_cluster):
    class Plain:
        def ping(self):
            return 1

    with pytest.raises(ValueError, match=r"get_if_exists=True needs a name"):
        nbcluster.remote(get_if_exists=True)(Plain).remote()


def test_num_cpus_and_memory_are_held_while_the_actor_lives(shared_cluster):
    total = nbcluster.cluster_resources()
    c = Counter.options(num_cpus=1, memory=2**30).remote()
    nbcluster.get(c.pid.remote(), timeout=30)
    poll_for(
        lambda: nbcluster.available_resources().get("CPU", 0) == total["CPU"] - 1,
        15,
        message=f"the actor's CPU is not held: {nbcluster.available_resources()}",
    )
    assert nbcluster.available_resources()["memory"] == pytest.approx(total["memory"] - 2**30)
    nbcluster.kill(c)
    poll_for(
        lambda: nbcluster.available_resources().get("CPU", 0) == total["CPU"],
        15,
        message="the killed actor's CPU did not come back",
    )


def test_default_actors_hold_no_cpu(shared_cluster):
    total = nbcluster.cluster_resources()["CPU"]
    actors = [Counter.remote() for _ in range(4)]  # more than the 2 CPUs
    assert len(set(nbcluster.get([a.pid.remote() for a in actors], timeout=60))) == 4
    # (task leases from earlier tests may still be held for a moment: wait for them)
    poll_for(
        lambda: nbcluster.available_resources().get("CPU", 0) == total,
        15,
        message=f"idle default actors hold CPUs: {nbcluster.available_resources()}",
    )
    for a in actors:
        nbcluster.kill(a)


def test_scheduling_strategies_place_the_actor(shared_cluster):
    node = nbcluster.get_runtime_context().get_node_id()

    @nbcluster.remote
    class Where:
        def node(self):
            return nbcluster.get_runtime_context().get_node_id()

    pinned = Where.options(
        scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=node, soft=False)
    ).remote()
    spread = Where.options(scheduling_strategy="SPREAD").remote()
    assert nbcluster.get([pinned.node.remote(), spread.node.remote()], timeout=30) == [node, node]
    # a hard affinity to a node that does not exist stays pending (it is not run elsewhere)
    nowhere = Where.options(
        scheduling_strategy=NodeAffinitySchedulingStrategy(node_id="ab" * 16, soft=False)
    ).remote()
    ref = nowhere.node.remote()
    ready, _ = nbcluster.wait([ref], timeout=1.5)
    if ready:  # refused (unschedulable) rather than left pending: fine, but not run elsewhere
        with pytest.raises(NbclusterError):
            nbcluster.get(ref, timeout=30)
    soft = Where.options(
        scheduling_strategy=NodeAffinitySchedulingStrategy(node_id="ab" * 16, soft=True)
    ).remote()
    assert nbcluster.get(soft.node.remote(), timeout=30) == node
    for h in (pinned, spread, nowhere, soft):
        nbcluster.kill(h)


# ============================================================ 3. names, kill, lifetime


def test_named_actors_get_actor_and_get_if_exists(shared_cluster):
    c = Counter.options(name="named-counter", namespace="team").remote(5)
    assert nbcluster.get(c.add.remote(), timeout=30) == 6
    found = nbcluster.get_actor("named-counter", namespace="team")
    assert isinstance(found, nbcluster.ActorHandle) and found == c
    assert nbcluster.get(found.add.remote(), timeout=30) == 7  # the same actor, same state
    # the name lives in its namespace only
    with pytest.raises(ValueError, match=r"named-counter"):
        nbcluster.get_actor("named-counter")
    with pytest.raises(ValueError, match=r"named-counter"):
        nbcluster.get_actor("named-counter", namespace="other")
    with pytest.raises(ValueError, match=r"no-such-actor"):
        nbcluster.get_actor("no-such-actor", namespace="team")
    # a second actor of that name is refused, unless get_if_exists asks for the first
    with pytest.raises(ValueError, match=r"already exists.*get_if_exists=True"):
        Counter.options(name="named-counter", namespace="team").remote()
    again = Counter.options(name="named-counter", namespace="team", get_if_exists=True).remote(99)
    assert again == c
    assert nbcluster.get(again.add.remote(), timeout=30) == 8  # __init__(99) did not run
    # the same name in another namespace is another actor
    other = Counter.options(name="named-counter", namespace="elsewhere").remote(100)
    assert nbcluster.get(other.add.remote(), timeout=30) == 101

    @nbcluster.remote
    def from_task() -> int:
        h = nbcluster.get_actor("named-counter", namespace="team")
        return nbcluster.get(h.add.remote(), timeout=30)

    assert nbcluster.get(from_task.remote(), timeout=30) == 9
    # once killed, the name is free
    nbcluster.kill(c)
    with pytest.raises(ValueError):
        nbcluster.get_actor("named-counter", namespace="team")
    fresh = Counter.options(name="named-counter", namespace="team").remote(0)
    assert nbcluster.get(fresh.add.remote(), timeout=30) == 1
    nbcluster.kill(fresh)
    nbcluster.kill(other)


def test_kill_ends_the_actor_and_its_process(shared_cluster):
    c = Counter.remote()
    pid = nbcluster.get(c.pid.remote(), timeout=30)
    nbcluster.kill(c)
    _await_exit(pid)
    with pytest.raises(ActorDiedError) as info:
        nbcluster.get(c.add.remote(), timeout=30)
    assert "killed" in str(info.value)
    assert info.value.actor_init_failed is False
    assert isinstance(info.value, NbclusterError)
    with pytest.raises(TypeError, match=r"kill\(\) expects an actor handle"):
        nbcluster.kill("not a handle")  # type: ignore[arg-type]
    nbcluster.kill(c)  # killing a dead actor again is harmless


def test_kill_without_no_restart_restarts_the_actor(shared_cluster):
    c = Counter.options(max_restarts=2).remote()
    assert nbcluster.get(c.add.remote(5), timeout=30) == 5
    pid = nbcluster.get(c.pid.remote(), timeout=30)
    nbcluster.kill(c, no_restart=False)
    _await_exit(pid)
    new_pid = poll_for(
        lambda: _pid_or_none(c), 30, 0.1, "the actor was not restarted after kill(no_restart=False)"
    )
    assert new_pid != pid
    assert nbcluster.get(c.add.remote(1), timeout=30) == 1  # __init__ ran again
    nbcluster.kill(c)  # no_restart=True by default: final
    _await_exit(new_pid)  # (kill is asynchronous, as in Ray)
    time.sleep(quiet_period(1.0))  # a restart would come now: one is left, but no_restart=True
    with pytest.raises(ActorDiedError):
        nbcluster.get(c.add.remote(), timeout=30)


def _pid_or_none(handle) -> int | None:
    try:
        return nbcluster.get(handle.pid.remote(), timeout=30)
    except ActorDiedError:
        return None


def test_an_actor_ends_when_its_last_handle_is_gone(shared_cluster):
    c = Counter.remote()
    pid = nbcluster.get(c.pid.remote(), timeout=30)
    alias = c
    del c
    gc.collect()
    assert nbcluster.get(alias.add.remote(), timeout=30) == 1  # one handle left: still alive
    assert pid_alive(pid)
    del alias
    gc.collect()
    _await_exit(pid)


def test_an_out_of_scope_actor_finishes_its_pending_calls_first(shared_cluster, tmp_path):
    go = tmp_path / "go"

    @nbcluster.remote
    class Slow:
        def pid(self):
            return os.getpid()

        def wait_then(self, go: str, value: int) -> int:
            assert _wait_file(go), "never told to go"
            return value

    s = Slow.remote()
    pid = nbcluster.get(s.pid.remote(), timeout=30)
    refs = [s.wait_then.remote(str(go), i) for i in range(3)]
    del s
    gc.collect()
    assert_stays(lambda: pid_alive(pid), quiet_period(0.3), "released with calls pending")
    go.touch()
    assert nbcluster.get(refs, timeout=30) == [0, 1, 2]
    _await_exit(pid)


# ============================================================ 5. concurrency (and L05)


def test_async_methods_run_concurrently_on_the_actors_loop(shared_cluster):
    @nbcluster.remote
    class Sleeper:
        def __init__(self) -> None:
            self.active = 0
            self.peak = 0

        async def nap(self, seconds: float):
            self.active += 1
            self.peak = max(self.peak, self.active)
            start = time.time()
            await asyncio.sleep(seconds)
            self.active -= 1
            return start, time.time(), threading.current_thread().name

        async def get_peak(self) -> int:
            return self.peak

    s = Sleeper.remote()
    nbcluster.get(s.get_peak.remote(), timeout=30)  # created
    t0 = time.monotonic()
    spans = nbcluster.get([s.nap.remote(0.5) for _ in range(20)], timeout=60)
    elapsed = time.monotonic() - t0
    assert elapsed < 5.0, f"20 async calls of 0.5 s took {elapsed:.1f} s: not concurrent"
    assert nbcluster.get(s.get_peak.remote(), timeout=30) >= 2
    assert len({name for _, _, name in spans}) == 1  # all on the one loop thread
    assert _overlaps(spans)
    nbcluster.kill(s)


def _overlaps(spans) -> bool:
    ordered = sorted((s[0], s[1]) for s in spans)
    return any(b[0] < a[1] for a, b in zip(ordered, ordered[1:], strict=False))


@nbcluster.remote
class Gate:
    """Counts how many ``hold`` calls run at once (``peak``)."""

    def __init__(self) -> None:
        self.active = 0
        self.peak = 0
        self.opened: asyncio.Event | None = None

    async def hold(self, threshold: int, linger: float, wait: float) -> int:
        if self.opened is None:
            self.opened = asyncio.Event()
        self.active += 1
        self.peak = max(self.peak, self.active)
        if self.active >= threshold:
            self.opened.set()
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self.opened.wait(), wait)
        await asyncio.sleep(linger)  # everyone queued behind may come in now, if allowed
        self.active -= 1
        return self.peak

    async def get_peak(self) -> int:
        return self.peak


def test_async_actors_run_at_most_1000_calls_at_once_by_default(shared_cluster):
    g = Gate.remote()
    refs = [g.hold.remote(1000, 0.3, 10.0) for _ in range(1100)]
    nbcluster.get(refs, timeout=120)
    assert nbcluster.get(g.get_peak.remote(), timeout=30) == 1000
    nbcluster.kill(g)


def test_async_actor_with_max_concurrency_1_runs_calls_one_at_a_time(shared_cluster):
    @nbcluster.remote(max_concurrency=1)
    class OneAtATime:
        def __init__(self) -> None:
            self.active = 0
            self.peak = 0

        async def nap(self, i: int):
            self.active += 1
            self.peak = max(self.peak, self.active)
            start = time.time()
            await asyncio.sleep(0.1)
            self.active -= 1
            return start, time.time(), i

        async def get_peak(self) -> int:
            return self.peak

    a = OneAtATime.remote()
    spans = nbcluster.get([a.nap.remote(i) for i in range(6)], timeout=60)
    assert [i for _, _, i in spans] == list(range(6))
    assert not _overlaps(spans), spans
    assert nbcluster.get(a.get_peak.remote(), timeout=30) == 1
    nbcluster.kill(a)


def test_sync_actor_with_max_concurrency_runs_calls_on_threads(shared_cluster):
    @nbcluster.remote(max_concurrency=4)
    class Threaded:
        def __init__(self) -> None:
            self.barrier = threading.Barrier(4, timeout=20)

        def meet(self):
            start = time.time()
            self.barrier.wait()  # passes only when 4 calls run at the same time
            time.sleep(0.1)
            return start, time.time(), threading.current_thread().name

    t = Threaded.remote()
    spans = nbcluster.get([t.meet.remote() for _ in range(4)], timeout=60)
    assert _overlaps(spans)
    assert len({name for _, _, name in spans}) == 4
    assert threading.current_thread().name not in {name for _, _, name in spans}
    nbcluster.kill(t)


def test_sync_actor_runs_calls_one_at_a_time_by_default(shared_cluster):
    @nbcluster.remote
    class Serial:
        def __init__(self) -> None:
            self.lock = threading.Lock()
            self.overlapped = False

        def work(self, i: int):
            if not self.lock.acquire(blocking=False):
                self.overlapped = True
                self.lock.acquire()
            try:
                start = time.time()
                time.sleep(0.05)
                return start, time.time(), i
            finally:
                self.lock.release()

        def overlapped_any(self) -> bool:
            return self.overlapped

    s = Serial.remote()
    spans = nbcluster.get([s.work.remote(i) for i in range(8)], timeout=60)
    assert not _overlaps(spans)
    assert nbcluster.get(s.overlapped_any.remote(), timeout=30) is False
    nbcluster.kill(s)


def test_max_pending_calls_refuses_the_11th_call_at_once_and_recovers(shared_cluster, tmp_path):
    go = tmp_path / "go"

    @nbcluster.remote(max_pending_calls=10)
    class Limited:
        def __init__(self) -> None:
            self.ran = 0

        def wait_then(self, go: str, i: int) -> int:
            assert _wait_file(go), "never told to go"
            self.ran += 1
            return i

        def count(self) -> int:
            return self.ran

    a = Limited.remote()
    refs = [a.wait_then.remote(str(go), i) for i in range(10)]
    # Hang guard: should the 11th call block instead of raising, this lets it through
    # after 15 s and the test fails on "DID NOT RAISE" rather than hanging.
    guard = threading.Timer(15.0, go.touch)
    guard.start()
    try:
        with pytest.raises(PendingCallsLimitExceeded, match=r"max_pending_calls=10"):
            a.wait_then.remote(str(go), 10)
        assert not go.exists(), "the 11th call blocked instead of raising at once"
    finally:
        guard.cancel()
    go.touch()
    assert nbcluster.get(refs, timeout=60) == list(range(10))
    # drained: the limit applies again to new calls, and they work
    more = [a.wait_then.remote(str(go), i) for i in range(10, 20)]
    assert nbcluster.get(more, timeout=60) == list(range(10, 20))
    assert nbcluster.get(a.count.remote(), timeout=30) == 20  # the refused call never ran
    nbcluster.kill(a)


# ============================================================ 7. L06: many zero-CPU actors


@nbcluster.remote(num_cpus=0)
class Idle:
    def pid(self) -> int:
        return os.getpid()


def _actor_table(actor_ids: set[str]) -> dict[str, object]:
    """The head's records of these actors (internal API): state, worker_pid, ..."""
    from nbcluster._runtime import context
    from nbcluster._runtime.protocol.rpc import pb

    client = context.require_client()
    reply = client.run(lambda: client.head().ListActors(pb.Empty(), timeout=30))
    return {a.actor_id.hex(): a for a in reply.actors if a.actor_id.hex() in actor_ids}


def _many_actors_become_ready_and_free_everything(session: str, n: int, timeout: float) -> None:
    """L06: n actors that hold no CPU all come up on a 2-CPU cluster, each in its own
    process (checked in the head's table and by calling every one of them), and killing or
    dropping them frees every process and resource."""
    from nbcluster._runtime.protocol.rpc import pb

    alive_state, dead_state = pb.ActorInfo.ALIVE, pb.ActorInfo.DEAD
    total = nbcluster.cluster_resources()
    actors = [Idle.remote() for _ in range(n)]
    ids = {a.actor_id for a in actors}

    def all_alive() -> bool:
        recs = _actor_table(ids)
        return len(recs) == n and all(r.state == alive_state for r in recs.values())

    poll_for(all_alive, timeout, 0.5, f"not all {n} actors became ready")
    pids = [r.worker_pid for r in _actor_table(ids).values()]
    assert len(set(pids)) == n and 0 not in pids  # each in its own process
    assert all(pid_alive(p) for p in pids)
    assert set(pids) <= set(worker_pids(session))
    answered = nbcluster.get([a.pid.remote() for a in actors], timeout=timeout)
    assert sorted(answered) == sorted(pids)
    killed = set(answered[: n // 2])
    # half are killed, the other half dropped
    for a in actors[: n // 2]:
        nbcluster.kill(a)
    del actors
    gc.collect()

    def still_running() -> str:
        alive = [p for p in pids if pid_alive(p)]
        k = sum(p in killed for p in alive)
        return f"{len(alive)} actor processes still running ({k} killed, {len(alive) - k} dropped): {alive[:10]}"

    deadline = max(60.0, n / 10)
    try:
        poll_for(lambda: not any(pid_alive(p) for p in pids), deadline, 0.2)
    except AssertionError:
        raise AssertionError(still_running()) from None
    assert not set(pids) & set(worker_pids(session))
    poll_for(
        lambda: all(r.state == dead_state for r in _actor_table(ids).values()),
        30,
        0.2,
        "the head still has live actors",
    )
    poll_for(
        lambda: nbcluster.available_resources().get("CPU", 0) == total["CPU"],
        15,
        message=f"resources not back: {nbcluster.available_resources()}",
    )


@pytest.mark.timeout(900)
def test_1000_zero_cpu_actors_on_2_cpus_become_ready_and_free_everything(shared_cluster):
    # L06 at its full size, in the suite (about 30-60 s on 2 loaded cores; the deadlines
    # are hang guards, not timing asserts).
    _many_actors_become_ready_and_free_everything(shared_cluster.session_dir, 1000, 600)


# ============================================================ 3. driver lifetime (subprocesses)


def _driver_env(temp_dir: Path) -> dict[str, str]:
    env = {**os.environ, "NBCLUSTER_TEMP_DIR": str(temp_dir)}
    for key in ("NBCLUSTER_ADDRESS", "NBCLUSTER_TOKEN", "NBCLUSTER_TOKEN_FILE"):
        env.pop(key, None)
    return env


DRIVER_A = textwrap.dedent(
    """
    import json, os, signal, sys
    import nbcluster

    nbcluster.init(address=sys.argv[1])

    @nbcluster.remote
    class Keeper:
        def __init__(self):
            self.n = 0
        def pid(self):
            return os.getpid()
        def bump(self):
            self.n += 1
            return self.n

    keeper = Keeper.options(name="keeper", namespace="team", lifetime="detached").remote()
    plain = Keeper.options(name="plain", namespace="team").remote()
    out = {
        "keeper": nbcluster.get(keeper.pid.remote(), timeout=60),
        "plain": nbcluster.get(plain.pid.remote(), timeout=60),
        "bump": nbcluster.get(keeper.bump.remote(), timeout=60),
    }
    print(json.dumps(out), flush=True)
    how = sys.argv[2]
    if how == "shutdown":
        nbcluster.shutdown()
    elif how == "sigkill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif how == "wait":  # exit (without shutdown) when told to
        sys.stdin.readline()
    """
)

DRIVER_B = textwrap.dedent(
    """
    import json, os, sys, time
    import nbcluster
    from nbcluster.exceptions import ActorDiedError

    nbcluster.init(address=sys.argv[1])
    if sys.argv[2] == "wait":  # connected; look up when told to
        print("ready", flush=True)
        sys.stdin.readline()
    out = {}
    try:
        nbcluster.get_actor("plain", namespace="team")
        out["plain"] = "found"
    except ValueError as e:
        out["plain"] = "missing: " + str(e)
    if sys.argv[2] != "wait":
        keeper = nbcluster.get_actor("keeper", namespace="team")
        out["bump"] = nbcluster.get(keeper.bump.remote(), timeout=60)
        out["pid"] = nbcluster.get(keeper.pid.remote(), timeout=60)
        nbcluster.kill(keeper)
        pid = out["pid"]
        def gone():  # reading a dying process's status can race its exit
            try:
                with open(f"/proc/{pid}/status") as f:
                    return "zombie" in f.read()
            except (FileNotFoundError, ProcessLookupError):
                return True
        while not gone():
            time.sleep(0.05)
        try:
            nbcluster.get(keeper.bump.remote(), timeout=60)
            out["after_kill"] = "answered"
        except ActorDiedError as e:
            out["after_kill"] = str(e)
    print(json.dumps(out), flush=True)
    nbcluster.shutdown()
    """
)


def _run_json(code: str, args: list[str], env: dict[str, str], expect_rc: int = 0) -> dict:
    p = subprocess.run(
        [sys.executable, "-c", code, *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    assert p.returncode == expect_rc, f"driver exited {p.returncode}:\n{p.stderr[-3000:]}"
    return json.loads(p.stdout.strip().splitlines()[-1])


def _kill_session_processes(temp_dir: Path) -> None:
    for proc in cluster_processes(temp_dir):
        with contextlib.suppress(psutil.NoSuchProcess, ProcessLookupError):
            os.kill(proc.pid, signal.SIGKILL)


def test_detached_actor_outlives_its_driver_and_non_detached_ones_do_not(tmp_path):
    """Cluster from ``nbcluster start --head``; driver A exits after shutdown(); B finds
    the detached actor by name, calls it (state kept) and kills it."""
    temp_dir = tmp_path / "sessions"
    env = _driver_env(temp_dir)
    try:
        started = subprocess.run(
            [*CLI, "start", "--head", "--num-cpus", "2"],
            env=env,
            capture_output=True,
            text=True,
            timeout=90,
            stdin=subprocess.DEVNULL,
        )
        assert started.returncode == 0, started.stderr[-3000:]
        address = started.stdout.split("nbcluster head started at ", 1)[1].split()[0]

        a = _run_json(DRIVER_A, [address, "shutdown"], env)
        assert a["bump"] == 1
        # A asked the head to finish its job before exiting: its non-detached actor is
        # already dead, and its process goes.
        _await_exit(a["plain"], what="A's non-detached actor")
        assert pid_alive(a["keeper"]), "the detached actor died with its driver"

        b = _run_json(DRIVER_B, [address, "now"], env)
        assert b["plain"].startswith("missing"), b
        assert b["bump"] == 2  # the same actor, its state kept
        assert b["pid"] == a["keeper"]
        assert "killed" in b["after_kill"]
        _await_exit(a["keeper"], what="the killed detached actor")
    finally:
        with contextlib.suppress(Exception):
            subprocess.run([*CLI, "stop"], env=env, capture_output=True, timeout=30)
        _kill_session_processes(temp_dir)


def test_a_killed_drivers_actors_end_and_its_detached_actor_stays(tmp_path):
    """Cluster from ``LocalCluster(detached=True)``; driver A is SIGKILLed (no FinishJob):
    the head notices the dead driver by pinging it and ends its non-detached actor."""
    temp_dir = tmp_path / "sessions"
    env = _driver_env(temp_dir)
    lc = nbcluster.LocalCluster(num_cpus=2, detached=True, temp_dir=str(temp_dir))
    try:
        lc.start()
        a = _run_json(DRIVER_A, [lc.address, "sigkill"], env, expect_rc=-signal.SIGKILL)
        assert a["bump"] == 1
        _await_exit(a["plain"], timeout=30, what="the SIGKILLed driver's non-detached actor")
        b = _run_json(DRIVER_B, [lc.address, "now"], env)
        assert b["plain"].startswith("missing"), b
        assert b["bump"] == 2 and b["pid"] == a["keeper"]
    finally:
        lc.stop()
        _kill_session_processes(temp_dir)


def test_a_clean_driver_exit_without_shutdown_ends_its_actors_at_once(tmp_path):
    temp_dir = tmp_path / "sessions"
    env = _driver_env(temp_dir)
    lc = nbcluster.LocalCluster(num_cpus=2, detached=True, temp_dir=str(temp_dir))
    procs: list[subprocess.Popen[str]] = []
    try:
        lc.start()

        def spawn(code: str, *args: str) -> subprocess.Popen[str]:
            p = subprocess.Popen(
                [sys.executable, "-c", code, *args],
                env=env,
                text=True,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
            )
            procs.append(p)
            return p

        a_proc = spawn(DRIVER_A, lc.address, "wait")
        a = json.loads(a_proc.stdout.readline())  # type: ignore[union-attr]
        b_proc = spawn(DRIVER_B, lc.address, "wait")
        assert b_proc.stdout.readline().strip() == "ready"  # type: ignore[union-attr]
        a_proc.stdin.write("\n")  # type: ignore[union-attr]
        a_proc.stdin.flush()  # type: ignore[union-attr]
        assert a_proc.wait(60) == 0, a_proc.stderr.read()  # type: ignore[union-attr]
        # A has exited normally: its job is over, so its non-detached actor is gone now
        # (not after the head's pings time out).
        out, err = b_proc.communicate("\n", timeout=60)
        b = json.loads(out.strip().splitlines()[-1])
        assert b["plain"].startswith("missing"), b
        _await_exit(a["plain"], timeout=30, what="A's non-detached actor")
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(10)
        lc.stop()
        _kill_session_processes(temp_dir)


PAUSED_DRIVER = textwrap.dedent(
    """
    import json, os, sys
    import nbcluster

    nbcluster.init(address=sys.argv[1])

    @nbcluster.remote
    class Keeper:
        def pid(self):
            return os.getpid()

    k = Keeper.remote()
    print(json.dumps({"actor": nbcluster.get(k.pid.remote(), timeout=60)}), flush=True)
    sys.stdin.readline()
    try:
        out = {"after": nbcluster.get(k.pid.remote(), timeout=30)}
    except Exception as e:
        out = {"after": type(e).__name__ + ": " + str(e)[:300]}
    print(json.dumps(out), flush=True)
    nbcluster.shutdown()
    """
)


def test_a_driver_that_pauses_keeps_its_actors(shared_cluster):
    p = subprocess.Popen(
        [sys.executable, "-c", PAUSED_DRIVER, shared_cluster.address],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        first = json.loads(p.stdout.readline())  # type: ignore[union-attr]
        os.kill(p.pid, signal.SIGSTOP)  # alive, but answers nothing for a while
        try:
            time.sleep(20)  # the head gives up after ~15 s
        finally:
            os.kill(p.pid, signal.SIGCONT)
        out, err = p.communicate("\n", timeout=60)
        assert json.loads(out.strip().splitlines()[-1]) == {"after": first["actor"]}, err[-2000:]
    finally:
        if p.poll() is None:
            os.kill(p.pid, signal.SIGCONT)
            p.kill()
            p.wait(10)


@nbcluster.remote
class _Keeper:
    """Keeps refs given inside a list (so they arrive as refs it borrows)."""

    def __init__(self) -> None:
        self.refs: list[Any] = []

    def keep(self, refs: list[Any]) -> int:
        self.refs.extend(refs)
        return len(self.refs)

    def values(self) -> list[Any]:
        return nbcluster.get(self.refs, timeout=30)


@nbcluster.remote
class _AsyncKeeper:
    """The same, as an async actor (its calls run on the actor's own event loop)."""

    def __init__(self) -> None:
        self.refs: list[Any] = []

    async def keep(self, refs: list[Any]) -> int:
        self.refs.extend(refs)
        return len(self.refs)

    async def values(self) -> list[Any]:
        return await asyncio.gather(*self.refs)


@pytest.mark.parametrize("keeper", [_Keeper, _AsyncKeeper], ids=["sync", "async"])
def test_an_actor_keeps_the_refs_it_was_given_after_the_caller_drops_its_own(
    shared_cluster, keeper
):
    # The actor tells the owner (this driver) it borrows them before its reply, so the
    # owner frees nothing when its own refs go (async actors did not: issue 11, session 16).
    actor = keeper.remote()
    refs = [nbcluster.put(f"v{i}") for i in range(3)]
    assert nbcluster.get(actor.keep.remote(refs), timeout=30) == 3
    ids = [r.binary() for r in refs]
    del refs
    gc.collect()
    time.sleep(0.2)  # (a dropped ref the loop releases is released by now)
    table = nbcluster._api.context.require_client().table
    assert all(table.get(oid) is not None for oid in ids)  # kept for the borrower
    assert nbcluster.get(actor.values.remote(), timeout=30) == ["v0", "v1", "v2"]
    nbcluster.kill(actor)


# ============================================================ own clusters (keep these last)


def test_gpus_and_custom_resources_are_held_and_assigned(cluster):
    cluster(num_cpus=2, num_gpus=2, resources={"foo": 2})

    @nbcluster.remote(num_gpus=1)
    class OnGpu:
        def __init__(self) -> None:
            self.at_init = nbcluster.get_gpu_ids()

        def init_ids(self):
            return self.at_init

        def pid(self):
            return os.getpid()

    g1, g2 = OnGpu.remote(), OnGpu.remote()
    ids = nbcluster.get([g1.init_ids.remote(), g2.init_ids.remote()], timeout=30)
    assert sorted(ids) == [[0], [1]]  # one GPU each, different ones
    poll_for(
        lambda: nbcluster.available_resources().get("GPU", 0) == 0,
        15,
        message=f"GPUs not held: {nbcluster.available_resources()}",
    )
    # a third GPU actor must wait for a GPU: it is placed once one is free
    g3 = OnGpu.remote()
    ref = g3.init_ids.remote()
    ready, _ = nbcluster.wait([ref], timeout=1.5)
    assert ready == []
    nbcluster.kill(g1)
    assert nbcluster.get(ref, timeout=30) == ids[0]  # it got g1's GPU

    c = Counter.options(resources={"foo": 1.5}).remote()
    nbcluster.get(c.pid.remote(), timeout=30)
    poll_for(
        lambda: nbcluster.available_resources().get("foo", 0) == 0.5,
        15,
        message=f"the custom resource is not held: {nbcluster.available_resources()}",
    )
    for h in (g2, g3, c):
        nbcluster.kill(h)
    poll_for(
        lambda: nbcluster.available_resources() == nbcluster.cluster_resources(),
        15,
        message=f"resources did not come back: {nbcluster.available_resources()}",
    )


def test_gpu_ids_are_visible_in_the_methods_of_a_gpu_actor(cluster):
    cluster(num_cpus=2, num_gpus=1)

    @nbcluster.remote(num_gpus=1)
    class OnGpu:
        def ids(self):
            return nbcluster.get_gpu_ids(), os.environ.get("CUDA_VISIBLE_DEVICES")

    g = OnGpu.remote()
    assert nbcluster.get(g.ids.remote(), timeout=30) == ([0], "0")
