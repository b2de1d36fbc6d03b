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
A value too large for a slot goes to the slot's big buffer, a file of its own in the same
directory, mapped by the writer and (on first use) by the readers, and reused while it is
large enough; a larger value replaces it by one twice the size (the slot's previous item
has been read by then, so the old file can go). The writer removes them at close.
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

_BIG_HEAD = struct.Struct("<IQ")  # the kind of the item in the file, and its size


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
        self._big: dict[str, tuple[mmap.mmap, memoryview]] = {}

    @property
    def seq(self) -> int:
        """The sequence number of the last item read."""
        return self.ring.seq

    def start(self) -> None:
        """Every writer has opened its end: from now on, reads block."""
        os.set_blocking(self.fd, True)

    def _item(self, kind: int, payload: memoryview) -> tuple[int, Any]:
        if kind == BIG:
            inner, size = _BIG_HEAD.unpack_from(payload, 0)
            name = bytes(payload[_BIG_HEAD.size :]).decode()
            view = self._big_view(name)
            return inner, decode(view[:size])
        return kind, decode(payload)

    def _big_view(self, name: str) -> memoryview:
        """The mapping of a slot's big buffer (kept while the slot keeps using it)."""
        mapped = self._big.get(name)
        if mapped is None:
            slot = name.rpartition("-slot")[2]
            for old in [n for n in self._big if n.rpartition("-slot")[2] == slot]:
                _unmap(*self._big.pop(old))  # the writer replaced that slot's buffer
            path = os.path.join(self.directory, name)
            mapped = self._big[name] = _map(path, os.stat(path).st_size)
        return mapped[1]

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
        """Close the FIFO and unmap the ring and big buffers."""
        with contextlib.suppress(OSError):
            os.close(self.fd)
        for mapped in self._big.values():
            _unmap(*mapped)
        self._big = {}
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
        # slot -> its big buffer (file name, mapping), for values larger than a slot
        self._big: dict[int, tuple[str, mmap.mmap, memoryview]] = {}
        self._generation = 0

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
        if not self.ring.fits(size):
            view, name = self._big_buffer(self.ring.slot_of(self.ring.seq + 1), size)
            pos = 0
            for chunk in chunks:
                n = memoryview(chunk).nbytes
                view[pos : pos + n] = memoryview(chunk).cast("B")
                pos += n
            chunks = [_BIG_HEAD.pack(kind, size), name.encode()]
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

    def _big_buffer(self, slot: int, size: int) -> tuple[memoryview, str]:
        """The big buffer of ``slot``, at least ``size`` bytes: reused while it is large
        enough, else replaced by one twice as large. The slot's previous item has been
        read by every reader, so its buffer can go."""
        current = self._big.get(slot)
        if current is not None and len(current[2]) >= size:
            return current[2], current[0]
        if current is not None:
            self._drop_big(slot)
        self._generation += 1
        name = f"big-{self.cid}-{os.getpid()}-{self._generation}-slot{slot}"
        path = os.path.join(self.directory, name)
        nbytes = max(size, 2 * len(current[2]) if current is not None else size)
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        try:
            os.ftruncate(fd, nbytes)
        finally:
            os.close(fd)
        mm, view = _map(path, nbytes)
        self._big[slot] = (name, mm, view)
        return view, name

    def _drop_big(self, slot: int) -> None:
        name, mm, view = self._big.pop(slot)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(self.directory, name))
        _unmap(mm, view)

    def close(self) -> None:
        """Close the FIFOs (readers then see end-of-file), unmap, remove big buffers."""
        for fd in self.fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        self.fds = []
        for slot in list(self._big):
            self._drop_big(slot)
        _unmap(self._mm, self._view)
