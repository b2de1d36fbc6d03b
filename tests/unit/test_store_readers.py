"""Readers of store files: locks held by live values, mappings kept across objects."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
from store_util import SIZE, MiB, free, inode, oid, put

from nbcluster._runtime.objects import readers, store
from nbcluster._runtime.serialization import deserialize, serialize

pytestmark = pytest.mark.skipif(not readers.LOCKS, reason="needs Linux OFD locks")


def state_of(path: str) -> str:
    fd = os.open(path, os.O_RDWR)
    try:
        return readers.readers_state(fd)
    finally:
        os.close(fd)


def test_a_reader_keeps_its_mapping_for_the_next_object_in_the_same_file(shm_dir) -> None:
    store.allocate_pool_files(shm_dir, [SIZE + MiB])
    rm = readers.reader_maps
    put(shm_dir, 1, 1.0)
    first = inode(shm_dir, 1)
    mapped, reused = rm.mapped, rm.reused
    assert deserialize(store.read_object(shm_dir, oid(1)))[0] == 1.0
    assert (rm.mapped, rm.reused) == (mapped + 1, reused)
    gc.collect()
    free(shm_dir, 1)  # the value is gone: pooled, though we keep the file mapped
    assert len(store.pool_file_sizes(shm_dir)) == 1
    put(shm_dir, 2, 2.0)  # the writer takes the same file back
    assert inode(shm_dir, 2) == first
    got = deserialize(store.read_object(shm_dir, oid(2)))
    np.testing.assert_array_equal(got, np.full(SIZE // 8, 2.0))  # the new contents
    assert (rm.mapped, rm.reused) == (mapped + 1, reused + 1)  # through the kept mapping


def test_any_value_made_from_a_read_holds_its_lock(shm_dir) -> None:
    put(shm_dir, 1, 1.0)
    view = store.read_object(shm_dir, oid(1))
    arr = deserialize(view)[1000:2000]  # a slice of an array built on a slice of the view
    del view
    gc.collect()
    path = store.object_path(shm_dir, oid(1))
    assert state_of(path) == "busy"
    free(shm_dir, 1)
    assert store.pool_file_sizes(shm_dir) == []  # waits: the slice still views it
    assert arr.sum() == 1000.0
    del arr
    gc.collect()
    assert store.promote_waiting(shm_dir) > 0


def test_two_reads_of_one_file_release_its_lock_after_both(shm_dir) -> None:
    put(shm_dir, 1, 1.0)
    path = store.object_path(shm_dir, oid(1))
    a = deserialize(store.read_object(shm_dir, oid(1)))
    b = deserialize(store.read_object(shm_dir, oid(1)))
    del a
    gc.collect()
    assert state_of(path) == "busy"
    del b
    gc.collect()
    assert state_of(path) == "free"


def test_a_read_racing_the_objects_free_reads_nothing(shm_dir, monkeypatch) -> None:
    # The reader opens the file by its name, then takes the lock; if the file was renamed
    # away (freed) in between, it may already be rewritten: the read must not use it.
    put(shm_dir, 1, 1.0)
    path = store.object_path(shm_dir, oid(1))
    real = readers._lock
    moved = os.path.join(shm_dir, "freed-meanwhile")

    def lock_after_free(fd: int, kind: int, wait: bool) -> bool:
        if os.path.exists(path):
            os.rename(path, moved)
        return real(fd, kind, wait)

    monkeypatch.setattr(readers, "_lock", lock_after_free)
    assert store.read_object(shm_dir, oid(1)) is None
    monkeypatch.setattr(readers, "_lock", real)
    assert state_of(moved) == "free"  # and it left no lock behind


def test_open_locked_holds_the_lock_until_closed(shm_dir) -> None:
    put(shm_dir, 1, 1.0)
    path = store.object_path(shm_dir, oid(1))
    fd = readers.open_locked(path)
    assert fd is not None
    assert state_of(path) == "busy"
    os.close(fd)
    assert state_of(path) == "free"
    assert readers.open_locked(os.path.join(shm_dir, "missing")) is None


def test_small_files_are_neither_locked_nor_kept(shm_dir) -> None:
    store.write_object(shm_dir, oid(1), serialize(np.ones(1000)))
    held = deserialize(store.read_object(shm_dir, oid(1)))
    assert len(readers.reader_maps) == 0
    assert held.sum() == 1000.0


def test_kept_mappings_are_bounded_and_expire(shm_dir) -> None:
    for n in (1, 2):
        put(shm_dir, n, float(n))
    rm = readers.ReaderMaps(max_files=1, linger_s=3600)
    a = deserialize(rm.read(store.object_path(shm_dir, oid(1))))
    b = deserialize(rm.read(store.object_path(shm_dir, oid(2))))
    assert len(rm) == 2  # both viewed: both kept whatever the limit
    del a, b
    gc.collect()
    assert len(rm) == 1  # one unviewed file at most
    rm.clear()

    rm = readers.ReaderMaps(linger_s=0.05)
    c = deserialize(rm.read(store.object_path(shm_dir, oid(1))))
    del c
    gc.collect()
    deadline = time.monotonic() + 30
    while len(rm) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(rm) == 0  # an idle process keeps no mapping


def test_a_forked_childs_inherited_values_hold_a_lock_of_their_own(shm_dir) -> None:
    # A data loader's forked workers read an argument their parent holds: when the parent
    # drops it first, the children's copies must still keep the file from being rewritten.
    for n in (1, 2):
        put(shm_dir, n, float(n))
    held = deserialize(store.read_object(shm_dir, oid(1)))
    other = deserialize(store.read_object(shm_dir, oid(2)))
    del other
    gc.collect()  # object 2's file stays mapped here, viewed by nothing
    path = store.object_path(shm_dir, oid(1))
    go_r, go_w = os.pipe()
    ready_r, ready_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        code = 1
        try:
            os.close(go_w)
            os.close(ready_r)
            code = 0 if len(readers.reader_maps) == 1 else 2  # only the viewed file
            os.write(ready_w, b"x")
            os.read(go_r, 1)  # the parent has dropped its value
            code = code or (0 if held[0] == 1.0 else 3)
            del held
            gc.collect()
            code = code or (0 if state_of(path) == "free" else 4)  # ours went with it
        finally:
            os._exit(code)
    os.close(go_r)
    os.close(ready_w)
    try:
        assert os.read(ready_r, 1) == b"x"
        del held
        gc.collect()
        assert state_of(path) == "busy"  # the child's value still views it
    finally:
        os.write(go_w, b"x")
        _, status = os.waitpid(pid, 0)
        os.close(go_w)
        os.close(ready_r)
    assert os.waitstatus_to_exitcode(status) == 0


def test_a_deleted_files_mapping_goes_at_the_next_new_mapping(shm_dir) -> None:
    # Its memory is freed only when the last mapping goes: a reader does not keep it.
    for n in (1, 2):
        put(shm_dir, n, float(n))
    rm = readers.ReaderMaps(linger_s=3600)
    a = deserialize(rm.read(store.object_path(shm_dir, oid(1))))
    del a
    gc.collect()
    assert len(rm) == 1
    os.unlink(store.object_path(shm_dir, oid(1)))  # freed and not pooled
    b = deserialize(rm.read(store.object_path(shm_dir, oid(2))))
    assert len(rm) == 1 and b[0] == 2.0  # only the file still viewed


def test_a_read_released_by_a_collection_inside_the_lock_does_not_deadlock(shm_dir) -> None:
    # A value in a reference cycle is freed by the garbage collector, which may run at
    # any allocation, including one made while the reader's lock is held.
    put(shm_dir, 1, 1.0)
    path = store.object_path(shm_dir, oid(1))
    rm = readers.ReaderMaps(linger_s=3600)

    class Holder:
        pass

    holder = Holder()
    holder.me = holder  # type: ignore[attr-defined]
    holder.value = deserialize(rm.read(path))  # type: ignore[attr-defined]
    del holder
    done = threading.Event()

    def collect_under_the_lock() -> None:
        with rm._lock:
            gc.collect()
        done.set()

    threading.Thread(target=collect_under_the_lock, daemon=True).start()
    assert done.wait(30)
    assert state_of(path) == "free"


def test_a_process_that_exits_holding_values_exits_quietly(shm_dir) -> None:
    """No release work at exit (the process's locks go with it), and nothing printed."""
    put(shm_dir, 1, 1.0)
    put(shm_dir, 2, 2.0)
    code = (
        "from nbcluster._runtime.objects import readers, store\n"
        "from nbcluster._runtime.serialization import deserialize\n"
        "rm = readers.reader_maps\n"
        "release = rm._release\n"
        "rm._release = lambda kept: (print('released', flush=True), release(kept))\n"
        f"held = deserialize(store.read_object({shm_dir!r}, {oid(1)!r}))\n"
        f"dropped = deserialize(store.read_object({shm_dir!r}, {oid(2)!r}))\n"
        "assert held[0] == 1.0 and dropped[0] == 2.0\n"
        "del dropped\n"  # released now: the only release this process makes
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=120)
    assert result.returncode == 0 and result.stderr == b"", result.stderr.decode()[-2000:]
    assert result.stdout.decode().split() == ["released"]
