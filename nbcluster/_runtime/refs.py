"""``ObjectRef``: a future for a value owned by the process that created it.

A ref counts itself in its process's core client while it is alive; the owner frees the
value when no ref remains anywhere (DESIGN §1, ownership).
"""

from __future__ import annotations

import _thread
import asyncio
import time
import types
import warnings
from typing import TYPE_CHECKING, Any

from nbcluster._runtime import client_slot, display
from nbcluster._runtime.serialization import note_contained_ref

if TYPE_CHECKING:
    from nbcluster._runtime.core.client import CoreClient

__all__ = ["OBJECT_ID_SIZE", "ObjectRef", "get_async"]


#: Length of an object id: the 16-byte id of the task that makes it and a 4-byte index.
OBJECT_ID_SIZE = 20


class ObjectRef:
    """A reference to a (possibly not yet computed) value in the cluster.

    Get the value with ``nbcluster.get(ref)``; pass the ref to other tasks to hand them
    the value without fetching it here. Refs come from ``.remote()`` and
    ``nbcluster.put``; ``ObjectRef[T]`` works in type hints.

    ``ObjectRef(id_bytes)`` (and :meth:`from_hex` / :meth:`from_binary`) rebuild a ref
    from its id, for ids passed out of band. As in Ray this is an anti-pattern: the
    cluster cannot count such a ref. In a process that still holds a ref to the object
    the rebuilt ref is a full one; elsewhere pass ``owner_address=`` (the original ref's
    :attr:`owner_address`), or ``nbcluster.get`` on it raises ``ObjectLostError``; a
    warning says so when the ref is made.
    """

    __slots__ = ("_id", "_owner", "_client", "__weakref__")

    _id: bytes
    _owner: str
    _client: CoreClient | None

    def __init__(self, id: bytes, owner_address: str = "") -> None:  # noqa: A002 - Ray's name
        if isinstance(id, bytearray | memoryview):
            id = bytes(id)  # noqa: A001
        if not isinstance(id, bytes):
            raise TypeError(
                f"ObjectRef(id) takes the id's bytes (ref.binary()), not a {type(id).__name__}; "
                "use ObjectRef.from_hex(text) for a hex string"
            )
        if len(id) != OBJECT_ID_SIZE:
            raise ValueError(
                f"an object id is {OBJECT_ID_SIZE} bytes, got {len(id)}: pass ref.binary() "
                "of an nbcluster ObjectRef"
            )
        client = client_slot.current_client()
        owner, owned = _known_owner(client, id)
        owner = owner or owner_address
        self._id = id
        self._owner = owner
        if not owner:
            warnings.warn(
                f"ObjectRef({id.hex()}) was made from an id this process holds no ref to, so "
                "its owner is unknown and nbcluster.get() on it will fail; pass the ObjectRef "
                "itself (as a task argument, or pickled), or ObjectRef(id, owner_address=...)",
                UserWarning,
                stacklevel=2,
            )
            self._client = None  # not counted: the owner cannot be told
            return
        self._client = client
        if client is not None:
            client.add_local_ref(id, owner, not owned)

    def __class_getitem__(cls, item: Any) -> Any:
        """``ObjectRef[int]`` in type hints."""
        return types.GenericAlias(cls, item)

    @classmethod
    def from_binary(cls, id: bytes, owner_address: str = "") -> ObjectRef[Any]:  # noqa: A002
        """The ref of an object id given as bytes (see the class notes on out-of-band ids)."""
        return cls(id, owner_address)

    @classmethod
    def from_hex(cls, hex_id: str, owner_address: str = "") -> ObjectRef[Any]:
        """The ref of an object id given as hex (``ref.hex()``); see the class notes."""
        try:
            raw = bytes.fromhex(hex_id)
        except (TypeError, ValueError):
            raise ValueError(
                f"ObjectRef.from_hex() takes the text of ref.hex(), got {hex_id!r}"
            ) from None
        return cls(raw, owner_address)

    @classmethod
    def nil(cls) -> ObjectRef[Any]:
        """A ref to no object (all-zero id); ``is_nil()`` is true for it."""
        ref = object.__new__(cls)
        ref._id = bytes(OBJECT_ID_SIZE)
        ref._owner = ""
        ref._client = None
        return ref

    def is_nil(self) -> bool:
        """True for :meth:`nil`."""
        return not any(self._id)

    @classmethod
    def _new(
        cls, object_id: bytes, owner: str, client: CoreClient | None, *, borrowed: bool = False
    ) -> ObjectRef:
        ref = cls._adopt(object_id, owner, client)
        if client is not None:
            client.add_local_ref(object_id, owner, borrowed)
        return ref

    @classmethod
    def _adopt(cls, object_id: bytes, owner: str, client: CoreClient | None) -> ObjectRef:
        """The ref of a new owned object whose entry counts it already (a call's returns:
        ``OwnershipTable.create_owned(..., refs=1)``)."""
        ref = object.__new__(cls)
        ref._id = object_id
        ref._owner = owner
        ref._client = client
        return ref

    def binary(self) -> bytes:
        """The raw 20-byte object id."""
        return self._id

    def hex(self) -> str:
        """The object id as hex."""
        return self._id.hex()

    def task_id(self) -> bytes:
        """Id of the task that produces this object."""
        return self._id[:16]

    @property
    def owner_address(self) -> str:
        """Address of the process that owns this object."""
        return self._owner

    def __hash__(self) -> int:
        return hash(self._id)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ObjectRef) and other._id == self._id

    def __repr__(self) -> str:
        return f"ObjectRef({self._id.hex()})"

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, str]:
        """Jupyter display: pending / ready / failed, size and where (text and HTML)."""
        return display.mimebundle(self, repr(self))

    def _repr_html_(self) -> str | None:
        """HTML display: pending / ready / failed, size and where."""
        return display.html(self)

    def __reduce__(self) -> tuple[Any, ...]:
        note_contained_ref(self)
        return (_rebuild_ref, (self._id, self._owner))

    def __del__(self) -> None:
        client = getattr(self, "_client", None)  # None too when __init__ refused the id
        if client is not None:
            try:  # noqa: SIM105 - contextlib may be gone at interpreter shutdown
                client.remove_local_ref(self._id)
            except KeyboardInterrupt:
                # Ctrl-C landed in this finalizer, where Python would print and drop it
                # ("Exception ignored in"): deliver it to the main thread again, a moment
                # later (once this finalizer has returned). A bare thread: starting a
                # threading.Timer waits here for it to run, and on a loaded machine the
                # interrupt could come back while this finalizer still waits, and be lost.
                _thread.start_new_thread(_interrupt_main_soon, ())
            except Exception:  # noqa: BLE001 - never raise from __del__
                pass

    def __await__(self) -> Any:
        return get_async(self).__await__()

    def future(self) -> Any:
        """A ``concurrent.futures.Future`` that completes with the value."""
        client = client_slot.require_client()
        return client.as_future(self)


async def get_async(ref: ObjectRef) -> Any:
    """Await a ref's value from asyncio code (``await ref`` uses this)."""
    client = client_slot.require_client()
    getter = getattr(client, "get_async", None)
    if getter is not None:
        return await getter(ref)
    return await asyncio.wrap_future(client.as_future(ref))


def _interrupt_main_soon() -> None:
    """Raise ``KeyboardInterrupt`` in the main thread after a moment (a finalizer's
    interrupt, delivered again once the finalizer has returned)."""
    time.sleep(0.05)
    _thread.interrupt_main()


def _known_owner(client: Any, object_id: bytes) -> tuple[str, bool]:
    """(owner address, owned here) of an object this process holds a ref to, else ("", False)."""
    if client is None:
        return "", False
    table = getattr(client, "table", None)
    if table is None:  # a Ray-client driver: its refs are counted by the proxy
        counts = getattr(client, "counts", {})
        return (client_slot.CLIENT_OWNER, False) if object_id in counts else ("", False)
    entry = table.get(object_id)
    return (entry.owner, entry.owned) if entry is not None else ("", False)


def _rebuild_ref(object_id: bytes, owner: str) -> ObjectRef:
    if owner == client_slot.CLIENT_OWNER and client_slot.client_ref_resolver is not None:
        real = client_slot.client_ref_resolver(object_id)  # in the proxy: the session's ref
        if real is not None:
            return real  # type: ignore[no-any-return]
    client = client_slot.current_client()
    borrowed = client is None or owner != client.address
    return ObjectRef._new(object_id, owner, client, borrowed=borrowed)
