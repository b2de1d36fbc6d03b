"""Ray Core objects and context on a live cluster (issue 20, item 4): ``ObjectRef`` ids
passed out of band, custom serializers across processes, and ``get_runtime_context()``
in a driver, a task, a sync, a threaded and an async actor."""

from __future__ import annotations

import asyncio
import threading
import time
import warnings
from pathlib import Path
from typing import Any

import pytest

import nbcluster
from nbcluster import ObjectRef
from nbcluster.exceptions import ObjectLostError, SerializationError, TaskCancelledError
from nbcluster.util import (
    PlacementGroupSchedulingStrategy,
    deregister_serializer,
    placement_group,
    register_serializer,
    remove_placement_group,
)


def test_object_ref_ids_round_trip_in_the_owner_and_with_owner_address(shared_cluster: Any):
    ref = nbcluster.put(41)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a process that holds the ref: no warning
        same = ObjectRef(ref.binary())
        from_hex = ObjectRef.from_hex(ref.hex())
    assert same == ref and from_hex == ref and from_hex.hex() == ref.hex()
    assert nbcluster.get([same, from_hex], timeout=30) == [41, 41]

    @nbcluster.remote
    def read(hex_id: str, owner: str) -> Any:
        return nbcluster.get(ObjectRef.from_hex(hex_id, owner_address=owner), timeout=30)

    @nbcluster.remote
    def read_unowned(hex_id: str) -> str:
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            orphan = ObjectRef.from_hex(hex_id)
        assert any("owner is unknown" in str(w.message) for w in seen)
        try:
            nbcluster.get(orphan, timeout=30)
        except ObjectLostError as err:
            return str(err)
        return "no error"

    # The id travels as text; the owner's address makes the rebuilt ref a real borrow.
    assert nbcluster.get(read.remote(ref.hex(), ref.owner_address), timeout=60) == 41
    assert "owner is unknown" in nbcluster.get(read_unowned.remote(ref.hex()), timeout=60)


def test_object_ref_type_hints_work_on_remote_functions(shared_cluster: Any):
    @nbcluster.remote
    def double(x: int) -> int:
        return 2 * x

    @nbcluster.remote
    def add(a: int, b: ObjectRef[int] | None = None) -> int:
        return a + (b or 0)

    refs: list[ObjectRef[int]] = [double.remote(i) for i in range(3)]
    assert nbcluster.get(add.remote(1, refs[2]), timeout=60) == 5


def test_a_registered_serializer_carries_unpicklable_values_through_the_cluster(
    shared_cluster: Any,
):
    # Defined here so that cloudpickle sends them by value (workers cannot import tests).
    class Locked:
        """Holds a lock, so it cannot be pickled without a custom serializer."""

        def __init__(self, value: int) -> None:
            self.value = value
            self.lock = threading.Lock()

    def _rebuild_locked(value: int) -> Locked:
        return Locked(value)

    @nbcluster.remote
    def value_of(obj: Locked) -> tuple[str, int]:
        return type(obj).__name__, obj.value

    with pytest.raises(SerializationError):
        nbcluster.put(Locked(1))
    register_serializer(Locked, serializer=lambda o: o.value, deserializer=_rebuild_locked)
    try:
        assert nbcluster.get(nbcluster.put(Locked(5)), timeout=30).value == 5
        assert nbcluster.get(value_of.remote(Locked(6)), timeout=60) == ("Locked", 6)
    finally:
        deregister_serializer(Locked)
    with pytest.raises(SerializationError):
        value_of.remote(Locked(7))


def test_runtime_context_in_the_driver(shared_cluster: Any):
    ctx = nbcluster.get_runtime_context()
    assert ctx.get_task_id() is None and ctx.task_id is None
    assert ctx.get_actor_id() is None and ctx.actor_id is None
    assert ctx.node_id == ctx.get_node_id() == shared_cluster.node_id
    assert ctx.node_id.hex() == ctx.get_node_id() and ctx.job_id.hex() == ctx.get_job_id()
    assert ctx.worker_id == ctx.get_worker_id()
    assert ctx.get_assigned_resources() == {}
    with pytest.raises(RuntimeError, match="inside a task"):
        ctx.is_canceled()


@nbcluster.remote
def _task_context() -> dict[str, Any]:
    ctx = nbcluster.get_runtime_context()
    return {
        "task_id": ctx.get_task_id(),
        "task_id_prop": ctx.task_id.hex() if ctx.task_id else None,
        "actor_id": ctx.get_actor_id(),
        "job_id": ctx.job_id,
        "node_id": ctx.node_id.hex(),
        "worker_id": ctx.worker_id,
        "resources": ctx.get_assigned_resources(),
        "accelerators": ctx.get_accelerator_ids(),
        "canceled": ctx.is_canceled(),
    }


def test_runtime_context_in_a_task(shared_cluster: Any):
    driver = nbcluster.get_runtime_context()
    ref = _task_context.remote()
    got = nbcluster.get(ref, timeout=60)
    assert got["task_id"] == got["task_id_prop"] == ref.task_id().hex()
    assert got["actor_id"] is None
    assert got["job_id"] == driver.get_job_id() and got["node_id"] == driver.get_node_id()
    assert got["worker_id"] != driver.get_worker_id()
    assert got["resources"] == {"CPU": 1.0}  # Ray's default for a task
    assert got["accelerators"] == {"GPU": []}
    assert got["canceled"] is False
    half = nbcluster.get(_task_context.options(num_cpus=0.5).remote(), timeout=60)
    assert half["resources"] == {"CPU": 0.5}


def test_is_canceled_turns_true_in_a_cancelled_task(shared_cluster: Any, tmp_path: Path):
    started, seen = tmp_path / "started", tmp_path / "seen"

    @nbcluster.remote
    def patient() -> None:
        ctx = nbcluster.get_runtime_context()
        started.write_text("yes")
        try:
            while True:
                time.sleep(0.05)
        except KeyboardInterrupt:
            seen.write_text(str(ctx.is_canceled()))
            raise

    ref = patient.remote()
    deadline = time.monotonic() + 60
    while not started.exists():
        assert time.monotonic() < deadline
        time.sleep(0.05)
    nbcluster.cancel(ref)
    with pytest.raises(TaskCancelledError):
        nbcluster.get(ref, timeout=60)
    assert seen.read_text() == "True"


N = 3


@nbcluster.remote(num_cpus=1, max_concurrency=N)
class _Threaded:
    def __init__(self) -> None:
        self.barrier = threading.Barrier(N, timeout=30)
        self.init_actor_id = nbcluster.get_runtime_context().get_actor_id()

    def context(self) -> dict[str, Any]:
        self.barrier.wait()  # the N calls run at once: each must see its own task id
        ctx = nbcluster.get_runtime_context()
        return {
            "task_id": ctx.get_task_id(),
            "actor_id": ctx.actor_id,
            "init_actor_id": self.init_actor_id,
            "resources": ctx.get_assigned_resources(),
            "canceled": ctx.is_canceled(),
        }


@nbcluster.remote
class _Async:
    def __init__(self) -> None:
        self.started = 0
        self.go: asyncio.Event | None = None

    async def context(self) -> dict[str, Any]:
        if self.go is None:
            self.go = asyncio.Event()
        self.started += 1
        if self.started == N:
            self.go.set()
        await asyncio.wait_for(self.go.wait(), 30)
        ctx = nbcluster.get_runtime_context()
        try:
            ctx.is_canceled()
            is_canceled = "no error"
        except RuntimeError as err:
            is_canceled = str(err)
        return {
            "task_id": ctx.get_task_id(),
            "actor_id": ctx.get_actor_id(),
            "resources": ctx.get_assigned_resources(),
            "is_canceled": is_canceled,
        }


def test_runtime_context_in_threaded_and_async_actor_calls(shared_cluster: Any):
    threaded = _Threaded.remote()
    refs = [threaded.context.remote() for _ in range(N)]
    for ref, got in zip(refs, nbcluster.get(refs, timeout=60), strict=True):
        assert got["task_id"] == ref.task_id().hex()
        assert got["actor_id"] == got["init_actor_id"] == threaded.actor_id
        assert got["resources"] == {"CPU": 1.0}  # what the actor asked for
        assert got["canceled"] is False
    nbcluster.kill(threaded)

    actor = _Async.remote()
    refs = [actor.context.remote() for _ in range(N)]
    for ref, got in zip(refs, nbcluster.get(refs, timeout=60), strict=True):
        assert got["task_id"] == ref.task_id().hex()
        assert got["actor_id"] == actor.actor_id
        assert "async actors" in got["is_canceled"]
    nbcluster.kill(actor)


def test_assigned_resources_in_a_placement_group_use_the_names_asked_for(shared_cluster: Any):
    pg = placement_group([{"CPU": 1}])
    nbcluster.get(pg.ready(), timeout=60)
    try:
        strategy = PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=0)
        got = nbcluster.get(
            _task_context.options(scheduling_strategy=strategy).remote(), timeout=60
        )
        assert got["resources"] == {"CPU": 1.0}
    finally:
        remove_placement_group(pg)
