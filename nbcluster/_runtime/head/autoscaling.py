"""The head's side of autoscaling: it gathers demand and keeps the scaling event stream.

The autoscaler itself (``nbcluster.autoscaler.monitor``) is a separate process on the head's
host, like Ray's monitor: it long-polls :meth:`AutoscalingService.GetDemand`, decides, asks
its node provider for nodes, and reports back with ``ReportAutoscaler``. This module only
stores and serves data, so the head works the same with or without a monitor:

- **load reports** from node managers (queued lease requests by shape, requests no node can
  fit, and whether tasks, actors, bundles or primary object copies live on the node);
- **pending placement groups**, read from the head's placement-group table;
- **request_resources()** bundles, kept in the head's KV table (so they survive a restart);
- **scaling events** and the monitor's latest status, in a bounded ring with sequence
  numbers, for ``nbcluster status``, the widgets and the lab extension;
- **drain**: the monitor asks the head to drain a node before removing it; the head relays
  it to the node and hides the node's free resources from everyone at once.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

import grpc

from nbcluster._runtime.head.placement import PENDING, PlacementGroupManager
from nbcluster._runtime.head.state import HeadState
from nbcluster._runtime.protocol.errors import RpcFailure
from nbcluster._runtime.protocol.protos import autoscaler_pb2 as apb
from nbcluster._runtime.protocol.protos import autoscaler_pb2_grpc as apb_grpc
from nbcluster._runtime.protocol.rpc import AuthedStub, make_channel

log = logging.getLogger(__name__)

KV_NAMESPACE = "autoscaler"
KV_REQUESTED = b"requested"
#: Load-report interval while a monitor listens, and otherwise.
FAST_REPORT_S = 0.5
SLOW_REPORT_S = 5.0
#: A monitor that has not reported for this long counts as gone.
MONITOR_STALE_S = 30.0


def _signature(report: apb.NodeLoadReport) -> tuple[Any, ...]:
    """What about a load report matters to the autoscaler (not its free resources)."""
    return (
        tuple(sorted((tuple(sorted(s.resources.items())), s.count) for s in report.pending)),
        tuple(sorted((tuple(sorted(s.resources.items())), s.count) for s in report.infeasible)),
        report.leased_workers > 0,
        report.bundles > 0,
        report.primary_objects > 0,
        report.draining,
    )


class AutoscalingService(apb_grpc.AutoscalingServicer):
    """The ``Autoscaling`` gRPC service of the head (see the module docstring)."""

    def __init__(
        self,
        state: HeadState,
        placement: PlacementGroupManager,
        token: str,
        persist_kv: Callable[[str, bytes, bytes], None],
        *,
        clock: Callable[[], float] = time.time,
        events_capacity: int = 2000,
    ) -> None:
        self.state = state
        self.placement = placement
        self.token = token
        self.persist_kv = persist_kv
        self.clock = clock
        self.loads: dict[bytes, tuple[apb.NodeLoadReport, float]] = {}
        self.signatures: dict[bytes, tuple[Any, ...]] = {}
        self.version = 1
        self.changed = asyncio.Event()
        self.events: collections.deque[apb.ScalingEvent] = collections.deque(maxlen=events_capacity)
        self.seq = 0
        self.report: apb.AutoscalerReport | None = None
        self.report_time = 0.0
        self.requested: list[apb.Shape] = []
        raw = state.kv_get(KV_NAMESPACE, KV_REQUESTED)
        if raw:
            with contextlib.suppress(Exception):
                self.requested = list(apb.RequestResourcesRequest.FromString(raw).bundles)
        self._channels: dict[str, grpc.aio.Channel] = {}
        #: Called with the last event seq when a report brings events or new demand (the
        #: head's event stream tells its subscribers; see ``head/events.py``).
        self.on_change: Callable[[int], None] | None = None

    def register(self, server: grpc.aio.Server) -> None:
        """Serve this service on the head's server."""
        apb_grpc.add_AutoscalingServicer_to_server(self, server)

    async def close(self) -> None:
        """Close the channels to nodes."""
        for ch in self._channels.values():
            with contextlib.suppress(Exception):
                await ch.close(grace=0.1)
        self._channels.clear()

    def _bump(self) -> None:
        self.version += 1
        self.changed.set()
        self.changed = asyncio.Event()

    def monitor_listening(self) -> bool:
        """True while a monitor reports (nodes then report their load more often)."""
        return self.report is not None and self.clock() - self.report_time < MONITOR_STALE_S

    # -- nodes ------------------------------------------------------------------------------
    async def ReportLoad(self, request: apb.NodeLoadReport, context: grpc.aio.ServicerContext):
        node = self.state.nodes.get(request.node_id)
        if node is None or not node.alive:
            return apb.LoadReply(unknown_node=True, interval_s=FAST_REPORT_S)
        self.loads[request.node_id] = (request, self.clock())
        sig = _signature(request)
        if self.signatures.get(request.node_id) != sig:
            self.signatures[request.node_id] = sig
            self._bump()
        interval = FAST_REPORT_S if self.monitor_listening() else SLOW_REPORT_S
        return apb.LoadReply(interval_s=interval)

    # -- the monitor --------------------------------------------------------------------------
    async def GetDemand(self, request: apb.DemandRequest, context: grpc.aio.ServicerContext):
        if request.after_version >= self.version and request.timeout > 0:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.changed.wait(), timeout=min(request.timeout, 60.0))
        return self.demand()

    def demand(self) -> apb.DemandReply:
        """Live nodes with their latest load, pending placement groups, requested bundles."""
        now = self.clock()
        live = self.state.live_nodes()
        alive = {n.node_id for n in live}
        for nid in [k for k in self.loads if k not in alive]:
            self.loads.pop(nid, None)
            self.signatures.pop(nid, None)
        reply = apb.DemandReply(version=self.version, head_time=now)
        for n in live:
            entry = reply.nodes.add(node_id=n.node_id, node_name=n.node_name, address=n.address)
            got = self.loads.get(n.node_id)
            if got is not None:
                report, at = got
                entry.load.CopyFrom(report)
                entry.has_load = True
                if not _busy(report):
                    entry.load.idle_s = report.idle_s + max(0.0, now - at)
                # The heartbeat is fresher than the load report for free resources.
                entry.load.available.clear()
                entry.load.available.update(n.available)
                entry.load.total.clear()
                entry.load.total.update(n.total)
        for pg in self.placement.groups.values():
            if pg.state != PENDING:
                continue
            g = reply.placement_groups.add(pg_id=pg.pg_id, name=pg.name, strategy=pg.strategy)
            for b in pg.bundles:
                g.bundles.add(resources=dict(b.resources), count=1)
        reply.requested.extend(self.requested)
        return reply

    async def ReportAutoscaler(
        self, request: apb.AutoscalerReport, context: grpc.aio.ServicerContext
    ):
        for ev in request.events:
            self.seq += 1
            ev.seq = self.seq
            self.events.append(ev)
            log.info("autoscaler: %s", ev.message)
        report = apb.AutoscalerReport()
        report.CopyFrom(request)
        del report.events[:]
        previous = self.report
        changed = (
            bool(request.events)
            or previous is None
            or list(previous.pending) != list(report.pending)
        )
        if changed and self.on_change is not None:
            self.on_change(self.seq)
        self.report = report
        self.report_time = self.clock()
        return apb.Ack()

    async def DrainNode(self, request: apb.DrainRequest, context: grpc.aio.ServicerContext):
        node = self.state.nodes.get(request.node_id) if request.node_id else None
        if node is None and request.node_name:
            node = next(
                (n for n in self.state.live_nodes() if n.node_name == request.node_name), None
            )
        if node is None or not node.alive:
            return apb.DrainReply(accepted=True, message="the node is not in the cluster")
        channel = self._channels.get(node.address)
        if channel is None:
            channel = self._channels[node.address] = make_channel(node.address, self.token)
        stub = AuthedStub(apb_grpc.NodeAutoscalingStub(channel), self.token)
        try:
            reply = await stub.DrainNode(
                apb.DrainRequest(node_id=node.node_id, reason=request.reason, undo=request.undo),
                timeout=10,
            )
        except RpcFailure as err:
            return apb.DrainReply(
                accepted=False, message=f"the node did not answer: {err.code().name}"
            )
        if reply.accepted and not request.undo:
            node.available = {}  # nobody places work there from now on
        return reply

    # -- drivers ---------------------------------------------------------------------------------
    async def RequestResources(
        self, request: apb.RequestResourcesRequest, context: grpc.aio.ServicerContext
    ):
        for b in request.bundles:
            if b.count < 0:
                await context.abort(
                    grpc.StatusCode.INVALID_ARGUMENT, f"bundle counts must be >= 0, got {b.count}"
                )
            for name, amount in b.resources.items():
                if not name or amount < 0 or amount != amount or amount == float("inf"):
                    await context.abort(
                        grpc.StatusCode.INVALID_ARGUMENT,
                        f"bundle amounts must be finite numbers >= 0, got {name!r}: {amount}",
                    )
        self.requested = list(request.bundles)
        raw = apb.RequestResourcesRequest(bundles=self.requested).SerializeToString()
        self.state.kv_put(KV_NAMESPACE, KV_REQUESTED, raw, True)
        self.persist_kv(KV_NAMESPACE, KV_REQUESTED, raw)
        self._bump()
        return apb.Ack()

    # -- tools -----------------------------------------------------------------------------------
    async def GetAutoscalerStatus(
        self, request: apb.StatusRequest, context: grpc.aio.ServicerContext
    ):
        reply = apb.AutoscalerStatus(enabled=self.report is not None, last_seq=self.seq)
        if self.report is not None:
            reply.report.CopyFrom(self.report)
            reply.report_age_s = max(0.0, self.clock() - self.report_time)
        reply.events.extend(e for e in self.events if e.seq > request.after_seq)
        reply.requested.extend(self.requested)
        return reply


def _busy(report: apb.NodeLoadReport) -> bool:
    return bool(
        report.leased_workers or report.bundles or report.primary_objects or len(report.pending)
    )
