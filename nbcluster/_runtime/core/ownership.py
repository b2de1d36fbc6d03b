"""The ownership table: what this process knows about each object it owns or borrows.

Pure bookkeeping with no I/O, shared by the driver and workers. It is touched from user
threads (refs created and dropped, ``get``) and from the I/O loop (results arriving), so
every public method takes the table's lock. Methods return what the caller must do next
(objects to free in a store, borrows to release), never do it themselves.
"""

from __future__ import annotations

import _thread
import contextlib
import threading
from collections.abc import Callable, Iterable
from typing import Any

PENDING = 0
READY = 1


class Entry:
    """One object: its state, where its bytes are, and who still needs it."""

    __slots__ = (
        "state",
        "owned",
        "owner",
        "data",
        "in_store",
        "size",
        "node_id",
        "node_address",
        "is_error",
        "exc",
        "local",
        "submitted",
        "borrowers",
        "escaped",
        "event",
        "waiters",
        "dependents",
        "task",
        "buffer",
        "registered",
        "fetching",
    )

    def __init__(self, owned: bool, owner: str) -> None:
        self.state = PENDING
        self.owned = owned
        self.owner = owner
        self.data: bytes | None = None
        self.in_store = False
        self.size = 0
        self.node_id = b""
        self.node_address = ""
        self.is_error = False
        self.exc: BaseException | None = None  # a local error to raise (lost, cancelled...)
        self.local = 0  # live ObjectRefs in this process
        self.submitted = 0  # pending tasks that take this object as an argument
        # other processes holding refs (owned objects); made on the first borrower, as most
        # objects never have one (one container fewer for the garbage collector per task)
        self.borrowers: set[str] | None = None
        self.escaped = False  # serialized into another object: pinned for the owner's lifetime
        self.event: threading.Event | None = None
        self.waiters: list[Any] | None = None  # Waiter objects of user threads
        self.dependents: list[Any] | None = None  # tasks waiting for this object (loop thread)
        self.task: Any = None  # the task that produces it (lineage, cancel)
        self.buffer: memoryview | None = None  # mapped store bytes, kept while the entry lives
        self.registered = False  # borrowed: the owner knows about us
        self.fetching = False  # borrowed: a status request to the owner is in flight

    def set_ready(
        self,
        *,
        data: bytes | None = None,
        in_store: bool = False,
        size: int = 0,
        node_id: bytes = b"",
        node_address: str = "",
        is_error: bool = False,
        exc: BaseException | None = None,
    ) -> None:
        """Record the value's location (caller holds the lock and wakes waiters after)."""
        self.data = data
        self.in_store = in_store
        self.size = size if size else (len(data) if data is not None else 0)
        self.node_id = node_id
        self.node_address = node_address
        self.is_error = is_error
        self.exc = exc
        self.state = READY

    def releasable(self) -> bool:
        """No ref, no pending task and no borrower needs it any more."""
        return self.local <= 0 and self.submitted <= 0 and not self.borrowers and not self.escaped

    def releasable_without(self, refs: int) -> bool:
        """:meth:`releasable` once ``refs`` local refs are gone."""
        return (
            self.local - refs <= 0
            and self.submitted <= 0
            and not self.borrowers
            and not self.escaped
        )


class Release:
    """What to do after a reference went away."""

    __slots__ = ("free_in_store", "unborrow")

    def __init__(self) -> None:
        self.free_in_store: list[tuple[str, bytes]] = []  # (node address, object id)
        self.unborrow: list[tuple[str, bytes]] = []  # (owner address, object id)

    def __bool__(self) -> bool:
        return bool(self.free_in_store or self.unborrow)


class OwnershipTable:
    """Objects owned or borrowed by this process, with their reference counts."""

    def __init__(self, address: str) -> None:
        self.address = address
        self.lock = threading.Lock()
        self.entries: dict[bytes, Entry] = {}
        #: Borrowed objects whose owners were not told of us yet (``take_unregistered``).
        self.unregistered: set[bytes] = set()

    def __len__(self) -> int:
        return len(self.entries)

    def get(self, object_id: bytes) -> Entry | None:
        """The entry of an object, if this process knows it."""
        return self.entries.get(object_id)

    def create_owned(self, object_id: bytes, task: Any = None, refs: int = 0) -> Entry:
        """A new object this process owns (a task return or a put), with ``refs`` local
        refs counted already (``ObjectRef._adopt``: one lock taken per new ref, not two)."""
        entry = Entry(True, self.address)
        entry.task = task
        entry.local = refs
        with self.lock:
            self.entries[object_id] = entry
        return entry

    def add_local_ref(self, object_id: bytes, owner: str, borrowed: bool) -> None:
        """A ref to ``object_id`` was created in this process."""
        with self.lock:
            entry = self.entries.get(object_id)
            if entry is None:
                entry = Entry(not borrowed and owner == self.address, owner)
                self.entries[object_id] = entry
                if not entry.owned:
                    self.unregistered.add(object_id)
            entry.local += 1

    def remove_local_ref(self, object_id: bytes) -> Release:
        """A ref was dropped; free the object when nothing else needs it."""
        out = Release()
        with self.lock:
            entry = self.entries.get(object_id)
            if entry is None:
                return out
            entry.local -= 1
            if entry.releasable():
                self._release(object_id, entry, out)
        return out

    def take_unregistered(self) -> list[bytes]:
        """The borrowed objects added since the last call whose owners were not told of us
        yet (each is handed out once: the caller registers them). A worker asks after
        every task; this keeps that look at the objects it gained, not at all it holds."""
        with self.lock:
            if not self.unregistered:
                return []
            entries = self.entries
            ids = [
                oid
                for oid in self.unregistered
                if (entry := entries.get(oid)) is not None and not entry.registered
            ]
            self.unregistered.clear()
        return ids

    def try_drop_local(self, object_id: bytes) -> bool:
        """:meth:`remove_local_ref` done at once, from any thread, when it needs no lock
        wait and no follow-up (the object is not in a store, not borrowed): True if done.
        False: nothing changed; queue it for the loop. (A ``__del__`` run by the garbage
        collector while this thread holds the lock gets False, never a deadlock.)"""
        if not self.lock.acquire(blocking=False):
            return False
        try:
            entry = self.entries.get(object_id)
            if entry is None:
                return True
            if entry.local <= 1 and entry.releasable_without(1):
                if entry.in_store or not entry.owned:
                    return False  # its release frees or unborrows: the loop does it
                del self.entries[object_id]
                entry.buffer = None
            entry.local -= 1
            return True
        finally:
            self.lock.release()

    def add_submitted(self, object_ids: Iterable[bytes]) -> None:
        """Pending tasks now take these objects as arguments."""
        with self.lock:
            for oid in object_ids:
                entry = self.entries.get(oid)
                if entry is not None:
                    entry.submitted += 1

    def remove_submitted(self, object_ids: Iterable[bytes]) -> Release:
        """Tasks that took these objects finished."""
        out = Release()
        if not object_ids:  # most tasks take no refs: no lock
            return out
        with self.lock:
            for oid in object_ids:
                entry = self.entries.get(oid)
                if entry is None:
                    continue
                entry.submitted -= 1
                if entry.releasable():
                    self._release(oid, entry, out)
        return out

    def update_borrowers(self, object_ids: Iterable[bytes], borrower: str, add: bool) -> Release:
        """Another process started or stopped borrowing objects we own."""
        out = Release()
        with self.lock:
            for oid in object_ids:
                entry = self.entries.get(oid)
                if entry is None or not entry.owned:
                    continue
                if add:
                    if entry.borrowers is None:
                        entry.borrowers = set()
                    entry.borrowers.add(borrower)
                elif entry.borrowers is not None:
                    entry.borrowers.discard(borrower)
                    if entry.releasable():
                        self._release(oid, entry, out)
        return out

    def mark_escaped(self, object_ids: Iterable[bytes]) -> None:
        """These owned objects were serialized into another value: keep them."""
        with self.lock:
            for oid in object_ids:
                entry = self.entries.get(oid)
                if entry is not None and entry.owned:
                    entry.escaped = True

    def drop_all(self) -> Release:
        """Forget everything (shutdown); return what to free."""
        out = Release()
        with self.lock:
            for oid, entry in list(self.entries.items()):
                self._release(oid, entry, out)
        return out

    def _release(self, oid: bytes, entry: Entry, out: Release) -> None:
        del self.entries[oid]
        entry.buffer = None
        if entry.owned:
            if entry.in_store and entry.node_address:
                out.free_in_store.append((entry.node_address, oid))
        elif entry.registered:
            out.unborrow.append((entry.owner, oid))
        else:
            self.unregistered.discard(oid)

    def wake(self, entry: Entry) -> None:
        """Wake user threads waiting on ``entry`` (call after ``set_ready``)."""
        if entry.event is not None:
            entry.event.set()
        waiters = entry.waiters
        if waiters:
            entry.waiters = None
            for w in waiters:
                w.hit()


class Flag:
    """A one-shot event for one waiting thread: a lock held until :meth:`set` (cheaper
    than ``threading.Event``, which builds a ``Condition`` and a lock per wait)."""

    __slots__ = ("_lock", "_set")

    def __init__(self) -> None:
        self._lock = _thread.allocate_lock()
        self._lock.acquire()
        self._set = False

    def set(self) -> None:
        """Wake the waiter (any thread; setting twice is harmless)."""
        if self._set:
            return
        self._set = True
        with contextlib.suppress(RuntimeError):  # a racing set() released it already
            self._lock.release()

    def is_set(self) -> bool:
        """True once set."""
        return self._set

    def wait(self, timeout: float) -> bool:
        """Wait at most ``timeout`` seconds for :meth:`set`; True when it is set."""
        if self._set:
            return True
        if self._lock.acquire(timeout=timeout):
            with contextlib.suppress(RuntimeError):  # two racing set() calls released it
                self._lock.release()
        return self._set


class Waiter:
    """Counts down as the objects it waits for become ready; set when enough are."""

    __slots__ = ("remaining", "event", "_lock")

    def __init__(self, needed: int) -> None:
        self.remaining = needed
        self.event = Flag()
        self._lock = _thread.allocate_lock()
        if needed <= 0:
            self.event.set()

    def hit(self) -> None:
        """One more object is ready."""
        with self._lock:
            self.remaining -= 1
            if self.remaining <= 0:
                self.event.set()

    def set(self) -> None:
        """Wake the waiter unconditionally."""
        self.event.set()


class CallbackWaiter:
    """Calls ``callback`` (on the waking thread, maybe under the table's lock: keep it to a
    hand-off such as ``loop.call_soon_threadsafe``) once the one object it waits for is
    ready. ``await ref`` uses it instead of a thread per await."""

    __slots__ = ("callback",)

    def __init__(self, callback: Callable[[], None]) -> None:
        self.callback = callback

    def hit(self) -> None:
        """The object is ready."""
        self.callback()

    def set(self) -> None:
        """Wake the waiter unconditionally."""
        self.callback()
