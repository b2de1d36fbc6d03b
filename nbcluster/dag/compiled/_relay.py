"""Channels between hosts: items travel as actor calls (``__ray_call__``), not through
shared memory. Used for a channel whose writer and readers cannot all see the same
shared-memory directory.

To an actor reader the writer sends each item with a call that runs in the reader's
process and puts it in an inbox, which the reader's loop takes from in sequence order
(calls may run concurrently on a threaded actor, so the order is restored from the
sequence numbers). The driver cannot be called, so an item for the driver waits in an
outbox in the writer's process, and the driver fetches it with a call.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

from nbcluster import _api as core
from nbcluster.dag.compiled._errors import ChannelTimeoutError
from nbcluster.dag.compiled._ring import decode, encode
from nbcluster.dag.compiled._shm import ChannelClosed

__all__ = [
    "RelayDriverReader",
    "RelayReader",
    "RelayWriter",
    "relay_collect",
    "relay_deliver",
]

_CLOSED = -1
_FETCH_WAIT = 1.0  # seconds a driver fetch waits in an async writer before returning empty
_MIN_BACKOFF = 0.0005  # seconds between fetches from a writer that answers at once...
_MAX_BACKOFF = 0.02  # ...doubling up to this while nothing comes

_INBOXES: dict[tuple[str, int], _Box] = {}
_OUTBOXES: dict[tuple[str, int], _Box] = {}
_registry_lock = threading.Lock()


class _Box:
    """Items by sequence number, with a condition to wait on; closed after ``_CLOSED``."""

    def __init__(self) -> None:
        self.items: dict[int, tuple[int, bytes]] = {}
        self.closed_at: int | None = None
        self.cond = threading.Condition()

    def put(self, seq: int, kind: int, data: bytes) -> None:
        with self.cond:
            if kind == _CLOSED:
                self.closed_at = seq
            else:
                self.items[seq] = (kind, data)
            self.cond.notify_all()

    def take(self, seq: int, timeout: float | None) -> tuple[int, bytes] | None:
        """Item ``seq`` once it is there; None on timeout; ChannelClosed once closed."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self.cond:
            while seq not in self.items:
                if self.closed_at is not None and seq >= self.closed_at:
                    raise ChannelClosed("the channel was closed by its writer")
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return None
                self.cond.wait(remaining)
            return self.items.pop(seq)

    def after(self, seq: int, timeout: float) -> tuple[list[tuple[int, int, bytes]], bool]:
        """Drop items up to ``seq``; wait up to ``timeout`` for later ones; return them
        and whether the box is closed after them."""
        deadline = time.monotonic() + timeout
        with self.cond:
            for s in [s for s in self.items if s <= seq]:
                del self.items[s]
            while not self.items and self.closed_at is None:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self.cond.wait(remaining)
            items = sorted((s, k, d) for s, (k, d) in self.items.items())
            return items, self.closed_at is not None


def _box(registry: dict[tuple[str, int], _Box], gid: str, cid: int) -> _Box:
    with _registry_lock:
        box = registry.get((gid, cid))
        if box is None:
            box = registry[(gid, cid)] = _Box()
        return box


def relay_deliver(instance: object, gid: str, cid: int, seq: int, kind: int, data: bytes) -> None:
    """Runs in a reader actor (``__ray_call__``): put an item in its inbox."""
    _box(_INBOXES, gid, cid).put(seq, kind, data)


def relay_collect(instance: object, gid: str, cid: int, after: int, wait: float) -> Any:
    """Runs in a writer actor (``__ray_call__``): the driver's items after ``after``.

    On an async actor this waits up to ``wait`` seconds for an item, off the event loop
    (the call returns an awaitable). Elsewhere it answers at once: the call may hold the
    actor's only execution thread, which the calls delivering items to the actor need.
    """
    box = _box(_OUTBOXES, gid, cid)
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return box.after(after, 0)
    return loop.run_in_executor(None, box.after, after, wait)


def forget(gid: str) -> None:
    """Drop the boxes of graph ``gid`` in this process."""
    with _registry_lock:
        for registry in (_INBOXES, _OUTBOXES):
            for key in [k for k in registry if k[0] == gid]:
                del registry[key]


class RelayWriter:
    """Writes channel ``cid`` to actor readers (by call) and to the driver (outbox)."""

    def __init__(self, gid: str, cid: int, readers: list[Any], to_driver: bool) -> None:
        self.gid = gid
        self.cid = cid
        self.readers = readers  # handles of the actor readers
        self.outbox = _box(_OUTBOXES, gid, cid) if to_driver else None
        self.seq = 0

    def open_wakeups(self) -> None:
        """Nothing to open (the set-up of shared-memory writers)."""

    def _send(self, kind: int, data: bytes) -> None:
        self.seq += 1
        for handle in self.readers:
            handle.__ray_call__.remote(relay_deliver, self.gid, self.cid, self.seq, kind, data)
        if self.outbox is not None:
            self.outbox.put(self.seq, kind, data)

    def write(self, kind: int, value: Any) -> None:
        """Send the next item."""
        self._send(kind, b"".join(bytes(memoryview(c).cast("B")) for c in encode(value)))

    def close(self) -> None:
        """Tell the readers that no item follows."""
        self._send(_CLOSED, b"")


class RelayReader:
    """An actor's reader of a relayed channel: takes items from its inbox in order."""

    def __init__(self, gid: str, cid: int) -> None:
        self.cid = cid
        self.box = _box(_INBOXES, gid, cid)
        self.seq = 0

    def start(self) -> None:
        """Nothing to do (the set-up of shared-memory readers)."""

    def read(self, timeout: float | None = None) -> tuple[int, Any]:
        """The next item (blocks; :class:`ChannelClosed` after the writer closed)."""
        item = self.box.take(self.seq + 1, timeout)
        if item is None:
            raise ChannelTimeoutError(f"no item on channel {self.cid} within {timeout}s")
        self.seq += 1
        kind, data = item
        return kind, decode(memoryview(data))

    def close(self) -> None:
        """Nothing to release."""


class RelayDriverReader:
    """The driver's reader of a relayed channel: fetches items from the writer's outbox."""

    def __init__(self, gid: str, cid: int, writer: Any) -> None:
        self.gid = gid
        self.cid = cid
        self.writer = writer
        self.seq = 0
        self.buffer: dict[int, tuple[int, bytes]] = {}
        self.closed = False
        self.backoff = _MIN_BACKOFF

    def start(self) -> None:
        """Nothing to do."""

    def read(self, timeout: float | None = None) -> tuple[int, Any]:
        """The next item; :class:`ChannelTimeoutError` after ``timeout`` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        want = self.seq + 1
        while want not in self.buffer:
            if self.closed:
                raise ChannelClosed(f"channel {self.cid} was closed by its writer")
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                raise ChannelTimeoutError(
                    f"no result within {timeout}s: the execution is still running. Get "
                    "it again later, or give a longer timeout (-1 waits forever)."
                )
            wait = _FETCH_WAIT if remaining is None else min(_FETCH_WAIT, remaining)
            ref = self.writer.__ray_call__.remote(relay_collect, self.gid, self.cid, self.seq, wait)
            try:
                items, closed = core.get(ref, timeout=wait + 30)
            except Exception as e:  # noqa: BLE001 - the writer is gone: the channel is closed
                raise ChannelClosed(f"channel {self.cid}: its writer is unreachable ({e})") from e
            for s, k, d in items:
                self.buffer[s] = (k, d)
            self.closed = closed
            if items or closed:
                self.backoff = _MIN_BACKOFF
            else:  # a writer that answers at once: poll again a little later
                time.sleep(self.backoff if remaining is None else min(self.backoff, remaining))
                self.backoff = min(self.backoff * 2, _MAX_BACKOFF)
        kind, data = self.buffer.pop(want)
        self.seq = want
        return kind, decode(memoryview(data))

    def close(self) -> None:
        """Nothing to release."""
