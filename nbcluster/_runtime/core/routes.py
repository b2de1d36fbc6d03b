"""Where a lease request of a strategy that names its nodes may go (SPREAD, node
affinity, placement group): the nodes, looked up from the head; the owner's state machine
picks one (``OwnerState.route_resolved``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from nbcluster._runtime import exceptions as exc
from nbcluster._runtime.protocol.rpc import pb

if TYPE_CHECKING:
    from nbcluster._runtime.core.ports import RouteHost
    from nbcluster._runtime.core.records import KeyQueue

__all__ = ["resolve_route"]


async def resolve_route(client: RouteHost, kq: KeyQueue) -> tuple[list[str], bool]:
    """The addresses ``kq``'s lease request may go to, and whether the node asked may
    send it on elsewhere (spill). Raises ``TaskUnschedulableError`` when the strategy can
    never be met (hard affinity to a dead node, a removed group) and ``RpcFailure`` when
    the head cannot be asked."""
    route = kq.route
    assert route is not None
    if route[0] == "spread":
        from nbcluster._runtime.scheduling.policy import fits

        nodes = [n for n in await client.alive_nodes() if fits(kq.resources, n.total)]
        return [n.address for n in nodes] or [client.node_address], not nodes
    if route[0] == "node":
        _, node_id, soft = route
        nodes = [n for n in await client.alive_nodes() if n.node_id == node_id]
        if not nodes:  # maybe it just joined: look again without the cache
            nodes = [n for n in await client.alive_nodes(max_age=0) if n.node_id == node_id]
        if nodes:
            # Soft or hard, a busy node is waited for (as Ray does by default); a soft
            # request goes elsewhere only when that node cannot ever run it.
            return [nodes[0].address], False
        if soft:
            return [client.node_address], True
        raise exc.TaskUnschedulableError(
            f"node {node_id.hex()} is dead or unknown and the node affinity is hard "
            "(soft=False); use soft=True to run elsewhere"
        )
    _, pg_id, index = route  # a placement group
    info = await client.placement_group_info(pg_id)
    if info.state != pb.PlacementGroupInfo.CREATED:
        raise exc.TaskUnschedulableError("the task's placement group was removed")
    addrs = list(info.bundle_node_addresses)
    # "Any bundle" may be redirected: only the group's nodes have its resources.
    return ([addrs[index]] if index >= 0 else sorted(set(addrs))), index < 0
