"""Objects end to end on real processes: put/get/wait, zero-copy reads, freeing, large counts.

Issue acceptance 4 and RELIABILITY row L02. Most tests share one 2-CPU cluster per module
(``shared_cluster``); the end-to-end file-backed store test starts its own cluster and is
kept last in this file, because starting a cluster in this process ends the shared one.

Store usage is read straight from the node manager (``GetStoreStats`` over a raw gRPC
channel with the session's token), not from heartbeats, so it is exact at the time of the
call; object presence is checked with the node's ``GetObjectInfo``.
"""

from __future__ import annotations

import contextlib
import gc
import mmap
import os
import shutil
import time
import warnings
from pathlib import Path

import grpc
import numpy as np
import pytest

import nbcluster
from nbcluster._runtime.objects import dirs as storedirs
from nbcluster._runtime.protocol.rpc import pb, pb_grpc
from nbcluster.config import Config
from nbcluster.exceptions import GetTimeoutError
from nbcluster.testing import assert_stays, poll_for, quiet_period

MiB = 2**20


# ------------------------------------------------------------------------------- helpers


class NodeRPC:
    """A raw, authenticated gRPC client of the (single) node manager of the current session."""

    def __init__(self) -> None:
        node = next(n for n in nbcluster.nodes() if n["Alive"])
        address = f"{node['NodeManagerAddress']}:{node['NodeManagerPort']}"
        session = nbcluster.get_runtime_context().session_dir
        token = (session / "token").read_text().strip()
        self._md = (("authorization", f"Bearer {token}"),)
        self._channel = grpc.insecure_channel(address, options=[("grpc.enable_http_proxy", 0)])
        self._stub = pb_grpc.NodeManagerStub(self._channel)

    def stats(self) -> pb.StoreStatsReply:
        return self._stub.GetStoreStats(pb.Empty(), metadata=self._md, timeout=10)

    def has(self, ref: nbcluster.ObjectRef) -> bool:
        """Whether the node's store holds the object (sealed, or spilled)."""
        return self.has_id(ref.binary())

    def has_id(self, object_id: bytes) -> bool:
        reply = self._stub.GetObjectInfo(
            pb.ObjectIds(object_ids=[object_id]), metadata=self._md, timeout=10
        )
        return reply.found

    def close(self) -> None:
        self._channel.close()


@pytest.fixture
def node(shared_cluster):
    rpc = NodeRPC()
    yield rpc
    rpc.close()


def store_dir_bytes(store_dir: str) -> int:
    """Bytes of every file under the store directory (sealed objects and the reuse pool)."""
    total = 0
    for root, _dirs, files in os.walk(store_dir):
        for name in files:
            with contextlib.suppress(FileNotFoundError):
                total += os.stat(os.path.join(root, name)).st_size
    return total


def local_store_dir() -> str:
    return nbcluster._api.context.require_client().store_dir


def settle(node: NodeRPC, timeout: float = 10.0) -> pb.StoreStatsReply:
    """Store stats once frees from earlier tests have landed (two equal reads in a row)."""
    last = node.stats()

    def stable() -> bool:
        nonlocal last
        time.sleep(0.05)
        now = node.stats()
        same = (now.used, now.num_objects) == (last.used, last.num_objects)
        last = now
        return same

    poll_for(stable, timeout, message="store usage kept changing")
    return last


def mmap_at_base(arr: np.ndarray) -> object:
    """Follow ``.base`` / ``memoryview.obj`` from a numpy array to the object owning the bytes."""
    obj: object = arr
    for _ in range(20):
        if isinstance(obj, np.ndarray) and obj.base is not None:
            obj = obj.base
        elif isinstance(obj, memoryview):
            obj = obj.obj
        else:
            break
    return obj


@nbcluster.remote
def identity(x):
    return x


@nbcluster.remote
def ones(n):
    return np.ones(n)


@nbcluster.remote
def wait_for_file(path, value=None, timeout=60.0):
    """Block until ``path`` exists (a gate the test opens), then return ``value``."""
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise TimeoutError(f"gate {path} was never opened")
        time.sleep(0.01)
    return value


@nbcluster.remote
def array_facts(arr):
    return arr.shape, float(arr[0]), float(arr[-1]), float(arr.sum()), arr.flags.writeable


@nbcluster.remote
def gated_sum(_gate, arr, small):
    return float(arr.sum()), small


# ------------------------------------------------------------------------------- put / get


def test_small_values_travel_inline(node):
    values = [42, "text", {"a": [1, 2.5, None]}, None, b"x" * 1000, (1, "two")]
    refs = [nbcluster.put(v) for v in values]
    assert [nbcluster.get(r) for r in refs] == values
    # Below the inline limit nothing goes into the node's store.
    assert [node.has(r) for r in refs] == [False] * len(values)


def test_large_values_go_to_the_store(node):
    arr = np.arange(10**6, dtype=np.int64)  # 8 MB
    blob = os.urandom(MiB)
    nested = {"weights": np.linspace(0, 1, 50_000), "name": "model"}
    refs = [nbcluster.put(arr), nbcluster.put(blob), nbcluster.put(nested)]
    assert all(node.has(r) for r in refs)
    got_arr, got_blob, got_nested = nbcluster.get(refs)
    np.testing.assert_array_equal(got_arr, arr)
    assert got_blob == blob
    assert got_nested["name"] == "model"
    np.testing.assert_array_equal(got_nested["weights"], nested["weights"])


def test_get_one_ref_gives_a_value_and_a_list_gives_a_list(shared_cluster):
    small = nbcluster.put(7)
    large = nbcluster.put(np.full(100_000, 3.0))
    task = identity.remote("from a task")
    assert nbcluster.get(small) == 7
    out = nbcluster.get([task, small, large])
    assert isinstance(out, list) and len(out) == 3
    assert out[0] == "from a task" and out[1] == 7
    assert out[2].shape == (100_000,) and float(out[2].sum()) == 300_000.0
    assert nbcluster.get((small, task)) == [7, "from a task"]
    assert nbcluster.get([]) == []
    with pytest.raises(TypeError, match="ObjectRef"):
        nbcluster.get(7)
    with pytest.raises(TypeError, match="item 1"):
        nbcluster.get([small, 7])


def test_get_timeout_raises_and_the_task_keeps_running(shared_cluster, tmp_path):
    gate = tmp_path / "gate"
    ref = wait_for_file.remote(str(gate), "done")
    for timeout in (0.2, 0):
        start = time.monotonic()
        with pytest.raises(GetTimeoutError) as info:
            nbcluster.get(ref, timeout=timeout)
        assert time.monotonic() - start < 10, "get(timeout=...) did not return"
        assert isinstance(info.value, TimeoutError)
        assert f"timed out after {timeout}s" in str(info.value)
        assert "1 of 1" in str(info.value)
    with pytest.raises(GetTimeoutError):
        nbcluster.get([nbcluster.put(1), ref], timeout=0.1)
    with pytest.raises(ValueError, match="timeout"):
        nbcluster.get(ref, timeout=-1)
    gate.touch()
    assert nbcluster.get(ref, timeout=30) == "done"


# ------------------------------------------------------------------------------- wait


def test_wait_returns_ready_and_not_ready_in_input_order(shared_cluster, tmp_path):
    gate = tmp_path / "gate"
    blocked1 = wait_for_file.remote(str(gate), "b1")
    p1 = nbcluster.put("p1")
    p2 = nbcluster.put(np.zeros(200_000))  # a store object
    blocked2 = wait_for_file.remote(str(gate), "b2")
    p3 = nbcluster.put("p3")
    refs = [blocked1, p1, p2, blocked2, p3]

    ready, not_ready = nbcluster.wait(refs, num_returns=2, timeout=10)
    assert ready == [p1, p2]
    assert not_ready == [blocked1, blocked2, p3]

    start = time.monotonic()
    ready, not_ready = nbcluster.wait(refs, num_returns=5, timeout=0.3)
    assert time.monotonic() - start < 10, "wait(timeout=...) did not return"
    assert ready == [p1, p2, p3]
    assert not_ready == [blocked1, blocked2]

    ready, not_ready = nbcluster.wait(refs, num_returns=3, fetch_local=False)
    assert ready == [p1, p2, p3] and not_ready == [blocked1, blocked2]
    ready, not_ready = nbcluster.wait(refs, timeout=0)  # num_returns defaults to 1
    assert ready == [p1] and not_ready == [blocked1, p2, blocked2, p3]

    gate.touch()
    ready, not_ready = nbcluster.wait(refs, num_returns=5, timeout=30, fetch_local=True)
    assert ready == refs and not_ready == []
    assert nbcluster.get([blocked1, blocked2]) == ["b1", "b2"]


def test_wait_argument_errors(shared_cluster):
    a, b = nbcluster.put(1), nbcluster.put(2)
    with pytest.raises(ValueError, match="same ObjectRef more than once"):
        nbcluster.wait([a, b, a])
    with pytest.raises(ValueError, match=r"num_returns \(3\) cannot exceed .* \(2\)"):
        nbcluster.wait([a, b], num_returns=3)
    with pytest.raises(TypeError, match="item 1 is a int"):
        nbcluster.wait([a, 5])
    with pytest.raises(TypeError, match="list of ObjectRefs"):
        nbcluster.wait(a)
    with pytest.raises(TypeError, match="num_returns"):
        nbcluster.wait([a], num_returns=1.5)
    with pytest.raises(ValueError, match="timeout"):
        nbcluster.wait([a], timeout=-0.5)
    # The refs are unharmed by the refused calls.
    assert nbcluster.wait([a, b], num_returns=2) == ([a, b], [])


# ------------------------------------------------------------------------------- zero copy


def test_numpy_from_the_store_is_read_only_and_zero_copy(shared_cluster):
    src = np.arange(2 * 10**6, dtype=np.float64)  # 16 MB
    ref = nbcluster.put(src)
    a = nbcluster.get(ref)
    b = nbcluster.get(ref)
    np.testing.assert_array_equal(a, src)
    assert a.flags.writeable is False
    assert np.shares_memory(a, b), "two gets of one ref must map the same shared memory"
    assert not np.shares_memory(a, src)
    assert isinstance(mmap_at_base(a), mmap.mmap), f"base chain ends in {type(mmap_at_base(a))}"
    with pytest.raises(ValueError, match="read-only"):
        a[0] = 1.0
    # A task's large return comes back the same way.
    c = nbcluster.get(ones.remote(10**6))
    assert c.flags.writeable is False and isinstance(mmap_at_base(c), mmap.mmap)
    # A store argument is read-only inside the task too.
    shape, first, last, total, writeable = nbcluster.get(array_facts.remote(ref))
    assert (shape, first, last, total) == (src.shape, 0.0, float(src[-1]), float(src.sum()))
    assert writeable is False


@nbcluster.remote
def where_is_my_argument(arr):
    """(pid, the file mapped at the array's address, its start address, writeable)."""
    address = arr.__array_interface__["data"][0]
    with open("/proc/self/maps") as f:
        for line in f:
            fields = line.split(maxsplit=5)
            start, end = (int(x, 16) for x in fields[0].split("-"))
            if start <= address < end:
                path = fields[5].strip() if len(fields) > 5 else ""
                return os.getpid(), path, start, arr.flags.writeable
    return os.getpid(), "", 0, arr.flags.writeable


def test_tasks_map_a_large_put_argument_without_copying_it(shared_cluster):
    src = np.ones(8 * MiB // 8)
    ref = nbcluster.put(src)
    oid_hex = ref.hex()
    results = nbcluster.get([where_is_my_argument.remote(ref) for _ in range(8)])
    for _pid, path, _start, writeable in results:
        # The array lives in the store's file itself: a shared mapping, no private copy.
        assert os.path.basename(path.split(" (deleted)")[0]) == oid_hex, path
        assert writeable is False
    assert len({pid for pid, *_ in results}) <= 2  # the cluster's two workers


def test_value_survives_after_the_task_that_made_it_finished(node):
    ref = ones.remote(10**6)
    first = nbcluster.get(ref)
    assert float(first.sum()) == 10**6
    del first
    # Other tasks run on the same workers meanwhile; the producing task is long gone.
    assert nbcluster.get([identity.remote(i) for i in range(20)]) == list(range(20))
    assert node.has(ref)
    again = nbcluster.get(ref)
    assert float(again.sum()) == 10**6
    assert nbcluster.get(array_facts.remote(ref))[3] == float(10**6)


@nbcluster.remote
def put_inside_task(n):
    return [nbcluster.put(np.full(n, 2.0))]


def test_value_put_by_a_finished_task_stays_readable(shared_cluster):
    (inner,) = nbcluster.get(put_inside_task.remote(500_000))
    assert nbcluster.get([identity.remote(i) for i in range(10)]) == list(range(10))
    assert float(nbcluster.get(inner).sum()) == 1_000_000.0
    assert nbcluster.get(array_facts.remote(inner))[3] == 1_000_000.0


def test_100_mb_array_round_trip(shared_cluster):
    src = np.arange(100 * MiB // 8, dtype=np.float64)
    ref = nbcluster.put(src)
    got = nbcluster.get(ref)
    assert got.nbytes == 100 * MiB
    assert np.array_equal(got, src)
    shape, first, last, total, _ = nbcluster.get(array_facts.remote(ref))
    assert shape == src.shape and first == 0.0 and last == float(src[-1])
    assert total == float(src.sum())


# ------------------------------------------------------------------------------- freeing


def test_put_and_drop_2000_objects_keeps_the_store_bounded(node):
    base = settle(node)
    store_dir = local_store_dir()
    peak_used = peak_disk = 0
    chunk = np.empty(MiB // 8, dtype=np.float64)
    for i in range(2000):
        chunk.fill(i)
        ref = nbcluster.put(chunk)
        del ref
        if i % 100 == 99:
            peak_used = max(peak_used, node.stats().used - base.used)
            peak_disk = max(peak_disk, store_dir_bytes(store_dir))
    assert peak_used < 200 * MiB, f"store usage grew to {peak_used / MiB:.0f} MiB"
    assert peak_disk < 200 * MiB, f"the store directory grew to {peak_disk / MiB:.0f} MiB"
    poll_for(
        lambda: node.stats().used <= base.used,
        10,
        message=f"store usage did not return to {base.used}: {node.stats()}",
    )
    assert node.stats().num_objects <= base.num_objects


def test_large_task_returns_are_freed_when_dropped(node):
    base = settle(node)
    refs = [ones.remote(512 * 1024) for _ in range(5)]  # 4 MiB each
    values = nbcluster.get(refs)
    assert all(float(v.sum()) == 512 * 1024 for v in values)
    assert all(node.has(r) for r in refs)
    assert node.stats().used >= base.used + 5 * 4 * MiB
    probes = [r.binary() for r in refs]
    del values, refs
    gc.collect()
    poll_for(
        lambda: node.stats().used <= base.used,
        10,
        message=f"task returns were not freed: {node.stats()}",
    )
    assert [node.has_id(oid) for oid in probes] == [False] * 5


def test_ref_passed_to_a_task_stays_alive_until_the_task_ran(node, tmp_path):
    gate = tmp_path / "gate"
    base = settle(node)
    big = nbcluster.put(np.full(MiB, 1.5))  # 8 MiB, in the store
    small = nbcluster.put({"k": "inline"})
    big_id = big.binary()
    out = gated_sum.remote(wait_for_file.remote(str(gate)), big, small)
    del big, small
    gc.collect()
    assert_stays(  # give a wrong free every chance to happen before the task runs
        lambda: node.has_id(big_id),
        quiet_period(0.3),
        "the argument was freed while a task that takes it was still pending",
    )
    gate.touch()
    assert nbcluster.get(out, timeout=30) == (1.5 * MiB, {"k": "inline"})
    # Once the task ran and no ref is left, the argument is freed.
    poll_for(
        lambda: node.stats().used <= base.used,
        10,
        message=f"the argument was not freed after the task: {node.stats()}",
    )


def test_put_of_an_object_ref_is_a_type_error(shared_cluster):
    ref = nbcluster.put(1)
    with pytest.raises(TypeError, match="put\\(\\) was given an ObjectRef"):
        nbcluster.put(ref)
    # Wrapping it is the documented way to store a ref to a ref.
    outer = nbcluster.put([ref])
    (inner,) = nbcluster.get(outer)
    assert inner == ref and nbcluster.get(inner) == 1


# ------------------------------------------------------------------------------- L02


@nbcluster.remote
def total_of(*values):
    return sum(float(np.sum(v)) for v in values), len(values)


@nbcluster.remote
def count_up(n):
    return list(range(n))


def test_task_with_10000_ref_arguments(shared_cluster):
    refs = [nbcluster.put(i) for i in range(9_950)]
    refs += [nbcluster.put(np.full(20_000, 1.0)) for _ in range(50)]  # in the store
    total, count = nbcluster.get(total_of.remote(*refs), timeout=120)
    assert count == 10_000
    assert total == sum(range(9_950)) + 50 * 20_000.0


def test_task_with_3000_returns(shared_cluster):
    refs = count_up.options(num_returns=3000).remote(3000)
    assert isinstance(refs, list) and len(refs) == 3000
    assert len(set(refs)) == 3000
    assert nbcluster.get(refs, timeout=120) == list(range(3000))
    assert nbcluster.get(refs[1234]) == 1234


def test_get_on_10000_refs(shared_cluster):
    refs = [nbcluster.put({"i": i}) for i in range(9_900)]
    refs += [nbcluster.put(np.full(20_000, float(i))) for i in range(100)]
    values = nbcluster.get(refs, timeout=120)
    assert len(values) == 10_000
    assert values[:9_900] == [{"i": i} for i in range(9_900)]
    arrays = values[9_900:]
    assert [float(a[0]) for a in arrays] == [float(i) for i in range(100)]
    assert all(a.flags.writeable is False and a.shape == (20_000,) for a in arrays)


# ------------------------------------------------------------------------------- file-backed store


def test_prepare_store_dir_falls_back_to_files_with_one_warning(tmp_path):
    base = tmp_path / "small-shm"
    base.mkdir()
    fallback = tmp_path / "fallback"
    free = shutil.disk_usage(base).free
    session = f"fallback-test-{os.getpid()}-{time.monotonic_ns()}"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        # Enough room: shared memory, no warning.
        path, file_backed = storedirs.prepare_store_dir(
            session + "-roomy", "aa01", MiB, base_dir=str(base), fallback_dir=str(fallback)
        )
        assert file_backed is False
        assert Path(path).parent.parent == base and Path(path).is_dir()
        assert caught == []
        # Capacity larger than the free space: ordinary files under the fallback dir.
        path, file_backed = storedirs.prepare_store_dir(
            session, "aa01", free + 2**30, base_dir=str(base), fallback_dir=str(fallback)
        )
        path2, file_backed2 = storedirs.prepare_store_dir(
            session, "aa02", free + 2**30, base_dir=str(base), fallback_dir=str(fallback)
        )
    assert file_backed is True and file_backed2 is True
    assert Path(path) == fallback / f"nbcluster-{session}" / "aa01"
    assert Path(path2) == fallback / f"nbcluster-{session}" / "aa02"
    assert Path(path).is_dir() and (Path(path).stat().st_mode & 0o777) == 0o700
    fallback_warnings = [
        w for w in caught if issubclass(w.category, storedirs.StoreFallbackWarning)
    ]
    assert len(fallback_warnings) == 1, [str(w.message) for w in caught]
    assert len(caught) == 1
    text = str(fallback_warnings[0].message)
    assert str(base) in text and "free" in text and str(fallback) in text
    assert "--shm-size" in text


def test_cluster_with_a_store_larger_than_shared_memory_is_file_backed(cluster):
    """Kept last in the module: starting this cluster ends the module's shared cluster."""
    shm_free = shutil.disk_usage(Config().store_base_dir).free
    capacity = shm_free + 2**30
    info = cluster(num_cpus=1, object_store_memory=capacity)
    session = Path(info.session_dir)
    rpc = NodeRPC()
    try:
        stats = rpc.stats()
        assert stats.file_backed is True
        assert stats.capacity == capacity
        assert nbcluster.nodes()[0]["ObjectStoreCapacity"] == capacity
        src = np.arange(10**6, dtype=np.float64)
        ref = nbcluster.put(src)
        assert rpc.has(ref)
        got = nbcluster.get(ref)
        np.testing.assert_array_equal(got, src)
        assert got.flags.writeable is False
        assert float(nbcluster.get(ones.remote(10**6)).sum()) == 10**6
        store_dir = Path(local_store_dir())
        assert store_dir.is_relative_to(session / "store"), store_dir
        assert (store_dir / ref.hex()).is_file()
        assert not Path(f"/dev/shm/nbcluster-{session.name}").exists()
    finally:
        rpc.close()
    logs = "".join(
        p.read_text(errors="replace") for p in (session / "logs").iterdir() if p.is_file()
    )
    assert logs.count("StoreFallbackWarning") == 1, logs[-2000:]
