"""Shared-memory channels between processes of one host.

A channel is a ring buffer in a file of a tmpfs directory (``/dev/shm`` when there is
one), mapped by its writer and readers (see ``_ring``), plus one FIFO per reader for
wake-ups: after publishing an item the writer writes one byte to each reader's FIFO, and
a reader with nothing to read blocks on its FIFO. The FIFOs also tell when the other end
is gone: a reader whose writer process closed the FIFO (it exited, or ended its loop)
reads end-of-file, and a writer whose reader is gone gets ``BrokenPipeError``. No futex,
no spinning: an idle graph costs no CPU.

Set-up goes in two steps so no ``open`` blocks: every reader opens its FIFO first
(non-blocking), then every writer opens the write ends. Once every process has opened
its ends, the driver unlinks the files; the mappings and FIFOs live on until closed.
A value too large for a slot goes to a file of its own in the same directory, which the
writer removes when the slot is reused (every reader has read it by then) or at close.
"""

from __future__ import annotations

import contextlib
import errno
import mmap
import os
import select
import struct
import tempfile
import time
from typing import Any

from nbcluster.dag.compiled._errors import ChannelError, ChannelTimeoutError
from nbcluster.dag.compiled._ring import (
    BIG,
    RingReader,
    RingWriter,
    decode,
    encode,
    encoded_size,
    ring_size,
)

__all__ = [
    "ChannelClosed",
    "ShmReader",
    "ShmWriter",
    "create_files",
    "fifo_path",
    "ring_path",
    "shm_root",
]

_BIG_HEAD = struct.Struct("<I")  # the kind of the item stored in the file


class ChannelClosed(ChannelError):
    """The process at the other end of a channel closed it or is gone."""


def shm_root() -> str:
    """Where channel files go: ``/dev/shm`` if usable, else the temp directory."""
    if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK | os.X_OK):
        return "/dev/shm"
    return tempfile.gettempdir()


def ring_path(directory: str, cid: int) -> str:
    """The ring buffer file of channel ``cid``."""
    return os.path.join(directory, f"ring-{cid}")


def fifo_path(directory: str, cid: int, reader: int) -> str:
    """The wake-up FIFO of reader number ``reader`` of channel ``cid``."""
    return os.path.join(directory, f"wake-{cid}-{reader}")


def create_files(directory: str, cid: int, nreaders: int, nbytes: int) -> None:
    """Create channel ``cid``'s ring file (zeroed) and its readers' FIFOs."""
    fd = os.open(ring_path(directory, cid), os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    try:
        os.ftruncate(fd, nbytes)
    finally:
        os.close(fd)
    for i in range(nreaders):
        os.mkfifo(fifo_path(directory, cid, i), 0o600)


def _map(path: str, nbytes: int) -> tuple[mmap.mmap, memoryview]:
    fd = os.open(path, os.O_RDWR)
    try:
        mm = mmap.mmap(fd, nbytes)
    finally:
        os.close(fd)
    return mm, memoryview(mm)


def _unmap(mm: mmap.mmap, view: memoryview) -> None:
    view.release()
    with contextlib.suppress(BufferError):  # a payload view still alive: the GC unmaps it
        mm.close()


class ShmReader:
    """Reader number ``index`` of channel ``cid``: ``read(timeout)`` returns the next
    ``(kind, value)`` and raises :class:`ChannelClosed` once the writer is gone."""

    def __init__(self, directory: str, cid: int, index: int, nslots: int, capacity: int) -> None:
        self.directory = directory
        self.cid = cid
        self._mm, self._view = _map(ring_path(directory, cid), ring_size(nslots, capacity))
        self.ring = RingReader(self._view, nslots, capacity)
        self.fd = os.open(fifo_path(directory, cid, index), os.O_RDONLY | os.O_NONBLOCK)
        self._poller: Any = None

    @property
    def seq(self) -> int:
        """The sequence number of the last item read."""
        return self.ring.seq

    def start(self) -> None:
        """Every writer has opened its end: from now on, reads block."""
        os.set_blocking(self.fd, True)

    def _item(self, kind: int, payload: memoryview) -> tuple[int, Any]:
        if kind == BIG:
            (inner,) = _BIG_HEAD.unpack_from(payload, 0)
            name = bytes(payload[_BIG_HEAD.size :]).decode()
            with open(os.path.join(self.directory, name), "rb") as fh:
                data = fh.read()
            return inner, decode(memoryview(data))
        return kind, decode(payload)

    def read(self, timeout: float | None = None) -> tuple[int, Any]:
        """The next item; blocks until it is written, for at most ``timeout`` seconds
        (None: no limit) and then raises :class:`ChannelTimeoutError`."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            item = self.ring.poll()
            if item is not None:
                return self._item(*item)
            if deadline is not None:
                if self._poller is None:
                    self._poller = select.poll()
                    self._poller.register(self.fd, select.POLLIN)
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not self._poller.poll(max(remaining, 0) * 1000):
                    raise ChannelTimeoutError(
                        f"no result within {timeout}s: the execution is still running. Get "
                        "it again later, or give a longer timeout (-1 waits forever)."
                    )
            if not os.read(self.fd, 4096):
                item = self.ring.poll()
                if item is not None:
                    return self._item(*item)
                raise ChannelClosed(f"channel {self.cid} was closed by its writer")

    def close(self) -> None:
        """Close the FIFO and unmap the ring."""
        with contextlib.suppress(OSError):
            os.close(self.fd)
        _unmap(self._mm, self._view)


class ShmWriter:
    """The writer of channel ``cid`` with ``nreaders`` readers."""

    def __init__(self, directory: str, cid: int, nreaders: int, nslots: int, capacity: int) -> None:
        self.directory = directory
        self.cid = cid
        self.nreaders = nreaders
        self._mm, self._view = _map(ring_path(directory, cid), ring_size(nslots, capacity))
        self.ring = RingWriter(self._view, nslots, capacity)
        self.fds: list[int] = []
        self._big: dict[int, str] = {}  # slot -> file of the BIG item in it
        self._prefix = f"big-{cid}-{os.getpid()}-"

    def open_wakeups(self) -> None:
        """Open the readers' FIFOs (they are open for reading already)."""
        for i in range(self.nreaders):
            self.fds.append(
                os.open(fifo_path(self.directory, self.cid, i), os.O_WRONLY | os.O_NONBLOCK)
            )

    def write(self, kind: int, value: Any) -> None:
        """Publish ``value`` as the next item and wake the readers; raises
        :class:`ChannelClosed` if a reader is gone."""
        chunks = encode(value)
        size = encoded_size(chunks)
        seq = self.ring.seq + 1
        slot = self.ring.slot_of(seq)
        old = self._big.pop(slot, None)
        if old is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(self.directory, old))
        if not self.ring.fits(size):
            name = f"{self._prefix}{seq}"
            with open(os.path.join(self.directory, name), "wb") as fh:
                for chunk in chunks:
                    fh.write(chunk)
            self._big[slot] = name
            chunks = [_BIG_HEAD.pack(kind), name.encode()]
            kind = BIG
        self.ring.write(kind, chunks)
        for fd in self.fds:
            try:
                os.write(fd, b"\0")
            except BlockingIOError:
                pass  # the FIFO is full of wake-ups already: the reader will look
            except OSError as e:
                if e.errno in (errno.EPIPE, errno.EBADF):
                    raise ChannelClosed(f"a reader of channel {self.cid} is gone") from None
                raise

    def close(self) -> None:
        """Close the FIFOs (readers then see end-of-file), unmap, remove big files."""
        for fd in self.fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        self.fds = []
        for name in self._big.values():
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(self.directory, name))
        self._big = {}
        _unmap(self._mm, self._view)
