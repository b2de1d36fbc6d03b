"""HeadLink, the node's heartbeat loop, against a fake head (no sockets, no processes).

A change made while a heartbeat is in flight (a lease granted during the RPC) must be
reported at the next interval, not held back until the keep-alive; so must a lease granted
and given back between two heartbeats (the head counted the actor it placed with it).
"""

from __future__ import annotations

import asyncio
import types
from typing import Any

from nbcluster._runtime.node.head_link import HeadLink
from nbcluster._runtime.protocol.rpc import pb


class FakeState:
    """The parts of NodeState the heartbeat reads."""

    def __init__(self) -> None:
        self.node_id = b"n" * 16
        self.available = {"CPU": 2.0}
        self.total = {"CPU": 2.0}
        self.pending: dict[bytes, Any] = {}
        self.workers: dict[bytes, Any] = {}
        self.leases: dict[bytes, Any] = {}

    def update_cluster_view(self, nodes: Any) -> list[Any]:
        return []


class FakeService:
    def __init__(self) -> None:
        self.state = FakeState()
        stats = types.SimpleNamespace(used=0, spilled_bytes=0)
        self.objects = types.SimpleNamespace(store=types.SimpleNamespace(stats=lambda: stats))
        self.changed = asyncio.Event()
        self.grants = 0

    def apply(self, instructions: list[Any]) -> None:
        self.changed.set()


class FakeHead:
    """Answers heartbeats; during the first one the node grants a lease."""

    def __init__(self, service: FakeService) -> None:
        self.service = service
        self.reports: list[dict[str, float]] = []
        self.second = asyncio.Event()

    async def Heartbeat(self, request: pb.HeartbeatRequest, timeout: float) -> Any:
        self.reports.append(dict(request.available))
        if len(self.reports) == 1:  # a lease is granted while this call is in flight
            self.service.state.available = {"CPU": 1.0}
            self.service.changed.set()
            await asyncio.sleep(0)
        else:
            self.second.set()
        return pb.HeartbeatReply()


def test_a_change_during_a_heartbeat_is_reported_without_waiting_for_the_keepalive() -> None:
    async def scenario() -> list[dict[str, float]]:
        service = FakeService()
        head = FakeHead(service)
        link = object.__new__(HeadLink)
        link.service, link.stub = service, head  # type: ignore[assignment]
        link.interval, link.keepalive = 0.01, 3600.0
        service.changed.set()  # something to report at start
        task = asyncio.create_task(link.run())
        try:
            await asyncio.wait_for(head.second.wait(), timeout=30)  # hang guard only
        finally:
            task.cancel()
        return head.reports

    reports = asyncio.run(scenario())
    assert reports[:2] == [{"CPU": 2.0}, {"CPU": 1.0}]


class QuietHead:
    """Answers heartbeats; counts them."""

    def __init__(self) -> None:
        self.reports: list[dict[str, float]] = []
        self.got = asyncio.Event()

    async def Heartbeat(self, request: pb.HeartbeatRequest, timeout: float) -> Any:
        self.reports.append(dict(request.available))
        self.got.set()
        return pb.HeartbeatReply()


def test_a_lease_granted_and_gone_between_heartbeats_is_still_reported() -> None:
    async def scenario() -> tuple[int, int, int]:
        service = FakeService()
        head = QuietHead()
        link = object.__new__(HeadLink)
        link.service, link.stub = service, head  # type: ignore[assignment]
        link.interval, link.keepalive = 0.01, 3600.0
        service.changed.set()
        task = asyncio.create_task(link.run())
        try:
            await asyncio.wait_for(head.got.wait(), timeout=30)
            first = len(head.reports)
            # Woken with nothing new to say: no report (the keep-alive is an hour away).
            head.got.clear()
            service.changed.set()
            await asyncio.sleep(0.1)
            idle = len(head.reports)
            # A lease granted and returned within one interval: the state reads as before.
            service.grants += 1
            service.changed.set()
            await asyncio.wait_for(head.got.wait(), timeout=30)  # hang guard only
            return first, idle, len(head.reports)
        finally:
            task.cancel()

    first, idle, after = asyncio.run(scenario())
    assert idle == first  # an unchanged state is not sent again
    assert after == idle + 1  # but it is after a grant
