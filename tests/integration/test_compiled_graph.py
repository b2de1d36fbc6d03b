"""Compiled graphs on a real cluster (issue 20 item 6), with Ray's semantics (2.60).

``dag.experimental_compile()`` on a DAG of calls on live actors; ``execute`` returns a
``CompiledDAGRef`` (a list for a ``MultiOutputNode``) read once with ``nbcluster.get`` or
``ref.get``; a stage's exception reaches the ``get`` and the graph keeps working; at most
``_max_inflight_executions`` unread executions (``CgraphCapacityExceeded``); a get
timeout raises ``ChannelTimeoutError`` (a ``TimeoutError``); ``teardown`` ends the actors'
loops and frees the channels; a killed actor makes ``get`` fail with ``ActorDiedError``
instead of hanging. Channels are shared memory on one host; ``_channel="relay"`` forces
the cross-host path (actor calls) so it is tested here too.
"""

from __future__ import annotations

import asyncio
import copy
import glob
import os
import pickle
import sys
import threading
import time
from typing import Any

import cloudpickle
import numpy as np
import pytest

import nbcluster
from nbcluster.dag import InputNode, MultiOutputNode
from nbcluster.dag.compiled import (
    CgraphCapacityExceeded,
    ChannelError,
    ChannelTimeoutError,
    CompiledDAG,
    CompiledDAGRef,
)
from nbcluster.dag.compiled._loop import loop_status
from nbcluster.exceptions import ActorDiedError, TaskError
from nbcluster.testing import pid_alive, poll_for

pytestmark = pytest.mark.integration

cloudpickle.register_pickle_by_value(sys.modules[__name__])


@nbcluster.remote
class Stage:
    def __init__(self, add: int = 1) -> None:
        self.add = add
        self.calls = 0

    def inc(self, x: Any) -> Any:
        self.calls += 1
        return x + self.add

    def mul(self, x: Any, factor: int = 2) -> Any:
        return x * factor

    def pair(self, x: Any, y: Any) -> tuple[Any, Any]:
        return (x, y)

    def pid(self, x: Any) -> int:
        return os.getpid()

    def maybe_fail(self, x: int) -> int:
        if x < 0:
            raise ValueError(f"negative input {x}")
        return x

    def sleep(self, seconds: float) -> float:
        time.sleep(seconds)
        return seconds

    def lock(self, x: Any) -> Any:
        return threading.Lock()  # cannot be pickled

    def count(self) -> int:
        return self.calls


@nbcluster.remote
class AsyncStage:
    async def double(self, x: int) -> int:
        await asyncio.sleep(0)
        return 2 * x


@pytest.fixture(scope="module")
def actors(_module_cluster: object) -> list[Any]:
    handles = [Stage.remote(1), Stage.remote(10)]
    nbcluster.get([h.count.remote() for h in handles], timeout=60)
    return handles


def _channel_dirs(gid: str) -> list[str]:
    return glob.glob(f"/dev/shm/nbcg-{gid}-*") + glob.glob(f"/tmp/nbcg-{gid}-*")


@pytest.mark.parametrize("channel", ["auto", "relay"])
def test_chain_round_trips(shared_cluster: object, actors: list[Any], channel: str) -> None:
    a, b = actors
    with InputNode() as inp:
        dag = b.inc.bind(a.inc.bind(inp))
    compiled = dag.experimental_compile(_channel=channel)
    try:
        assert isinstance(compiled, CompiledDAG)
        expected = "shm" if channel == "auto" else "relay"
        assert set(compiled._kinds.values()) == {expected}
        ref = compiled.execute(1)
        assert isinstance(ref, CompiledDAGRef)
        assert nbcluster.get(ref) == 12
        assert [compiled.execute(i).get(timeout=30) for i in range(20)] == [
            i + 11 for i in range(20)
        ]
        refs = [compiled.execute(i) for i in range(5)]
        assert nbcluster.get(refs[::-1]) == [15, 14, 13, 12, 11]  # later first: earlier buffered
        assert nbcluster.get(a.inc.remote(0), timeout=30) == 1  # the actors still take calls
        # the uncompiled DAG still runs as tasks
        assert nbcluster.get(dag.execute(1), timeout=30) == 12
    finally:
        compiled.teardown()


def test_refs_are_read_once_and_never_copied(shared_cluster: object, actors: list[Any]) -> None:
    a, _ = actors
    with InputNode() as inp:
        dag = a.inc.bind(inp)
    compiled = dag.experimental_compile()
    try:
        ref = compiled.execute(1)
        assert ref.get() == 2
        with pytest.raises(ValueError, match="can only be called once"):
            nbcluster.get(ref)
        ref = compiled.execute(2)
        with pytest.raises(ValueError, match="cannot be pickled"):
            pickle.dumps(ref)
        with pytest.raises(ValueError, match="cannot be copied"):
            copy.copy(ref)
        del ref  # dropped unread: its result is discarded when it arrives
        for i in range(30):  # more than the in-flight limit: the dropped ones do not count
            assert compiled.execute(i).get() == i + 1
    finally:
        compiled.teardown()


def test_inputs_multiple_outputs_and_calls_on_one_actor(
    shared_cluster: object, actors: list[Any]
) -> None:
    a, b = actors
    with InputNode() as inp:
        x = a.inc.bind(inp.value)  # a: value + 1
        y = a.mul.bind(x, factor=inp.factor)  # same actor: passed in memory
        z = b.pair.bind(x, "const")
        dag = MultiOutputNode([y, z, x])
    compiled = dag.experimental_compile()
    try:
        assert nbcluster.get(compiled.execute(value=1, factor=3)) == [6, (2, "const"), 2]
        refs = compiled.execute(value=np.arange(3), factor=2)
        assert [r.get() for r in refs][1][1] == "const"
        with pytest.raises(TypeError, match="no keyword argument 'factor'"):
            compiled.execute(value=1)  # checked before anything is sent
        assert nbcluster.get(compiled.execute(value=0, factor=1)) == [1, (1, "const"), 1]
    finally:
        compiled.teardown()


def test_stage_errors_reach_get_and_the_graph_goes_on(
    shared_cluster: object, actors: list[Any]
) -> None:
    a, b = actors
    with InputNode() as inp:
        dag = b.inc.bind(a.maybe_fail.bind(inp))
    compiled = dag.experimental_compile()
    try:
        with pytest.raises(ValueError, match="negative input -1") as info:
            nbcluster.get(compiled.execute(-1))
        assert isinstance(info.value, TaskError)
        assert "maybe_fail" in str(info.value)  # the remote traceback names the stage
        assert nbcluster.get(compiled.execute(5)) == 15
        with InputNode() as inp:
            bad = b.lock.bind(inp)
        compiled2 = bad.experimental_compile()
        with pytest.raises(TaskError, match="pickle"):
            nbcluster.get(compiled2.execute(1))
        compiled2.teardown()
    finally:
        compiled.teardown()


def test_capacity_and_timeouts(shared_cluster: object, actors: list[Any]) -> None:
    a, _ = actors
    with InputNode() as inp:
        dag = a.sleep.bind(inp)
    compiled = dag.experimental_compile(_max_inflight_executions=2)
    try:
        first = compiled.execute(0.5)
        second = compiled.execute(0.0)
        with pytest.raises(CgraphCapacityExceeded, match="more than 2 in-flight executions"):
            compiled.execute(0.0)
        with pytest.raises(ChannelTimeoutError) as info:
            first.get(timeout=0.05)
        assert isinstance(info.value, TimeoutError)
        assert first.get(timeout=30) == 0.5  # the execution went on
        assert second.get(timeout=30) == 0.0
        assert compiled.execute(0.0).get(timeout=30) == 0.0
    finally:
        compiled.teardown()
    with pytest.raises(ValueError, match="positive integer"):
        dag.experimental_compile(_max_inflight_executions=0)


def test_large_values_and_other_kinds_of_actor(shared_cluster: object, actors: list[Any]) -> None:
    a, _ = actors
    threaded = Stage.options(max_concurrency=4).remote(100)
    asynchronous = AsyncStage.remote()
    with InputNode() as inp:
        dag = asynchronous.double.bind(threaded.inc.bind(a.inc.bind(inp)))
    compiled = dag.experimental_compile(_buffer_size_bytes=4096)
    try:
        assert nbcluster.get(compiled.execute(1)) == 204
        big = np.arange(300_000, dtype=np.int64)  # 2.4 MB: larger than a slot
        out = nbcluster.get(compiled.execute(big))
        np.testing.assert_array_equal(out, (big + 101) * 2)
        out[0] = -1  # results are the caller's own (writable) arrays
        for n in (600_000, 100, 300_000):  # the slots' big buffers grow, and are reused
            arr = np.ones(n, dtype=np.int64)
            np.testing.assert_array_equal(nbcluster.get(compiled.execute(arr)), (arr + 101) * 2)
        assert nbcluster.get(compiled.execute(0)) == 202
    finally:
        compiled.teardown()
        nbcluster.kill(threaded)
        nbcluster.kill(asynchronous)


def test_asyncio_execution(shared_cluster: object, actors: list[Any]) -> None:
    a, b = actors
    with InputNode() as inp:
        dag = b.inc.bind(a.inc.bind(inp))
    compiled = dag.experimental_compile(enable_asyncio=True)

    async def main() -> list[int]:
        futures = [await compiled.execute_async(i) for i in range(3)]
        return [await f for f in futures]

    try:
        assert asyncio.run(main()) == [11, 12, 13]
        with pytest.raises(ValueError, match="Use execute_async"):
            compiled.execute(1)
    finally:
        compiled.teardown()


def test_teardown_ends_the_loops_and_frees_the_channels(
    shared_cluster: object, actors: list[Any]
) -> None:
    a, b = actors
    with InputNode() as inp:
        dag = b.inc.bind(a.inc.bind(inp))
    compiled = dag.experimental_compile()
    gid = compiled.get_id()
    assert _channel_dirs(gid)
    compiled.execute(1)  # an unread result does not stop teardown
    compiled.teardown()
    assert not _channel_dirs(gid)

    def loops_ended() -> bool:
        statuses = nbcluster.get([h.__ray_call__.remote(loop_status, gid) for h in (a, b)])
        return not any(s["running"] for s in statuses)

    poll_for(loops_ended, timeout=10, message="the actors' loops did not end")
    with pytest.raises(ChannelError, match="torn down"):
        compiled.execute(1)
    compiled.teardown()  # twice is fine
    again = dag.experimental_compile()  # the actors can join a new graph
    assert nbcluster.get(again.execute(0)) == 11
    again.teardown()


@pytest.mark.parametrize("channel", ["auto", "relay"])
def test_a_killed_actor_fails_get_instead_of_hanging(shared_cluster: object, channel: str) -> None:
    a, b = Stage.remote(1), Stage.remote(1)
    with InputNode() as inp:
        dag = b.inc.bind(a.inc.bind(inp))
    compiled = dag.experimental_compile(_channel=channel)
    assert nbcluster.get(compiled.execute(0)) == 2
    pid = nbcluster.state.actor_info(b)["pid"]
    nbcluster.kill(b)  # asynchronous, as in Ray: wait until b's process is gone
    poll_for(lambda: not pid_alive(pid), timeout=30)
    start = time.monotonic()
    with pytest.raises(ActorDiedError):
        nbcluster.get(compiled.execute(1), timeout=30)
    assert time.monotonic() - start < 25  # found out, not timed out
    with pytest.raises((ChannelError, ActorDiedError)):
        nbcluster.get(compiled.execute(2), timeout=30)
    compiled.teardown()
    assert nbcluster.get(a.inc.remote(1), timeout=30) == 2  # the other actor is fine
    nbcluster.kill(a)
