"""Remote tasks on real clusters (issue acceptance 3; RELIABILITY B01, B04, L06).

Remote functions are defined inside the tests, as a notebook would define them, so that
cloudpickle sends them by value. Executions are counted with append-only files under
``tmp_path`` (the workers share this host's filesystem), and concurrency is shown with
file barriers and timestamps, never with timing thresholds.

The tests that need a cluster with special resources (``cluster`` factory) come first: the
factory shuts down any cluster this process is connected to, so they must run before the
module's ``shared_cluster`` is created.
"""

from __future__ import annotations

import os
import time
import warnings
from pathlib import Path

import numpy as np
import pytest

import nbcluster
from nbcluster.exceptions import (
    GetTimeoutError,
    InfeasibleResourceWarning,
    TaskCancelledError,
    TaskError,
)
from nbcluster.testing import pid_alive, poll_for

pytestmark = pytest.mark.integration


def _marks(path: Path) -> list[str]:
    """Lines appended to ``path`` by tasks (one per execution)."""
    try:
        return path.read_text().split()
    except FileNotFoundError:
        return []


# ------------------------------------------------------------------ special clusters (factory)


def test_gpu_tasks_get_distinct_cuda_visible_devices(cluster, tmp_path):
    cluster(num_cpus=2, num_gpus=2)

    @nbcluster.remote(num_gpus=1)
    def gpu_task(me, other):
        open(me, "w").close()
        deadline = time.monotonic() + 20
        while not os.path.exists(other):  # both tasks hold a GPU at the same time
            if time.monotonic() > deadline:
                raise TimeoutError("the other GPU task never started")
            time.sleep(0.005)
        return os.environ.get("CUDA_VISIBLE_DEVICES"), nbcluster.get_gpu_ids()

    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    (env_a, ids_a), (env_b, ids_b) = nbcluster.get(
        [gpu_task.remote(a, b), gpu_task.remote(b, a)], timeout=30
    )
    assert {env_a, env_b} == {"0", "1"}
    assert ids_a == [int(env_a)] and ids_b == [int(env_b)]

    @nbcluster.remote
    def visible():
        return os.environ.get("CUDA_VISIBLE_DEVICES"), nbcluster.get_gpu_ids()

    env2, ids2 = nbcluster.get(visible.options(num_gpus=2).remote(), timeout=30)
    assert sorted(env2.split(",")) == ["0", "1"] and sorted(ids2) == [0, 1]

    # num_gpus=0 (the default): no GPU, also on workers that just ran GPU tasks.
    no_gpu = nbcluster.get([visible.options(num_gpus=0).remote() for _ in range(6)], timeout=30)
    assert all(env in (None, "") and ids == [] for env, ids in no_gpu), no_gpu


def test_custom_resource_gates_placement(cluster, tmp_path):
    cluster(num_cpus=2, resources={"disk": 1})
    assert nbcluster.cluster_resources()["disk"] == 1

    @nbcluster.remote(resources={"disk": 1})
    def use_disk():
        start = time.time()
        time.sleep(0.3)
        return start, time.time()

    (s1, e1), (s2, e2) = nbcluster.get([use_disk.remote(), use_disk.remote()], timeout=30)
    # One disk, two CPUs: the two tasks ran one after the other.
    assert e1 <= s2 or e2 <= s1, ((s1, e1), (s2, e2))

    # Control: with half a disk each, both fit and do run at the same time.
    @nbcluster.remote(resources={"disk": 0.5})
    def half_disk(me, other):
        open(me, "w").close()
        deadline = time.monotonic() + 20
        while not os.path.exists(other):
            if time.monotonic() > deadline:
                raise TimeoutError("the other half-disk task never started")
            time.sleep(0.005)
        return True

    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    assert nbcluster.get([half_disk.remote(a, b), half_disk.remote(b, a)], timeout=30) == [
        True,
        True,
    ]


# ------------------------------------------------------------------ defining and calling


def test_bare_decorator_and_call_form(shared_cluster):
    @nbcluster.remote
    def add(a, b=10):
        return a + b

    def mul(a, b):
        return a * b

    mul_remote = nbcluster.remote(num_cpus=1)(mul)
    assert isinstance(add, nbcluster.RemoteFunction)
    assert isinstance(mul_remote, nbcluster.RemoteFunction)
    assert mul_remote.function is mul
    refs = [add.remote(1), add.remote(1, 2), add.remote(a=3, b=4), mul_remote.remote(6, 7)]
    assert all(isinstance(r, nbcluster.ObjectRef) for r in refs)
    assert nbcluster.get(refs, timeout=30) == [11, 3, 7, 42]


def test_decorator_accepts_every_task_option(shared_cluster):
    @nbcluster.remote(
        num_cpus=0.5,
        num_gpus=0,
        resources={},
        memory=2**20,
        num_returns=2,
        max_retries=1,
        retry_exceptions=[ValueError],
        max_calls=3,
        name="every_option",
    )
    def every_option(x):
        return x, x + 1

    a, b = every_option.remote(1)
    assert nbcluster.get([a, b], timeout=30) == [1, 2]

    @nbcluster.remote(retry_exceptions=True, max_retries=0, num_cpus=0)
    def zero_cpu():
        return "ok"

    assert nbcluster.get(zero_cpu.remote(), timeout=30) == "ok"


def test_options_override_per_call_and_chain(shared_cluster):
    @nbcluster.remote
    def pair():
        return "a", "b"

    one = pair.remote()
    assert isinstance(one, nbcluster.ObjectRef)
    assert nbcluster.get(one, timeout=30) == ("a", "b")

    two = pair.options(num_returns=2).remote()
    assert isinstance(two, list) and len(two) == 2
    assert nbcluster.get(two, timeout=30) == ["a", "b"]

    chained = pair.options(num_returns=3, num_cpus=0.5).options(num_returns=2, max_retries=0)
    refs = chained.remote()
    assert len(refs) == 2  # the last .options() wins
    assert nbcluster.get(refs, timeout=30) == ["a", "b"]

    # .options() does not change the function itself.
    assert isinstance(pair.remote(), nbcluster.ObjectRef)


BAD_OPTIONS = [
    pytest.param(
        {"foo": 1}, ValueError, r"Invalid option 'foo'.*Valid options: .*num_cpus", id="foo"
    ),
    pytest.param(
        {"num_cpu": 1},
        ValueError,
        r"Valid options: .*max_retries.*Did you mean 'num_cpus'",
        id="typo",
    ),
    pytest.param(
        {"num_cpus": "a"}, TypeError, r"num_cpus must be a non-negative number", id="cpus-str"
    ),
    pytest.param({"num_cpus": -1}, ValueError, r"num_cpus must be a non-negative", id="cpus-neg"),
    pytest.param(
        {"max_retries": -5}, ValueError, r"max_retries must be an integer >= -1", id="retries"
    ),
    pytest.param(
        {"num_returns": -1}, ValueError, r"num_returns must be an integer >= 0", id="returns"
    ),
    pytest.param(
        {"num_returns": 1.5}, TypeError, r"num_returns must be an integer", id="returns-float"
    ),
    pytest.param(
        {"retry_exceptions": "ValueError"}, TypeError, r"retry_exceptions must be", id="retry-exc"
    ),
    pytest.param({"resources": {"CPU": 1}}, ValueError, r"Use the num_cpus option", id="res-cpu"),
    pytest.param({"resources": {"disk": "x"}}, TypeError, r"resources\['disk'\]", id="res-type"),
    pytest.param(
        {"memory": True}, TypeError, r"memory must be a non-negative number", id="memory-bool"
    ),
]


@pytest.mark.parametrize(("kwargs", "error", "match"), BAD_OPTIONS)
def test_bad_options_rejected_at_decoration(kwargs, error, match):
    # No cluster: validation happens before anything is connected or submitted.
    def fn():
        return 1

    with pytest.raises(error, match=match):
        nbcluster.remote(**kwargs)(fn)


def test_bad_options_rejected_at_options_and_nothing_runs(shared_cluster, tmp_path):
    runs = tmp_path / "runs"

    @nbcluster.remote
    def work(path):
        with open(path, "a") as fh:
            fh.write("x\n")
        return "ran"

    for param in BAD_OPTIONS:
        kwargs, error, match = param.values
        with pytest.raises(error, match=match):
            work.options(**kwargs).remote(str(runs))
        with pytest.raises(error, match=match):
            work.options(num_cpus=1).options(**kwargs).remote(str(runs))
    with pytest.raises(ValueError, match=r"max_calls can only be set in @remote\(\.\.\.\)"):
        work.options(max_calls=1).remote(str(runs))
    with pytest.raises(ValueError, match=r"max_calls can only be set in @remote"):
        work.options(num_cpus=1).options(max_calls=2)
    with pytest.raises(ValueError, match=r"Valid options: .*num_returns"):
        work.options(foo=1)

    # Nothing of the above reached a worker: one good call makes exactly one execution.
    assert nbcluster.get(work.remote(str(runs)), timeout=30) == "ran"
    assert _marks(runs) == ["x"]


def test_calling_remote_function_directly_is_a_type_error(shared_cluster, tmp_path):
    runs = tmp_path / "runs"

    @nbcluster.remote
    def f(path):
        with open(path, "a") as fh:
            fh.write("x\n")
        return 1

    with pytest.raises(TypeError, match=r"cannot be called directly.*try '.*f\.remote\(\)'"):
        f(str(runs))
    with pytest.raises(TypeError, match=r"f\.remote\(\)"):
        f.options(num_cpus=1)(str(runs))
    assert nbcluster.get(f.remote(str(runs)), timeout=30) == 1
    assert _marks(runs) == ["x"]


def test_wrong_arity_raises_at_call_site(shared_cluster, tmp_path):
    runs = tmp_path / "runs"

    @nbcluster.remote
    def one_arg(path):
        with open(path, "a") as fh:
            fh.write("x\n")
        return 1

    with pytest.raises(
        TypeError, match=r"one_arg\.remote\(\): missing a required argument: 'path'"
    ):
        one_arg.remote()
    with pytest.raises(TypeError, match=r"one_arg\.remote\(\): too many positional arguments"):
        one_arg.remote(str(runs), 2)
    with pytest.raises(
        TypeError, match=r"one_arg\.remote\(\): got an unexpected keyword argument 'bogus'"
    ):
        one_arg.remote(str(runs), bogus=1)
    with pytest.raises(TypeError, match=r"one_arg\.remote\(\)"):
        one_arg.options(num_cpus=1).remote()
    assert nbcluster.get(one_arg.remote(path=str(runs)), timeout=30) == 1
    assert _marks(runs) == ["x"]


# ------------------------------------------------------------------ arguments


def test_top_level_ref_arguments_are_resolved_to_values(shared_cluster):
    @nbcluster.remote
    def produce(x):
        return x * 2

    @nbcluster.remote
    def describe(a, b, *, c):
        return [
            (type(v).__name__, v if not isinstance(v, np.ndarray) else int(v.sum()))
            for v in (a, b, c)
        ]

    big = np.arange(200_000, dtype=np.int64)  # 1.6 MB: lives in the object store
    out = nbcluster.get(
        describe.remote(nbcluster.put(41), produce.remote(21), c=nbcluster.put(big)), timeout=30
    )
    assert out == [("int", 41), ("int", 42), ("ndarray", int(big.sum()))]


def test_nested_refs_arrive_as_refs_and_can_be_fetched(shared_cluster):
    @nbcluster.remote
    def slow(x):
        time.sleep(0.2)
        return x

    @nbcluster.remote
    def consume(items, mapping):
        kinds = [type(r).__name__ for r in items] + [type(mapping["k"]).__name__]
        ready, _ = nbcluster.wait(list(items), num_returns=len(items), timeout=30)
        return kinds, len(ready), nbcluster.get(list(items)), nbcluster.get(mapping["k"])

    kinds, n_ready, values, mapped = nbcluster.get(
        consume.remote([nbcluster.put(1), slow.remote(2)], {"k": nbcluster.put("v")}), timeout=30
    )
    assert kinds == ["ObjectRef", "ObjectRef", "ObjectRef"]
    assert n_ready == 2
    assert values == [1, 2]
    assert mapped == "v"


def test_large_argument_and_return_round_trip(shared_cluster):
    arr = np.random.default_rng(0).random(5 * 2**20 // 8)  # 5 MiB of float64

    @nbcluster.remote
    def echo(a, *, scale=1.0):
        return a * scale, float(a.sum())

    back, total = nbcluster.get(echo.remote(arr), timeout=60)
    np.testing.assert_array_equal(back, arr)
    assert total == float(arr.sum())

    back2, _ = nbcluster.get(echo.remote(nbcluster.put(arr), scale=2.0), timeout=60)
    np.testing.assert_array_equal(back2, arr * 2.0)

    @nbcluster.remote
    def make(n):
        return np.arange(n, dtype=np.float64)

    n = 5 * 2**20 // 8
    made = nbcluster.get(make.remote(n), timeout=60)
    np.testing.assert_array_equal(made, np.arange(n, dtype=np.float64))

    @nbcluster.remote
    def big_bytes(n):
        return b"\xab" * n

    assert nbcluster.get(big_bytes.remote(5 * 2**20), timeout=60) == b"\xab" * (5 * 2**20)


# ------------------------------------------------------------------ nested tasks


def test_tasks_submit_tasks_and_use_get_and_wait(shared_cluster):
    @nbcluster.remote
    def child(i):
        return i * i

    @nbcluster.remote
    def parent(n):
        refs = [child.remote(i) for i in range(n)]
        ready, not_ready = nbcluster.wait(refs, num_returns=n, timeout=30)
        assert len(ready) == n and not not_ready
        return sum(nbcluster.get(refs, timeout=30))

    assert nbcluster.get(parent.remote(5), timeout=60) == sum(i * i for i in range(5))


def test_no_deadlock_when_parents_wait_on_children(shared_cluster):
    @nbcluster.remote
    def child(i, j):
        return i * 10 + j

    @nbcluster.remote
    def parent(i):
        return nbcluster.get([child.remote(i, j) for j in range(3)], timeout=60)

    # 2 CPUs, 4 parents: every CPU is held by a parent blocked on its children.
    out = nbcluster.get([parent.remote(i) for i in range(4)], timeout=60)
    assert out == [[i * 10 + j for j in range(3)] for i in range(4)]


def test_recursive_fib_does_not_deadlock(shared_cluster):
    @nbcluster.remote
    def fib(n):
        if n < 2:
            return n
        return sum(nbcluster.get([fib.remote(n - 1), fib.remote(n - 2)], timeout=60))

    assert nbcluster.get(fib.remote(6), timeout=60) == 8


def test_slow_tasks_after_fast_tasks_run_in_parallel(shared_cluster, tmp_path):
    @nbcluster.remote
    def quick(i):
        return i

    assert nbcluster.get([quick.remote(i) for i in range(50)], timeout=30) == list(range(50))

    @nbcluster.remote
    def rendezvous(me, other):
        open(me, "w").close()
        deadline = time.monotonic() + 3
        while not os.path.exists(other):
            if time.monotonic() > deadline:
                raise TimeoutError("ran alone: the other task never started on the free CPU")
            time.sleep(0.005)
        return True

    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    refs = [rendezvous.remote(a, b), rendezvous.remote(b, a)]
    assert nbcluster.get(refs, timeout=30) == [True, True]


# ------------------------------------------------------------------ num_returns


def test_num_returns_zero_one_three(shared_cluster, tmp_path):
    runs = tmp_path / "runs"

    @nbcluster.remote(num_returns=0)
    def side_effect(path):
        with open(path, "a") as fh:
            fh.write("x\n")

    assert side_effect.remote(str(runs)) is None
    poll_for(lambda: _marks(runs) == ["x"], timeout=10, message="num_returns=0 task did not run")

    @nbcluster.remote(num_returns=1)
    def one():
        return 1, 2, 3

    ref = one.remote()
    assert isinstance(ref, nbcluster.ObjectRef)
    assert nbcluster.get(ref, timeout=30) == (1, 2, 3)

    @nbcluster.remote(num_returns=3)
    def three():
        return "a", [1], {"k": 2}

    refs = three.remote()
    assert isinstance(refs, list) and len(refs) == 3
    assert all(isinstance(r, nbcluster.ObjectRef) for r in refs)
    assert nbcluster.get(refs, timeout=30) == ["a", [1], {"k": 2}]
    assert nbcluster.get(refs[1], timeout=30) == [1]


@pytest.mark.parametrize(
    ("result", "got"),
    [((1, 2), "returned 2"), ([1, 2, 3, 4], "returned 4"), (7, "returned a int")],
    ids=["too-few", "too-many", "not-a-sequence"],
)
def test_wrong_number_of_returns_names_num_returns(shared_cluster, result, got):
    @nbcluster.remote(num_returns=3)
    def bad():
        return result

    refs = bad.remote()
    assert len(refs) == 3
    for ref in refs:
        with pytest.raises(TaskError, match=rf"declared num_returns=3 but {got}") as info:
            nbcluster.get(ref, timeout=30)
        assert isinstance(info.value, ValueError)


# ------------------------------------------------------------------ workers and resources


def test_max_calls_one_gives_a_fresh_worker_per_call(shared_cluster):
    @nbcluster.remote(max_calls=1)
    def whoami():
        return os.getpid()

    pids = [nbcluster.get(whoami.remote(), timeout=30) for _ in range(3)]
    pids += nbcluster.get([whoami.remote() for _ in range(3)], timeout=30)
    assert len(set(pids)) == 6, pids
    poll_for(
        lambda: not any(pid_alive(p) for p in pids),
        timeout=10,
        message="workers with max_calls=1 did not exit after their call",
    )

    @nbcluster.remote
    def plain_pid():
        return os.getpid()

    # Without max_calls, a worker is reused: 6 sequential calls use at most 2 processes.
    assert len({nbcluster.get(plain_pid.remote(), timeout=30) for _ in range(6)}) <= 2


def test_infeasible_task_warns_and_stays_pending(shared_cluster):
    @nbcluster.remote
    def wants_gpus():
        return "ran"

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ref = wants_gpus.options(num_gpus=5).remote()
        found = poll_for(
            lambda: [w for w in caught if issubclass(w.category, InfeasibleResourceWarning)],
            timeout=10,
            message="no InfeasibleResourceWarning within 10 s",
        )
    message = str(found[0].message)
    assert "wants_gpus" in message and "GPU: 5" in message, message

    with pytest.raises(GetTimeoutError):
        nbcluster.get(ref, timeout=0.5)

    # The cluster is still usable while the infeasible task waits.
    @nbcluster.remote
    def fine(x):
        return x + 1

    assert nbcluster.get([fine.remote(i) for i in range(10)], timeout=30) == list(range(1, 11))
    with pytest.raises(GetTimeoutError):
        nbcluster.get(ref, timeout=0.2)  # still pending, never ran

    nbcluster.cancel(ref)
    with pytest.raises(TaskCancelledError):
        nbcluster.get(ref, timeout=10)
