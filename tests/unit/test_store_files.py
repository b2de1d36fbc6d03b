"""The file-per-object store: write, map, delete, recycle, spill, and its directories."""

from __future__ import annotations

import errno
import fcntl
import gc
import mmap
import os
import shutil
import subprocess
import sys
import textwrap
import warnings

import numpy as np
import pytest

from nbcluster._runtime.objects import dirs, filling, store
from nbcluster._runtime.serialization import ALIGNMENT, deserialize, serialize

MiB = 1 << 20


def oid(n: int) -> bytes:
    return n.to_bytes(20, "big")


def listing(path: str) -> list[str]:
    return sorted(os.listdir(path))


def test_object_path_is_the_hex_id() -> None:
    assert store.object_path("/x/y", bytes([0, 255, 16])) == "/x/y/00ff10"


def test_write_then_read_gives_read_only_zero_copy_arrays(shm_dir: str) -> None:
    arr = np.arange(2_000_000, dtype=np.float64).reshape(1000, 2000)
    sv = serialize({"arr": arr, "name": "x"})
    assert store.write_object(shm_dir, oid(1), sv) == sv.total_size
    assert listing(shm_dir) == [oid(1).hex()]  # no temporary file left behind
    assert os.stat(store.object_path(shm_dir, oid(1))).st_mode & 0o777 == 0o600

    view = store.read_object(shm_dir, oid(1))
    assert view is not None and view.readonly and view.nbytes == sv.total_size
    out = deserialize(view)
    got = out["arr"]
    np.testing.assert_array_equal(got, arr)
    assert out["name"] == "x"
    assert got.flags.writeable is False
    assert np.shares_memory(got, np.frombuffer(view, dtype=np.uint8))
    assert got.ctypes.data % ALIGNMENT == 0
    base = got  # a view of the store file's mapping, through the read's exporter
    while isinstance(base, (np.ndarray, memoryview)):
        base = base.base if isinstance(base, np.ndarray) else base.obj
    assert isinstance(base, mmap.mmap)


def test_read_missing_object_is_none(shm_dir: str) -> None:
    assert store.read_object(shm_dir, oid(404)) is None


def test_mapping_outlives_delete(shm_dir: str) -> None:
    arr = np.random.default_rng(0).random(500_000)
    store.write_object(shm_dir, oid(1), serialize(arr))
    got = deserialize(store.read_object(shm_dir, oid(1)))
    assert store.delete_object(shm_dir, oid(1)) > arr.nbytes
    assert listing(shm_dir) == []
    np.testing.assert_array_equal(got, arr)  # the pages live on while mapped
    assert store.delete_object(shm_dir, oid(1)) == 0


def test_second_write_of_a_sealed_id_is_refused(shm_dir: str) -> None:
    store.write_object(shm_dir, oid(1), serialize(np.ones(100_000)))
    with pytest.raises(FileExistsError):
        store.write_object(shm_dir, oid(1), serialize(np.zeros(100_000)))
    assert listing(shm_dir) == [oid(1).hex()]
    assert deserialize(store.read_object(shm_dir, oid(1)))[0] == 1.0


def test_many_buffers_and_short_writes(shm_dir: str, monkeypatch) -> None:
    arrays = [np.full(200, i, dtype=np.int64) for i in range(3000)]  # > IOV_MAX pieces
    sv = serialize(arrays)
    assert len(sv.buffers) == 3000
    real_pwritev = os.pwritev
    calls = []

    def short_pwritev(fd, buffers, offset):  # the kernel may write less than asked
        calls.append(len(buffers))
        budget = 5000
        pieces = []
        for b in buffers:
            b = memoryview(b)[:budget]
            pieces.append(b)
            budget -= b.nbytes
            if budget <= 0:
                break
        return real_pwritev(fd, pieces, offset)

    monkeypatch.setattr(os, "pwritev", short_pwritev)
    store.write_object(shm_dir, oid(1), sv)
    assert max(calls) <= 1024 and len(calls) > 100
    out = deserialize(store.read_object(shm_dir, oid(1)))
    assert all((a == i).all() for i, a in enumerate(out))


def test_failed_write_leaves_nothing(shm_dir: str, monkeypatch) -> None:
    def no_space(fd, buffers, offset):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "pwritev", no_space)
    with pytest.raises(OSError) as info:
        store.write_object(shm_dir, oid(1), serialize(np.ones(10_000)))
    assert info.value.errno == errno.ENOSPC
    assert listing(shm_dir) == []


def test_disk_full_empties_the_pool_and_retries(shm_dir: str, monkeypatch) -> None:
    store.write_object(shm_dir, oid(1), serialize(np.ones(MiB)))
    store.delete_object(shm_dir, oid(1), recycle_limit=100 * MiB)
    assert store.free_pool_bytes(shm_dir) > 0
    real_pwritev = os.pwritev
    failures = [OSError(errno.ENOSPC, "No space left on device")]

    def full_once(fd, buffers, offset):
        if failures:
            raise failures.pop()
        return real_pwritev(fd, buffers, offset)

    monkeypatch.setattr(os, "pwritev", full_once)
    store.write_object(shm_dir, oid(2), serialize(np.ones(10_000)))  # too small to reuse
    assert store.free_pool_bytes(shm_dir) == 0
    assert deserialize(store.read_object(shm_dir, oid(2))).sum() == 10_000


# -- recycling ----------------------------------------------------------------------------------


def pool(shm_dir: str) -> list[str]:
    return sorted(os.listdir(os.path.join(shm_dir, store.FREE_DIR)))


def test_freed_files_are_reused(shm_dir: str) -> None:
    a = np.ones(4 * MiB // 8)
    store.write_object(shm_dir, oid(1), serialize(a))
    inode = os.stat(store.object_path(shm_dir, oid(1))).st_ino
    size = store.delete_object(shm_dir, oid(1), recycle_limit=64 * MiB)
    assert listing(shm_dir) == [store.FREE_DIR]
    assert pool(shm_dir) == [f"{size}-{os.getpid()}-" + pool(shm_dir)[0].split("-", 2)[2]]
    assert store.free_pool_bytes(shm_dir) == size

    b = np.arange(3 * MiB // 8, dtype=np.float64)  # smaller: the file is truncated to fit
    sv = serialize(b)
    store.write_object(shm_dir, oid(2), sv)
    st = os.stat(store.object_path(shm_dir, oid(2)))
    assert st.st_ino == inode and st.st_size == sv.total_size
    assert pool(shm_dir) == []
    np.testing.assert_array_equal(deserialize(store.read_object(shm_dir, oid(2))), b)

    c = np.arange(5 * MiB // 8, dtype=np.float64)  # larger: the file grows
    store.delete_object(shm_dir, oid(2), recycle_limit=64 * MiB)
    store.write_object(shm_dir, oid(3), serialize(c))
    assert os.stat(store.object_path(shm_dir, oid(3))).st_ino == inode
    np.testing.assert_array_equal(deserialize(store.read_object(shm_dir, oid(3))), c)


@pytest.mark.parametrize("threads", [1, 2])
def test_a_recycled_file_is_written_through_a_mapping(shm_dir: str, monkeypatch, threads) -> None:
    monkeypatch.setattr(filling, "copy_threads", threads)
    monkeypatch.setattr(filling, "_PARALLEL_COPY_MIN", 1 * MiB)  # split even this small value
    store.allocate_pool_files(shm_dir, [8 * MiB])
    calls = []
    real = store.write_mapped
    monkeypatch.setattr(store, "write_mapped", lambda *a: calls.append(a[1]) or real(*a))
    # Odd sizes and several buffers: the split and the gaps between buffers must be exact.
    value = {
        "a": np.arange(3 * MiB // 8 + 3, dtype=np.float64),
        "b": np.frombuffer(os.urandom(MiB + 17), dtype=np.uint8),
        "tail": b"x" * 1000,
    }
    sv = serialize(value)
    store.write_object(shm_dir, oid(1), sv)
    assert calls == [sv.total_size]
    out = deserialize(store.read_object(shm_dir, oid(1)))
    np.testing.assert_array_equal(out["a"], value["a"])
    np.testing.assert_array_equal(out["b"], value["b"])
    assert out["tail"] == value["tail"]
    with open(store.object_path(shm_dir, oid(1)), "rb") as f:
        assert f.read() == sv.to_bytes()


def test_a_smaller_pool_file_is_written_without_a_mapping(shm_dir: str, monkeypatch) -> None:
    # Its extra pages are not allocated: a mapping could SIGBUS on a full disk.
    store.allocate_pool_files(shm_dir, [2 * MiB])
    monkeypatch.setattr(store, "write_mapped", lambda *a: pytest.fail("mapped"))
    arr = np.arange(4 * MiB // 8, dtype=np.float64)
    store.write_object(shm_dir, oid(1), serialize(arr))
    assert pool(shm_dir) == []  # the pool file was used all the same
    np.testing.assert_array_equal(deserialize(store.read_object(shm_dir, oid(1))), arr)


def test_allocate_pool_files(shm_dir: str, monkeypatch) -> None:
    assert store.allocate_pool_files(shm_dir, [2 * MiB, 3 * MiB]) == 5 * MiB
    assert sorted(store.pool_file_sizes(shm_dir)) == [2 * MiB, 3 * MiB]
    for name in pool(shm_dir):
        st = os.stat(os.path.join(shm_dir, store.FREE_DIR, name))
        assert st.st_blocks * 512 >= st.st_size  # the pages are allocated
    assert store.spare_bytes(shm_dir) > 0

    def full(fd, offset, length):
        raise OSError(errno.ENOSPC, "full")

    monkeypatch.setattr(os, "posix_fallocate", full)
    assert store.allocate_pool_files(shm_dir, [MiB]) == 0
    assert sorted(store.pool_file_sizes(shm_dir)) == [2 * MiB, 3 * MiB]  # nothing half-made
    assert len(pool(shm_dir)) == 2


def test_a_mapped_file_waits_until_its_readers_are_gone(shm_dir: str) -> None:
    a = np.ones(2 * MiB // 8)
    store.write_object(shm_dir, oid(1), serialize(a))
    held = deserialize(store.read_object(shm_dir, oid(1)))  # fd closed, mapping alive
    size = store.delete_object(shm_dir, oid(1), recycle_limit=64 * MiB)
    assert size > 0
    assert listing(shm_dir) == [store.FREE_DIR]  # nobody can open it by its name
    assert [n.split("-")[:2] for n in pool(shm_dir)] == [[".busy", str(size)]]  # hidden
    assert store.pool_file_sizes(shm_dir) == []
    assert store.free_pool_bytes(shm_dir) == size  # counts against the pool's limit
    assert store.promote_waiting(shm_dir) == 0  # still mapped
    store.write_object(shm_dir, oid(2), serialize(np.zeros(2 * MiB // 8)))  # a new file
    assert held.sum() == a.sum()  # the reader's view did not change
    del held
    gc.collect()
    assert store.promote_waiting(shm_dir) == size
    assert store.pool_file_sizes(shm_dir) == [size]
    store.write_object(shm_dir, oid(3), serialize(np.full(2 * MiB // 8, 3.0)))
    assert pool(shm_dir) == []  # reused
    assert deserialize(store.read_object(shm_dir, oid(3)))[0] == 3.0


def test_promoting_a_file_a_writer_claimed_meanwhile_is_skipped(
    shm_dir: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker that kept a mapping renames its freed ``.busy-`` file to reuse it
    (objects/kept_maps.py) while the node promotes waiting files: the node's rename then
    finds nothing, and must skip it (it raised FileNotFoundError, failing CreateObject)."""
    store.write_object(shm_dir, oid(1), serialize(np.ones(2 * MiB // 8)))
    held = store.read_object(shm_dir, oid(1))
    store.delete_object(shm_dir, oid(1), recycle_limit=64 * MiB)  # waits as .busy-
    (busy,) = pool(shm_dir)
    del held
    gc.collect()
    real = store.readers_state

    def claimed_meanwhile(fd: int) -> str:
        state = real(fd)
        free_dir = os.path.join(shm_dir, store.FREE_DIR)
        os.rename(os.path.join(free_dir, busy), os.path.join(shm_dir, "claimed-by-a-writer"))
        return state

    monkeypatch.setattr(store, "readers_state", claimed_meanwhile)
    assert store.promote_waiting(shm_dir) == 0
    assert pool(shm_dir) == []


def test_waiting_files_are_trimmed_first(shm_dir: str) -> None:
    for n in (1, 2):
        store.write_object(shm_dir, oid(n), serialize(np.ones(2 * MiB // 8)))
    held = store.read_object(shm_dir, oid(1))
    store.delete_object(shm_dir, oid(1), recycle_limit=64 * MiB)  # waits
    size = store.delete_object(shm_dir, oid(2), recycle_limit=64 * MiB)  # pooled
    assert store.trim_free_pool(shm_dir, keep_bytes=size) == size
    assert store.pool_file_sizes(shm_dir) == [size]  # the usable one stays
    assert held.nbytes == size


def test_without_locks_a_freed_file_is_unlinked(shm_dir: str, monkeypatch) -> None:
    real = fcntl.fcntl

    def no_locks(fd, cmd, arg=0):
        if cmd in (fcntl.F_OFD_SETLK, fcntl.F_OFD_SETLKW):
            raise OSError(errno.EINVAL, "no OFD locks here")
        return real(fd, cmd, arg)

    monkeypatch.setattr(fcntl, "fcntl", no_locks)
    store.write_object(shm_dir, oid(1), serialize(np.ones(2 * MiB // 8)))
    assert store.delete_object(shm_dir, oid(1), recycle_limit=64 * MiB) > 0
    assert pool(shm_dir) == []


def _child(code: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )


def test_a_file_another_process_views_is_never_recycled(shm_dir: str) -> None:
    store.write_object(shm_dir, oid(1), serialize(np.ones(2 * MiB // 8)))
    child = _child(
        f"""
        import sys
        from nbcluster._runtime.objects import store
        from nbcluster._runtime.serialization import deserialize
        held = deserialize(store.read_object({shm_dir!r}, {oid(1)!r}))
        print("viewing", flush=True)
        sys.stdin.readline()
        del held
        print("dropped", flush=True)
        sys.stdin.readline()
        """
    )
    try:
        assert child.stdout.readline().strip() == "viewing"
        size = store.delete_object(shm_dir, oid(1), recycle_limit=64 * MiB)
        assert store.pool_file_sizes(shm_dir) == []  # it waits, hidden
        assert store.promote_waiting(shm_dir) == 0
        child.stdin.write("drop\n")
        child.stdin.flush()
        assert child.stdout.readline().strip() == "dropped"
        # the child still has the file mapped (for its next read), but views nothing
        assert store.promote_waiting(shm_dir) == size
        assert store.pool_file_sizes(shm_dir) == [size]
    finally:
        child.stdin.close()
        child.wait(timeout=30)


def test_pool_limits(shm_dir: str) -> None:
    store.write_object(shm_dir, oid(1), serialize(np.ones(1000)))  # under RECYCLE_MIN_SIZE
    store.delete_object(shm_dir, oid(1), recycle_limit=64 * MiB)
    assert store.free_pool_bytes(shm_dir) == 0
    for n in range(2, 6):
        store.write_object(shm_dir, oid(n), serialize(np.ones(2 * MiB // 8)))
    for n in range(2, 6):
        store.delete_object(shm_dir, oid(n), recycle_limit=5 * MiB)
    assert store.free_pool_bytes(shm_dir) <= 5 * MiB
    assert len(pool(shm_dir)) == 2
    assert listing(shm_dir) == [store.FREE_DIR]


def test_best_fit_and_trim(shm_dir: str) -> None:
    sizes = {}
    for n, mib in ((1, 2), (2, 8), (3, 4)):
        sv = serialize(np.ones(mib * MiB // 8))
        store.write_object(shm_dir, oid(n), sv)
        sizes[mib] = sv.total_size
    for n in (1, 2, 3):
        store.delete_object(shm_dir, oid(n), recycle_limit=64 * MiB)
    store.write_object(shm_dir, oid(9), serialize(np.ones(3 * MiB // 8)))  # takes the 4 MiB one
    left = sorted(int(name.split("-")[0]) for name in pool(shm_dir))
    assert left == [sizes[2], sizes[8]]
    assert store.trim_free_pool(shm_dir, keep_bytes=sizes[2]) == sizes[8]
    assert store.trim_free_pool(shm_dir) == sizes[2]
    assert pool(shm_dir) == [] and store.trim_free_pool(shm_dir) == 0


def test_pool_is_optional(tmp_path) -> None:
    assert store.free_pool_bytes(str(tmp_path)) == 0
    assert store.trim_free_pool(str(tmp_path)) == 0


# -- spilling ------------------------------------------------------------------------------------


@pytest.mark.parametrize("spill_on", ["other filesystem", "same filesystem"])
def test_spill_and_restore(shm_dir: str, tmp_path, spill_on: str) -> None:
    spill_dir = str(tmp_path) if spill_on == "other filesystem" else os.path.join(shm_dir, "spill")
    os.makedirs(spill_dir, exist_ok=True)
    arr = np.random.default_rng(1).random(300_000)
    size = store.write_object(shm_dir, oid(1), serialize(arr))
    held = deserialize(store.read_object(shm_dir, oid(1)))

    assert store.spill_object(shm_dir, spill_dir, oid(1)) == size
    assert store.read_object(shm_dir, oid(1)) is None
    assert listing(spill_dir) == [oid(1).hex()]
    np.testing.assert_array_equal(held, arr)  # existing mapping still valid

    assert store.restore_object(spill_dir, shm_dir, oid(1)) == size
    assert listing(spill_dir) == []
    np.testing.assert_array_equal(deserialize(store.read_object(shm_dir, oid(1))), arr)
    assert [n for n in listing(shm_dir) if n.startswith(".tmp")] == []


def test_spill_and_restore_errors(shm_dir: str, tmp_path) -> None:
    with pytest.raises(FileNotFoundError):
        store.spill_object(shm_dir, str(tmp_path), oid(1))
    with pytest.raises(FileNotFoundError):
        store.restore_object(str(tmp_path), shm_dir, oid(1))
    # already back in the store: restoring only removes the spill copy
    size = store.write_object(shm_dir, oid(2), serialize(np.ones(50_000)))
    shutil.copy(store.object_path(shm_dir, oid(2)), store.object_path(str(tmp_path), oid(2)))
    assert store.restore_object(str(tmp_path), shm_dir, oid(2)) == size
    assert listing(str(tmp_path)) == []


def test_restore_reuses_a_pooled_file(shm_dir: str, tmp_path) -> None:
    big = serialize(np.ones(3 * MiB // 8))
    store.write_object(shm_dir, oid(1), big)
    store.spill_object(shm_dir, str(tmp_path), oid(1))
    store.write_object(shm_dir, oid(2), big)
    inode = os.stat(store.object_path(shm_dir, oid(2))).st_ino
    store.delete_object(shm_dir, oid(2), recycle_limit=64 * MiB)
    store.restore_object(str(tmp_path), shm_dir, oid(1))
    assert os.stat(store.object_path(shm_dir, oid(1))).st_ino == inode
    assert deserialize(store.read_object(shm_dir, oid(1))).sum() == 3 * MiB // 8


# -- directories and capacity -------------------------------------------------------------------


def test_prepare_store_dir_in_shared_memory(tmp_path) -> None:
    base = tmp_path / "shm"
    base.mkdir()
    path, file_backed = dirs.prepare_store_dir("s1", "ab01", 1 * MiB, base_dir=str(base))
    assert path == str(base / "nbcluster-s1" / "ab01") and file_backed is False
    assert os.stat(path).st_mode & 0o777 == 0o700
    assert dirs.prepare_store_dir("s1", "ab01", 1 * MiB, base_dir=str(base)) == (path, False)
    dirs.remove_store_dir(path)
    assert not os.path.exists(base / "nbcluster-s1")


def test_small_shared_memory_falls_back_with_one_warning(tmp_path) -> None:
    base, fallback = tmp_path / "shm", tmp_path / "disk"
    base.mkdir()
    huge = 1 << 60
    with pytest.warns(dirs.StoreFallbackWarning) as record:
        path, file_backed = dirs.prepare_store_dir(
            "s2", "ab01", huge, base_dir=str(base), fallback_dir=str(fallback)
        )
    assert file_backed is True and path == str(fallback / "nbcluster-s2" / "ab01")
    assert os.path.isdir(path)
    message = str(record[0].message)
    assert message.startswith(f"{base} has only ")
    assert "less than the 1073741824.0 GiB the object store needs" in message
    assert "--shm-size" in message and "object_store_memory" in message
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a second node of the same session: no new warning
        dirs.prepare_store_dir("s2", "ab02", huge, base_dir=str(base), fallback_dir=str(fallback))


def test_missing_base_dir_falls_back(tmp_path) -> None:
    with pytest.warns(dirs.StoreFallbackWarning, match="does not exist"):
        path, file_backed = dirs.prepare_store_dir(
            "s3", "ab01", MiB, base_dir=str(tmp_path / "nope"), fallback_dir=str(tmp_path)
        )
    assert file_backed and path.startswith(str(tmp_path))


@pytest.mark.parametrize("session, node", [("../etc", "ab"), ("s", "a/b"), ("", "ab"), ("s", "..")])
def test_unsafe_names_are_rejected(tmp_path, session: str, node: str) -> None:
    with pytest.raises(ValueError, match="must be letters"):
        dirs.prepare_store_dir(session, node, MiB, base_dir=str(tmp_path))


def test_a_planted_symlink_is_refused(tmp_path) -> None:
    target = tmp_path / "elsewhere"
    target.mkdir()
    (tmp_path / "nbcluster-s4").symlink_to(target)
    with pytest.raises(PermissionError, match="not a directory owned by this user"):
        dirs.prepare_store_dir("s4", "ab01", MiB, base_dir=str(tmp_path))


def test_default_store_capacity(monkeypatch, tmp_path) -> None:
    GiB = 1 << 30
    monkeypatch.setattr(dirs, "_usable_memory", lambda: 10 * GiB)
    monkeypatch.setattr(dirs, "free_bytes", lambda path: 20 * GiB)
    assert dirs.default_store_capacity() == 3 * GiB  # 30% of memory
    monkeypatch.setattr(dirs, "free_bytes", lambda path: 2 * GiB)
    assert dirs.default_store_capacity() == int(2 * GiB * 0.9)  # fits in /dev/shm
    monkeypatch.setattr(dirs, "free_bytes", lambda path: 64 * 1000 * 1000)  # Docker's 64 MB
    assert dirs.default_store_capacity() == 3 * GiB  # too small to use: file-backed, full size
    monkeypatch.setattr(dirs, "free_bytes", lambda path: None)
    assert dirs.default_store_capacity() == 3 * GiB
    monkeypatch.setattr(dirs, "_usable_memory", lambda: 100 * MiB)
    assert dirs.default_store_capacity() == dirs.MIN_CAPACITY


def test_usable_memory_respects_the_cgroup_limit(monkeypatch) -> None:
    monkeypatch.setattr(dirs, "_cgroup_memory_limit", lambda: 512 * MiB)
    assert dirs._usable_memory() == 512 * MiB
    monkeypatch.setattr(dirs, "_cgroup_memory_limit", lambda: None)
    assert dirs._usable_memory() == os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def test_cgroup_limit_is_read_from_v2_then_v1(tmp_path) -> None:
    proc = tmp_path / "cgroup"
    root = tmp_path / "sys"
    (root / "user.slice" / "me").mkdir(parents=True)
    (root / "memory").mkdir()
    proc.write_text("0::/user.slice/me\n")
    assert dirs._cgroup_memory_limit(str(proc), str(root)) is None  # no files at all
    (root / "memory" / "memory.limit_in_bytes").write_text("9223372036854771712\n")
    assert dirs._cgroup_memory_limit(str(proc), str(root)) is None  # v1 "unlimited"
    (root / "memory" / "memory.limit_in_bytes").write_text("1073741824\n")
    assert dirs._cgroup_memory_limit(str(proc), str(root)) == 1 << 30
    (root / "memory.max").write_text("max\n")
    assert dirs._cgroup_memory_limit(str(proc), str(root)) is None
    (root / "user.slice" / "me" / "memory.max").write_text("536870912\n")
    assert dirs._cgroup_memory_limit(str(proc), str(root)) == 512 * MiB


# -- mappings a worker keeps between tasks -------------------------------------------------------


def test_a_dead_node_managers_store_is_swept_and_a_live_ones_kept(tmp_path) -> None:
    base = tmp_path / "shm"
    base.mkdir()
    live, _ = dirs.prepare_store_dir("s1", "aa01", MiB, base_dir=str(base))
    lock = dirs.lock_store_dir(live)
    code = textwrap.dedent(
        f"""
        import sys
        from nbcluster._runtime.objects import dirs
        path, _ = dirs.prepare_store_dir("s2", "bb02", 1 << 20, base_dir={str(base)!r})
        dirs.lock_store_dir(path)
        open(path + "/obj", "wb").write(b"x" * 5000)
        print(path, flush=True)
        sys.stdin.read()
        """
    )
    child = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        dead = child.stdout.readline().strip()
        assert os.path.isdir(dead)
        assert dirs.sweep_stale_stores(str(base)) == 0  # both nodes alive: nothing goes
        child.kill()  # like SIGKILL: no cleanup
        child.wait(timeout=30)
        freed = dirs.sweep_stale_stores(str(base))
        assert freed >= 5000
        assert not os.path.exists(os.path.dirname(dead))  # its empty session dir went too
        assert os.path.isdir(live)
        no_lock = base / "nbcluster-s3" / "cc03"  # an older version's: left alone
        no_lock.mkdir(parents=True)
        assert dirs.sweep_stale_stores(str(base)) == 0 and no_lock.is_dir()
    finally:
        child.kill()
        child.wait(timeout=30)
    os.close(lock)  # this "node" ends too: its store is stale now
    dirs.sweep_stale_stores(str(base))
    assert not os.path.exists(live)
