"""Placement groups at the head: gang reservation of bundles across nodes.

The head picks a node per bundle with :func:`place_bundles` on its cluster view, then
reserves them with two phases: ``PrepareBundle`` on every chosen node, and ``CommitBundle``
on all of them only if every prepare succeeded (else ``CancelBundle`` on those that did).
So a group is reserved entirely or not at all. A group that cannot be placed stays
PENDING and is retried; its ``message`` says why (for example, it can never fit).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import grpc

from nbcluster._runtime.head.state import HeadState
from nbcluster._runtime.protocol.errors import RpcError
from nbcluster._runtime.protocol.rpc import Channels, pb
from nbcluster._runtime.scheduling.policy import NodeView, bundle_resource_names, place_bundles

log = logging.getLogger(__name__)

PENDING, CREATED, REMOVED = (
    pb.PlacementGroupInfo.PENDING,
    pb.PlacementGroupInfo.CREATED,
    pb.PlacementGroupInfo.REMOVED,
)


class PlacementGroupManager:
    """All placement groups of the cluster."""

    def __init__(
        self,
        state: HeadState,
        channels: Channels,
        persist: Any = None,
    ) -> None:
        self.persist = persist
        self.state = state
        self.channels = channels
        self.groups: dict[bytes, pb.PlacementGroupInfo] = {}
        self.names: dict[tuple[str, str], bytes] = {}
        self.waiters: dict[bytes, list[asyncio.Future[None]]] = {}
        self.wake = asyncio.Event()
        self.task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self.task = asyncio.get_running_loop().create_task(self._loop())

    def close(self) -> None:
        if self.task is not None:
            self.task.cancel()

    def recover(self, groups: list[pb.PlacementGroupInfo]) -> None:
        """After a head restart: created groups stay reserved; pending ones are placed again."""
        for pg in groups:
            pg.version += 1
            self.groups[pg.pg_id] = pg
            if pg.name and pg.state != REMOVED:
                self.names[(pg.namespace, pg.name)] = pg.pg_id
        self.wake.set()

    def _changed(self, pg: pb.PlacementGroupInfo) -> None:
        pg.version += 1
        if self.persist is not None:
            try:
                self.persist(pg)
            except Exception:  # noqa: BLE001 - persistence must not stop the head
                log.exception("could not persist placement group")
        for fut in self.waiters.pop(pg.pg_id, []):
            if not fut.done():
                fut.set_result(None)

    # -- RPCs ------------------------------------------------------------------------------
    async def create(
        self, request: pb.CreatePlacementGroupRequest, context: grpc.aio.ServicerContext
    ) -> pb.PlacementGroupInfo:
        pg = pb.PlacementGroupInfo()
        pg.CopyFrom(request.pg)
        if not pg.bundles:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, "a placement group needs at least one bundle"
            )
        if pg.pg_id in self.groups:  # a retried request
            return self.groups[pg.pg_id]
        if pg.name:
            key = (pg.namespace, pg.name)
            old = self.names.get(key)
            if old is not None and self.groups[old].state != REMOVED:
                await context.abort(
                    grpc.StatusCode.ALREADY_EXISTS,
                    f"a placement group named {pg.name!r} already exists; remove it or pick another name",
                )
            self.names[key] = pg.pg_id
        pg.state = PENDING
        pg.version = 0
        self.groups[pg.pg_id] = pg
        self._changed(pg)
        self.wake.set()
        return pg

    async def wait(
        self, request: pb.PlacementGroupRequest, context: grpc.aio.ServicerContext
    ) -> pb.PlacementGroupInfo:
        pg = self.groups.get(request.pg_id)
        if pg is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, "no such placement group")
        if pg.version <= request.after_version and pg.state == PENDING:
            fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self.waiters.setdefault(pg.pg_id, []).append(fut)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(fut, timeout=request.timeout or 30.0)
        return pg

    async def get(
        self, request: pb.PlacementGroupRequest, context: grpc.aio.ServicerContext
    ) -> pb.PlacementGroupInfo:
        pg_id = request.pg_id or self.names.get((request.namespace, request.name), b"")
        pg = self.groups.get(pg_id)
        if pg is None or (request.name and pg.state == REMOVED):
            what = f"named {request.name!r}" if request.name else pg_id.hex()
            await context.abort(grpc.StatusCode.NOT_FOUND, f"no placement group {what}")
        return pg

    async def remove(
        self, request: pb.PlacementGroupRequest, context: grpc.aio.ServicerContext
    ) -> pb.Empty:
        pg = self.groups.get(request.pg_id)
        if pg is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, "no such placement group")
        await self._remove(pg)
        return pb.Empty()

    def list(self) -> pb.ListPlacementGroupsReply:
        return pb.ListPlacementGroupsReply(groups=list(self.groups.values()))

    async def _remove(self, pg: pb.PlacementGroupInfo) -> None:
        if pg.state == REMOVED:
            return
        was_created = pg.state == CREATED
        pg.state = REMOVED
        if was_created:
            await asyncio.gather(
                *(
                    self._bundle_rpc("CancelBundle", addr, pg, i)
                    for i, addr in enumerate(pg.bundle_node_addresses)
                ),
                return_exceptions=True,
            )
        self._changed(pg)

    def job_finished(self, job_id: bytes) -> None:
        for pg in list(self.groups.values()):
            if pg.job_id == job_id and not pg.detached and pg.state != REMOVED:
                asyncio.get_running_loop().create_task(self._remove(pg))

    # -- placement ---------------------------------------------------------------------------
    async def _loop(self) -> None:
        while True:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.wake.wait(), timeout=1.0)
            self.wake.clear()
            for pg in [g for g in self.groups.values() if g.state == PENDING]:
                try:
                    await self._try_place(pg)
                except Exception:  # noqa: BLE001 - keep placing the others
                    log.exception("placing placement group %s failed", pg.pg_id.hex()[:8])

    def _views(self) -> list[NodeView]:
        return [
            NodeView(n.node_id, n.address, n.total, n.available) for n in self.state.live_nodes()
        ]

    async def _try_place(self, pg: pb.PlacementGroupInfo) -> None:
        bundles = [dict(b.resources) for b in pg.bundles]
        views = self._views()
        chosen = place_bundles(bundles, views, pg.strategy)
        if chosen is None:
            if place_bundles(bundles, views, pg.strategy, use_total=True) is None:
                msg = (
                    f"infeasible: the cluster cannot ever hold these bundles with {pg.strategy} "
                    "(a bundle is larger than every node, or there are too few nodes); it stays "
                    "pending in case nodes join"
                )
            else:
                msg = "waiting for resources to free up"
            if pg.message != msg:
                pg.message = msg
                self._changed(pg)
            return
        replies = await asyncio.gather(
            *(
                self._bundle_rpc("PrepareBundle", node.address, pg, i)
                for i, node in enumerate(chosen)
            )
        )
        prepared = [
            (i, n.address)
            for i, (n, r) in enumerate(zip(chosen, replies, strict=True))
            if r is not None and r.ok
        ]
        ok = len(prepared) == len(chosen)
        if not ok or pg.state != PENDING:
            await asyncio.gather(
                *(self._bundle_rpc("CancelBundle", addr, pg, i) for i, addr in prepared),
                return_exceptions=True,
            )
            return
        await asyncio.gather(
            *(self._bundle_rpc("CommitBundle", addr, pg, i) for i, addr in prepared)
        )
        if pg.state != PENDING:  # removed while the commits were in flight
            await asyncio.gather(
                *(self._bundle_rpc("CancelBundle", addr, pg, i) for i, addr in prepared),
                return_exceptions=True,
            )
            return
        del pg.bundle_node_ids[:]
        del pg.bundle_node_addresses[:]
        pg.bundle_node_ids.extend(n.node_id for n in chosen)
        pg.bundle_node_addresses.extend(n.address for n in chosen)
        pg.state = CREATED
        pg.message = ""
        # Reflect the reservation in the view at once, so the next group sees it.
        for i, (node, b) in enumerate(zip(chosen, bundles, strict=True)):
            rec = self.state.nodes.get(node.node_id)
            if rec is not None:
                for k, v in b.items():
                    rec.available[k] = rec.available.get(k, 0.0) - v
                for k, v in bundle_resource_names(pg.pg_id.hex(), i, b).items():
                    rec.total[k] = rec.total.get(k, 0.0) + v
                    rec.available[k] = rec.available.get(k, 0.0) + v
        self._changed(pg)

    async def _bundle_rpc(
        self, method: str, address: str, pg: pb.PlacementGroupInfo, index: int
    ) -> Any:
        stub = self.channels.stub(address, "node")
        req = pb.BundleRequest(pg_id=pg.pg_id, index=index, resources=pg.bundles[index].resources)
        try:
            return await getattr(stub, method)(req, timeout=10)
        except RpcError as err:
            log.warning("%s on %s failed: %s", method, address, err.code().name)
            return None
