"""``nbcluster.util.multiprocessing.Pool`` on a real cluster (issue 20 item 5).

The standard library's ``multiprocessing.Pool`` and Ray's ``ray.util.multiprocessing.Pool``
(2.60) are the reference: ``map``/``starmap``/``imap``/``imap_unordered``/``apply`` and
their ``_async`` forms give the same results as a local pool, in the same order; a call's
exception is re-raised by ``get`` (with the remote traceback as its cause);
``AsyncResult.get(timeout)`` raises ``multiprocessing.TimeoutError``; ``close`` refuses new
work, ``join`` needs a closed pool, ``terminate`` (and leaving the ``with`` block) stops
the processes; ``maxtasksperchild`` replaces a process; the work runs in other processes.
"""

from __future__ import annotations

import itertools
import multiprocessing
import os
import pickle
import sys
import threading
import time
from multiprocessing.pool import RemoteTraceback

import cloudpickle
import pytest

import nbcluster
from nbcluster.exceptions import ActorDiedError
from nbcluster.util.multiprocessing import AsyncResult, Pool, TimeoutError

pytestmark = pytest.mark.integration

cloudpickle.register_pickle_by_value(sys.modules[__name__])


def square(x: int) -> int:
    return x * x


def add(a: int, b: int) -> int:
    return a + b


def pid(_: object = None) -> int:
    return os.getpid()


def fail_on_three(x: int) -> int:
    if x == 3:
        raise ValueError(f"bad value {x}")
    return x


def set_marker(value: str) -> None:
    os.environ["NBCLUSTER_POOL_MARKER"] = value


def read_marker(_: object = None) -> str:
    return os.environ.get("NBCLUSTER_POOL_MARKER", "")


def sleep_then(x: float) -> float:
    time.sleep(x)
    return x


@pytest.fixture(scope="module")
def pool(_module_cluster: object) -> object:
    p = Pool(initializer=set_marker, initargs=("ready",))
    yield p
    p.terminate()


def test_results_match_a_local_pool(shared_cluster: object, pool: Pool) -> None:
    xs = list(range(23))
    assert pool.map(square, xs) == [x * x for x in xs]
    assert pool.map(square, xs, chunksize=5) == [x * x for x in xs]
    assert pool.map(square, iter(xs)) == [x * x for x in xs]  # no len(): read into a list
    assert pool.map(square, []) == []
    assert pool.starmap(add, [(1, 2), (3, 4)]) == [3, 7]
    assert list(pool.imap(square, xs)) == [x * x for x in xs]
    assert list(pool.imap(square, xs, chunksize=4)) == [x * x for x in xs]
    assert sorted(pool.imap_unordered(square, xs)) == sorted(x * x for x in xs)
    assert pool.apply(add, (1, 2)) == 3
    assert pool.apply(add, (1,), {"b": 5}) == 6
    assert pool.apply(add, kwargs={"a": 1, "b": 2}) == 3  # Ray's keyword name
    assert pool.apply_async(square, (9,)).get(timeout=30) == 81
    assert pool.map_async(square, xs).get(timeout=30) == [x * x for x in xs]
    assert pool.starmap_async(add, [(1, 1)]).get(timeout=30) == [2]


def test_work_runs_in_the_pool_processes(shared_cluster: object, pool: Pool) -> None:
    pids = set(pool.map(pid, range(40), chunksize=1))
    assert os.getpid() not in pids
    assert len(pids) == 2  # the default is one process per cluster CPU (2 here)
    # initializer ran in every process before its work
    assert set(pool.map(read_marker, range(8), chunksize=1)) == {"ready"}


def test_imap_reads_its_input_lazily(shared_cluster: object, pool: Pool) -> None:
    it = pool.imap(square, itertools.count())  # endless input
    assert [next(it) for _ in range(10)] == [x * x for x in range(10)]
    it = pool.imap(sleep_then, [0.5])
    with pytest.raises(TimeoutError):
        it.next(timeout=0.05)
    assert isinstance(TimeoutError(), multiprocessing.TimeoutError)


def test_errors_are_reraised_with_the_remote_traceback(shared_cluster: object, pool: Pool) -> None:
    with pytest.raises(ValueError, match="bad value 3") as info:
        pool.map(fail_on_three, range(6))
    assert isinstance(info.value.__cause__, RemoteTraceback)
    assert "fail_on_three" in str(info.value.__cause__)
    result = pool.map_async(fail_on_three, range(6))
    result.wait(timeout=30)
    assert result.ready() and not result.successful()
    # imap raises at the failing position and goes on after it
    it = pool.imap(fail_on_three, range(5))
    assert [next(it), next(it), next(it)] == [0, 1, 2]
    with pytest.raises(ValueError, match="bad value 3"):
        next(it)
    assert next(it) == 4
    with pytest.raises(StopIteration):
        next(it)


def test_callbacks(shared_cluster: object, pool: Pool) -> None:
    got: list[object] = []
    done = threading.Event()

    def record(value: object) -> None:
        got.append(value)
        done.set()

    pool.map_async(square, range(5), callback=record, error_callback=record)
    assert done.wait(30)
    assert got == [[0, 1, 4, 9, 16]]
    done.clear()
    pool.apply_async(fail_on_three, (3,), callback=record, error_callback=record)
    assert done.wait(30)
    assert isinstance(got[-1], ValueError) and "bad value 3" in str(got[-1])


def test_async_result_timeout_and_state(shared_cluster: object, pool: Pool) -> None:
    result = pool.apply_async(sleep_then, (1.0,))
    assert isinstance(result, AsyncResult)
    with pytest.raises(TimeoutError):
        result.get(timeout=0.05)
    assert not result.ready()
    with pytest.raises(ValueError, match="not ready"):
        result.successful()
    assert result.get(timeout=30) == 1.0
    assert result.ready() and result.successful()


def test_maxtasksperchild_replaces_processes(shared_cluster: object) -> None:
    with Pool(processes=1, maxtasksperchild=1) as p:
        pids = [p.apply(pid) for _ in range(3)]
    assert len(set(pids)) == 3


def test_close_join_terminate(shared_cluster: object) -> None:
    p = Pool(processes=2)
    with pytest.raises(ValueError, match="still running"):
        p.join()
    result = p.map_async(sleep_then, [0.2, 0.2])
    p.close()
    with pytest.raises(ValueError, match="Pool not running"):
        p.map(square, [1])
    with pytest.raises(ValueError, match="Pool not running"):
        p.apply_async(square, (1,))
    p.join()  # waits for the work given before close()
    assert result.get(timeout=0) == [0.2, 0.2]

    with Pool(processes=1) as p:
        slow = p.apply_async(sleep_then, (60.0,))
    with pytest.raises(ActorDiedError):  # leaving the block terminated the pool
        slow.get(timeout=30)


def test_bad_arguments(shared_cluster: object) -> None:
    cpus = int(nbcluster.cluster_resources()["CPU"])
    with pytest.raises(ValueError, match=f"only {cpus} CPUs"):
        Pool(processes=cpus + 1)
    with pytest.raises(ValueError, match="must be >0"):
        Pool(processes=0)
    with pytest.raises(ValueError, match="maxtasksperchild"):
        Pool(processes=1, maxtasksperchild=0)
    with Pool(processes=1) as p:
        with pytest.raises(ValueError, match="Chunksize must be 1\\+"):
            p.map(square, [1], chunksize=0)
        with pytest.raises(NotImplementedError, match="cannot be passed between processes"):
            pickle.dumps(p)


def test_initializer_failure_is_raised(shared_cluster: object) -> None:
    def broken() -> None:
        raise RuntimeError("initializer broke")

    with pytest.raises(ActorDiedError, match="initializer broke"):
        Pool(processes=1, initializer=broken)
