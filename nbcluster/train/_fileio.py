"""Writes that a reader never sees half-done: the file helpers of Train's storage (and Tune's).

Every file a run writes for another process to read (checkpoint files and metadata, the
run's state file, Tune's experiment state) goes through :func:`atomic_write_bytes` or
:func:`atomic_copy_file`: the bytes go to a hidden temporary name in the same directory,
are flushed and ``fsync``-ed, and the file is renamed into place. A rename within a
directory is atomic, so a reader finds either the old file or the complete new one — never
an empty or truncated file, also when the writer is killed half-way (the temporary file is
left behind under a hidden name and removed with its directory).

:func:`dir_lock` serialises read-modify-write updates of one directory's files between
processes (several ranks merging checkpoint metadata into one directory).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import uuid
from collections.abc import Iterator

__all__ = [
    "TMP_PREFIX",
    "atomic_copy_file",
    "atomic_copy_tree",
    "atomic_write_bytes",
    "atomic_write_text",
    "dir_lock",
    "fsync_dir",
]

#: Temporary files start with this (hidden, and recognisable as litter of a killed writer).
TMP_PREFIX = ".nbtmp-"


def _tmp_name(path: str) -> str:
    head, tail = os.path.split(path)
    return os.path.join(head, f"{TMP_PREFIX}{tail}.{os.getpid()}.{uuid.uuid4().hex[:8]}")


def fsync_dir(path: str) -> None:
    """Make a rename or a new entry in directory ``path`` durable (best effort)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some file systems cannot fsync a directory; the rename is still atomic
    finally:
        os.close(fd)


def atomic_write_bytes(path: str, data: bytes, *, durable: bool = True) -> None:
    """Write ``data`` to ``path`` so that readers see the old file or all of the new one.

    ``durable``: ``fsync`` the file before the rename (and the directory after it), so the
    file is complete after a crash of the machine too.
    """
    tmp = _tmp_name(path)
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise
    if durable:
        fsync_dir(os.path.dirname(path) or ".")


def atomic_write_text(path: str, text: str, *, durable: bool = True) -> None:
    """:func:`atomic_write_bytes` of ``text`` in UTF-8."""
    atomic_write_bytes(path, text.encode("utf-8"), durable=durable)


def atomic_copy_file(src: str, dest: str) -> None:
    """Copy the file ``src`` to ``dest`` (contents and mode bits) atomically and durably."""
    tmp = _tmp_name(dest)
    try:
        with open(src, "rb") as fin, open(tmp, "wb") as fout:
            shutil.copyfileobj(fin, fout, 1 << 20)
            fout.flush()
            os.fsync(fout.fileno())
        shutil.copystat(src, tmp)
        os.replace(tmp, dest)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise


def atomic_copy_tree(src: str, dest: str, skip: frozenset[str] = frozenset()) -> None:
    """Copy the files under ``src`` into ``dest`` (merging), each file atomically.

    Top-level entries named in ``skip`` are left out (the caller handles them).
    """
    os.makedirs(dest, exist_ok=True)
    for entry in os.scandir(src):
        if entry.name in skip:
            continue
        target = os.path.join(dest, entry.name)
        if entry.is_dir(follow_symlinks=False):
            atomic_copy_tree(entry.path, target)
        else:
            atomic_copy_file(entry.path, target)
    fsync_dir(dest)


@contextlib.contextmanager
def dir_lock(path: str) -> Iterator[None]:
    """Hold an exclusive lock on directory ``path`` between processes (``flock``).

    On file systems where a directory cannot be locked, this holds nothing (each write is
    still atomic; only concurrent read-modify-write merges could then lose an update).
    """
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        yield
        return
    try:
        with contextlib.suppress(OSError):
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the lock
