"""``write_object``'s ``reserve`` callback: when the node's reservation is awaited.

A new file is written only after the reservation (writing allocates the memory the node
reserves for it); a pooled file, whose memory is allocated already, is written first so
the reservation's round trip overlaps the copy. Either way nothing is sealed before the
reservation, and a refused one leaves no file behind.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

from nbcluster._runtime.objects import store
from nbcluster._runtime.serialization import deserialize, serialize

MiB = 1 << 20


def _temp_files(store_dir: str) -> list[str]:
    return [n for n in os.listdir(store_dir) if n.startswith(".tmp-")]


def _observer(store_dir: str, object_id: bytes, seen: list[dict]):
    """A reserve callback that records the state of the store when it is called."""

    def reserve() -> None:
        tmps = _temp_files(store_dir)
        assert len(tmps) == 1
        with open(os.path.join(store_dir, tmps[0]), "rb") as f:
            head = f.read(4)
        seen.append(
            {
                "sealed": os.path.exists(store.object_path(store_dir, object_id)),
                "written": head == b"NBC1",
            }
        )

    return reserve


def test_a_new_file_is_written_only_after_the_reservation(shm_dir: str) -> None:
    value = serialize(np.arange(2 * MiB // 8, dtype=np.float64))
    seen: list[dict] = []
    store.write_object(shm_dir, b"\x01" * 20, value, reserve=_observer(shm_dir, b"\x01" * 20, seen))
    assert seen == [{"sealed": False, "written": False}]
    view = store.read_object(shm_dir, b"\x01" * 20)
    assert view is not None and float(deserialize(view)[-1]) == 2 * MiB // 8 - 1


def test_a_pooled_file_is_written_before_the_reservation_is_awaited(shm_dir: str) -> None:
    store.allocate_pool_files(shm_dir, [4 * MiB])
    value = serialize(np.ones(3 * MiB // 8))
    seen: list[dict] = []
    store.write_object(shm_dir, b"\x02" * 20, value, reserve=_observer(shm_dir, b"\x02" * 20, seen))
    assert seen == [{"sealed": False, "written": True}]  # the copy overlapped the round trip
    assert store.pool_file_sizes(shm_dir) == []  # it went into the pooled file
    view = store.read_object(shm_dir, b"\x02" * 20)
    assert view is not None and float(deserialize(view).sum()) == 3 * MiB // 8


def test_a_file_pooled_during_the_reservation_is_used(shm_dir: str) -> None:
    # The node recycles a just-freed object's file before it answers the reservation: the
    # write must use that file rather than allocate a new one.
    value = serialize(np.ones(3 * MiB // 8))
    calls = []

    def reserve() -> None:
        calls.append(1)
        store.allocate_pool_files(shm_dir, [4 * MiB])

    store.write_object(shm_dir, b"\x04" * 20, value, reserve=reserve)
    assert calls == [1]
    assert store.pool_file_sizes(shm_dir) == []  # the pooled file was taken
    assert os.stat(store.object_path(shm_dir, b"\x04" * 20)).st_size == value.total_size
    view = store.read_object(shm_dir, b"\x04" * 20)
    assert view is not None and float(deserialize(view).sum()) == 3 * MiB // 8


@pytest.mark.parametrize("pooled", [False, True])
def test_a_refused_reservation_leaves_nothing_behind(shm_dir: str, pooled: bool) -> None:
    if pooled:
        store.allocate_pool_files(shm_dir, [4 * MiB])

    def refuse() -> None:
        raise MemoryError("ObjectStoreFull")

    with pytest.raises(MemoryError):
        store.write_object(shm_dir, b"\x03" * 20, serialize(np.ones(3 * MiB // 8)), reserve=refuse)
    assert not os.path.exists(store.object_path(shm_dir, b"\x03" * 20))
    assert _temp_files(shm_dir) == []
