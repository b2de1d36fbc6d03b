"""Placement groups at the head: gang reservation of bundles across nodes.

The head picks a node per bundle with :func:`place_bundles` on its cluster view and
charges the view at once (so groups placed concurrently do not pick the same room), then
reserves the bundles on their nodes, a whole node's share per call (``bundles.proto``):

- a group on **one node** is prepared and committed in a single ``PrepareBundles(commit)``,
  all or nothing on that node;
- a group on **several nodes** takes two phases: ``PrepareBundles`` on every node, then
  ``CommitBundles`` on all of them only if every prepare succeeded (else
  ``CancelBundles`` on those that did).

So a group is reserved entirely or not at all. ``CreatePlacementGroup`` tries at once and
answers when the group is placed (or after ``place_wait_s``), so a free cluster answers
``CREATED`` and ``ready()`` costs no wait; the record is written once, in that state. A
group that cannot be placed stays PENDING with a ``message`` saying why (for example, it
can never fit), and is tried again when the cluster's resources change (a node joins or
reports, a group is removed): nothing polls. ``RemovePlacementGroup`` answers once the
nodes cancelled the bundles (one call per node), so no new task starts in a removed
group; a restarted head sends the removals it knows of again, in case one was lost.
The last ``removed_kept``
removed groups are kept for the state API; older ones are forgotten (in memory and on
disk), so a long-running cluster does not grow without end.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
from collections.abc import Callable, Iterable
from typing import Any

import grpc

from nbcluster._runtime.head.state import HeadState
from nbcluster._runtime.protocol import tls
from nbcluster._runtime.protocol.ctrl import (
    AsyncCtrlConnection,
    CtrlBroken,
    Method,
    open_async,
    token_fits,
)
from nbcluster._runtime.protocol.errors import RpcFailure
from nbcluster._runtime.protocol.protos import (
    bundles_pb2,
    bundles_pb2_grpc,
    ctrl_pb2,
    ctrl_pb2_grpc,
)
from nbcluster._runtime.protocol.rpc import AuthedStub, Channels, RetryingStub, pb
from nbcluster._runtime.scheduling.policy import NodeView, bundle_resource_names, place_bundles

log = logging.getLogger(__name__)

PENDING, CREATED, REMOVED = (
    pb.PlacementGroupInfo.PENDING,
    pb.PlacementGroupInfo.CREATED,
    pb.PlacementGroupInfo.REMOVED,
)
WAITING_FOR_RESOURCES = "waiting for resources to free up"


class PlacementGroupManager:
    """All placement groups of the cluster."""

    def __init__(
        self,
        state: HeadState,
        channels: Channels,
        persist: Callable[[pb.PlacementGroupInfo], None] | None = None,
        forget: Callable[[Iterable[bytes]], None] | None = None,
        *,
        removed_kept: int = 1000,
        place_wait_s: float = 2.0,
    ) -> None:
        self.persist = persist
        self.forget = forget
        self.state = state
        self.channels = channels
        self.removed_kept = removed_kept
        self.place_wait_s = place_wait_s
        self.groups: dict[bytes, pb.PlacementGroupInfo] = {}
        self.names: dict[tuple[str, str], bytes] = {}
        self.waiters: dict[bytes, list[asyncio.Future[None]]] = {}
        self.removed: collections.deque[bytes] = collections.deque()
        self.placing: set[bytes] = set()  # groups with a placement attempt in flight
        self.pending: dict[bytes, pb.PlacementGroupInfo] = {}  # PENDING groups, oldest first
        self.wake = asyncio.Event()
        self.task: asyncio.Task[None] | None = None
        self._stubs: dict[str, Any] = {}
        self._releasing: set[asyncio.Task[None]] = set()

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
            if pg.state == REMOVED:
                self.removed.append(pg.pg_id)
            elif pg.name:
                self.names[(pg.namespace, pg.name)] = pg.pg_id
            if pg.state == PENDING:
                self.pending[pg.pg_id] = pg
        self._prune()
        # A removal may not have reached its nodes before the old head stopped: release
        # again, one call per node (nodes ignore bundles they no longer hold).
        releases: dict[str, list[Any]] = {}
        for pg_id in self.removed:
            pg = self.groups[pg_id]
            for address, indexes in _by_node(pg.bundle_node_addresses).items():
                releases.setdefault(address, []).append(self._request(pg, indexes))
        loop = asyncio.get_running_loop()
        for address, batch in releases.items():
            task = loop.create_task(self._send_releases(address, batch))
            self._releasing.add(task)
            task.add_done_callback(self._releasing.discard)
        self.wake.set()

    def resources_changed(self) -> None:
        """A node joined, left or reported new availability: retry waiting groups."""
        if self._waiting():
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

    def _waiting(self) -> list[pb.PlacementGroupInfo]:
        """Pending groups with no placement attempt in flight, oldest first."""
        return [g for g in self.pending.values() if g.pg_id not in self.placing]

    # -- RPCs ------------------------------------------------------------------------------
    def ctrl_methods(self) -> dict[str, Method]:
        """The drivers' placement-group calls, for the control channel (``protocol/ctrl.py``)."""

        async def list_groups(request: pb.Empty, context: Any) -> pb.ListPlacementGroupsReply:
            return self.list()

        return {
            "CreatePlacementGroup": (self.create, pb.CreatePlacementGroupRequest),
            "RemovePlacementGroup": (self.remove, pb.PlacementGroupRequest),
            "GetPlacementGroup": (self.get, pb.PlacementGroupRequest),
            "WaitPlacementGroup": (self.wait, pb.PlacementGroupRequest),
            "ListPlacementGroups": (list_groups, pb.Empty),
        }

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
        waiting = self._waiting()  # groups placed earlier go first
        pg.state = PENDING
        pg.version = 0
        self.groups[pg.pg_id] = pg
        self.pending[pg.pg_id] = pg
        if waiting:
            self._changed(pg)
            self.wake.set()
            return pg
        # Place it now; the record is written once, in its final state, when that is quick.
        # (Were the head to die before the reply, the driver retries the create.)
        attempt = asyncio.ensure_future(self._try_place(pg))
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(asyncio.shield(attempt), timeout=self.place_wait_s)
        if pg.version == 0:  # nothing recorded it yet (still pending, no message)
            self._changed(pg)
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
        """Mark the group removed, cancel its bundles on its nodes (one call per node), and
        give their resources back to the view; the caller hears back once the nodes did,
        so no new task can start in the group after ``remove_placement_group`` returns."""
        if pg.state == REMOVED:
            return
        was_created = pg.state == CREATED
        pg.state = REMOVED
        self.pending.pop(pg.pg_id, None)
        self._changed(pg)
        self.removed.append(pg.pg_id)
        self._prune()
        if was_created:
            await asyncio.gather(
                *(
                    self._bundles_rpc("CancelBundles", address, pg, indexes)
                    for address, indexes in _by_node(pg.bundle_node_addresses).items()
                ),
                return_exceptions=True,
            )
            self._refund(pg, list(pg.bundle_node_ids), created=True)
            self.resources_changed()

    async def _send_releases(self, address: str, releases: list[Any]) -> None:
        """Cancel several groups' bundles on one node in one call (after a head restart)."""
        req = bundles_pb2.BundlesRequest(release=releases)
        with contextlib.suppress(RpcFailure):
            await self._stub(address).PrepareBundles(req, timeout=10)

    def _prune(self) -> None:
        """Forget the oldest removed groups beyond ``removed_kept``."""
        gone = []
        while len(self.removed) > self.removed_kept:
            pg_id = self.removed.popleft()
            pg = self.groups.get(pg_id)
            if pg is None or pg.state != REMOVED:
                continue
            del self.groups[pg_id]
            if pg.name and self.names.get((pg.namespace, pg.name)) == pg_id:
                del self.names[(pg.namespace, pg.name)]
            gone.append(pg_id)
        if gone and self.forget is not None:
            try:
                self.forget(gone)
            except Exception:  # noqa: BLE001 - persistence must not stop the head
                log.exception("could not forget removed placement groups")

    def job_finished(self, job_id: bytes) -> None:
        for pg in list(self.groups.values()):
            if pg.job_id == job_id and not pg.detached and pg.state != REMOVED:
                asyncio.get_running_loop().create_task(self._remove(pg))

    # -- placement ---------------------------------------------------------------------------
    async def _loop(self) -> None:
        while True:
            await self.wake.wait()  # set when resources change; never a timed poll
            self.wake.clear()
            for pg in self._waiting():
                try:
                    await self._try_place(pg)
                except Exception:  # noqa: BLE001 - keep placing the others
                    log.exception("placing placement group %s failed", pg.pg_id.hex()[:8])

    def _views(self) -> list[NodeView]:
        return [
            NodeView(n.node_id, n.address, n.total, n.available) for n in self.state.live_nodes()
        ]

    async def _try_place(self, pg: pb.PlacementGroupInfo) -> None:
        if pg.pg_id in self.placing or pg.state != PENDING:
            return
        self.placing.add(pg.pg_id)
        try:
            await self._place(pg)
        finally:
            self.placing.discard(pg.pg_id)

    async def _place(self, pg: pb.PlacementGroupInfo) -> None:
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
                msg = WAITING_FOR_RESOURCES
            self._set_message(pg, msg)
            return
        node_ids = [n.node_id for n in chosen]
        addresses = [n.address for n in chosen]
        self._charge(bundles, node_ids)  # before any await: concurrent placements see it
        by_node = _by_node(addresses)
        single = len(by_node) == 1
        replies = await asyncio.gather(
            *(
                self._prepare(address, pg, indexes, commit=single)
                for address, indexes in by_node.items()
            )
        )
        prepared = [a for a, r in zip(by_node, replies, strict=True) if r is not None and r.ok]
        ok = len(prepared) == len(by_node)
        if ok and not single and pg.state == PENDING:
            commits = await asyncio.gather(
                *(self._bundles_rpc("CommitBundles", a, pg, by_node[a]) for a in prepared)
            )
            ok = all(r is not None and r.ok for r in commits)
        if not ok or pg.state != PENDING:  # refused (or removed while in flight): undo
            await asyncio.gather(
                *(self._bundles_rpc("CancelBundles", a, pg, by_node[a]) for a in prepared),
                return_exceptions=True,
            )
            self._refund(pg, node_ids, created=False)
            if pg.state == PENDING:
                self._set_message(pg, WAITING_FOR_RESOURCES)
            return
        del pg.bundle_node_ids[:]
        del pg.bundle_node_addresses[:]
        pg.bundle_node_ids.extend(node_ids)
        pg.bundle_node_addresses.extend(addresses)
        pg.state = CREATED
        pg.message = ""
        self.pending.pop(pg.pg_id, None)
        for i, (node_id, b) in enumerate(zip(node_ids, bundles, strict=True)):
            rec = self.state.nodes.get(node_id)
            if rec is not None:  # the group's own resource names appear on its nodes
                for k, v in bundle_resource_names(pg.pg_id.hex(), i, b).items():
                    rec.total[k] = rec.total.get(k, 0.0) + v
                    rec.available[k] = rec.available.get(k, 0.0) + v
        self._changed(pg)

    def _set_message(self, pg: pb.PlacementGroupInfo, msg: str) -> None:
        if pg.message != msg:
            pg.message = msg
            self._changed(pg)

    def _charge(self, bundles: list[dict[str, float]], node_ids: list[bytes]) -> None:
        """Take the bundles' resources out of the head's view of their nodes."""
        for node_id, b in zip(node_ids, bundles, strict=True):
            rec = self.state.nodes.get(node_id)
            if rec is not None:
                for k, v in b.items():
                    rec.available[k] = rec.available.get(k, 0.0) - v

    def _refund(self, pg: pb.PlacementGroupInfo, node_ids: list[bytes], *, created: bool) -> None:
        """Give the bundles' resources back to the view (and drop the group's own names)."""
        for i, (node_id, b) in enumerate(zip(node_ids, pg.bundles, strict=True)):
            rec = self.state.nodes.get(node_id)
            if rec is None:
                continue
            for k, v in b.resources.items():
                rec.available[k] = min(rec.total.get(k, 0.0), rec.available.get(k, 0.0) + float(v))
            if created:
                for k in bundle_resource_names(pg.pg_id.hex(), i, dict(b.resources)):
                    rec.total.pop(k, None)
                    rec.available.pop(k, None)

    def _stub(self, address: str) -> Any:
        stub = self._stubs.get(address)
        if stub is None:
            stub = NodeBundles(address, self.channels)
            self._stubs[address] = stub
        return stub

    @staticmethod
    def _request(
        pg: pb.PlacementGroupInfo, indexes: list[int], *, commit: bool = False
    ) -> bundles_pb2.BundlesRequest:
        return bundles_pb2.BundlesRequest(
            pg_id=pg.pg_id,
            bundles=[
                bundles_pb2.BundleSpec(index=i, resources=pg.bundles[i].resources) for i in indexes
            ],
            commit=commit,
        )

    async def _prepare(
        self, address: str, pg: pb.PlacementGroupInfo, indexes: list[int], *, commit: bool
    ) -> Any:
        return await self._bundles_rpc("PrepareBundles", address, pg, indexes, commit=commit)

    async def _bundles_rpc(
        self,
        method: str,
        address: str,
        pg: pb.PlacementGroupInfo,
        indexes: list[int],
        *,
        commit: bool = False,
        release: list[Any] | None = None,
    ) -> Any:
        req = self._request(pg, indexes, commit=commit)
        if release:
            req.release.extend(release)
        try:
            return await getattr(self._stub(address), method)(req, timeout=10)
        except RpcFailure as err:
            log.warning("%s on %s failed: %s", method, address, err.code().name)
            return None


def _by_node(addresses: Iterable[str]) -> dict[str, list[int]]:
    """Bundle indexes grouped by node address, in first-seen order."""
    out: dict[str, list[int]] = {}
    for i, address in enumerate(addresses):
        out.setdefault(address, []).append(i)
    return out


class NodeBundles:
    """Bundle calls to one node manager: over its control channel (``protocol/ctrl.py``)
    when it serves one, else over gRPC (as when the channel breaks: that call goes over
    gRPC, with its retries, and the channel is looked up again on the next one)."""

    def __init__(self, address: str, channels: Channels) -> None:
        self.address = address
        self.channels = channels
        raw = bundles_pb2_grpc.BundlesStub(channels.channel(address))
        self.grpc = RetryingStub(AuthedStub(raw, channels.token, address), channels.retry_budget_s)
        # None: not asked yet; "": none to use (the node serves none, or the token is too
        # long for a control channel's hello)
        self.ctrl_address: str | None = None if token_fits(channels.token) else ""
        self.conn: AsyncCtrlConnection | None = None
        self._lock = asyncio.Lock()

    async def _connection(self) -> AsyncCtrlConnection | None:
        conn = self.conn
        if conn is not None and not conn.closed:
            return conn
        async with self._lock:
            if self.conn is not None and not self.conn.closed:
                return self.conn
            self.conn = None
            if self.ctrl_address is None:
                raw = ctrl_pb2_grpc.ControlStub(self.channels.channel(self.address))
                stub = AuthedStub(raw, self.channels.token, self.address)
                try:
                    reply = await stub.ControlAddress(ctrl_pb2.ControlAddressRequest(), timeout=5)
                except RpcFailure as err:
                    if err.code() == grpc.StatusCode.UNIMPLEMENTED:
                        self.ctrl_address = ""  # an older node manager: gRPC only
                    return None
                self.ctrl_address = reply.address
            if not self.ctrl_address:
                return None
            settings = tls.current()
            try:
                self.conn = await open_async(
                    self.ctrl_address,
                    self.channels.token,
                    max_frame=self.channels.max_message_bytes,
                    ssl_context=tls.ssl_context(settings, server=False) if settings else None,
                    server_hostname=settings.server_name if settings else None,
                    timeout=5,
                )
            except RpcFailure:
                self.ctrl_address = None  # a restarted node listens elsewhere: ask again
                return None
            return self.conn

    async def _call(self, method: str, request: Any, timeout: float) -> Any:
        conn = await self._connection()
        if conn is not None:
            try:
                return await conn.call(method, request, bundles_pb2.BundlesReply, timeout)
            except CtrlBroken:
                self.conn = None
                self.ctrl_address = None
        return await getattr(self.grpc, method)(request, timeout=timeout)

    async def PrepareBundles(self, request: Any, timeout: float = 10) -> Any:
        """Reserve (and, with ``commit``, commit) a group's bundles on this node."""
        return await self._call("PrepareBundles", request, timeout)

    async def CommitBundles(self, request: Any, timeout: float = 10) -> Any:
        """Commit prepared bundles."""
        return await self._call("CommitBundles", request, timeout)

    async def CancelBundles(self, request: Any, timeout: float = 10) -> Any:
        """Release bundles (prepared or committed)."""
        return await self._call("CancelBundles", request, timeout)
