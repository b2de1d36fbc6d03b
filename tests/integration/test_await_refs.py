"""``await ref`` from asyncio code: values inline and in the store, errors, borrowed refs,
cancellation, and many awaits at once without a thread per await.

An ``await`` wakes on a callback from the object's entry (no waiting thread), and an async
actor runs calls with small arguments and returns without leaving its loop; these tests
pin the behaviour those fast paths must keep.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import numpy as np
import pytest

import nbcluster


@nbcluster.remote
def echo(x: Any) -> Any:
    return x


@nbcluster.remote
def big(n: int) -> np.ndarray:
    return np.arange(n, dtype=np.int64)


@nbcluster.remote
def fail() -> None:
    raise ValueError("boom in the task")


@nbcluster.remote
def slow(s: float) -> str:
    import time

    time.sleep(s)
    return "done"


@nbcluster.remote
class AsyncEcho:
    async def echo(self, x: Any) -> Any:
        return x

    async def total(self, refs: list[Any]) -> int:
        # borrowed refs, awaited inside an async actor
        values = await asyncio.gather(*refs)
        return int(sum(int(np.asarray(v).sum()) for v in values))

    async def size(self, arr: np.ndarray) -> int:
        return int(arr.size)

    async def raises(self) -> None:
        raise KeyError("boom in the actor")


def test_await_inline_stored_and_error_values(shared_cluster: Any) -> None:
    async def main() -> None:
        assert await echo.remote(7) == 7
        arr = await big.remote(1_000_000)  # 8 MB: returned through the store
        assert arr.shape == (1_000_000,) and int(arr[-1]) == 999_999
        with pytest.raises(nbcluster.exceptions.TaskError, match="boom in the task"):
            await fail.remote()
        put_ref = nbcluster.put(np.ones(500_000))
        assert float((await put_ref).sum()) == 500_000.0

    asyncio.run(main())


def test_many_awaits_at_once_start_no_thread_each(shared_cluster: Any) -> None:
    threads_before = threading.active_count()
    peak = [0]

    async def watch(stop: asyncio.Event) -> None:
        while not stop.is_set():
            peak[0] = max(peak[0], threading.active_count())
            await asyncio.sleep(0.005)

    async def main() -> list[Any]:
        stop = asyncio.Event()
        watcher = asyncio.create_task(watch(stop))
        pending = slow.remote(0.5)
        refs = [echo.remote(i) for i in range(100)]
        out = await asyncio.gather(*[_await(pending) for _ in range(200)], *refs)
        stop.set()
        await watcher
        return out

    out = asyncio.run(main())
    assert out[:200] == ["done"] * 200 and out[200:] == list(range(100))
    # one thread per await would have added hundreds while the slow tasks ran
    assert peak[0] - threads_before < 50, (threads_before, peak[0])


def test_cancelled_await_leaves_the_ref_usable(shared_cluster: Any) -> None:
    ref = slow.remote(0.5)

    async def main() -> Any:
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(asyncio.ensure_future(_await(ref)), 0.05)
        return await ref

    assert asyncio.run(main()) == "done"
    assert nbcluster.get(ref) == "done"


async def _await(ref: Any) -> Any:
    return await ref


def test_async_actor_with_inline_stored_and_borrowed_values(shared_cluster: Any) -> None:
    actor = AsyncEcho.remote()
    assert nbcluster.get(actor.echo.remote({"a": 1})) == {"a": 1}
    arr = np.arange(2_000_000, dtype=np.int64)  # stored argument: mapped off the loop
    assert nbcluster.get(actor.size.remote(arr)) == 2_000_000
    stored = nbcluster.get(actor.echo.remote(arr))  # large return: written off the loop
    assert stored.shape == arr.shape and int(stored[-1]) == 1_999_999
    refs = [big.remote(10), nbcluster.put(np.ones(300_000, dtype=np.int64))]
    assert nbcluster.get(actor.total.remote(refs)) == 45 + 300_000
    with pytest.raises(nbcluster.exceptions.TaskError, match="boom in the actor"):
        nbcluster.get(actor.raises.remote())
    assert nbcluster.get(actor.echo.remote("still alive")) == "still alive"
    nbcluster.kill(actor)


def test_when_ready_calls_back_once_per_ref_without_polling(shared_cluster: Any) -> None:
    from nbcluster.state import when_ready

    calls: list[tuple[str, str]] = []
    all_done = threading.Event()

    def record(tag: str) -> Any:
        def cb(ref: Any) -> None:
            calls.append((tag, ref.hex()))
            if len(calls) == 3:
                all_done.set()

        return cb

    ready = nbcluster.put(1)
    when_ready(ready, record("ready"))  # ready already: called at once, on this thread
    assert calls == [("ready", ready.hex())]
    pending = slow.remote(0.3)
    failing = fail.remote()
    when_ready(pending, record("pending"))
    when_ready(failing, record("failing"))
    assert all_done.wait(30), calls
    assert sorted(t for t, _ in calls) == ["failing", "pending", "ready"]
    assert nbcluster.get(pending) == "done"
    with pytest.raises(nbcluster.exceptions.TaskError):
        nbcluster.get(failing)
