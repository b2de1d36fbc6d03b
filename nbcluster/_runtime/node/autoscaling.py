"""The node manager's side of autoscaling: load reports to the head, and drain.

:class:`LoadReporter` tells the head what this node is asked for and whether it may be
removed: lease requests queued here (by resource shape), requests no node of the cluster
can fit (the node answers those with INFEASIBLE at once and the owner retries, so they are
remembered for a few seconds), and what lives here that must not be lost (leased workers =
running tasks and actors, placement-group bundles, objects whose primary copy is here). It
reports when that changes (promptly when new demand appears) and otherwise every few
seconds; the head answers with the interval it wants.

:class:`NodeAutoscalingService` serves ``DrainNode``: before the autoscaler removes this
node it asks, through the head, to drain it. A busy node refuses; an idle one stops
offering resources (so nothing new is placed on it) until it is stopped or undrained.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

import grpc

from nbcluster._runtime.objects.state import StoreState
from nbcluster._runtime.protocol.errors import RpcFailure
from nbcluster._runtime.protocol.protos import autoscaler_pb2 as apb
from nbcluster._runtime.protocol.protos import autoscaler_pb2_grpc as apb_grpc
from nbcluster._runtime.protocol.rpc import AuthedStub, make_channel

log = logging.getLogger(__name__)

#: How long an INFEASIBLE answer counts as demand (owners retry about once a second).
INFEASIBLE_WINDOW_S = 3.0
#: How often the node looks at itself (busy or idle).
SAMPLE_S = 0.1
#: After the first request of a burst, wait this long for the rest before reporting.
SETTLE_S = 0.05
#: Quickest follow-up report after a change.
MIN_GAP_S = 0.1
#: A report at least this often, changed or not.
KEEPALIVE_S = 5.0

ShapeKey = tuple[tuple[str, float], ...]


def _key(resources: Mapping[str, float]) -> ShapeKey:
    return tuple(sorted((k, float(v)) for k, v in resources.items() if v > 0))


def _shapes(counts: Mapping[ShapeKey, int]) -> list[apb.Shape]:
    return [apb.Shape(resources=dict(k), count=n) for k, n in sorted(counts.items()) if n > 0]


def primary_objects(store: StoreState) -> tuple[int, int]:
    """(count, bytes) of objects whose primary copy is in this node's store."""
    return store.primary_totals()


def busy_reason(report: apb.NodeLoadReport) -> str:
    """Why a node must not be removed now, or "" when it is idle."""
    parts = []
    if report.leased_workers:
        parts.append(f"{report.leased_workers} running task(s)/actor(s)")
    queued = sum(s.count for s in report.pending)
    if queued:
        parts.append(f"{queued} queued request(s)")
    if report.bundles:
        parts.append(f"{report.bundles} placement-group bundle(s)")
    if report.primary_objects:
        parts.append(
            f"{report.primary_objects} object(s) ({report.primary_bytes / 2**20:.1f} MiB) "
            "stored only here"
        )
    return ", ".join(parts)


class LoadReporter:
    """Builds and sends this node's load reports (see the module docstring)."""

    def __init__(
        self,
        service: Any,
        token: str,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.service = service
        self.token = token
        self.clock = clock
        self.infeasible: collections.deque[tuple[float, ShapeKey, str]] = collections.deque()
        self.last_busy = clock()
        self.draining = False
        self.saved: tuple[dict[str, float], dict[str, float]] | None = None
        self.drain_reason = ""
        self.interval = 5.0
        self.wake = asyncio.Event()
        self.channel: grpc.aio.Channel | None = None
        self.stub: Any = None

    # -- observations ---------------------------------------------------------------------
    def note_infeasible(self, resources: Mapping[str, float], owner: str) -> None:
        """A lease request was answered INFEASIBLE (no node of the cluster fits it)."""
        key = _key(resources)
        if not key or any("_group_" in k for k, _ in key):
            return
        self.infeasible.append((self.clock(), key, owner))
        self.wake.set()

    def _infeasible_counts(self, now: float) -> dict[ShapeKey, int]:
        while self.infeasible and now - self.infeasible[0][0] > INFEASIBLE_WINDOW_S:
            self.infeasible.popleft()
        # Owners keep one retry in flight per request, about once a second: the requests
        # seen in the last second are the demand; a shape seen earlier in the window counts
        # at least once.
        recent: collections.Counter[ShapeKey] = collections.Counter()
        for at, key, _owner in self.infeasible:
            recent[key] += 1 if now - at <= 1.0 else 0
        return {k: max(n, 1) for k, n in recent.items()}

    def _pending_counts(self) -> dict[ShapeKey, int]:
        return dict(
            collections.Counter(
                _key(p.resources) for p in list(self.service.state.pending.values())
            )
        )

    def report(self, primary: tuple[int, int] | None = None) -> apb.NodeLoadReport:
        """This node's load right now (``primary``: a fresh (count, bytes) of primary objects)."""
        st = self.service.state
        now = self.clock()
        n_obj, n_bytes = (
            primary if primary is not None else primary_objects(self.service.objects.store)
        )
        rep = apb.NodeLoadReport(
            node_id=st.node_id,
            total=dict(st.total),
            available=dict(st.available),
            pending=_shapes(self._pending_counts()),
            infeasible=_shapes(self._infeasible_counts(now)),
            leased_workers=len(st.leases),
            bundles=len(st.bundles),
            primary_objects=n_obj,
            primary_bytes=n_bytes,
            draining=self.draining,
        )
        if busy_reason(rep):
            self.last_busy = now
        rep.idle_s = now - self.last_busy
        return rep

    # -- the loop -----------------------------------------------------------------------------
    async def run(self, head_address: str) -> None:
        """Report to the head until cancelled.

        Every ``SAMPLE_S`` the node looks at its queue and leases (cheap); objects are
        counted once a second. A report goes out when what the autoscaler cares about
        changed (at most every ``MIN_GAP_S``) and otherwise every ``interval`` seconds.
        """
        self.channel = make_channel(head_address, self.token)
        self.stub = AuthedStub(apb_grpc.AutoscalingStub(self.channel), self.token)
        last_sent = -1e9
        last_fast: Any = None
        last_slow: Any = None
        primary = (0, 0)
        counted_at = -1e9
        idle = False
        try:
            while True:
                # Busy: look every SAMPLE_S. Idle: sleep until the node's state changes or
                # the keep-alive is due (an idle node costs no CPU between them).
                timeout = SAMPLE_S
                if idle:
                    timeout = max(SAMPLE_S, KEEPALIVE_S - (self.clock() - last_sent))
                try:
                    await asyncio.wait_for(self.wake.wait(), timeout=timeout)
                    # Woken by a request: let the rest of its burst arrive, so that one
                    # report carries all of it (an owner sends its requests together).
                    await asyncio.sleep(SETTLE_S)
                except TimeoutError:
                    pass
                self.wake.clear()
                st = self.service.state
                now = self.clock()
                if idle or now - counted_at >= 1.0:  # idle: woken by a change, count now
                    primary, counted_at = primary_objects(self.service.objects.store), now
                busy = bool(st.leases or st.pending or st.bundles or primary[0])
                if busy:
                    self.last_busy = now
                pending = self._pending_counts()
                infeasible = self._infeasible_counts(now)
                # New shapes, or a node turning busy or idle, go out at once; changed counts
                # at the head's interval; otherwise a keep-alive.
                fast = (sorted(pending), sorted(infeasible), busy, self.draining)
                slow = (sorted(pending.items()), sorted(infeasible.items()))
                gap = now - last_sent
                # Quiet when everything is reported and no infeasible request can expire:
                # nothing changes then without an event that wakes us (lease, request,
                # object), so no timer is needed until the keep-alive.
                idle = not infeasible and fast == last_fast and slow == last_slow
                if not (
                    (fast != last_fast and gap >= MIN_GAP_S)
                    or (slow != last_slow and gap >= self.interval)
                    or gap >= KEEPALIVE_S
                ):
                    continue
                last_sent = now
                try:
                    rep = self.report(primary)
                    reply = await self.stub.ReportLoad(rep, timeout=5)
                except RpcFailure as err:
                    log.debug("load report failed: %s", err.code().name)
                    continue
                except Exception:  # a bug here must not silence the node's reports for good
                    log.exception("load report failed")
                    continue
                if reply.unknown_node:  # not registered (yet, or again): try again soon
                    last_fast = last_slow = None
                    idle = False
                    continue
                last_fast, last_slow = fast, slow
                idle = not infeasible
                if reply.interval_s > 0:
                    self.interval = reply.interval_s
        finally:
            with contextlib.suppress(Exception):
                await self.channel.close(grace=0.1)

    # -- drain -------------------------------------------------------------------------------
    def leave_reason(self) -> str:
        """What the node tells the head when it stops."""
        if self.draining:
            return f"removed by the autoscaler: {self.drain_reason or 'idle'}"
        return "node stopped"

    def drain(self, undo: bool, reason: str = "") -> apb.DrainReply:
        """Stop offering resources if idle (or give them back with ``undo``)."""
        st = self.service.state
        if undo:
            if self.saved is not None:
                st.total, st.available = self.saved
                self.saved = None
            self.draining = False
            self.wake.set()
            return apb.DrainReply(accepted=True)
        if self.draining:
            return apb.DrainReply(accepted=True, message="already draining")
        why = busy_reason(self.report())
        if why:
            return apb.DrainReply(accepted=False, message=f"busy: {why}")
        self.saved = (dict(st.total), dict(st.available))
        self.drain_reason = reason
        st.total, st.available = {}, {}
        self.draining = True
        self.wake.set()
        log.info("node drained: it takes no new work and is about to be removed")
        return apb.DrainReply(accepted=True)


class NodeAutoscalingService(apb_grpc.NodeAutoscalingServicer):
    """``DrainNode`` on the node manager's server."""

    def __init__(self, reporter: LoadReporter) -> None:
        self.reporter = reporter

    async def DrainNode(self, request: apb.DrainRequest, context: grpc.aio.ServicerContext):
        st = self.reporter.service.state
        if request.node_id and request.node_id != st.node_id:
            return apb.DrainReply(accepted=False, message="not this node (its id changed)")
        return self.reporter.drain(request.undo, request.reason)


def start(service: Any, server: grpc.aio.Server, token: str) -> LoadReporter:
    """Wire autoscaling into a node manager: the drain service on its server, and the
    infeasible-request hook. Call :meth:`LoadReporter.run` once registered."""
    reporter = LoadReporter(service, token)
    apb_grpc.add_NodeAutoscalingServicer_to_server(NodeAutoscalingService(reporter), server)
    service.on_infeasible = reporter.note_infeasible
    service.load_changed = reporter.wake  # set by every change of the node's state
    return reporter
