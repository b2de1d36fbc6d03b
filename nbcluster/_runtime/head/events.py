"""The head's event publisher: what changes in the cluster, pushed to subscribers.

The head calls the ``*_changed`` / ``tasks`` methods of :class:`EventPublisher` from its
gRPC handlers (all on the head's event loop); subscribers hold one ``Events/Subscribe``
server stream each (``events.proto``). Nothing is computed for an event nobody listens
to, and an idle cluster publishes nothing, so widgets and the lab extension that
subscribe cost the head no CPU while nothing happens (unlike polling).

Every subscriber has a :class:`SubscriberBuffer`: a bounded queue of the events it has
not been sent yet. When a subscriber reads too slowly and its buffer is full, the oldest
events are dropped and counted; the next batch it gets starts with one ``Dropped``
event saying how many. The buffer is a pure data structure, unit-tested without gRPC
(``tests/unit/test_head_events.py``).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import grpc

from nbcluster._runtime.head.state import JobRecord, NodeRecord
from nbcluster._runtime.protocol.protos import events_pb2 as epb
from nbcluster._runtime.protocol.protos import events_pb2_grpc as epb_grpc
from nbcluster._runtime.protocol.rpc import pb

__all__ = [
    "DEFAULT_BUFFER",
    "KINDS",
    "MAX_BATCH",
    "MAX_BUFFER",
    "EventPublisher",
    "Snapshot",
    "SubscriberBuffer",
    "node_key",
]

log = logging.getLogger(__name__)

#: The kinds of events a subscriber may ask for.
KINDS = ("task", "actor", "node", "job", "object", "autoscaler")
#: Events a subscriber may fall behind by, unless it asks for another bound.
DEFAULT_BUFFER = 4096
#: The largest buffer a subscriber may ask for.
MAX_BUFFER = 65536
#: Events per streamed batch at most.
MAX_BATCH = 1000


class SubscriberBuffer:
    """A bounded FIFO of events for one subscriber that counts what it had to drop.

    ``push`` never blocks: when the buffer holds ``capacity`` events, the oldest one is
    dropped. ``take`` returns how many were dropped since the previous ``take`` (0 when
    none) and up to ``limit`` events, oldest first.
    """

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be at least 1, got {capacity}")
        self.capacity = capacity
        self._items: collections.deque[Any] = collections.deque()
        self._dropped = 0
        #: Every event ever dropped for this subscriber.
        self.total_dropped = 0

    def __len__(self) -> int:
        return len(self._items)

    def push(self, item: Any) -> None:
        """Queue ``item``; drop the oldest queued item when the buffer is full."""
        if len(self._items) >= self.capacity:
            self._items.popleft()
            self._dropped += 1
            self.total_dropped += 1
        self._items.append(item)

    def take(self, limit: int = MAX_BATCH) -> tuple[int, list[Any]]:
        """``(dropped since the last take, up to limit items)``; both may be empty."""
        dropped, self._dropped = self._dropped, 0
        n = min(limit, len(self._items))
        return dropped, [self._items.popleft() for _ in range(n)]


def node_key(node: NodeRecord | None) -> tuple[Any, ...] | None:
    """What about a node the subscribers see: a heartbeat that leaves it equal is no event."""
    if node is None:
        return None
    return (
        node.alive,
        tuple(sorted(node.total.items())),
        tuple(sorted(node.available.items())),
        node.num_workers,
        node.pending_leases,
        node.leased_workers,
        node.store_used,
        node.store_spilled,
        node.store_capacity,
    )


def _store_key(node: NodeRecord) -> tuple[int, int, int]:
    return (node.store_used, node.store_spilled, node.store_capacity)


@dataclass(frozen=True)
class Snapshot:
    """The current state a new subscriber starts from."""

    nodes: list[pb.NodeInfo]
    actors: list[pb.ActorInfo]
    jobs: list[pb.JobInfo]


@dataclass(eq=False)
class _Subscriber:
    kinds: frozenset[str]
    job_id: bytes
    buffer: SubscriberBuffer
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    closed: bool = False

    def wants(self, kind: str, job_id: bytes = b"") -> bool:
        if kind not in self.kinds:
            return False
        return not (kind == "task" and self.job_id and job_id != self.job_id)


class EventPublisher(epb_grpc.EventsServicer):
    """Fans the head's changes out to ``Events/Subscribe`` streams (see the module doc).

    ``snapshot()`` returns the current nodes, actors and jobs for a new subscriber;
    ``node_info``/``job_info`` turn the head's records into their wire form.
    """

    def __init__(
        self,
        snapshot: Callable[[], Snapshot],
        node_info: Callable[[NodeRecord], pb.NodeInfo],
        job_info: Callable[[JobRecord], pb.JobInfo],
        *,
        clock: Callable[[], float] = time.time,
        default_buffer: int = DEFAULT_BUFFER,
    ) -> None:
        self._snapshot = snapshot
        self._node_info = node_info
        self._job_info = job_info
        self.clock = clock
        self.default_buffer = default_buffer
        self.head_id = os.urandom(8).hex()
        self.seq = 0
        self._subs: list[_Subscriber] = []
        self._closed = False

    @property
    def subscribers(self) -> int:
        """How many streams are open."""
        return len(self._subs)

    def register(self, server: grpc.aio.Server) -> None:
        """Serve ``Events`` on the head's server."""
        epb_grpc.add_EventsServicer_to_server(self, server)

    def close(self) -> None:
        """End every stream (the head is stopping)."""
        self._closed = True
        for sub in self._subs:
            sub.closed = True
            sub.wake.set()

    # -- publishing (the head's handlers call these) ------------------------------------------
    def _fanout(self, kind: str, make: Callable[[], epb.Event], job_id: bytes = b"") -> None:
        targets = [s for s in self._subs if s.wants(kind, job_id)]
        self.seq += 1
        if not targets:
            return
        event = make()
        event.seq = self.seq
        event.time = self.clock()
        for sub in targets:
            sub.buffer.push(event)
            sub.wake.set()

    def node_joined(self, node: NodeRecord) -> None:
        """A node registered."""
        self._node(epb.NodeEvent.JOINED, node)
        self._store(node)

    def node_died(self, node: NodeRecord | None) -> None:
        """A node left or was declared dead."""
        if node is not None:
            self._node(epb.NodeEvent.DIED, node)

    def node_heartbeat(self, before: tuple[Any, ...] | None, node: NodeRecord | None) -> None:
        """A heartbeat arrived: publish the node (and its store) if what shows changed.

        ``before`` is :func:`node_key` of the node taken before the heartbeat was applied.
        """
        if node is None or not node.alive or node_key(node) == before:
            return
        self._node(epb.NodeEvent.UPDATED, node)
        if before is None or before[6:9] != _store_key(node):
            self._store(node)

    def _node(self, change: int, node: NodeRecord) -> None:
        self._fanout(
            "node",
            lambda: epb.Event(node=epb.NodeEvent(change=change, node=self._node_info(node))),
        )

    def _store(self, node: NodeRecord) -> None:
        self._fanout(
            "object",
            lambda: epb.Event(
                object=epb.ObjectStoreEvent(
                    node_id=node.node_id,
                    node_name=node.node_name,
                    used=node.store_used,
                    spilled=node.store_spilled,
                    capacity=node.store_capacity,
                )
            ),
        )

    def job_changed(self, job: JobRecord) -> None:
        """A driver attached, detached or died."""
        self._fanout("job", lambda: epb.Event(job=epb.JobEvent(job=self._job_info(job))))

    def actor_changed(self, info: pb.ActorInfo) -> None:
        """An actor changed state."""
        self._fanout("actor", lambda: epb.Event(actor=epb.ActorEvent(actor=info)))

    def autoscaler_changed(self, last_seq: int) -> None:
        """The autoscaler reported scaling events or new demand."""
        self._fanout(
            "autoscaler", lambda: epb.Event(autoscaler=epb.AutoscalerEvent(last_seq=last_seq))
        )

    def tasks(self, events: Iterable[pb.TaskEvent]) -> None:
        """Task attempts the workers reported."""
        for ev in events:
            self._fanout("task", lambda ev=ev: epb.Event(task=ev), ev.job_id)

    # -- the stream ------------------------------------------------------------------------------
    async def Subscribe(self, request: epb.SubscribeRequest, context: grpc.aio.ServicerContext):
        unknown = sorted(set(request.kinds) - set(KINDS))
        if unknown:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"unknown event kinds {unknown}; choose from {list(KINDS)} (none means all)",
            )
        if request.buffer > MAX_BUFFER:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"buffer must be at most {MAX_BUFFER} events, got {request.buffer}",
            )
        if self._closed:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "the head is stopping")
        sub = _Subscriber(
            kinds=frozenset(request.kinds or KINDS),
            job_id=request.job_id,
            buffer=SubscriberBuffer(request.buffer or self.default_buffer),
        )
        # Registered and snapshotted in one step of the loop: no change falls in between.
        self._subs.append(sub)
        try:
            first = self._snapshot_batch(sub) if request.snapshot else None
            if first is not None:
                yield first
            while not sub.closed:
                await sub.wake.wait()
                sub.wake.clear()
                while not sub.closed:
                    batch = self._next_batch(sub)
                    if batch is None:
                        break
                    yield batch
        finally:
            self._subs.remove(sub)

    def _snapshot_batch(self, sub: _Subscriber) -> epb.EventBatch:
        snap = self._snapshot()
        now = self.clock()
        batch = epb.EventBatch(snapshot=True, head_id=self.head_id)
        if "node" in sub.kinds:
            for n in snap.nodes:
                batch.events.add(seq=self.seq, time=now).node.CopyFrom(
                    epb.NodeEvent(change=epb.NodeEvent.UPDATED, node=n)
                )
        if "object" in sub.kinds:
            for n in snap.nodes:
                batch.events.add(seq=self.seq, time=now).object.CopyFrom(
                    epb.ObjectStoreEvent(
                        node_id=n.node_id,
                        node_name=n.node_name,
                        used=n.store_used,
                        spilled=n.store_spilled,
                        capacity=n.store_capacity,
                    )
                )
        if "actor" in sub.kinds:
            for a in snap.actors:
                batch.events.add(seq=self.seq, time=now).actor.actor.CopyFrom(a)
        if "job" in sub.kinds:
            for j in snap.jobs:
                batch.events.add(seq=self.seq, time=now).job.job.CopyFrom(j)
        return batch

    def _next_batch(self, sub: _Subscriber) -> epb.EventBatch | None:
        dropped, items = sub.buffer.take(MAX_BATCH)
        if not dropped and not items:
            return None
        batch = epb.EventBatch(head_id=self.head_id)
        if dropped:
            first_kept = items[0].seq if items else self.seq + 1
            batch.events.add(seq=first_kept - 1, time=self.clock()).dropped.count = dropped
            log.info("an event subscriber fell behind: dropped %d events", dropped)
        batch.events.extend(items)
        return batch
