"""The head's logic as a state machine: events in, instructions out, no I/O.

The gRPC servicer (``service.py``) turns RPCs into calls here and carries out what comes
back (persisting rows, answering callers). Time is passed in, never read, so tests drive
liveness with a fake clock.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Iterable
from typing import Any

from nbcluster._runtime.head.live_tasks import LiveTasks


@dataclasses.dataclass
class NodeRecord:
    """What the head knows about one node manager."""

    node_id: bytes
    node_name: str
    address: str
    hostname: str
    store_dir: str
    total: dict[str, float]
    available: dict[str, float]
    store_capacity: int
    pid: int
    start_time: float
    last_heartbeat: float
    alive: bool = True
    death_reason: str = ""
    store_used: int = 0
    store_spilled: int = 0
    num_workers: int = 0
    pending_leases: int = 0
    leased_workers: int = 0
    # False for a record restored from the head's database after a restart, until the node
    # shows it is still there (a heartbeat or a new registration). Unconfirmed nodes get no
    # new work; one that stays silent for the death timeout is declared dead.
    confirmed: bool = True
    # False while the head cannot reach the address the node advertised (probed at
    # registration, then again until it answers): such a node gets no work.
    reachable: bool = True
    unreachable_reason: str = ""


@dataclasses.dataclass
class JobRecord:
    """A driver attached to the cluster."""

    job_id: bytes
    driver_address: str
    driver_pid: int
    namespace: str
    entrypoint: str
    start_time: float
    driver_hostname: str = ""
    end_time: float = 0.0
    alive: bool = True


@dataclasses.dataclass(frozen=True)
class NodeDied:
    """Instruction: tell the cluster this node is dead (and why)."""

    node_id: bytes
    reason: str


class HeadState:
    """Nodes with liveness, jobs, the function table, internal KV and task events."""

    def __init__(self, node_death_timeout_s: float, task_events_capacity: int = 100_000) -> None:
        self.node_death_timeout_s = node_death_timeout_s
        self.nodes: dict[bytes, NodeRecord] = {}
        self.jobs: dict[bytes, JobRecord] = {}
        self.functions: dict[bytes, tuple[str, bytes]] = {}
        self.kv: dict[tuple[str, bytes], bytes] = {}
        self.task_events: collections.deque[Any] = collections.deque(maxlen=task_events_capacity)
        self.dropped_events = 0
        self.live_tasks = LiveTasks()  # running attempts and owners' pending tasks

    # -- nodes -------------------------------------------------------------------------
    def register_node(self, record: NodeRecord) -> None:
        """A node joins (or re-joins under a fresh id after being fenced)."""
        self.nodes[record.node_id] = record

    def restore_node(self, record: NodeRecord, now: float) -> None:
        """A node record read back from disk after a head restart.

        A node that was alive is not trusted to still be: it stays unconfirmed (no new
        work) until it heartbeats or registers, and :meth:`tick` declares it dead when it
        stays silent for the death timeout counted from ``now`` (the restart).
        """
        if record.alive:
            record.confirmed = False
            record.last_heartbeat = now
        self.nodes[record.node_id] = record

    def heartbeat(
        self,
        node_id: bytes,
        now: float,
        available: dict[str, float],
        store_used: int,
        num_workers: int,
        store_spilled: int = 0,
        pending_leases: int = 0,
        total: dict[str, float] | None = None,
        leased_workers: int = 0,
    ) -> bool:
        """Record a heartbeat; return False when the node must re-register.

        A node the head does not know (head restarted) or has declared dead (it hung past
        the timeout and came back) is fenced: it must re-register under a new id.
        """
        node = self.nodes.get(node_id)
        if node is None or not node.alive:
            return False
        node.last_heartbeat = now
        node.confirmed = True
        node.available = dict(available)
        if total:
            node.total = dict(total)
        node.store_used = store_used
        node.store_spilled = store_spilled
        node.num_workers = num_workers
        node.pending_leases = pending_leases
        node.leased_workers = leased_workers
        return True

    def unregister_node(self, node_id: bytes, reason: str) -> NodeDied | None:
        """A node leaves cleanly."""
        node = self.nodes.get(node_id)
        if node is None or not node.alive:
            return None
        node.alive = False
        node.death_reason = reason
        return NodeDied(node_id, reason)

    def tick(self, now: float) -> list[NodeDied]:
        """Declare dead every live node whose last heartbeat is older than the timeout."""
        died = []
        for node in self.nodes.values():
            if node.alive and now - node.last_heartbeat > self.node_death_timeout_s:
                node.alive = False
                if node.confirmed:
                    node.death_reason = (
                        f"no heartbeat for {now - node.last_heartbeat:.1f}s "
                        f"(timeout {self.node_death_timeout_s:.1f}s)"
                    )
                else:
                    node.death_reason = (
                        "it did not come back within the death timeout "
                        f"({self.node_death_timeout_s:.1f}s) after the head restarted"
                    )
                died.append(NodeDied(node.node_id, node.death_reason))
        return died

    def set_reachable(self, node_id: bytes, reachable: bool, reason: str = "") -> bool:
        """Record the result of probing a node's advertised address; True when it changed."""
        node = self.nodes.get(node_id)
        if node is None or node.reachable == reachable:
            if node is not None:
                node.unreachable_reason = reason
            return False
        node.reachable = reachable
        node.unreachable_reason = reason
        return True

    def live_nodes(self) -> list[NodeRecord]:
        """Live nodes that may take work, oldest first: restored ones not yet confirmed and
        ones the head cannot reach are left out."""
        return [n for n in self.nodes.values() if n.alive and n.confirmed and n.reachable]

    # -- jobs --------------------------------------------------------------------------
    def register_job(self, job: JobRecord) -> None:
        """A driver attached."""
        self.jobs[job.job_id] = job

    def finish_job(self, job_id: bytes, now: float) -> JobRecord | None:
        """A driver detached (or died)."""
        job = self.jobs.get(job_id)
        if job is None or not job.alive:
            return None
        job.alive = False
        job.end_time = now
        return job

    # -- function table -----------------------------------------------------------------
    def export_function(self, function_id: bytes, name: str, payload: bytes) -> bool:
        """Store a pickled function by content hash; True when it was new."""
        if function_id in self.functions:
            return False
        self.functions[function_id] = (name, payload)
        return True

    # -- internal KV ----------------------------------------------------------------------
    def kv_put(self, ns: str, key: bytes, value: bytes, overwrite: bool) -> bool:
        """Set a key; return True when it was added (not already present)."""
        k = (ns, key)
        existed = k in self.kv
        if existed and not overwrite:
            return False
        self.kv[k] = value
        return not existed

    def kv_get(self, ns: str, key: bytes) -> bytes | None:
        """Get a key's value, or None."""
        return self.kv.get((ns, key))

    def kv_del(self, ns: str, key: bytes, prefix: bool = False) -> list[bytes]:
        """Delete a key (or every key starting with ``key`` when ``prefix``); return deleted keys."""
        if prefix:
            doomed = [k for (n, k) in self.kv if n == ns and k.startswith(key)]
        else:
            doomed = [key] if (ns, key) in self.kv else []
        for k in doomed:
            del self.kv[(ns, k)]
        return doomed

    def kv_keys(self, ns: str, prefix: bytes) -> list[bytes]:
        """Keys of namespace ``ns`` that start with ``prefix``."""
        return sorted(k for (n, k) in self.kv if n == ns and k.startswith(prefix))

    # -- task events -----------------------------------------------------------------------
    def add_task_events(self, events: Iterable[Any]) -> list[Any]:
        """Append finished attempts to the bounded ring (oldest dropped first); ``RUNNING``
        ones go to :attr:`live_tasks` instead. Return the finished ones."""
        ended = self.live_tasks.report(events)
        for ev in ended:
            if len(self.task_events) == self.task_events.maxlen:
                self.dropped_events += 1
            self.task_events.append(ev)
        return ended
