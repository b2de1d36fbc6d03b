"""The records the state API returns and the head's pushed events, as plain dataclasses.

A leaf module below :mod:`nbcluster.state` (which re-exports every name): what the head
answers or pushes (protobuf) becomes these frozen dataclasses, so tools and widgets never
see protobuf.
"""

from __future__ import annotations

import dataclasses
from typing import Any

__all__ = [
    "ActorChange",
    "ClusterEvent",
    "EventBatch",
    "EventSubscription",
    "JobChange",
    "NodeChange",
    "NodeStats",
    "ObjectInfo",
    "OutputRecord",
    "StoreChange",
    "TaskEvent",
    "event_of",
    "node_of",
]


@dataclasses.dataclass(frozen=True)
class TaskEvent:
    """One finished task attempt, as recorded by the head (for timelines)."""

    task_id: str
    job_id: str
    name: str
    node_id: str
    worker_id: str
    worker_pid: int
    state: str
    start_time: float
    end_time: float
    parent_task_id: str
    attempt: int


@dataclasses.dataclass(frozen=True)
class OutputRecord:
    """Text a task wrote to stdout or stderr (``dropped_lines`` folded by the rate limit),
    or, with ``stream`` ``"display"``, a rich ``display()`` output: ``text`` is the JSON
    ``{"data": {mime: ...}, "metadata": {...}}`` (``dropped_lines``: displays folded)."""

    task_name: str
    stream: str
    text: str
    dropped_lines: int
    pid: int


@dataclasses.dataclass(frozen=True)
class ObjectInfo:
    """An object owned by this driver."""

    object_id: str
    state: str  # "pending", "ready" or "failed"
    size: int
    in_store: bool
    node_id: str
    local_refs: int


@dataclasses.dataclass(frozen=True)
class NodeStats:
    """Resources and object-store use of one node."""

    node_id: str
    name: str
    address: str
    alive: bool
    total: dict[str, float]
    available: dict[str, float]
    store_capacity: int
    store_used: int
    store_spilled: int
    num_workers: int


# -- the event stream ------------------------------------------------------------------------
# What the head pushes (``events.proto``): widgets, the server extension and tools
# subscribe here instead of polling the functions above.


@dataclasses.dataclass(frozen=True)
class NodeChange:
    """A node joined, changed (resources, load, store use) or died."""

    change: str  # "joined", "updated" or "died"
    node: NodeStats
    pending_leases: int  # lease requests waiting on the node (queued tasks)
    running_tasks: int  # leased workers (tasks and actors running)
    death_reason: str


@dataclasses.dataclass(frozen=True)
class ActorChange:
    """An actor changed state (``PENDING``, ``ALIVE``, ``RESTARTING``, ``DEAD``)."""

    actor_id: str
    class_name: str
    name: str
    namespace: str
    state: str
    node_id: str
    pid: int
    job_id: str
    restarts: int
    death_cause: str


@dataclasses.dataclass(frozen=True)
class JobChange:
    """A driver attached (``alive``) or detached/died."""

    job_id: str
    alive: bool
    driver_pid: int
    entrypoint: str
    start_time: float
    end_time: float


@dataclasses.dataclass(frozen=True)
class StoreChange:
    """A node's object-store use changed (bytes)."""

    node_id: str
    node_name: str
    used: int
    spilled: int
    capacity: int


@dataclasses.dataclass(frozen=True)
class ClusterEvent:
    """One pushed event. ``kind`` is ``"task"`` (``data``: :class:`TaskEvent`), ``"node"``
    (:class:`NodeChange`), ``"actor"`` (:class:`ActorChange`), ``"job"``
    (:class:`JobChange`), ``"object"`` (:class:`StoreChange`), ``"autoscaler"`` (``data``:
    the last scaling-event seq; read the news with :func:`autoscaler_status`) or
    ``"dropped"`` (``data``: how many events this subscriber missed because it fell
    behind)."""

    seq: int
    time: float
    kind: str
    data: Any


@dataclasses.dataclass(frozen=True)
class EventBatch:
    """What a subscriber's callback receives.

    ``snapshot``: the events are the current nodes, actors and jobs, not changes (the
    first batch, and again after a reconnection). ``connected`` is False once when the
    stream broke (it resubscribes by itself); ``error`` is set when it ended for good.
    """

    events: tuple[ClusterEvent, ...]
    snapshot: bool = False
    head_id: str = ""
    connected: bool = True
    error: str = ""


class EventSubscription:
    """An open subscription made by :func:`subscribe_events`; :meth:`close` ends it."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    @property
    def alive(self) -> bool:
        """True while subscribed (or reconnecting)."""
        return bool(self._stream.alive)

    @property
    def error(self) -> str | None:
        """Why the stream ended for good (None while it lives)."""
        return self._stream.error  # type: ignore[no-any-return]

    def wait_ready(self, timeout: float = 10.0) -> bool:
        """Wait until the head answered (the snapshot arrived); False at the deadline."""
        return bool(self._stream.wait_ready(timeout))

    def close(self) -> None:
        """End the subscription (idempotent)."""
        self._stream.close()


_ACTOR_STATES = {0: "PENDING", 1: "ALIVE", 2: "RESTARTING", 3: "DEAD"}
_NODE_CHANGES = {0: "updated", 1: "joined", 2: "died"}


def node_of(n: Any) -> NodeStats:
    """A ``NodeInfo`` message as :class:`NodeStats`."""
    return NodeStats(
        node_id=n.node_id.hex(),
        name=n.node_name,
        address=n.address,
        alive=n.alive,
        total=dict(n.total),
        available=dict(n.available),
        store_capacity=n.store_capacity,
        store_used=n.store_used,
        store_spilled=n.store_spilled,
        num_workers=n.num_workers,
    )


def event_of(e: Any) -> ClusterEvent | None:
    """A pushed ``ClusterEvent`` message as a :class:`ClusterEvent` (None: an unknown kind)."""
    kind = e.WhichOneof("body")
    data: Any
    if kind == "task":
        t = e.task
        data = TaskEvent(
            t.task_id.hex(), t.job_id.hex(), t.name, t.node_id.hex(), t.worker_id.hex(),
            t.worker_pid, t.state, t.start_time, t.end_time, t.parent_task_id.hex(), t.attempt,
        )  # fmt: skip
    elif kind == "node":
        n = e.node.node
        data = NodeChange(
            _NODE_CHANGES.get(e.node.change, "updated"),
            node_of(n),
            n.pending_leases,
            n.leased_workers,
            n.death_reason,
        )
    elif kind == "actor":
        a = e.actor.actor
        data = ActorChange(
            a.actor_id.hex(), a.class_name, a.name, a.namespace,
            _ACTOR_STATES.get(a.state, str(a.state)), a.node_id.hex(), a.worker_pid,
            a.job_id.hex(), a.num_restarts, a.death_cause,
        )  # fmt: skip
    elif kind == "job":
        j = e.job.job
        data = JobChange(
            j.job_id.hex(), j.alive, j.driver_pid, j.entrypoint, j.start_time, j.end_time
        )
    elif kind == "object":
        o = e.object
        data = StoreChange(o.node_id.hex(), o.node_name, o.used, o.spilled, o.capacity)
    elif kind == "dropped":
        data = int(e.dropped.count)
    elif kind == "autoscaler":
        data = int(e.autoscaler.last_seq)
    else:
        return None  # a kind this version does not know
    return ClusterEvent(int(e.seq), float(e.time), kind, data)
