"""Writers keep the mappings of the files they wrote (objects.kept_maps): reuse and safety."""

from __future__ import annotations

import gc
import mmap
import os
import time

import numpy as np
from store_util import SIZE, MiB, free, inode, oid, put, value

from nbcluster._runtime.objects import kept_maps as km
from nbcluster._runtime.objects import store
from nbcluster._runtime.serialization import deserialize, serialize


def test_fits_only_files_that_hold_the_object_and_are_not_far_bigger() -> None:
    assert km.fits(SIZE, SIZE, SIZE)
    assert km.fits(SIZE, SIZE, SIZE - 100)
    assert not km.fits(SIZE, SIZE, SIZE + 1)  # the file has no pages beyond its size
    assert not km.fits(SIZE - 1, SIZE, SIZE)  # nor the mapping
    assert not km.fits(8 * SIZE, 8 * SIZE, SIZE)  # far bigger: the pool should have it
    assert not km.fits(SIZE, SIZE, 0)


def test_a_freed_file_is_rewritten_through_the_writers_kept_mapping(shm_dir) -> None:
    store.allocate_pool_files(shm_dir, [SIZE + MiB])
    put(shm_dir, 1, 1.0)  # into the pool file, through a mapping that stays
    first = inode(shm_dir, 1)
    assert len(km.kept_maps) == 1
    free(shm_dir, 1)  # no value views it: pooled (our kept mapping views nothing)
    assert len(store.pool_file_sizes(shm_dir)) == 1
    reused = km.kept_maps.reused
    put(shm_dir, 2, 2.0)
    assert inode(shm_dir, 2) == first and km.kept_maps.reused == reused + 1
    np.testing.assert_array_equal(deserialize(store.read_object(shm_dir, oid(2))), value(2.0))
    assert not [n for n in os.listdir(shm_dir) if n.startswith(".tmp-")]


def test_a_file_someone_still_reads_is_never_rewritten(shm_dir) -> None:
    store.allocate_pool_files(shm_dir, [SIZE + MiB])
    put(shm_dir, 1, 1.0)
    first = inode(shm_dir, 1)
    view = deserialize(store.read_object(shm_dir, oid(1)))  # a reader's zero-copy view
    free(shm_dir, 1)
    for n in range(2, 6):  # writes of the same size, the freed object's view still alive
        put(shm_dir, n, float(n))
        assert inode(shm_dir, n) != first
        assert view[0] == 1.0 and view[-1] == 1.0  # never overwritten
    np.testing.assert_array_equal(view, value(1.0))
    names = os.listdir(os.path.join(shm_dir, store.FREE_DIR))
    assert any(name.startswith(".busy-") for name in names)  # waiting for the reader
    del view
    gc.collect()
    seen = set()
    for n in range(6, 9):  # with the reader gone, the file comes back into use
        free(shm_dir, n - 1)
        store.promote_waiting(shm_dir)  # (the node does this on each CreateObject)
        put(shm_dir, n, float(n))
        seen.add(inode(shm_dir, n))
    assert first in seen


def test_a_live_objects_file_is_never_claimed(shm_dir) -> None:
    store.allocate_pool_files(shm_dir, [SIZE + MiB, SIZE + MiB])
    put(shm_dir, 1, 1.0)
    put(shm_dir, 2, 2.0)  # object 1 is alive: its kept file must not be taken
    assert inode(shm_dir, 1) != inode(shm_dir, 2)
    np.testing.assert_array_equal(deserialize(store.read_object(shm_dir, oid(1))), value(1.0))


def test_a_kept_file_too_small_or_big_goes_back_to_the_pool(shm_dir) -> None:
    store.allocate_pool_files(shm_dir, [SIZE + MiB])
    put(shm_dir, 1, 1.0)
    first = inode(shm_dir, 1)
    free(shm_dir, 1)
    big = np.ones(2 * SIZE // 8)  # does not fit the kept file: released, then reused
    store.write_object(shm_dir, oid(2), serialize(big))
    assert inode(shm_dir, 2) == first and len(km.kept_maps) == 0
    np.testing.assert_array_equal(deserialize(store.read_object(shm_dir, oid(2))), big)


def test_a_trimmed_file_is_dropped_and_kept_maps_expire(shm_dir) -> None:
    store.allocate_pool_files(shm_dir, [SIZE + MiB])
    put(shm_dir, 1, 1.0)
    free(shm_dir, 1)
    assert store.trim_free_pool(shm_dir) > 0  # the node shrinks its pool: file deleted
    put(shm_dir, 2, 2.0)  # (a new file: nothing pooled)
    assert len(km.kept_maps) == 0  # the deleted file's mapping went with it

    maps = km.KeptMaps(linger_s=0.05)
    fd = os.open(os.path.join(shm_dir, "f"), os.O_RDWR | os.O_CREAT, 0o600)
    os.ftruncate(fd, MiB)
    st = os.fstat(fd)
    maps.keep(km.KeptMap(fd, mmap.mmap(fd, MiB), MiB, st.st_dev, st.st_ino))
    deadline = time.monotonic() + 30
    while len(maps) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(maps) == 0  # an idle process holds no kept mapping


def test_a_kept_file_freed_during_the_reservation_is_rewritten(shm_dir) -> None:
    # The free of the object just dropped reaches the node ahead of the next write's
    # reservation: once the reservation is answered, the writer's kept file is pooled and
    # the write goes into it, rather than mapping another file.
    store.allocate_pool_files(shm_dir, [SIZE + MiB, SIZE + MiB])
    put(shm_dir, 1, 1.0)
    first = inode(shm_dir, 1)
    assert km.kept_maps.fitting(SIZE) and not km.kept_maps.fitting(4 * SIZE)
    reused, calls = km.kept_maps.reused, []

    def reserve() -> None:
        calls.append(1)
        free(shm_dir, 1)

    store.write_object(shm_dir, oid(2), serialize(value(2.0)), reserve=reserve)
    assert calls == [1]
    assert inode(shm_dir, 2) == first and km.kept_maps.reused == reused + 1
    assert len(store.pool_file_sizes(shm_dir)) == 1  # the other pool file is still there
    np.testing.assert_array_equal(deserialize(store.read_object(shm_dir, oid(2))), value(2.0))


def test_a_kept_file_whose_object_lives_on_is_not_waited_for_twice(shm_dir) -> None:
    store.allocate_pool_files(shm_dir, [SIZE + MiB, SIZE + MiB])
    put(shm_dir, 1, 1.0)
    calls = []
    store.write_object(shm_dir, oid(2), serialize(value(2.0)), reserve=lambda: calls.append(1))
    assert calls == [1]  # asked once, before the write; the write took the other pool file
    assert inode(shm_dir, 2) != inode(shm_dir, 1)
    assert store.pool_file_sizes(shm_dir) == []
    np.testing.assert_array_equal(deserialize(store.read_object(shm_dir, oid(1))), value(1.0))
    np.testing.assert_array_equal(deserialize(store.read_object(shm_dir, oid(2))), value(2.0))
