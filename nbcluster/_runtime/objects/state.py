"""Accounting of one node's object store: a state machine with no I/O.

Events in (``create``, ``seal``, ``access``, ``free``, ``mark_spilled``, ...), decisions
out (write it / spill these first / evict these / it does not fit, and why). The node
manager turns decisions into file operations with ``objects.store`` and reports back.

Life of an object::

    create ──▶ CREATING ──seal──▶ SEALED ──(chosen to make room)──▶ SPILLING
                                    ▲                                   │ mark_spilled
                       mark_restored│                                   ▼
                                RESTORING ◀──────access (restore)─── SPILLED

Memory accounting: ``used`` counts every object whose bytes are, or are about to be, in
memory (CREATING, SEALED, SPILLING, RESTORING). Objects chosen for spilling still count
until ``mark_spilled``, but room is promised against them at once, so two creations never
spill the same bytes. The invariant is ``used - (bytes being spilled) <= capacity``.

Making room, cheapest first: *evict* secondary copies (objects created with
``primary=False``, for example copies pulled from another node; the primary copy lives
elsewhere), least recently used first; then, if spilling is enabled, *spill* primary
objects, least recently used first. Objects still being written, spilled or restored are
never chosen. ``access`` marks an object as recently used.

Objects that nobody references any more are freed by their owner (``free``); this module
does not guess reference counts.

Frees can cross file operations in flight: when ``seal``, ``mark_spilled`` or
``mark_restored`` returns ``False``, the object was freed meanwhile and the caller deletes
what it just wrote.
"""

from __future__ import annotations

import enum
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

__all__ = ["AccessDecision", "Decision", "Location", "StoreState", "StoreStats"]


class Location(enum.StrEnum):
    """Where an object's bytes are. Compares equal to its value (``"memory"``, ``"spilled"``)."""

    MEMORY = "memory"
    SPILLED = "spilled"


class _Phase(enum.Enum):
    CREATING = "creating"
    SEALED = "sealed"
    SPILLING = "spilling"
    SPILLED = "spilled"
    RESTORING = "restoring"


@dataclass(slots=True)
class _Entry:
    size: int
    owner: str
    primary: bool
    phase: _Phase


@dataclass(frozen=True, slots=True)
class ObjectListing:
    """One store entry as the state API lists it (``phase``: creating, sealed, spilled...)."""

    object_id: bytes
    size: int
    owner: str
    phase: str
    primary: bool


@dataclass(frozen=True, slots=True)
class Decision:
    """What to do about a ``create``.

    ``status`` is ``"ok"`` (write it, after spilling ``spill`` and deleting ``evict``),
    ``"exists"`` (the object is already stored or being stored: do not write it again)
    or ``"full"`` (it cannot fit: raise ``ObjectStoreFullError(message)``).
    """

    status: Literal["ok", "exists", "full"]
    spill: tuple[bytes, ...] = ()
    evict: tuple[bytes, ...] = ()
    message: str = ""

    @property
    def ok(self) -> bool:
        """True unless the object does not fit."""
        return self.status != "full"


@dataclass(frozen=True, slots=True)
class AccessDecision:
    """What to do before reading an object.

    ``status`` is ``"ok"`` (it is in memory: read it), ``"restore"`` (spill ``spill`` and
    delete ``evict``, restore it, then ``mark_restored``), ``"pending"`` (it is being
    written, spilled or restored right now: ask again shortly) or ``"full"`` (it is spilled
    and there is no room to bring it back; ``message`` says why).
    """

    status: Literal["ok", "restore", "pending", "full"]
    size: int
    spill: tuple[bytes, ...] = ()
    evict: tuple[bytes, ...] = ()
    message: str = ""

    @property
    def restore(self) -> bool:
        """True if the object must be restored from spill before it can be read."""
        return self.status == "restore"

    @property
    def ok(self) -> bool:
        """True if the object can be read now, or after the restore this decision asks for."""
        return self.status in ("ok", "restore")


@dataclass(frozen=True, slots=True)
class StoreStats:
    """A snapshot of the store's accounting. ``*_total`` and ``restored_*``/``evicted_*``
    count since the store started; the rest describe the present."""

    capacity: int
    used: int
    num_objects: int
    spilled_bytes: int
    num_spilled: int
    spilled_bytes_total: int
    num_spilled_total: int
    restored_bytes: int
    num_restored: int
    evicted_bytes: int
    num_evicted: int
    spilling_enabled: bool


class StoreState:
    """The accounting of one node's object store (see the module docstring)."""

    def __init__(self, capacity: int, spilling_enabled: bool = True) -> None:
        if capacity <= 0:
            raise ValueError(f"capacity must be positive, got {capacity}")
        self.capacity = capacity
        self.spilling_enabled = spilling_enabled
        self._entries: dict[bytes, _Entry] = {}
        # SEALED objects in memory, least recently used first: the candidates for room.
        self._lru: OrderedDict[bytes, None] = OrderedDict()
        self._used = 0
        self._leaving = 0  # bytes of SPILLING objects
        self._spilled = 0  # bytes of SPILLED and RESTORING objects (their spill files)
        self._num_spilled = 0
        self._spilled_total = 0
        self._num_spilled_total = 0
        self._restored_total = 0
        self._num_restored = 0
        self._evicted_total = 0
        self._num_evicted = 0

    # -- events ------------------------------------------------------------------------------
    def create(self, object_id: bytes, size: int, owner: str, *, primary: bool = True) -> Decision:
        """Reserve room for a new object of ``size`` bytes owned by ``owner``.

        ``primary=False`` marks a secondary copy, which may later be evicted instead of
        spilled.
        """
        if size < 0:
            raise ValueError(f"size must be >= 0, got {size}")
        if object_id in self._entries:
            return Decision("exists")
        if size > self.capacity:
            return Decision("full", message=self._full_message(size, "too big"))
        room = self._make_room(size)
        if room is None:
            reason = "spilling disabled" if not self.spilling_enabled else "busy"
            return Decision("full", message=self._full_message(size, reason))
        evict, spill = room
        self._apply_room(evict, spill)
        self._entries[object_id] = _Entry(size, owner, primary, _Phase.CREATING)
        self._used += size
        return Decision("ok", spill=spill, evict=evict)

    def seal(self, object_id: bytes) -> bool:
        """The object is fully written. ``False`` if it was freed meanwhile (delete it)."""
        entry = self._entries.get(object_id)
        if entry is None:
            return False
        if entry.phase is _Phase.CREATING:
            entry.phase = _Phase.SEALED
            self._lru[object_id] = None
        return True

    def access(self, object_id: bytes) -> AccessDecision | None:
        """Someone is about to read the object; ``None`` if this store does not have it."""
        entry = self._entries.get(object_id)
        if entry is None:
            return None
        phase = entry.phase
        if phase is _Phase.SEALED:
            self._lru.move_to_end(object_id)
            return AccessDecision("ok", entry.size)
        if phase is not _Phase.SPILLED:
            return AccessDecision("pending", entry.size)
        size = entry.size
        if size > self.capacity:  # only possible if the capacity was lowered
            return AccessDecision("full", size, message=self._full_message(size, "too big"))
        room = self._make_room(size)
        if room is None:
            reason = "spilling disabled" if not self.spilling_enabled else "busy"
            return AccessDecision("full", size, message=self._full_message(size, reason))
        evict, spill = room
        self._apply_room(evict, spill)
        entry.phase = _Phase.RESTORING
        self._used += size
        return AccessDecision("restore", size, spill=spill, evict=evict)

    def free(self, object_ids: Iterable[bytes]) -> list[tuple[bytes, Location]]:
        """Forget these objects; return what to delete and where. Unknown ids are ignored.

        An object freed while being spilled is reported in memory (and ``mark_spilled``
        then returns ``False``); one freed while being restored is reported spilled (and
        ``mark_restored`` then returns ``False``).
        """
        out: list[tuple[bytes, Location]] = []
        for object_id in object_ids:
            entry = self._entries.pop(object_id, None)
            if entry is None:
                continue
            phase = entry.phase
            self._lru.pop(object_id, None)
            if phase is _Phase.SPILLED:
                self._spilled -= entry.size
                self._num_spilled -= 1
                out.append((object_id, Location.SPILLED))
                continue
            self._used -= entry.size
            if phase is _Phase.SPILLING:
                self._leaving -= entry.size
            if phase is _Phase.RESTORING:
                self._spilled -= entry.size
                self._num_spilled -= 1
                out.append((object_id, Location.SPILLED))
            else:
                out.append((object_id, Location.MEMORY))
        return out

    def mark_spilled(self, object_id: bytes) -> bool:
        """A spill chosen by ``create``/``access`` finished. ``False``: freed meanwhile."""
        entry = self._entries.get(object_id)
        if entry is None:
            return False
        self._expect(entry, _Phase.SPILLING, object_id)
        entry.phase = _Phase.SPILLED
        self._used -= entry.size
        self._leaving -= entry.size
        self._spilled += entry.size
        self._num_spilled += 1
        self._spilled_total += entry.size
        self._num_spilled_total += 1
        return True

    def cancel_spill(self, object_id: bytes) -> bool:
        """A spill failed (disk full, ...): the object stays in memory. ``False``: freed."""
        entry = self._entries.get(object_id)
        if entry is None:
            return False
        self._expect(entry, _Phase.SPILLING, object_id)
        entry.phase = _Phase.SEALED
        self._leaving -= entry.size
        self._lru[object_id] = None
        self._lru.move_to_end(object_id, last=False)
        return True

    def mark_restored(self, object_id: bytes) -> bool:
        """A restore asked for by ``access`` finished. ``False``: freed meanwhile."""
        entry = self._entries.get(object_id)
        if entry is None:
            return False
        self._expect(entry, _Phase.RESTORING, object_id)
        entry.phase = _Phase.SEALED
        self._spilled -= entry.size
        self._num_spilled -= 1
        self._restored_total += entry.size
        self._num_restored += 1
        self._lru[object_id] = None
        return True

    def cancel_restore(self, object_id: bytes) -> bool:
        """A restore failed: the object stays spilled. ``False``: freed meanwhile."""
        entry = self._entries.get(object_id)
        if entry is None:
            return False
        self._expect(entry, _Phase.RESTORING, object_id)
        entry.phase = _Phase.SPILLED
        self._used -= entry.size
        return True

    # -- queries -----------------------------------------------------------------------------
    def __contains__(self, object_id: object) -> bool:
        return object_id in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def location(self, object_id: bytes) -> Location | None:
        """Where the object's bytes are now (a spill in progress still counts as memory)."""
        entry = self._entries.get(object_id)
        if entry is None:
            return None
        if entry.phase in (_Phase.SPILLED, _Phase.RESTORING):
            return Location.SPILLED
        return Location.MEMORY

    def largest(self, n: int = 10) -> list[tuple[bytes, int, str, Location]]:
        """The ``n`` largest objects as ``(id, size, owner, location)``."""
        items = sorted(self._entries.items(), key=lambda kv: kv[1].size, reverse=True)[:n]
        return [(oid, e.size, e.owner, self.location(oid)) for oid, e in items]  # type: ignore[misc]

    def listing(self) -> list[ObjectListing]:
        """Every object the store accounts for, with its size, owner, phase and primary flag."""
        return [
            ObjectListing(oid, e.size, e.owner, e.phase.value, e.primary)
            for oid, e in list(self._entries.items())
        ]

    def primary_totals(self) -> tuple[int, int]:
        """(count, bytes) of the objects whose primary copy is here."""
        n = size = 0
        for e in list(self._entries.values()):
            if e.primary:
                n += 1
                size += e.size
        return n, size

    def owned_by(self, owner: str) -> list[bytes]:
        """Every object ``owner`` owns here (primary or copy, in memory or spilled)."""
        return [oid for oid, e in self._entries.items() if e.owner == owner]

    def object_ids(self) -> list[bytes]:
        """Ids of every object the store accounts for (in memory, spilled, or in flight)."""
        return list(self._entries)

    def stats(self) -> StoreStats:
        """Current accounting and totals since start."""
        in_memory = sum(
            1 for e in self._entries.values() if e.phase not in (_Phase.SPILLED, _Phase.RESTORING)
        )
        return StoreStats(
            capacity=self.capacity,
            used=self._used,
            num_objects=in_memory,
            spilled_bytes=self._spilled,
            num_spilled=self._num_spilled,
            spilled_bytes_total=self._spilled_total,
            num_spilled_total=self._num_spilled_total,
            restored_bytes=self._restored_total,
            num_restored=self._num_restored,
            evicted_bytes=self._evicted_total,
            num_evicted=self._num_evicted,
            spilling_enabled=self.spilling_enabled,
        )

    # -- internals ---------------------------------------------------------------------------
    def _make_room(self, size: int) -> tuple[tuple[bytes, ...], tuple[bytes, ...]] | None:
        """Pick what to evict and spill so ``size`` more bytes fit; ``None`` if impossible."""
        need = size - (self.capacity - (self._used - self._leaving))
        if need <= 0:
            return (), ()
        evict: list[bytes] = []
        for object_id in self._lru:
            entry = self._entries[object_id]
            if not entry.primary:
                evict.append(object_id)
                need -= entry.size
                if need <= 0:
                    return tuple(evict), ()
        if not self.spilling_enabled:
            return None
        spill: list[bytes] = []
        for object_id in self._lru:
            entry = self._entries[object_id]
            if entry.primary:
                spill.append(object_id)
                need -= entry.size
                if need <= 0:
                    return tuple(evict), tuple(spill)
        return None

    def _apply_room(self, evict: tuple[bytes, ...], spill: tuple[bytes, ...]) -> None:
        for object_id in evict:
            entry = self._entries.pop(object_id)
            del self._lru[object_id]
            self._used -= entry.size
            self._evicted_total += entry.size
            self._num_evicted += 1
        for object_id in spill:
            entry = self._entries[object_id]
            del self._lru[object_id]
            entry.phase = _Phase.SPILLING
            self._leaving += entry.size

    def _expect(self, entry: _Entry, phase: _Phase, object_id: bytes) -> None:
        if entry.phase is not phase:
            raise ValueError(f"object {object_id.hex()} is {entry.phase.value}, not {phase.value}")

    def _full_message(self, size: int, reason: str) -> str:
        in_memory = [
            e for e in self._entries.values() if e.phase not in (_Phase.SPILLED, _Phase.RESTORING)
        ]
        used = sum(e.size for e in in_memory)
        head = f"object of {_fmt_bytes(size)} does not fit in the {_fmt_bytes(self.capacity)} store"
        if reason == "too big":
            return (
                f"{head} (it is larger than the whole store); raise object_store_memory, "
                "or split the value into smaller objects"
            )
        usage = f"{_fmt_bytes(used)} used by {len(in_memory)} objects"
        if reason == "spilling disabled":
            return (
                f"{head} ({usage}); free references with `del`, raise object_store_memory, "
                "or enable spilling"
            )
        busy = sum(e.size for e in in_memory if e.phase is not _Phase.SEALED)
        return (
            f"{head} ({usage}, {_fmt_bytes(busy)} of it being written, spilled or restored); "
            "wait for running tasks, free references with `del`, or raise object_store_memory"
        )


def _fmt_bytes(n: float) -> str:
    """``1536`` -> ``"1.5 KiB"``; MiB and GiB with one decimal."""
    if n < 1024:
        return f"{int(n)} B"
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        n /= 1024
        if n < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}"
    raise AssertionError("unreachable")
