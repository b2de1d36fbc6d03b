"""What a submission builds before the owner's state machine sees it (``core/calls.py``) and
what a spec learns from its lease (``core/thread_tasks.fill_spec``), without processes.

These records live as long as the task's refs: they hold no container they do not need
(each one more object for the garbage collector to walk, per task)."""

from __future__ import annotations

import gc

from nbcluster._runtime.core.calls import _ids, _queue_key, _return_ids
from nbcluster._runtime.core.records import KeyQueue, Lease
from nbcluster._runtime.core.thread_tasks import fill_spec
from nbcluster._runtime.options import TaskOptions
from nbcluster._runtime.protocol.protos import nbcluster_pb2 as pb

TASK = bytes(range(16))


def test_return_ids_number_each_return_from_one() -> None:
    assert _return_ids(TASK, 1) == (TASK + b"\x00\x00\x00\x01",)
    assert _return_ids(TASK, 3) == tuple(TASK + i.to_bytes(4, "big") for i in (1, 2, 3))


def test_no_returns_and_generators_still_get_one_id() -> None:
    # num_returns=0 has one (the task's end), a generator its end-of-stream marker
    for wire in (0, -1, -2):
        assert _return_ids(TASK, wire) == (TASK + b"\x00\x00\x00\x01",)


class _Ref:
    def __init__(self, oid: bytes) -> None:
        self.oid = oid

    def binary(self) -> bytes:
        return self.oid


def test_ids_of_no_refs_are_an_empty_tuple_the_collector_never_sees() -> None:
    for empty in (_ids([]), _ids(())):
        assert type(empty) is tuple and empty == () and not gc.is_tracked(empty)
    assert _ids([_Ref(b"a"), _Ref(b"b")]) == (b"a", b"b")


def test_ids_are_tuples_the_collector_stops_walking() -> None:
    ids = _ids([_Ref(b"a")]) + _return_ids(TASK, 2)
    gc.collect()
    assert not gc.is_tracked(ids)


def test_the_queue_key_is_built_once_per_options_strategy_and_environment() -> None:
    opts = TaskOptions(num_cpus=2)
    shape = opts.resource_shape()
    first = _queue_key(opts, shape, "DEFAULT", None, "")
    assert first == ((("CPU", 2.0),), "DEFAULT", False, "")
    assert _queue_key(opts, opts.resource_shape(), "DEFAULT", None, "") is first
    # another environment or strategy: its own key (and the cache follows the last one)
    env = '{"env_vars": {"A": "1"}}'
    other = _queue_key(opts, shape, "DEFAULT", None, env)
    assert other == ((("CPU", 2.0),), "DEFAULT", False, env)
    spread = _queue_key(opts, shape, "SPREAD", ("spread",), "")
    assert spread == ((("CPU", 2.0),), "SPREAD", False, "")
    assert _queue_key(opts, shape, "SPREAD", ("spread",), "") is spread


def test_a_placement_groups_shape_is_never_taken_from_the_cache() -> None:
    opts = TaskOptions()
    plain = _queue_key(opts, opts.resource_shape(), "DEFAULT", None, "")
    pg_shape = {"CPU_group_0_ab": 1.0, "bundle_group_ab": 0.001}
    route = ("pg", b"\xab", 0)
    key = _queue_key(opts, pg_shape, "PG:ab:0", route, "")
    assert key[0] == tuple(sorted(pg_shape.items()))
    # and the plain key is still the one for the plain shape
    assert _queue_key(opts, opts.resource_shape(), "DEFAULT", None, "") == plain
    assert _queue_key(TaskOptions(max_calls=1), {"CPU": 1.0}, "DEFAULT", None, "")[2] is True


def _lease(resources: dict[str, float], gpu_ids: list[int]) -> Lease:
    kq = KeyQueue(("k",), resources, "DEFAULT")
    grant = pb.LeaseReply(lease_id=b"L1", worker_id=b"w", gpu_ids=gpu_ids)
    return Lease(kq, grant, "127.0.0.1:7001")


def test_a_spec_takes_its_leases_id_gpus_and_the_resources_of_its_queue() -> None:
    spec = pb.TaskSpec(task_id=TASK, poll_after=True)
    fill_spec(spec, _lease({"CPU": 1.0, "GPU": 2.0}, [0, 1]))
    assert spec.lease_id == b"L1"
    assert not spec.poll_after
    assert list(spec.gpu_ids) == [0, 1]
    assert dict(spec.resources) == {"CPU": 1.0, "GPU": 2.0}


def test_a_retry_on_another_lease_replaces_the_gpus_and_keeps_the_resources() -> None:
    spec = pb.TaskSpec(task_id=TASK)
    fill_spec(spec, _lease({"CPU": 1.0, "GPU": 1.0}, [3]))
    fill_spec(spec, _lease({"CPU": 1.0, "GPU": 1.0}, [1]))
    assert list(spec.gpu_ids) == [1]
    fill_spec(spec, _lease({"CPU": 4.0}, []))
    assert list(spec.gpu_ids) == []
    assert dict(spec.resources) == {"CPU": 1.0, "GPU": 1.0}  # (set once: what it asked for)
