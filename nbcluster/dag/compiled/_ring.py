"""The channel protocol, without I/O: a ring of slots in a shared buffer, one writer and
any number of readers, and how values are encoded into a slot.

A channel's buffer holds ``nslots`` slots of ``SLOT_HEADER.size + capacity`` bytes. The
item with sequence number ``seq`` (1, 2, 3...) goes to slot ``(seq - 1) % nslots``. The
writer fills the payload, then the kind and size, and writes ``seq`` last: a slot whose
``seq`` field equals the sequence number a reader waits for is complete. The graph never
has more than ``nslots`` executions in flight (``execute`` refuses the next one), so a
slot is only rewritten after every reader has read it; :meth:`RingReader.poll` checks
this anyway and reports a protocol violation instead of returning another item.

Values are pickled with protocol 5; their out-of-band buffers (numpy arrays...) are laid
out after the pickle, so a large array is copied once into the channel and once out. A
payload larger than the slot goes to a file of its own (kind ``BIG``), whose name the
slot carries.
"""

from __future__ import annotations

import pickle
import struct
from collections.abc import Iterable
from typing import Any

import cloudpickle

__all__ = [
    "BIG",
    "ERROR",
    "SLOT_HEADER",
    "VALUE",
    "ProtocolError",
    "RingReader",
    "RingWriter",
    "decode",
    "encode",
    "ring_size",
]

#: Slot header: sequence number, kind, payload size.
SLOT_HEADER = struct.Struct("<QIxxxxQ")
_SEQ = struct.Struct("<Q")

#: Kinds of item.
VALUE = 0  # an encoded value
ERROR = 1  # an encoded TaskError raised by the stage that wrote it
BIG = 2  # the name (utf-8) of a file holding the encoded value or error; see RingWriter.write

_PAYLOAD_HEAD = struct.Struct("<QI")  # pickle size, number of out-of-band buffers
_BUF_LEN = struct.Struct("<Q")


class ProtocolError(RuntimeError):
    """The buffer does not hold what the protocol says it must (a bug, or memory reused)."""


def ring_size(nslots: int, capacity: int) -> int:
    """Bytes of a buffer with ``nslots`` slots of ``capacity`` payload bytes each."""
    return nslots * (SLOT_HEADER.size + capacity)


def encode(value: Any) -> list[Any]:
    """``value`` as a list of byte chunks: head, pickle, then each out-of-band buffer."""
    buffers: list[pickle.PickleBuffer] = []
    try:
        data = pickle.dumps(value, protocol=5, buffer_callback=buffers.append)
    except (pickle.PicklingError, AttributeError, TypeError):
        buffers = []
        data = cloudpickle.dumps(value, protocol=5, buffer_callback=buffers.append)
    views = [b.raw() for b in buffers]
    head = _PAYLOAD_HEAD.pack(len(data), len(views)) + b"".join(
        _BUF_LEN.pack(v.nbytes) for v in views
    )
    return [head, data, *views]


def encoded_size(chunks: Iterable[Any]) -> int:
    """Total bytes of :func:`encode`'s chunks."""
    return sum(memoryview(c).nbytes for c in chunks)


def decode(payload: memoryview) -> Any:
    """The value :func:`encode` wrote into ``payload``. Buffers are copied out, so the
    value stays valid after the slot is reused (and numpy arrays are writable)."""
    size, n = _PAYLOAD_HEAD.unpack_from(payload, 0)
    pos = _PAYLOAD_HEAD.size
    lens = [_BUF_LEN.unpack_from(payload, pos + i * _BUF_LEN.size)[0] for i in range(n)]
    pos += n * _BUF_LEN.size
    data = payload[pos : pos + size]
    pos += size
    bufs = []
    for length in lens:
        bufs.append(bytearray(payload[pos : pos + length]))
        pos += length
    return pickle.loads(data, buffers=bufs)


class RingWriter:
    """Writes items into a ring buffer: ``write(kind, chunks)`` gives them seq 1, 2, 3..."""

    def __init__(self, buf: memoryview, nslots: int, capacity: int) -> None:
        if len(buf) < ring_size(nslots, capacity):
            raise ValueError("buffer too small for the ring")
        self.buf = buf
        self.nslots = nslots
        self.capacity = capacity
        self.stride = SLOT_HEADER.size + capacity
        self.seq = 0  # last written

    def fits(self, size: int) -> bool:
        """Whether a payload of ``size`` bytes fits in a slot (else: write it as ``BIG``)."""
        return size <= self.capacity

    def write(self, kind: int, chunks: Iterable[Any]) -> int:
        """Publish the next item; returns its seq. The chunks must fit (see :meth:`fits`)."""
        seq = self.seq + 1
        off = ((seq - 1) % self.nslots) * self.stride
        pos = off + SLOT_HEADER.size
        for chunk in chunks:
            n = memoryview(chunk).nbytes
            if pos + n > off + self.stride:
                raise ValueError(f"payload larger than the slot capacity ({self.capacity} bytes)")
            self.buf[pos : pos + n] = memoryview(chunk).cast("B")
            pos += n
        size = pos - off - SLOT_HEADER.size
        SLOT_HEADER.pack_into(self.buf, off, 0, kind, size)  # seq 0 while incomplete
        _SEQ.pack_into(self.buf, off, seq)  # then publish
        self.seq = seq
        return seq

    def slot_of(self, seq: int) -> int:
        """The slot index that item ``seq`` goes to."""
        return (seq - 1) % self.nslots


class RingReader:
    """Reads items of a ring buffer in order; :meth:`poll` returns the next one if it is
    complete, else None."""

    def __init__(self, buf: memoryview, nslots: int, capacity: int) -> None:
        self.buf = buf
        self.nslots = nslots
        self.stride = SLOT_HEADER.size + capacity
        self.seq = 0  # last read

    def poll(self) -> tuple[int, memoryview] | None:
        """``(kind, payload)`` of the next item, or None while it is not written yet.

        The payload is a view into the ring: use it before the writer can reuse the slot
        (that is, before this reader's process lets the execution complete).
        """
        want = self.seq + 1
        off = ((want - 1) % self.nslots) * self.stride
        seq, kind, size = SLOT_HEADER.unpack_from(self.buf, off)
        if seq != want:
            if seq > want:
                raise ProtocolError(
                    f"slot overwritten: waited for item {want}, found item {seq} "
                    "(more executions in flight than the channel holds)"
                )
            return None
        self.seq = want
        start = off + SLOT_HEADER.size
        return kind, self.buf[start : start + size]
