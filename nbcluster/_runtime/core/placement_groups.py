"""Placement groups as the driver asks for them: create, remove, look up, list, ``ready()``.

The API (``nbcluster.util.placement_group``) validates the bundles and the strategy; these
functions make the head calls, over the head's control channel (``head_ctrl.py``; their
errors become nbcluster's exceptions there, as gRPC's do in ``call_head``), and
keep the client's cache of created groups, so ``ready()`` of a group the head placed at
once needs no round trip.
"""

from __future__ import annotations

import asyncio
from typing import Any

from nbcluster._runtime import exceptions as exc
from nbcluster._runtime.core.client import CoreClient
from nbcluster._runtime.core.head_ctrl import head_control
from nbcluster._runtime.protocol.errors import Peer, RpcFailure, to_exception
from nbcluster._runtime.protocol.rpc import pb
from nbcluster._runtime.refs import ObjectRef
from nbcluster._runtime.serialization import serialize

__all__ = ["create", "get_by_name", "ready_ref", "remove", "table"]

_STATE = {0: "PENDING", 1: "CREATED", 2: "REMOVED"}
_TRUE = serialize(True).to_bytes()  # what ready() resolves to


def create(
    client: CoreClient,
    pg_id: bytes,
    bundles: list[dict[str, float]],
    strategy: str,
    name: str,
    detached: bool,
) -> bytes:
    """Ask the head to reserve ``bundles`` as group ``pg_id``; returns ``pg_id`` at once."""
    info = pb.PlacementGroupInfo(
        pg_id=pg_id,
        name=name,
        bundles=[pb.Bundle(resources=b) for b in bundles],
        strategy=strategy,
        detached=detached,
        job_id=client.job_id,
        namespace=client.namespace,
    )
    request = pb.CreatePlacementGroupRequest(pg=info)
    reply = head_control(client).call(
        "CreatePlacementGroup", "CreatePlacementGroup", request, pb.PlacementGroupInfo, 10
    )
    client.remember_placement_group(reply)  # placed already: ready() need not ask
    return pg_id


def remove(client: CoreClient, pg_id: bytes) -> None:
    """Release a group (the head ends the work running in it)."""
    request = pb.PlacementGroupRequest(pg_id=pg_id)
    head_control(client).call("RemovePlacementGroup", "RemovePlacementGroup", request, pb.Empty, 30)
    client.forget_placement_group(pg_id)


def get_by_name(client: CoreClient, name: str) -> tuple[bytes, list[dict[str, float]], str]:
    """(id, bundles, name) of the group called ``name`` in the job's namespace."""
    request = pb.PlacementGroupRequest(name=name, namespace=client.namespace)
    info = head_control(client).call(
        "GetPlacementGroup",
        "GetPlacementGroup",
        request,
        pb.PlacementGroupInfo,
        10,
        not_found=f"Failed to look up placement group with name {name!r}",
    )
    return info.pg_id, [dict(b.resources) for b in info.bundles], info.name


def _row(info: pb.PlacementGroupInfo) -> dict[str, Any]:
    return {
        "placement_group_id": info.pg_id.hex(),
        "name": info.name,
        "bundles": {i: dict(b.resources) for i, b in enumerate(info.bundles)},
        "bundles_to_node_id": {i: n.hex() for i, n in enumerate(info.bundle_node_ids)},
        "strategy": info.strategy,
        "state": _STATE.get(info.state, str(info.state)),
        "stats": {"message": info.message},
        "detached": info.detached,
    }


def table(client: CoreClient, pg_id: bytes | None) -> list[dict[str, Any]]:
    """Rows of one group (``pg_id``) or of every group."""
    what = "placement_group_table"
    control = head_control(client)
    if pg_id is not None:
        request = pb.PlacementGroupRequest(pg_id=pg_id)
        info = control.call(what, "GetPlacementGroup", request, pb.PlacementGroupInfo, 10)
        return [_row(info)]
    reply = control.call(what, "ListPlacementGroups", pb.Empty(), pb.ListPlacementGroupsReply, 10)
    return [_row(g) for g in reply.groups]


def ready_ref(client: CoreClient, pg_id: bytes) -> ObjectRef:
    """An owned ref that becomes ready (True) when the group is created."""
    oid = client.next_task_id() + (0).to_bytes(4, "big")
    entry = client.table.create_owned(oid)
    ref = ObjectRef._new(oid, client.address, client)
    if client.cached_placement_group(pg_id) is not None:
        # Created already (the head placed it at once): ready now, in this thread. Nothing
        # waits on or depends on an entry nobody has seen yet, so there is no one to wake.
        with client.table.lock:
            entry.set_ready(data=_TRUE)
        return ref

    async def watch() -> None:
        try:
            info = await client.placement_group_info(pg_id)
            if info.state == pb.PlacementGroupInfo.CREATED:
                kwargs: dict[str, Any] = {"data": _TRUE}
            else:
                kwargs = {
                    "exc": exc.NbclusterError(
                        "the placement group was removed before it was created"
                    )
                }
        except RpcFailure as err:
            kwargs = {"exc": to_exception(err, Peer.HEAD, "WaitPlacementGroup")}
        except asyncio.CancelledError:
            return
        with client.table.lock:
            entry.set_ready(**kwargs)
        client.table.wake(entry)
        client.submitter.object_ready(entry)

    client.call_soon(lambda: client.loop.create_task(watch()))
    return ref
