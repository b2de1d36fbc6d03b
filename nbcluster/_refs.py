"""``ObjectRef``: a future for a value owned by the process that created it.

A ref counts itself in its process's core client while it is alive; the owner frees the
value when no ref remains anywhere (DESIGN §1, ownership).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from nbcluster._runtime import context
from nbcluster._runtime.serialization import note_contained_ref

if TYPE_CHECKING:
    from nbcluster._runtime.core.client import CoreClient

__all__ = ["ObjectRef"]


class ObjectRef:
    """A reference to a (possibly not yet computed) value in the cluster.

    Get the value with ``nbcluster.get(ref)``; pass the ref to other tasks to hand them
    the value without fetching it here. Refs are created by ``.remote()`` and
    ``nbcluster.put``, never by calling this class.
    """

    __slots__ = ("_id", "_owner", "_client", "__weakref__")

    _id: bytes
    _owner: str
    _client: CoreClient | None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise TypeError(
            "ObjectRef cannot be created directly; it comes from f.remote(...) or nbcluster.put(value)"
        )

    @classmethod
    def _new(
        cls, object_id: bytes, owner: str, client: CoreClient | None, *, borrowed: bool = False
    ) -> ObjectRef:
        ref = object.__new__(cls)
        ref._id = object_id
        ref._owner = owner
        ref._client = client
        if client is not None:
            client.add_local_ref(object_id, owner, borrowed)
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
        from nbcluster.jupyter.display import object_ref_mimebundle

        return object_ref_mimebundle(self)

    def _repr_html_(self) -> str:
        """HTML display: pending / ready / failed, size and where."""
        from nbcluster.jupyter.display import object_ref_html

        return object_ref_html(self)

    def __reduce__(self) -> tuple[Any, ...]:
        note_contained_ref(self)
        return (_rebuild_ref, (self._id, self._owner))

    def __del__(self) -> None:
        client = self._client
        if client is not None:
            try:  # noqa: SIM105 - contextlib may be gone at interpreter shutdown
                client.remove_local_ref(self._id)
            except Exception:  # noqa: BLE001 - never raise from __del__
                pass

    def __await__(self) -> Any:
        from nbcluster import _api

        return _api.get_async(self).__await__()

    def future(self) -> Any:
        """A ``concurrent.futures.Future`` that completes with the value."""
        client = context.require_client()
        return client.as_future(self)


def _rebuild_ref(object_id: bytes, owner: str) -> ObjectRef:
    if owner == context.CLIENT_OWNER and context.client_ref_resolver is not None:
        real = context.client_ref_resolver(object_id)  # in the proxy: the session's ref
        if real is not None:
            return real  # type: ignore[no-any-return]
    client = context.current_client()
    borrowed = client is None or owner != client.address
    return ObjectRef._new(object_id, owner, client, borrowed=borrowed)
