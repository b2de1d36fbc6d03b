"""Generator tasks, written from Ray's "Ray Generators" and "Dynamic generators" pages.

A generator function's ``.remote()`` returns an ``ObjectRefGenerator`` (Ray >= 2.8
streams by default) whose refs arrive while the task still runs; ``num_returns=N``
stores N yielded values as N returns; ``num_returns="dynamic"`` returns one ref to a
``DynamicObjectRefGenerator``. An exception mid-stream takes the next position.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import nbcluster
from nbcluster import state
from nbcluster.exceptions import TaskCancelledError, TaskError, WorkerCrashedError

T = 60  # generous deadline against hangs (never a timing assert)


def _wait_file(path: Path, timeout: float = T) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.02)


def _lines(path: Path) -> list[str]:
    return path.read_text().split() if path.exists() else []


def _next(gen: nbcluster.ObjectRefGenerator) -> Any:
    """next(gen) with a deadline: a hang fails the test instead of blocking it."""
    ref = gen._next_sync(T)
    assert ref is not None and not ref.is_nil(), "no item within the deadline"
    return ref


@nbcluster.remote
def count(n: int):
    yield from range(n)


@nbcluster.remote
def gated(first: int, gate: str):
    """Yields ``first`` values, waits for the file ``gate``, then yields one more."""
    yield from range(first)
    while not os.path.exists(gate):
        time.sleep(0.01)
    yield first


def test_generator_function_returns_a_streaming_generator(shared_cluster: Any):
    gen = count.remote(4)
    assert isinstance(gen, nbcluster.ObjectRefGenerator)
    refs = list(gen)
    assert all(isinstance(r, nbcluster.ObjectRef) for r in refs)
    assert nbcluster.get(refs, timeout=T) == [0, 1, 2, 3]
    with pytest.raises(StopIteration):
        next(gen)
    assert nbcluster.get(gen.completed(), timeout=T) is None
    assert gen.is_finished()
    # the explicit spelling does the same; an empty generator stops at once
    assert [nbcluster.get(r) for r in count.options(num_returns="streaming").remote(2)] == [0, 1]
    assert list(count.remote(0)) == []
    # many quick yields: reports are pipelined and may overtake each other; order holds
    many = count.remote(500)
    assert nbcluster.get(list(many), timeout=T) == list(range(500))


def test_refs_arrive_while_the_task_still_runs(shared_cluster: Any, tmp_path: Path):
    gate = tmp_path / "gate"
    gen = gated.remote(2, str(gate))
    # the task cannot finish before the gate opens: these refs were streamed
    assert nbcluster.get(_next(gen), timeout=T) == 0
    assert nbcluster.get(_next(gen), timeout=T) == 1
    ready, _ = nbcluster.wait([gen.completed()], timeout=0)
    assert not ready
    gate.touch()
    assert nbcluster.get(_next(gen), timeout=T) == 2
    with pytest.raises(StopIteration):
        next(gen)


def test_a_task_can_own_and_consume_a_generator(shared_cluster: Any):
    @nbcluster.remote(num_cpus=0.5)
    def consumer(n: int) -> list[int]:
        return [nbcluster.get(r) for r in count.options(num_cpus=0.5).remote(n)]

    assert nbcluster.get(consumer.remote(3), timeout=T) == [0, 1, 2]


def test_fixed_num_returns_generator_and_wrong_counts(shared_cluster: Any):
    @nbcluster.remote(num_returns=3)
    def three():
        yield "a"
        yield "b"
        yield "c"

    refs = three.remote()
    assert isinstance(refs, list) and len(refs) == 3
    assert nbcluster.get(refs, timeout=T) == ["a", "b", "c"]
    one = count.options(num_returns=1).remote(1)
    assert nbcluster.get(one, timeout=T) == 0
    too_many = count.options(num_returns=2).remote(3)
    with pytest.raises(ValueError, match=r"num_returns=2 but its generator yielded more than 2"):
        nbcluster.get(too_many[0], timeout=T)
    too_few = count.options(num_returns=3).remote(1)
    with pytest.raises(TaskError, match=r"num_returns=3 but its generator yielded 1 value"):
        nbcluster.get(too_few[2], timeout=T)


def test_an_exception_mid_stream_arrives_at_its_position(shared_cluster: Any):
    @nbcluster.remote
    def fails_after(n: int):
        yield from range(n)
        raise ValueError("boom after the last yield")

    gen = fails_after.remote(2)
    assert nbcluster.get(next(gen), timeout=T) == 0
    assert nbcluster.get(next(gen), timeout=T) == 1
    bad = next(gen)
    with pytest.raises(ValueError, match="boom after the last yield") as info:
        nbcluster.get(bad, timeout=T)
    assert isinstance(info.value, TaskError)
    with pytest.raises(StopIteration):
        next(gen)
    with pytest.raises(ValueError, match="boom"):
        nbcluster.get(gen.completed(), timeout=T)
    # a generator that fails before its first yield: the error is at position 0
    gen = fails_after.remote(0)
    with pytest.raises(ValueError, match="boom"):
        nbcluster.get(next(gen), timeout=T)
    with pytest.raises(StopIteration):
        next(gen)


def test_streaming_on_a_function_that_is_not_a_generator(shared_cluster: Any):
    @nbcluster.remote(num_returns="streaming")
    def not_a_generator():
        return [1, 2]

    gen = not_a_generator.remote()
    with pytest.raises(TypeError, match=r'num_returns="streaming" but returned a list'):
        nbcluster.get(next(gen), timeout=T)
    with pytest.raises(StopIteration):
        next(gen)


def test_dynamic_returns_one_ref_to_a_dynamic_generator(shared_cluster: Any):
    @nbcluster.remote(num_returns="dynamic")
    def split(n: int):
        for i in range(n):
            yield np.full(4, i)

    ref = split.remote(3)
    assert isinstance(ref, nbcluster.ObjectRef)
    dyn = nbcluster.get(ref, timeout=T)
    assert isinstance(dyn, nbcluster.DynamicObjectRefGenerator)
    assert len(dyn) == 3
    arrays = [nbcluster.get(r, timeout=T) for r in dyn]
    assert [a.tolist() for a in arrays] == [[i] * 4 for i in range(3)]

    @nbcluster.remote
    def total(*parts: Any) -> int:
        return int(sum(p.sum() for p in parts))

    # the inner refs are ordinary refs: pass them to other tasks
    assert nbcluster.get(total.remote(*dyn), timeout=T) == 12


def test_async_for_and_anext(shared_cluster: Any):
    async def consume() -> list[int]:
        out = []
        async for ref in count.remote(3):
            out.append(await ref)
        gen = count.remote(1)
        out.append(await (await gen.__anext__()))
        with pytest.raises(StopAsyncIteration):
            await gen.__anext__()
        return out

    assert asyncio.run(consume()) == [0, 1, 2, 0]


def test_async_iteration_does_not_block_the_event_loop(shared_cluster: Any, tmp_path: Path):
    gate = tmp_path / "gate"
    ticks = []

    async def main() -> list[int]:
        gen = gated.remote(0, str(gate))

        async def ticker() -> None:
            for _ in range(3):
                ticks.append(1)
                await asyncio.sleep(0.01)
            gate.touch()  # only runs if the loop is free while __anext__ waits

        t = asyncio.create_task(ticker())
        values = [await ref async for ref in gen]
        await t
        return values

    assert asyncio.run(asyncio.wait_for(main(), T)) == [0]
    assert len(ticks) == 3


def test_wait_on_a_generator_is_ready_when_next_would_not_block(
    shared_cluster: Any, tmp_path: Path
):
    gate = tmp_path / "gate"
    gen = gated.remote(1, str(gate))
    ready, not_ready = nbcluster.wait([gen], timeout=T)
    assert ready == [gen] and not_ready == []
    assert nbcluster.get(next(gen), timeout=T) == 0
    # blocked on the gate: not ready
    ready, not_ready = nbcluster.wait([gen], timeout=0.2)
    assert ready == [] and not_ready == [gen]
    # mixed with plain refs, num_returns counts both kinds
    plain = nbcluster.put("x")
    ready, not_ready = nbcluster.wait([gen, plain], num_returns=1, timeout=T)
    assert ready == [plain] and not_ready == [gen]
    gate.touch()
    ready, _ = nbcluster.wait([gen, plain], num_returns=2, timeout=T)
    assert ready == [gen, plain]
    assert nbcluster.get(next(gen), timeout=T) == 1
    ready, _ = nbcluster.wait([gen], timeout=T)  # the end: next() raises at once
    assert ready == [gen]
    with pytest.raises(StopIteration):
        next(gen)


def test_actor_generator_methods_sync_threaded_and_async(shared_cluster: Any):
    @nbcluster.remote
    class Sync:
        def __init__(self) -> None:
            self.base = 10

        def gen(self, n: int):
            for i in range(n):
                yield self.base + i

        @nbcluster.method(num_returns=2)
        def pair(self):
            yield "x"
            yield "y"

    @nbcluster.remote
    class Async:
        async def agen(self, n: int):
            for i in range(n):
                await asyncio.sleep(0)
                yield i * 2

        def sync_gen_in_async_actor(self, n: int):
            yield from range(n)

    s = Sync.remote()
    assert [nbcluster.get(r, timeout=T) for r in s.gen.remote(3)] == [10, 11, 12]
    assert nbcluster.get(s.pair.remote(), timeout=T) == ["x", "y"]
    dyn = nbcluster.get(s.gen.options(num_returns="dynamic").remote(2), timeout=T)
    assert [nbcluster.get(r, timeout=T) for r in dyn] == [10, 11]
    threaded = Sync.options(max_concurrency=2).remote()
    assert [nbcluster.get(r, timeout=T) for r in threaded.gen.remote(2)] == [10, 11]
    a = Async.remote()
    gen = a.agen.remote(3)
    assert isinstance(gen, nbcluster.ObjectRefGenerator)
    assert [nbcluster.get(r, timeout=T) for r in gen] == [0, 2, 4]
    assert [nbcluster.get(r, timeout=T) for r in a.sync_gen_in_async_actor.remote(2)] == [0, 1]
    for actor in (s, threaded, a):
        nbcluster.kill(actor)


def test_backpressure_pauses_the_task_until_items_are_consumed(shared_cluster: Any, tmp_path: Path):
    log = tmp_path / "produced"

    @nbcluster.remote(_generator_backpressure_num_objects=2)
    def producer(path: str, n: int):
        for i in range(n):
            with open(path, "a") as f:
                f.write(f"{i}\n")
            yield i

    gen = producer.remote(str(log), 5)
    deadline = time.monotonic() + T
    while len(_lines(log)) < 2:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    # two unconsumed items: the task is paused and cannot finish or produce a third
    ready, _ = nbcluster.wait([gen.completed()], timeout=0.5)
    assert not ready
    assert _lines(log) == ["0", "1"]
    assert [nbcluster.get(r, timeout=T) for r in gen] == [0, 1, 2, 3, 4]
    assert _lines(log) == ["0", "1", "2", "3", "4"]

    # the same option on an actor method
    @nbcluster.remote
    class A:
        def gen(self, path: str, n: int):
            for i in range(n):
                with open(path, "a") as f:
                    f.write(f"{i}\n")
                yield i

    log2 = tmp_path / "actor"
    a = A.remote()
    agen = a.gen.options(_generator_backpressure_num_objects=1).remote(str(log2), 3)
    assert nbcluster.get(_next(agen), timeout=T) == 0
    ready, _ = nbcluster.wait([agen.completed()], timeout=0.3)
    assert not ready
    assert len(_lines(log2)) <= 2  # at most one produced but not taken
    assert [nbcluster.get(r, timeout=T) for r in agen] == [1, 2]
    nbcluster.kill(a)


def test_cancel_a_running_generator(shared_cluster: Any):
    @nbcluster.remote
    def forever():
        i = 0
        while True:
            yield i
            i += 1
            time.sleep(0.05)

    gen = forever.remote()
    assert nbcluster.get(_next(gen), timeout=T) == 0
    nbcluster.cancel(gen)
    values = []
    with pytest.raises(TaskCancelledError):  # some more items, then the cancellation
        for ref in gen:
            values.append(nbcluster.get(ref, timeout=T))
    assert values == list(range(1, len(values) + 1))
    with pytest.raises(StopIteration):
        next(gen)


def test_large_yields_go_through_the_store_zero_copy(shared_cluster: Any):
    @nbcluster.remote
    def chunks(n: int):
        for i in range(n):
            yield np.full(1 << 19, i, dtype=np.float64)  # 4 MiB each

    gen = chunks.remote(2)
    client = nbcluster._api.context.current_client()
    for i, ref in enumerate(gen):
        arr = nbcluster.get(ref, timeout=T)
        assert arr.shape == (1 << 19,) and arr[0] == i and arr[-1] == i
        assert not arr.flags.writeable  # a read-only view of the shared-memory store
        assert client.table.get(ref.binary()).in_store


def test_generator_output_is_captured_like_other_task_output(shared_cluster: Any):
    records: list[tuple[Any, Any]] = []
    lock = threading.Lock()

    def handler(ctx: Any, record: Any) -> None:
        with lock:
            records.append((ctx, record))

    state.set_output_handler(handler)
    state.set_submit_context_provider(lambda: "cell-7")
    try:

        @nbcluster.remote
        def chatty(n: int):
            for i in range(n):
                print(f"yielding {i}")
                yield i

        assert [nbcluster.get(r, timeout=T) for r in chatty.remote(2)] == [0, 1]
        deadline = time.monotonic() + T
        while True:
            with lock:
                lines = [
                    line
                    for ctx, r in records
                    if ctx == "cell-7" and r.stream == "stdout"
                    for line in r.text.splitlines()
                ]
            if lines == ["yielding 0", "yielding 1"]:
                break
            assert time.monotonic() < deadline, records
            time.sleep(0.05)
    finally:
        state.set_output_handler(None)
        state.set_submit_context_provider(None)


def test_worker_death_mid_stream(shared_cluster: Any, tmp_path: Path):
    @nbcluster.remote(max_retries=0)
    def dies_after(n: int):
        yield from range(n)
        os._exit(1)

    gen = dies_after.remote(2)
    values = []
    # As Ray documents: the system error comes as the last ref, and the items the process
    # had yielded but not yet reported when it died are lost (1 to N + 1 refs).
    with pytest.raises(WorkerCrashedError, match="exited with code 1"):
        for ref in gen:
            values.append(nbcluster.get(ref, timeout=T))
    assert values == [0, 1][: len(values)]
    with pytest.raises(StopIteration):
        next(gen)

    marker = tmp_path / "crashed-once"

    @nbcluster.remote(max_retries=1)
    def dies_once(path: str, n: int):
        for i in range(n):
            if i == 2 and not os.path.exists(path):
                open(path, "w").close()
                os._exit(1)
            yield i

    # retried (a deterministic generator): the items already delivered are not repeated
    assert [nbcluster.get(r, timeout=T) for r in dies_once.remote(str(marker), 4)] == [0, 1, 2, 3]
    assert marker.exists()


def test_dropped_generator_frees_the_items_it_did_not_take(shared_cluster: Any):
    gen = count.remote(3)
    nbcluster.get(gen.completed(), timeout=T)
    first = next(gen)
    client = nbcluster._api.context.current_client()
    ids = [first.binary()[:16] + (i + 2).to_bytes(4, "big") for i in range(3)]
    assert all(client.table.get(oid) is not None for oid in ids)
    del gen
    deadline = time.monotonic() + T
    while any(client.table.get(oid) is not None for oid in ids[1:]):
        assert time.monotonic() < deadline, "untaken items were not freed"
        time.sleep(0.02)
    assert nbcluster.get(first, timeout=T) == 0  # the taken ref is a normal ref


def test_generators_cannot_be_passed_to_tasks_and_bad_options_fail_early(shared_cluster: Any):
    @nbcluster.remote
    def takes(x: Any) -> Any:
        return x

    gen = count.remote(1)
    with pytest.raises(Exception, match="ObjectRefGenerator cannot be passed"):
        takes.remote(gen)
    with pytest.raises(TypeError, match=r"get\(\) does not take an ObjectRefGenerator"):
        nbcluster.get(gen)
    list(gen)
    with pytest.raises(ValueError, match=r'"streaming" or "dynamic", got \'stream\''):
        count.options(num_returns="stream")
    with pytest.raises(ValueError, match="_generator_backpressure_num_objects"):
        count.options(_generator_backpressure_num_objects=0)
    with pytest.raises(ValueError, match="num_returns"):
        nbcluster.method(num_returns="bogus")
