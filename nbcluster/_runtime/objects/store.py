"""The node's object store on disk: one file per object in a shared-memory directory.

Layout of a store directory (normally ``/dev/shm/nbcluster-<session>/<node-id-hex>``)::

    <object-id-hex>            a sealed object: the encoding of ``serialization``
    .tmp-<id>-<pid>-<n>        an object being written (never read)
    .free/<size>-<pid>-<n>     a freed object file kept for reuse (see "Recycling")
    .free/.check-<pid>-<n>     a freed file being checked for readers (never reused)
    .free/.busy-<size>-<pid>-<n>  a freed file a reader's value still views (waits, hidden)

**Sealing** is an atomic ``link(tmp, final)`` followed by ``unlink(tmp)``: readers never
see a partial object, and a second writer of the same id gets ``FileExistsError``
instead of replacing an object someone may have mapped.

**Reading** maps the file read-only (``objects.readers``); ``deserialize(read_object(...))``
gives numpy arrays that are read-only views of that mapping. A view holds the file's read
lock while it lives, so the file is never rewritten under it, and it stays valid after the
file is deleted or spilled (Linux keeps the pages while they are mapped): readers need no
pin. A reader keeps the mapping of a large file after its views are gone, so an object
written later into the same (recycled) file costs it no new mapping and no page faults.

**Writing, measured** (100 MiB numpy array into tmpfs ``/dev/shm``, 2-vCPU VM, kernel
6.18, Python 3.11; numpy ``copyto`` into a warm array of the same size measured 7-13 GB/s
on this shared machine, varying from run to run):

============================================================  ===========
method                                                        % memcpy
============================================================  ===========
``ftruncate`` + ``mmap`` + copy into a new file               15 - 25
``os.pwritev`` of header + buffers, new file                  30 - 48
``os.pwritev`` into a recycled file (pages already allocated) 55 - 65
``MAP_POPULATE`` mapping + copy into a recycled file          75 - 80
the same, copied by two threads (two cores)                   110 - 125
the same into the writer's kept mapping (no populate, no unmap) 150 - 200
============================================================  ===========

The copy itself is cheap; what costs is the kernel allocating, zeroing and accounting a
fresh tmpfs page for every 4 KiB (``/dev/shm`` has no huge pages unless mounted with
``huge=``; ``posix_fallocate`` alone does not help: tmpfs zeroes a page on its first
write). So a new file is written with ``os.pwritev`` straight from the numpy buffer (one
copy, no page faults), and a large object goes, whenever possible, into a file whose
pages are allocated and zeroed already, through a ``MAP_POPULATE`` mapping copied by two
threads (``filling.write_mapped``; never into a file with unallocated pages, where a full disk
would be a ``SIGBUS``). Those files come from **recycling**: ``delete_object(...,
recycle_limit=N)`` keeps freed files of at least ``RECYCLE_MIN_SIZE`` in ``.free/`` (up to
N bytes in all) and ``write_object`` overwrites the smallest one that fits (and is at most
about twice the size). A file is recycled only if nobody can still see its old contents:
it is renamed away from its object name first (so nobody can open it any more) and then
its write lock is tried (``objects.readers.readers_state``), which is free only when no
value made from the file lives anywhere. A file still viewed waits under a hidden name
until :func:`promote_waiting` finds its readers gone. The node manager also fills the
pool ahead of demand (:func:`allocate_pool_files`, sized by ``objects.pool.WarmPool``),
in a low-priority thread. Pool files still occupy the tmpfs: size the directory for ``capacity +
recycle_limit``; writes empty the pool and retry once when the disk is full.

**Kept mappings.** Mapping a 100 MiB file in (``MAP_POPULATE``) and out again costs a
writer 5-8 ms, about as much as the copy. So a process keeps the populated mapping of
each pooled file it wrote (``objects.kept_maps``); once the object in it is freed (its
file is in ``.free/``) and the write lock on the kept descriptor shows no value views it,
the writer claims it by renaming it and writes its next object of a fitting size through
the same mapping.
A file that another process still views is never rewritten, as in recycling.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import mmap
import os
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

from nbcluster._runtime.objects.dirs import free_bytes
from nbcluster._runtime.objects.filling import (
    IOV_MAX,
    close_quiet,
    copy_chunks,
    pwritev_all,
    pwritev_at,
    run_aside,
    write_mapped,
)
from nbcluster._runtime.objects.kept_maps import KeptMap, kept_maps
from nbcluster._runtime.objects.readers import (
    LOCKS,
    RECYCLE_MIN_SIZE,
    open_locked,
    reader_maps,
    readers_state,
)

if TYPE_CHECKING:
    from nbcluster._runtime.serialization import SerializedValue

__all__ = [
    "FREE_DIR",
    "RECYCLE_MIN_SIZE",
    "allocate_pool_files",
    "delete_object",
    "drop_pool_files",
    "free_pool_bytes",
    "object_path",
    "pool_file_sizes",
    "promote_waiting",
    "read_object",
    "restore_object",
    "spare_bytes",
    "spill_object",
    "trim_free_pool",
    "write_object",
]

#: Smallest recycled file written through a mapping instead of ``pwritev``.
MAPPED_WRITE_MIN = 1 << 20
#: Subdirectory of a store directory holding freed files kept for reuse.
FREE_DIR = ".free"

_TMP_PREFIX = ".tmp-"
_CHECK_PREFIX = ".check-"
_BUSY_PREFIX = ".busy-"
_FILE_MODE = 0o600
_DIR_MODE = 0o700
_MAX_RW = 0x7FFFF000  # Linux moves at most this many bytes per read/write call
_COPY_CHUNK = 8 << 20
_ZERO_CHUNK = 1 << 20
_MMAP_KW = {"trackfd": False} if sys.version_info >= (3, 13) else {}
_MAP_POPULATE = getattr(mmap, "MAP_POPULATE", 0)
_MADV_POPULATE_WRITE = getattr(mmap, "MADV_POPULATE_WRITE", 23)  # Linux 5.14
_counter = itertools.count()


# --------------------------------------------------------------------------------------------
# objects


def object_path(store_dir: str, object_id: bytes) -> str:
    """Path of the file holding ``object_id`` (its hex form) in ``store_dir``."""
    return os.path.join(store_dir, object_id.hex())


def write_object(
    store_dir: str,
    object_id: bytes,
    value: SerializedValue,
    reserve: Callable[[], None] | None = None,
) -> int:
    """Write and seal ``value`` as ``object_id``; return its size in bytes.

    The bytes go from the value's own buffers into the file with one ``os.pwritev``
    (one copy), into a recycled file when one is available. Raises ``FileExistsError``
    if the object is already sealed (treat it as stored: ids are never reused for
    different values), and ``OSError(ENOSPC)`` when the directory is full.

    ``reserve``, if given, blocks until the node manager has made room for the object
    (the reply to ``CreateObject``, sent before this call) and raises if it refused. It is
    called before a new file is written (writing allocates the memory it reserved), but
    only after a recycled file is written (its memory is allocated already): the round
    trip then overlaps the copy. When no pooled file fits, or this process's kept file
    that fits still holds an object, the pool and the kept files are looked at again
    after the reply (the node may have recycled a just-freed file meanwhile). Either way
    it returns before the object is sealed; if it raises, nothing is left behind.
    """
    final = object_path(store_dir, object_id)
    if os.path.exists(final):
        raise FileExistsError(errno.EEXIST, "object already sealed", final)
    size = value.total_size
    chunks = value.chunks()
    tmp = _temp_path(store_dir, object_id)
    if size >= MAPPED_WRITE_MIN and len(kept_maps):
        kept = _claim_kept(store_dir, size, tmp)
        if kept is None and reserve is not None and kept_maps.fitting(size):
            # A kept file that fits still holds an object: most often the one freed just
            # before this write, its free sent ahead of this reservation. After the reply
            # the node has pooled it: a round trip instead of mapping another file.
            reserve()
            reserve = None
            kept = _claim_kept(store_dir, size, tmp)
        if kept is not None:
            return _write_kept(kept, tmp, final, chunks, reserve)
    mapping: mmap.mmap | None = None
    fd, allocated = _open_new(store_dir, tmp, size)
    try:
        if not allocated and reserve is not None and size >= RECYCLE_MIN_SIZE:
            # The pool had no file that fits, but one may be on its way back (an object
            # freed just before this write, whose file the node recycles before it answers
            # the reservation): look again after the reply, before writing a new file.
            reserve()
            reserve = None
            if os.fstat(fd).st_size == 0 and _pool_files(store_dir):
                os.close(fd)
                fd = -1
                _unlink_quiet(tmp)
                fd, allocated = _open_new(store_dir, tmp, size)
        if allocated and size >= MAPPED_WRITE_MIN:
            mapping = write_mapped(fd, size, chunks)
        else:
            if reserve is not None:
                reserve()
                reserve = None
            try:
                pwritev_all(fd, chunks)
            except OSError as err:
                if err.errno != errno.ENOSPC or trim_free_pool(store_dir) == 0:
                    raise
                pwritev_all(fd, chunks)
        if reserve is not None:
            reserve()
        _seal(tmp, final)
    except BaseException:
        if mapping is not None:
            close_quiet(mapping)
        if fd >= 0:
            os.close(fd)
        _unlink_quiet(tmp)
        raise
    if mapping is None:
        os.close(fd)
    else:  # keep the populated mapping for this process's next write into the same file
        st = os.fstat(fd)
        _keep(KeptMap(fd, mapping, size, st.st_dev, st.st_ino))
    return size


def _write_kept(
    kept: KeptMap,
    tmp: str,
    final: str,
    chunks: list[bytes | memoryview],
    reserve: Callable[[], None] | None,
) -> int:
    """Write into a kept file (claimed and renamed to ``tmp``) through its kept mapping."""
    try:
        copy_chunks(kept.mapping, kept.length, chunks)
        if reserve is not None:
            reserve()
        _seal(tmp, final)
    except BaseException:
        _unlink_quiet(tmp)
        kept.close()
        raise
    kept_maps.reused += 1
    _keep(kept)
    return kept.length


def _claim_kept(store_dir: str, size: int, tmp: str) -> KeptMap | None:
    freed = _pool_files(store_dir, _BUSY_PREFIX) + _pool_files(store_dir)
    kept, released = kept_maps.claim([path for _, path in freed], size, tmp)
    if released:
        promote_waiting(store_dir)  # (the files were busy only for our own mapping)
    return kept


def _keep(kept: KeptMap) -> None:
    for old in kept_maps.keep(kept):
        run_aside(old.close)


def read_object(store_dir: str, object_id: bytes) -> memoryview | None:
    """Map ``object_id`` read-only; ``None`` if it is not in ``store_dir``.

    The view (and anything sliced from it, numpy arrays from ``deserialize`` included)
    stays valid however long it lives: a large object's file is not reused while a view
    of it lives (it holds the file's read lock, ``objects.readers``), and a mapping stays
    valid if its file is deleted or spilled. The mapping of a large file is kept after
    the view is gone, for the next object written into the same file.
    """
    return reader_maps.read(object_path(store_dir, object_id))


def delete_object(store_dir: str, object_id: bytes, *, recycle_limit: int = 0) -> int:
    """Remove ``object_id`` from ``store_dir``; return the bytes it held (0 if absent).

    With ``recycle_limit > 0``, a file of at least ``RECYCLE_MIN_SIZE`` that no value
    views goes to the reuse pool instead, as long as the pool stays within
    ``recycle_limit`` bytes. Mappings of the object made earlier stay valid either way.
    """
    path = object_path(store_dir, object_id)
    if recycle_limit > 0 and LOCKS:
        freed = _recycle(store_dir, path, recycle_limit)
        if freed is not None:
            return freed
    try:
        size = os.stat(path).st_size
        os.unlink(path)
    except FileNotFoundError:
        return 0
    return size


def spill_object(store_dir: str, spill_dir: str, object_id: bytes) -> int:
    """Move ``object_id`` from ``store_dir`` to ``spill_dir``; return its size.

    Existing mappings stay valid. A rename when both are on one filesystem, otherwise a
    kernel-side copy (``sendfile``) to a temporary name in ``spill_dir``, then a rename,
    then the unlink of the store file. Raises ``FileNotFoundError`` if the object is not in
    the store and ``OSError(ENOSPC)`` if the spill disk is full (nothing changes then).
    """
    src = object_path(store_dir, object_id)
    dst = object_path(spill_dir, object_id)
    fd_in = open_locked(src)
    if fd_in is None:
        raise FileNotFoundError(errno.ENOENT, "object not in the store", src)
    try:
        size = os.fstat(fd_in).st_size
        try:
            os.rename(src, dst)
            return size
        except OSError as err:
            if err.errno != errno.EXDEV:
                raise
        tmp = _temp_path(spill_dir, object_id)
        fd_out = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, _FILE_MODE)
        try:
            _copy_fd(fd_in, fd_out, size)
        except BaseException:
            os.close(fd_out)
            _unlink_quiet(tmp)
            raise
        os.close(fd_out)
        os.replace(tmp, dst)
        _unlink_quiet(src)
        return size
    finally:
        os.close(fd_in)


def restore_object(spill_dir: str, store_dir: str, object_id: bytes) -> int:
    """Bring ``object_id`` back from ``spill_dir`` into ``store_dir``; return its size.

    The copy goes into a recycled file when one is available and is sealed like a write;
    the spill file is removed afterwards. If the object is already back in the store,
    only the spill file is removed. Raises ``FileNotFoundError`` if it is not spilled.
    """
    src = object_path(spill_dir, object_id)
    dst = object_path(store_dir, object_id)
    fd_in = os.open(src, os.O_RDONLY | os.O_CLOEXEC)
    try:
        size = os.fstat(fd_in).st_size
        if os.path.exists(dst):
            _unlink_quiet(src)
            return size
        tmp = _temp_path(store_dir, object_id)
        fd_out, _ = _open_new(store_dir, tmp, size)
        try:
            try:
                _copy_fd(fd_in, fd_out, size)
            except OSError as err:
                if err.errno != errno.ENOSPC or trim_free_pool(store_dir) == 0:
                    raise
                os.lseek(fd_out, 0, os.SEEK_SET)
                _copy_fd(fd_in, fd_out, size)
        except BaseException:
            os.close(fd_out)
            _unlink_quiet(tmp)
            raise
        os.close(fd_out)
        with contextlib.suppress(FileExistsError):  # someone restored it first
            _seal(tmp, dst)
        _unlink_quiet(src)
        return size
    finally:
        os.close(fd_in)


# --------------------------------------------------------------------------------------------
# the reuse pool


def free_pool_bytes(store_dir: str) -> int:
    """Bytes held by freed files kept for reuse in ``store_dir`` (waiting ones included)."""
    return sum(size for size, _ in _pool_files(store_dir) + _pool_files(store_dir, _BUSY_PREFIX))


def trim_free_pool(store_dir: str, keep_bytes: int = 0) -> int:
    """Delete pooled files until at most ``keep_bytes`` remain; return the bytes freed.

    Files still waiting for their readers go first, then the largest.
    """
    busy = sorted(_pool_files(store_dir, _BUSY_PREFIX), reverse=True)
    files = busy + sorted(_pool_files(store_dir), reverse=True)
    total = sum(size for size, _ in files)
    freed = 0
    for size, path in files:
        if total <= keep_bytes:
            break
        try:
            os.unlink(path)
        except FileNotFoundError:  # claimed by a writer meanwhile
            pass
        else:
            freed += size
        total -= size
    return freed


def promote_waiting(store_dir: str) -> int:
    """Move freed files whose readers are all gone into the pool; return their bytes.

    A freed file that was still mapped waits under a hidden name (nobody can open it
    any more) until its last mapping goes; call this before relying on the pool.
    """
    promoted = 0
    for size, path in _pool_files(store_dir, _BUSY_PREFIX):
        try:
            fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        except FileNotFoundError:
            continue
        try:
            if readers_state(fd) == "free":
                unique = os.path.basename(path).split("-", 2)[2]
                try:
                    os.rename(path, os.path.join(os.path.dirname(path), f"{size}-{unique}"))
                except FileNotFoundError:  # a writer claimed its kept file meanwhile
                    continue
                promoted += size
        finally:
            os.close(fd)
    return promoted


def _pool_files(store_dir: str, prefix: str = "") -> list[tuple[int, str]]:
    """(size, path) of the pool's files: ready ones, or those named ``prefix<size>-...``."""
    free_dir = os.path.join(store_dir, FREE_DIR)
    try:
        names = os.listdir(free_dir)
    except FileNotFoundError:
        return []
    out = []
    for name in names:
        if prefix:
            if not name.startswith(prefix):
                continue
            name = name[len(prefix) :]
            full = prefix + name
        elif name.startswith("."):
            continue
        else:
            full = name
        size, _, _ = name.partition("-")
        if size.isdigit():
            out.append((int(size), os.path.join(free_dir, full)))
    return out


def _recycle(store_dir: str, path: str, limit: int) -> int | None:
    """Move a freed object file into the pool; ``None`` means "unlink it instead"."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    except FileNotFoundError:
        return 0
    try:
        size = os.fstat(fd).st_size
        if size < RECYCLE_MIN_SIZE or free_pool_bytes(store_dir) + size > limit:
            return None
        free_dir = os.path.join(store_dir, FREE_DIR)
        os.makedirs(free_dir, mode=_DIR_MODE, exist_ok=True)
        unique = f"{os.getpid()}-{next(_counter)}"
        checking = os.path.join(free_dir, _CHECK_PREFIX + unique)
        try:
            os.rename(path, checking)  # from here on nobody can open it by its object name
        except FileNotFoundError:
            return 0
        state = readers_state(fd)
        if state == "free":
            os.rename(checking, os.path.join(free_dir, f"{size}-{unique}"))
        elif state == "busy":  # still viewed: wait (hidden) until promote_waiting sees it free
            os.rename(checking, os.path.join(free_dir, f"{_BUSY_PREFIX}{size}-{unique}"))
        else:
            os.unlink(checking)
        return size
    finally:
        os.close(fd)


def _claim_recycled(store_dir: str, size: int, tmp: str) -> int:
    """Rename the best-fitting pooled file to ``tmp``; return its size (0: the pool had none)."""
    files = _pool_files(store_dir)
    if not files:
        return 0
    fits = sorted(f for f in files if size <= f[0] <= 2 * size + RECYCLE_MIN_SIZE)  # best fit
    smaller = sorted((f for f in files if f[0] < size), reverse=True)  # else reuse the most
    for had, path in (fits + smaller)[:8]:
        try:
            os.rename(path, tmp)
        except FileNotFoundError:  # another writer took it
            continue
        return had
    return 0


# --------------------------------------------------------------------------------------------
# file helpers


def _temp_path(directory: str, object_id: bytes) -> str:
    return os.path.join(directory, f"{_TMP_PREFIX}{object_id.hex()}-{os.getpid()}-{next(_counter)}")


def _open_new(store_dir: str, tmp: str, size: int) -> tuple[int, bool]:
    """Open ``tmp`` (read-write) for ``size`` bytes: a recycled file if possible, else a new one.

    Returns ``(fd, allocated)``; ``allocated`` means every page of the ``size`` bytes is
    already allocated (a recycled file at least that big), so the file may be written
    through a mapping without risking ``SIGBUS`` on a full disk.
    """
    had = _claim_recycled(store_dir, size, tmp) if size >= RECYCLE_MIN_SIZE else 0
    if had:
        fd = os.open(tmp, os.O_RDWR | os.O_CLOEXEC)
        try:
            os.ftruncate(fd, size)
        except BaseException:
            os.close(fd)
            _unlink_quiet(tmp)
            raise
        return fd, had >= size
    return os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, _FILE_MODE), False


def _seal(tmp: str, final: str) -> None:
    """Publish ``tmp`` as ``final`` atomically, never replacing an existing ``final``."""
    try:
        os.link(tmp, final)
    except FileExistsError:
        _unlink_quiet(tmp)
        raise FileExistsError(errno.EEXIST, "object already sealed", final) from None
    except OSError as err:
        if err.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP):
            _unlink_quiet(tmp)
            raise
        os.rename(tmp, final)  # filesystem without hard links
        return
    os.unlink(tmp)


def _copy_fd(fd_in: int, fd_out: int, size: int) -> None:
    """Copy ``size`` bytes from the start of ``fd_in`` to ``fd_out``'s position."""
    offset = 0
    while offset < size:
        try:
            n = os.sendfile(fd_out, fd_in, offset, min(size - offset, _MAX_RW))
        except OSError as err:
            if offset or err.errno not in (errno.EINVAL, errno.ENOSYS):
                raise
            _copy_fd_plain(fd_in, fd_out, size)
            return
        if n == 0:
            raise OSError(errno.EIO, "object file ended early")
        offset += n


def _copy_fd_plain(fd_in: int, fd_out: int, size: int) -> None:
    offset = 0
    while offset < size:
        data = os.pread(fd_in, min(_COPY_CHUNK, size - offset), offset)
        if not data:
            raise OSError(errno.EIO, "object file ended early")
        view = memoryview(data)
        while view:
            n = os.write(fd_out, view)
            view = view[n:]
        offset += len(data)


def _unlink_quiet(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


class RawWriter:
    """Write an object's encoded bytes piece by piece (a copy pulled from another node).

    ``with RawWriter(store_dir, oid, size) as w: w.write(offset, data)``, or receive into
    ``w.mapped()``; on a clean exit the object is sealed (published atomically), on an
    error the partial file is removed.
    """

    def __init__(self, store_dir: str, object_id: bytes, size: int) -> None:
        self.store_dir = store_dir
        self.final = object_path(store_dir, object_id)
        self.tmp = _temp_path(store_dir, object_id)
        self.fd, self.allocated = _open_new(store_dir, self.tmp, size)
        self.size = size
        self._mapping: mmap.mmap | None = None
        self._reserved = False

    def write(self, offset: int, data: bytes | memoryview) -> None:
        """Write ``data`` at ``offset``."""
        view = memoryview(data)
        while view.nbytes:
            n = os.pwrite(self.fd, view, offset)
            if n <= 0:
                raise OSError(errno.EIO, "pwrite made no progress")
            view = view[n:]
            offset += n

    def mapped(self) -> memoryview:
        """A writable view of the whole file, to receive into (release it before exit).

        The pages are reserved first (``posix_fallocate``, so a full disk raises
        ``ENOSPC`` here and never ``SIGBUS`` later); a recycled file's pages are mapped at
        once, and :meth:`prefault` faults in a fresh file's pages range by range.
        """
        if self._mapping is None:
            self.reserve()
            flags = mmap.MAP_SHARED | (_MAP_POPULATE if self.allocated else 0)
            self._mapping = mmap.mmap(
                self.fd, self.size, flags=flags, prot=mmap.PROT_READ | mmap.PROT_WRITE
            )
        return memoryview(self._mapping)

    def reserve(self) -> None:
        """Make sure the file's pages exist (``posix_fallocate``; once): a full store raises
        ``ENOSPC`` here, after trying to make room by trimming the pool of freed files."""
        if self.allocated or self._reserved or not self.size:
            return
        try:
            os.posix_fallocate(self.fd, 0, self.size)
        except OSError as err:
            if err.errno != errno.ENOSPC or trim_free_pool(self.store_dir) == 0:
                raise
            os.posix_fallocate(self.fd, 0, self.size)
        self._reserved = True

    def prefault(self, offset: int, length: int) -> None:
        """Fault in ``[offset, offset + length)`` of the mapping for writing, in one call."""
        if self._mapping is None or self.allocated or length <= 0:
            return
        start = offset & ~(mmap.PAGESIZE - 1)
        with contextlib.suppress(OSError, ValueError):  # kernels before 5.14: faults come later
            self._mapping.madvise(_MADV_POPULATE_WRITE, start, offset + length - start)

    def __enter__(self) -> RawWriter:
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if self._mapping is not None:
            with contextlib.suppress(BufferError):  # a live view keeps the mapping
                self._mapping.close()
            self._mapping = None
        os.close(self.fd)
        if exc_type is not None:
            _unlink_quiet(self.tmp)
            return
        with contextlib.suppress(FileExistsError):  # another fetch of it finished first
            _seal(self.tmp, self.final)


def allocate_pool_files(store_dir: str, sizes: list[int]) -> int:
    """Add files of these sizes, their pages allocated, to the reuse pool; return the bytes.

    The next writes of objects that fit them skip tmpfs page allocation (see
    ``objects.pool``). Stops at the first ``posix_fallocate`` failure (a full disk).
    """
    free_dir = os.path.join(store_dir, FREE_DIR)
    os.makedirs(free_dir, mode=_DIR_MODE, exist_ok=True)
    made = 0
    for size in sizes:
        unique = f"{os.getpid()}-{next(_counter)}"
        building = os.path.join(free_dir, _CHECK_PREFIX + unique)  # hidden from writers
        fd = os.open(building, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, _FILE_MODE)
        try:
            # posix_fallocate reserves the pages, but tmpfs zeroes each one on its first
            # write, so writing them now is what makes the later object write cheap.
            os.posix_fallocate(fd, 0, size)
            _write_zeros(fd, size)
        except OSError:
            os.close(fd)
            _unlink_quiet(building)
            break
        os.close(fd)
        os.rename(building, os.path.join(free_dir, f"{size}-{unique}"))
        made += size
    return made


def _write_zeros(fd: int, size: int) -> None:
    zeros = memoryview(bytes(_ZERO_CHUNK))
    offset = 0
    while offset < size:
        n = min(size - offset, _ZERO_CHUNK * IOV_MAX)
        views = [zeros] * (n // _ZERO_CHUNK)
        if n % _ZERO_CHUNK:
            views.append(zeros[: n % _ZERO_CHUNK])
        pwritev_at(fd, views, offset)
        offset += n


def pool_file_sizes(store_dir: str) -> list[int]:
    """Sizes of the files in the reuse pool."""
    return [size for size, _ in _pool_files(store_dir)]


def drop_pool_files(store_dir: str, sizes: list[int]) -> int:
    """Delete one pool file of each of these sizes (those still there); return the bytes."""
    by_size: dict[int, list[str]] = {}
    for size, path in _pool_files(store_dir):
        by_size.setdefault(size, []).append(path)
    freed = 0
    for size in sizes:
        paths = by_size.get(size)
        if paths:
            try:
                os.unlink(paths.pop())
            except FileNotFoundError:  # claimed by a writer meanwhile
                continue
            freed += size
    return freed


def spare_bytes(store_dir: str) -> int:
    """Free bytes of the filesystem that holds ``store_dir``."""
    return free_bytes(store_dir) or 0
