"""``nbcluster.util.queue.Queue`` against a real cluster, with Ray's semantics (issue 20 item 5).

Ray's ``ray.util.queue`` (2.60) is the reference: FIFO order; ``put``/``get`` block by
default, ``block=False`` or an expired ``timeout`` raise ``Full``/``Empty`` (subclasses of
the standard library's ``queue.Full``/``queue.Empty``); a negative timeout is a
``ValueError``; the batch variants move all items or none; a queue passed to tasks and
actors is the same queue; ``shutdown`` ends its actor.
"""

from __future__ import annotations

import asyncio
import queue as stdqueue
import sys
import threading
import time

import cloudpickle
import pytest

import nbcluster
from nbcluster.exceptions import ActorDiedError
from nbcluster.testing import poll_for
from nbcluster.util.queue import Empty, Full, Queue

pytestmark = pytest.mark.integration

cloudpickle.register_pickle_by_value(sys.modules[__name__])


@nbcluster.remote
def produce(q: Queue, items: list[int]) -> int:
    for item in items:
        q.put(item)
    return len(items)


@nbcluster.remote
class Consumer:
    def __init__(self, q: Queue) -> None:
        self.q = q

    def take(self, n: int) -> list[int]:
        return [self.q.get(timeout=20) for _ in range(n)]

    async def take_async(self, n: int) -> list[int]:
        return [await self.q.get_async(timeout=20) for _ in range(n)]


def test_fifo_order_and_sizes(shared_cluster: object) -> None:
    q = Queue()
    assert q.empty() and not q.full()
    assert q.size() == q.qsize() == len(q) == 0
    for i in range(10):
        q.put(i)
    assert q.size() == q.qsize() == len(q) == 10
    assert not q.empty() and not q.full()  # unbounded: never full
    assert [q.get() for _ in range(10)] == list(range(10))
    assert q.empty()
    q.shutdown()


def test_get_on_empty_queue(shared_cluster: object) -> None:
    q = Queue()
    with pytest.raises(Empty):
        q.get(block=False)
    with pytest.raises(Empty):
        q.get_nowait()
    start = time.monotonic()
    with pytest.raises(stdqueue.Empty):  # Empty is the standard library's Empty too
        q.get(timeout=0.2)
    assert time.monotonic() - start >= 0.19
    with pytest.raises(ValueError, match="non-negative"):
        q.get(timeout=-1)
    q.put("x")
    assert q.get(timeout=5) == "x"
    q.shutdown()


def test_put_on_full_queue(shared_cluster: object) -> None:
    q = Queue(maxsize=1)
    q.put(1)
    assert q.full()
    with pytest.raises(Full):
        q.put(2, block=False)
    with pytest.raises(Full):
        q.put_nowait(2)
    with pytest.raises(stdqueue.Full):
        q.put(2, timeout=0.2)
    with pytest.raises(ValueError, match="non-negative"):
        q.put(2, timeout=-1)
    assert q.get() == 1
    q.put_nowait(3)
    assert q.get_nowait() == 3
    q.shutdown()


def test_blocked_get_wakes_on_put_from_a_task(shared_cluster: object) -> None:
    q = Queue()
    got: list[int] = []
    reader = threading.Thread(target=lambda: got.extend(q.get(timeout=30) for _ in range(3)))
    reader.start()
    time.sleep(0.2)  # the reader is blocked in get() on the empty queue
    assert nbcluster.get(produce.remote(q, [7, 8, 9]), timeout=30) == 3
    reader.join(30)
    assert got == [7, 8, 9]
    q.shutdown()


def test_blocked_put_wakes_on_get(shared_cluster: object) -> None:
    q = Queue(maxsize=2)
    ref = produce.remote(q, list(range(6)))  # blocks in put() after two items
    poll_for(q.full, timeout=20, message="the producer never filled the queue")
    ready, _ = nbcluster.wait([ref], timeout=0.2)
    assert not ready  # still blocked on the full queue
    assert [q.get(timeout=20) for _ in range(6)] == list(range(6))
    assert nbcluster.get(ref, timeout=20) == 6
    q.shutdown()


def test_queue_shared_by_tasks_and_actors(shared_cluster: object) -> None:
    q = Queue(maxsize=4)
    consumer = Consumer.remote(q)
    taken = consumer.take.remote(10)
    assert nbcluster.get(produce.remote(q, list(range(10))), timeout=30) == 10
    assert nbcluster.get(taken, timeout=30) == list(range(10))
    taken = consumer.take_async.remote(5)
    q.put_nowait_batch(range(4))
    q.put(4)
    assert nbcluster.get(taken, timeout=30) == list(range(5))
    nbcluster.kill(consumer)
    q.shutdown()


def test_batches_are_all_or_nothing(shared_cluster: object) -> None:
    q = Queue(maxsize=3)
    q.put_nowait_batch([1, 2])
    with pytest.raises(Full, match="Cannot add 2 items to queue of size 2 and maxsize 3"):
        q.put_nowait_batch([3, 4])
    assert q.size() == 2  # nothing of the failed batch went in
    with pytest.raises(Empty, match="Cannot get 3 items from queue of size 2"):
        q.get_nowait_batch(3)
    assert q.get_nowait_batch(2) == [1, 2]
    assert q.get_nowait_batch(0) == []
    with pytest.raises(TypeError, match="must be an Iterable"):
        q.put_nowait_batch(5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="must be an int"):
        q.get_nowait_batch("2")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="nonnegative"):
        q.get_nowait_batch(-1)
    q.shutdown()


def test_async_variants(shared_cluster: object) -> None:
    q = Queue(maxsize=1)

    async def main() -> list[object]:
        await q.put_async("a")
        with pytest.raises(Full):
            await q.put_async("b", block=False)
        with pytest.raises(Full):
            await q.put_async("b", timeout=0.1)
        first = await q.get_async()
        with pytest.raises(Empty):
            await q.get_async(block=False)
        with pytest.raises(Empty):
            await q.get_async(timeout=0.1)
        waiter = asyncio.ensure_future(q.get_async(timeout=20))
        await asyncio.sleep(0.1)
        await q.put_async("c")
        return [first, await waiter]

    assert asyncio.run(main()) == ["a", "c"]
    q.shutdown()


def test_actor_options_and_shutdown(shared_cluster: object) -> None:
    total = nbcluster.cluster_resources()["CPU"]
    q = Queue(actor_options={"num_cpus": 1, "name": "test-queue"})
    q.put("x")
    poll_for(lambda: nbcluster.available_resources().get("CPU", 0) == total - 1, timeout=20)
    assert nbcluster.get_actor("test-queue") == q.actor
    actor = q.actor
    q.shutdown()
    with pytest.raises(ActorDiedError):
        nbcluster.get(actor.qsize.remote(), timeout=20)  # type: ignore[union-attr]
    poll_for(lambda: nbcluster.available_resources().get("CPU", 0) == total, timeout=20)
    with pytest.raises(RuntimeError, match="shut down"):
        q.put("y")
    q.shutdown()  # a second shutdown does nothing


def test_bad_arguments() -> None:
    with pytest.raises(TypeError, match="maxsize must be an int"):
        Queue(maxsize="3")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="actor_options must be a dict"):
        Queue(actor_options=[("num_cpus", 1)])  # type: ignore[arg-type]
