"""``nbcluster.util.ActorPool`` against real actors, with Ray's semantics (issue 3 acc. 6).

Ray's ``ray.util.ActorPool`` (2.60) is the reference: results in submission order from
``map``/``get_next``, in completion order from ``map_unordered``/``get_next_unordered``;
a call's error is raised by the get that returns it; timeouts raise the builtin
``TimeoutError``; ``get_next`` after ``get_next_unordered`` raises ``ValueError``.
Completion order is forced with "go" files rather than sleeps where it matters.
"""

from __future__ import annotations

import os
import sys
import threading
import time

import cloudpickle
import pytest

import nbcluster
from nbcluster.exceptions import ActorDiedError, TaskError
from nbcluster.testing import poll_for
from nbcluster.util import ActorPool

pytestmark = pytest.mark.integration

cloudpickle.register_pickle_by_value(sys.modules[__name__])


def _wait_file(path: str, timeout: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


@nbcluster.remote
class Worker:
    def __init__(self, name: str = "") -> None:
        self.name = name

    def double(self, x: int) -> int:
        return 2 * x

    def double_after(self, x: int, go: str) -> int:
        assert _wait_file(go), "never told to go"
        return 2 * x

    def double_logged(self, x: int, log: str) -> int:
        with open(log, "a") as fh:
            fh.write(f"{x}\n")
        return 2 * x

    def fail_on(self, x: int, bad: int) -> int:
        if x == bad:
            raise ValueError(f"bad value {x}")
        return x

    def who(self, _: object = None) -> str:
        return self.name


@pytest.fixture
def workers(shared_cluster):
    actors = [Worker.remote(f"w{i}") for i in range(2)]
    nbcluster.get([a.who.remote() for a in actors], timeout=30)
    yield actors
    for a in actors:
        nbcluster.kill(a)


def test_map_returns_results_in_order(workers):
    pool = ActorPool(workers)
    out = list(pool.map(lambda a, v: a.double.remote(v), range(20)))
    assert out == [2 * v for v in range(20)]
    assert not pool.has_next()
    # the pool is reusable
    assert list(pool.map(lambda a, v: a.double.remote(v), [5, 6])) == [10, 12]
    assert list(pool.map(lambda a, v: a.double.remote(v), [])) == []


def test_map_keeps_order_when_later_values_finish_first(workers, tmp_path):
    go0 = tmp_path / "go0"
    done = tmp_path / "already"
    done.touch()
    pool = ActorPool(workers)
    # the first value is released 1 s after the second one has finished
    timer = threading.Timer(1.0, go0.touch)
    timer.start()
    try:
        values = [(1, str(go0)), (2, str(done))]
        assert list(pool.map(lambda a, v: a.double_after.remote(*v), values)) == [2, 4]
    finally:
        timer.cancel()
        go0.touch()


def test_map_unordered_yields_in_completion_order(workers, tmp_path):
    slow_go, fast_go = tmp_path / "slow", tmp_path / "fast"
    fast_go.touch()
    pool = ActorPool(workers)
    gen = pool.map_unordered(
        lambda a, v: a.double_after.remote(v[0], v[1]), [(1, str(slow_go)), (2, str(fast_go))]
    )
    first = next(gen)
    assert first == 4  # the second value finished first
    slow_go.touch()
    assert list(gen) == [2]
    assert sorted(pool.map_unordered(lambda a, v: a.double.remote(v), range(10))) == [
        2 * v for v in range(10)
    ]


def test_submit_get_next_has_next_and_queued_submits(workers, tmp_path):
    go = tmp_path / "go"
    pool = ActorPool(workers)
    assert not pool.has_next()
    assert pool.has_free()
    for v in range(5):  # two run, three wait for a free actor
        pool.submit(lambda a, v: a.double_after.remote(v, str(go)), v)
    assert pool.has_next()
    assert not pool.has_free()
    assert pool.pop_idle() is None
    go.touch()
    assert [pool.get_next() for _ in range(5)] == [0, 2, 4, 6, 8]
    assert not pool.has_next()
    assert pool.has_free()
    with pytest.raises(StopIteration):
        pool.get_next()
    with pytest.raises(StopIteration):
        pool.get_next_unordered()


def test_get_next_unordered_returns_the_first_to_finish(workers, tmp_path):
    slow_go, fast_go = tmp_path / "slow", tmp_path / "fast"
    pool = ActorPool(workers)
    pool.submit(lambda a, v: a.double_after.remote(v, str(slow_go)), 1)
    pool.submit(lambda a, v: a.double_after.remote(v, str(fast_go)), 2)
    fast_go.touch()
    assert pool.get_next_unordered(timeout=30) == 4
    slow_go.touch()
    assert pool.get_next_unordered(timeout=30) == 2
    assert not pool.has_next()


def test_get_next_after_get_next_unordered_raises_value_error(workers, tmp_path):
    slow_go, fast_go = tmp_path / "slow", tmp_path / "fast"
    pool = ActorPool(workers)
    pool.submit(lambda a, v: a.double_after.remote(v, str(slow_go)), 1)
    pool.submit(lambda a, v: a.double_after.remote(v, str(fast_go)), 2)
    fast_go.touch()
    assert pool.get_next_unordered(timeout=30) == 4  # index 1 returned before index 0
    with pytest.raises(ValueError, match=r"get_next\(\) after get_next_unordered\(\)"):
        pool.get_next()
    slow_go.touch()
    assert pool.get_next_unordered(timeout=30) == 2


def test_timeouts_raise_timeout_error_and_keep_the_result(workers, tmp_path):
    go = tmp_path / "go"
    pool = ActorPool(workers)
    pool.submit(lambda a, v: a.double_after.remote(v, str(go)), 21)
    with pytest.raises(TimeoutError):
        pool.get_next(timeout=0.2)
    with pytest.raises(TimeoutError):
        pool.get_next_unordered(timeout=0.2)
    assert pool.has_next()
    go.touch()
    assert pool.get_next(timeout=30) == 42


def test_a_calls_error_is_raised_by_the_get_that_returns_it(workers):
    pool = ActorPool(workers)
    for v in range(4):
        pool.submit(lambda a, v: a.fail_on.remote(v, 2), v)
    assert pool.get_next() == 0
    assert pool.get_next() == 1
    with pytest.raises(TaskError, match=r"bad value 2") as info:
        pool.get_next()
    assert isinstance(info.value, ValueError)
    assert pool.get_next() == 3
    # the pool still works, with both actors
    out = list(pool.map(lambda a, v: a.who.remote(v), range(6)))
    assert set(out) == {"w0", "w1"}
    with pytest.raises(TaskError, match=r"bad value 1"):
        list(pool.map_unordered(lambda a, v: a.fail_on.remote(v, 1), [1]))


def test_pop_idle_and_push(workers):
    pool = ActorPool(workers)
    popped = pool.pop_idle()
    assert popped in workers
    other = pool.pop_idle()
    assert other in workers and other != popped
    assert pool.pop_idle() is None
    assert not pool.has_free()
    pool.push(popped)
    with pytest.raises(ValueError, match=r"already belongs"):
        pool.push(popped)
    # only the pushed actor works now
    assert set(pool.map(lambda a, v: a.who.remote(v), range(4))) == {
        nbcluster.get(popped.who.remote(), timeout=30)
    }
    pool.push(other)
    assert set(pool.map(lambda a, v: a.who.remote(v), range(8))) == {"w0", "w1"}


def test_push_refuses_a_busy_actor(workers, tmp_path):
    go = tmp_path / "go"
    pool = ActorPool(workers[:1])
    pool.submit(lambda a, v: a.double_after.remote(v, str(go)), 1)
    with pytest.raises(ValueError, match=r"already belongs"):
        pool.push(workers[0])
    go.touch()
    assert pool.get_next(timeout=30) == 2


def test_a_queued_submit_runs_when_an_actor_is_pushed(workers):
    pool = ActorPool([])
    pool.submit(lambda a, v: a.who.remote(v), 0)
    assert pool.has_next() and not pool.has_free()
    pool.push(workers[1])
    assert pool.get_next(timeout=30) == "w1"


def test_get_next_ignore_if_timedout_drops_the_call_like_ray(workers, tmp_path):
    go = tmp_path / "go"
    pool = ActorPool(workers[:1])
    pool.submit(lambda a, v: a.double_after.remote(v, str(go)), 1)
    try:
        with pytest.raises(TimeoutError):
            pool.get_next(timeout=0.2, ignore_if_timedout=True)
        assert not pool.has_next()
        assert pool.has_free()
    finally:
        go.touch()


def test_a_dead_actor_leaves_the_pool_like_ray(shared_cluster):
    alive, doomed = Worker.remote("alive"), Worker.remote("doomed")
    nbcluster.get([alive.who.remote(), doomed.who.remote()], timeout=30)
    nbcluster.kill(doomed)
    poll_for(lambda: _is_dead(doomed), 20, 0.1, "the killed actor still answers")
    pool = ActorPool([alive, doomed])  # submit takes the last idle actor: doomed
    pool.submit(lambda a, v: a.who.remote(v), 0)
    with pytest.raises(ActorDiedError):
        pool.get_next(timeout=30)
    try:
        assert pool.pop_idle() == alive
        assert pool.pop_idle() is None
    finally:
        nbcluster.kill(alive)


def _is_dead(handle) -> bool:
    try:
        nbcluster.get(handle.who.remote(), timeout=30)
    except ActorDiedError:
        return True
    return False


def test_map_submits_before_iteration_like_ray(workers, tmp_path):
    log = tmp_path / "log"
    pool = ActorPool(workers)
    gen = pool.map(lambda a, v: a.double_logged.remote(v, str(log)), range(4))
    try:  # one call per idle actor starts at once; the rest wait for a free actor
        poll_for(
            lambda: log.exists() and len(log.read_text().split()) == len(workers),
            10,
            0.05,
            "map() submitted nothing before iteration",
        )
    finally:
        assert list(gen) == [0, 2, 4, 6]


def test_the_submit_function_must_return_a_ref(workers):
    pool = ActorPool(workers)
    with pytest.raises(TypeError, match=r"must return the ref of an actor call"):
        pool.submit(lambda a, v: v, 1)
