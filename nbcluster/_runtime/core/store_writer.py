"""Writing an object into the local node's store: reserve, write, seal (``put``, returns).

The node manager accounts for the store (``CreateObject`` reserves room, making it by
spilling or evicting; ``SealObject`` marks the object complete); the bytes go straight
from the caller's buffers into the object's file (``objects.store.write_object``).

Neither round trip waits on the copy's critical path when it need not:

* ``CreateObject`` is sent first and its reply awaited only when the write needs it: at
  once for a new file (writing it allocates the memory the node reserves), after the copy
  for a recycled file (its memory is allocated already). A 100 MB ``put`` into a pooled
  file thus pays the reservation's round trip inside its ~10 ms copy.
* A driver sends ``SealObject`` without waiting for its reply (a worker waits: it may
  exit right after its task's reply). The object is readable as soon as
  its file is published (readers map the file by name; the publish is atomic), so no
  reader needs the node to know first; the node's own uses of a sealed object (pulls from
  other nodes, ``GetObjectInfo``) wait for a pending object to be sealed, and a ``free``
  that overtakes the seal deletes the file when the seal arrives (``NodeObjects.seal``).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from nbcluster._runtime.objects import store as objstore
from nbcluster._runtime.protocol.errors import Peer, RpcFailure, to_exception
from nbcluster._runtime.protocol.rpc import pb

if TYPE_CHECKING:
    from nbcluster._runtime.serialization import SerializedValue

__all__ = ["StoreClient", "write_to_local_store"]

log = logging.getLogger(__name__)

_RPC_TIMEOUT_S = 60
#: Seal calls in flight (asyncio keeps only weak references to running tasks).
_sealing: set[asyncio.Task[Any]] = set()


class StoreClient(Protocol):
    """What writing needs of the core client (``CoreClient`` is one)."""

    #: The local node's store directory.
    store_dir: str
    #: The client's I/O loop (RPCs are made on it).
    loop: asyncio.AbstractEventLoop

    def node(self) -> Any:
        """The local node manager's stub."""
        ...


def write_to_local_store(
    client: StoreClient,
    object_id: bytes,
    sv: SerializedValue,
    owner_address: str,
    *,
    wait_for_seal: bool = False,
) -> None:
    """Reserve room in ``client``'s node store, write ``sv`` as ``object_id`` and seal it.

    Called from a user thread (never the client's I/O loop). Raises nbcluster's exception
    for a refused reservation (``ObjectStoreFullError``, ``OutOfDiskError``, ...); a
    retried task that finds its object already written keeps it. ``wait_for_seal``: wait
    for the node's reply to the seal (a worker may exit right after its reply, and the
    seal must not die with it); a driver does not wait.
    """
    size = sv.total_size
    create = _start(
        client,
        lambda: client.node().CreateObject(
            pb.CreateObjectRequest(object_id=object_id, size=size, owner_address=owner_address),
            timeout=_RPC_TIMEOUT_S,
        ),
    )

    def reserve() -> None:
        try:
            create.result(_RPC_TIMEOUT_S + 5)
        except RpcFailure as err:
            raise to_exception(err, Peer.NODE, "CreateObject") from None

    try:
        with contextlib.suppress(FileExistsError):  # a retried task wrote it already
            objstore.write_object(client.store_dir, object_id, sv, reserve=reserve)
        reserve()  # (returns at once if the write waited for it already)
    except BaseException:
        create.cancel()
        raise
    if wait_for_seal:
        _start(client, lambda: _seal(client, object_id, size)).result(_RPC_TIMEOUT_S + 5)
    else:
        client.loop.call_soon_threadsafe(_seal_soon, client, object_id, size)


def _start(client: StoreClient, call: Callable[[], Any]) -> Any:
    """Start an RPC (created on the I/O loop) and return its ``concurrent.futures`` future."""

    async def run() -> Any:
        return await call()

    return contextvars.Context().run(asyncio.run_coroutine_threadsafe, run(), client.loop)


def _seal_soon(client: StoreClient, object_id: bytes, size: int) -> None:
    task = client.loop.create_task(_seal(client, object_id, size))
    _sealing.add(task)
    task.add_done_callback(_sealing.discard)


async def _seal(client: StoreClient, object_id: bytes, size: int) -> None:
    try:
        await client.node().SealObject(
            pb.SealObjectRequest(object_id=object_id, size=size), timeout=_RPC_TIMEOUT_S
        )
    except RpcFailure as err:  # the node is gone (its objects with it) or shutting down
        log.debug("SealObject %s failed: %s", object_id.hex(), err)
