"""The node's link to the head: registration, heartbeats, and the cluster view they bring
back (fed to the node's state machine, which decides where lease requests spill)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import TYPE_CHECKING

from nbcluster._runtime.protocol.errors import RpcFailure, RpcUnavailable
from nbcluster._runtime.protocol.rpc import AuthedStub, make_channel, pb, pb_grpc
from nbcluster._runtime.scheduling.policy import NodeView

if TYPE_CHECKING:
    from nbcluster._runtime.node.service import NodeService

__all__ = ["HeadLink"]

log = logging.getLogger(__name__)


class HeadLink:
    """Registration and heartbeats to the head; feeds the cluster view back to the state."""

    def __init__(
        self,
        service: NodeService,
        token: str,
        info: pb.NodeInfo,
        interval: float,
        keepalive: float | None = None,
    ) -> None:
        self.service = service
        self.token = token
        self.info = info
        self.interval = interval
        self.keepalive = max(interval, keepalive if keepalive is not None else interval)
        self.channel = make_channel(service.head_address, token)
        self.stub = AuthedStub(pb_grpc.HeadStub(self.channel), token)

    async def register(self, budget_s: float = 30.0) -> None:
        """Register with the head, retrying while it is unreachable (it may be starting)."""
        deadline = time.monotonic() + budget_s
        delay = 0.02
        while True:
            try:
                await self.stub.RegisterNode(pb.RegisterNodeRequest(node=self.info), timeout=10)
                return
            except RpcFailure as err:
                if not isinstance(err, RpcUnavailable) or time.monotonic() > deadline:
                    raise
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.5)

    def _report(self) -> pb.HeartbeatRequest:
        st = self.service.state
        stats = self.service.objects.store.stats()
        return pb.HeartbeatRequest(
            node_id=st.node_id,
            available=st.available,
            store_used=stats.used,
            store_spilled=stats.spilled_bytes,
            num_workers=len(st.workers),
            pending_leases=len(st.pending),
            total=st.total,
            leased_workers=len(st.leases),
        )

    async def run(self) -> None:
        """Report to the head when something changed, at most once per ``interval``.

        A node with lease requests waiting reports every ``interval`` (its view of the
        other nodes decides where they spill); an idle node only sends a keep-alive every
        ``keepalive`` seconds, so it costs no CPU between them.

        A report that looks as the last one still goes out when a lease was granted since:
        the head counts the actors it places against its view of the node at once, and a
        short-lived actor (granted and gone within one interval) would otherwise leave its
        resources missing there until the keep-alive.
        """
        service = self.service
        last = b""
        last_sent = 0.0
        last_grants = 0
        while True:
            await asyncio.sleep(self.interval)
            if not service.state.pending:
                with contextlib.suppress(asyncio.TimeoutError):
                    left = self.keepalive - (time.monotonic() - last_sent)
                    await asyncio.wait_for(service.changed.wait(), timeout=max(0.0, left))
            service.changed.clear()
            request = self._report()
            payload = request.SerializeToString(deterministic=True)
            now = time.monotonic()
            grants = service.grants
            if (
                payload == last
                and grants == last_grants
                and not service.state.pending
                and now - last_sent < self.keepalive
            ):
                continue  # woken, but nothing the head sees changed
            try:
                reply = await self.stub.Heartbeat(request, timeout=max(self.interval * 4, 2.0))
            except RpcFailure as err:
                log.warning("heartbeat to head failed: %s", err.code().name)
                continue
            last, last_sent, last_grants = payload, now, grants
            st = service.state
            if reply.reregister:
                if reply.fenced:
                    log.warning(
                        "this node was declared dead while unreachable: starting over as a new node"
                    )
                    await self.service.reset_as_new_node()
                    self.info.node_id = self.service.state.node_id
                else:
                    log.warning(
                        "the head does not know this node (it restarted): registering again"
                    )
                with contextlib.suppress(RpcFailure):
                    await self.register()
                continue
            view = [
                NodeView(
                    n.node_id,
                    n.address,
                    dict(n.total),
                    dict(n.available),
                    n.alive,
                    n.last_heartbeat,
                )
                for n in reply.nodes
            ]
            instructions = st.update_cluster_view(view)
            if instructions:  # a new view alone is nothing to report
                self.service.apply(instructions)
            # ``changed`` is not cleared here: a lease granted while the heartbeat was in
            # flight set it, and clearing it hid that change from the head until the next
            # keep-alive (the head then offered other nodes' spills a CPU already taken).

    async def unregister(self, reason: str = "node stopped") -> None:
        with contextlib.suppress(RpcFailure):
            await self.stub.UnregisterNode(
                pb.NodeRef(node_id=self.service.state.node_id, reason=reason), timeout=2
            )
        await self.channel.close()
