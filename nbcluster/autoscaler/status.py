"""What the autoscaler is doing, read from the head: node types, demand, scaling events.

The head keeps the autoscaler's latest report and a ring of scaling events (launches,
joins, removals, failed launches, infeasible requests); this module reads them into plain
dataclasses. It is the one place that data comes from: ``nbcluster status``, the
``Autoscaler`` widget (through :func:`nbcluster.state.autoscaler_status`) and the server
extension's cluster card all use :func:`read_status`.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping

from nbcluster._runtime.protocol.errors import Peer, RpcFailure, to_exception
from nbcluster._runtime.protocol.protos import autoscaler_pb2 as apb
from nbcluster._runtime.protocol.protos import autoscaler_pb2_grpc as apb_grpc
from nbcluster._runtime.protocol.rpc import SyncStub, make_sync_channel
from nbcluster.autoscaler.policy import format_shape

__all__ = ["AutoscalerStatus", "NodeTypeStatus", "ScalingEvent", "from_proto", "read_status"]


@dataclasses.dataclass(frozen=True)
class ScalingEvent:
    """One autoscaler event: ``kind`` is ``launch``, ``joined``, ``terminate``, ``removed``,
    ``launch-failed``, ``terminate-failed``, ``infeasible``, ``resumed`` or ``lost``."""

    seq: int
    time: float
    kind: str
    message: str
    node_type: str = ""
    instance_id: str = ""
    count: int = 0
    shape: Mapping[str, float] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class NodeTypeStatus:
    """Nodes of one type: running, launching, limits, and launch failures in a row."""

    name: str
    resources: Mapping[str, float]
    min_workers: int
    max_workers: int
    running: int
    launching: int
    failures: int = 0
    retry_in_s: float = 0.0


@dataclasses.dataclass(frozen=True)
class AutoscalerStatus:
    """The autoscaler's latest report plus events (``enabled`` is False without one).

    ``pending``: demand seen in the last round as (shape, count); ``infeasible``: shapes
    no node type can hold; ``waiting``: (shape, count, why) for feasible demand not
    placed yet; ``requested``: the bundles of the last ``request_resources()``.
    """

    enabled: bool
    cluster_name: str = ""
    provider: str = ""
    node_types: tuple[NodeTypeStatus, ...] = ()
    pending: tuple[tuple[Mapping[str, float], int], ...] = ()
    infeasible: tuple[tuple[Mapping[str, float], int], ...] = ()
    waiting: tuple[tuple[Mapping[str, float], int, str], ...] = ()
    requested: tuple[tuple[Mapping[str, float], int], ...] = ()
    events: tuple[ScalingEvent, ...] = ()
    last_seq: int = 0
    report_age_s: float = 0.0
    idle_timeout_s: float = 0.0
    max_workers: int = 0

    @property
    def running(self) -> int:
        """Worker nodes running."""
        return sum(t.running for t in self.node_types)

    @property
    def launching(self) -> int:
        """Worker nodes starting."""
        return sum(t.launching for t in self.node_types)

    def summary(self) -> str:
        """One line: ``autoscaler (local): 2 running, 1 launching, max 3; 4 queued``."""
        if not self.enabled:
            return "autoscaler: off"
        queued = sum(n for _, n in self.pending)
        text = (
            f"autoscaler ({self.provider}): {self.running} running, {self.launching} "
            f"launching, max {self.max_workers}; {queued} queued"
        )
        if self.infeasible:
            text += f"; {len(self.infeasible)} infeasible shape(s)"
        return text

    def format(self, events: int = 10) -> str:
        """Several lines for a terminal: types, demand, decisions, the last ``events``."""
        if not self.enabled:
            return "autoscaler: off (no autoscaler reports to this head)"
        stale = f" (last report {self.report_age_s:.0f}s ago)" if self.report_age_s > 30 else ""
        lines = [
            f"autoscaler: cluster {self.cluster_name!r}, {self.provider} provider, idle "
            f"timeout {self.idle_timeout_s:g}s, max {self.max_workers} workers{stale}"
        ]
        for t in self.node_types:
            line = (
                f"  {t.name:<14} {format_shape(t.resources):<24} {t.running} running, "
                f"{t.launching} launching (min {t.min_workers}, max {t.max_workers})"
            )
            if t.failures:
                line += f"; {t.failures} failed launch(es), retry in {t.retry_in_s:.0f}s"
            lines.append(line)
        lines.append(
            "  pending demand: "
            + (", ".join(f"{n} x {format_shape(s)}" for s, n in self.pending) or "none")
        )
        for s, n, why in self.waiting:
            lines.append(f"  waiting: {n} x {format_shape(s)}: {why}")
        for s, n in self.infeasible:
            lines.append(f"  infeasible: {n} x {format_shape(s)} (no node type can hold it)")
        if self.requested:
            lines.append(
                "  request_resources: "
                + ", ".join(f"{n} x {format_shape(s)}" for s, n in self.requested)
            )
        if events and self.events:
            lines.append("  recent events:")
            for ev in self.events[-events:]:
                stamp = time.strftime("%H:%M:%S", time.localtime(ev.time))
                lines.append(f"    {stamp} {ev.kind:<15} {ev.message}")
        return "\n".join(lines)


def _shape(s: apb.Shape) -> tuple[dict[str, float], int]:
    return dict(s.resources), int(s.count)


def from_proto(msg: apb.AutoscalerStatus) -> AutoscalerStatus:
    """Convert the head's reply."""
    requested = tuple(_shape(s) for s in msg.requested)
    events = tuple(
        ScalingEvent(
            e.seq, e.time, e.kind, e.message, e.node_type, e.instance_id, e.count, dict(e.shape)
        )
        for e in msg.events
    )
    if not msg.enabled:
        return AutoscalerStatus(False, requested=requested, events=events, last_seq=msg.last_seq)
    r = msg.report
    return AutoscalerStatus(
        enabled=True,
        cluster_name=r.cluster_name,
        provider=r.provider,
        node_types=tuple(
            NodeTypeStatus(
                t.name,
                dict(t.resources),
                t.min_workers,
                t.max_workers,
                t.running,
                t.launching,
                t.failures,
                t.retry_in_s,
            )
            for t in r.node_types
        ),
        pending=tuple(_shape(s) for s in r.pending),
        infeasible=tuple(_shape(s) for s in r.infeasible),
        waiting=tuple((*_shape(w.shape), w.reason) for w in r.waiting),
        requested=requested,
        events=events,
        last_seq=msg.last_seq,
        report_age_s=msg.report_age_s,
        idle_timeout_s=r.idle_timeout_s,
        max_workers=r.max_workers,
    )


def read_status(
    address: str, token: str, *, after_seq: int = 0, timeout: float = 5.0
) -> AutoscalerStatus:
    """Ask the head at ``address`` (blocking; any thread). ``after_seq``: only newer events.

    Raises ``HeadUnavailableError`` when the head cannot be reached.
    """
    channel = make_sync_channel(address, token)
    try:
        stub = SyncStub(apb_grpc.AutoscalingStub(channel), token, address)
        try:
            reply = stub.GetAutoscalerStatus(
                apb.StatusRequest(after_seq=after_seq), timeout=timeout
            )
        except RpcFailure as err:
            raise to_exception(err, Peer.HEAD, "autoscaler status") from None
    finally:
        channel.close()
    return from_proto(reply)
