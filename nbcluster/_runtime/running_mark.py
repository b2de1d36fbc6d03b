"""Which task a worker process began last, readable after the process died.

An owner pipelines fast tasks: when their worker dies, it holds several without a reply.
The one the worker was running is charged a retry; those queued behind it go again
uncharged. The owner's send order alone cannot tell which one that was: the reply of a
task that finished just before the crash may still have been in the worker's memory,
unsent, so the first task without a reply is not always the one that crashed (a crashing
task queued behind it would then run again uncharged, past its ``max_retries``).

So a worker writes each task's id and attempt into a small file it maps (:class:`RunningMark`,
a few memory writes per task; the page stays in the page cache when the process dies,
however it dies), and its node reads and removes the file when the process has exited
(:func:`read_mark`), answering ``GetWorkerExitInfo`` with it.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import struct
from pathlib import Path

__all__ = ["RunningMark", "mark_dir", "mark_path", "read_mark"]

#: Bytes of the mapped file: a length byte, then the task id and its attempt.
SIZE = 64
_ATTEMPT = struct.Struct(">I")


def mark_dir(session_dir: str | os.PathLike[str]) -> Path:
    """The directory of a node's running marks, under its session directory."""
    return Path(session_dir) / "running"


def mark_path(session_dir: str | os.PathLike[str], worker_id: bytes) -> Path:
    """The running mark of worker ``worker_id``."""
    return mark_dir(session_dir) / worker_id.hex()


def encode(task_id: bytes, attempt: int) -> bytes:
    """A mark's content: the task id, then its attempt (4 bytes, big-endian)."""
    return task_id + _ATTEMPT.pack(attempt & 0xFFFFFFFF)


class RunningMark:
    """The worker's side: a mapped file holding the task it began last."""

    def __init__(self, path: Path) -> None:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.ftruncate(fd, SIZE)
            self._map = mmap.mmap(fd, SIZE)
        finally:
            os.close(fd)

    @classmethod
    def open(cls, session_dir: str, worker_id: bytes) -> RunningMark | None:
        """The mark of this worker, or None where it cannot be made (no session directory:
        its owners then charge the first task without a reply, as before marks existed)."""
        if not session_dir:
            return None
        try:
            return cls(mark_path(session_dir, worker_id))
        except OSError:
            return None

    def set(self, task_id: bytes, attempt: int) -> None:
        """The worker begins running this attempt of ``task_id``."""
        data = encode(task_id, attempt)
        n = len(data)
        if n >= SIZE:
            return
        m = self._map
        m[0] = 0  # torn if the process dies in between: read as unknown
        m[1 : 1 + n] = data
        m[0] = n

    def close(self) -> None:
        """Unmap (the file stays for the node to read and remove)."""
        with contextlib.suppress(BufferError, ValueError):
            self._map.close()


def read_mark(path: Path) -> bytes:
    """The node's side, after the worker exited: what its mark holds (``encode``'s bytes,
    empty when unknown); the file is removed."""
    try:
        data = path.read_bytes()
    except OSError:
        return b""
    with contextlib.suppress(OSError):
        path.unlink()
    if len(data) < 1:
        return b""
    n = data[0]
    if n == 0 or 1 + n > len(data):
        return b""
    return data[1 : 1 + n]
