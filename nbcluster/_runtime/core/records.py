"""The owner's records of its tasks: one per task, one per scheduling key, one per lease.

These are plain data. :mod:`owner_state` makes every decision about them; the shell in
:mod:`submitter` fills in what only it can touch (the stream of a lease, its idle timer).
"""

from __future__ import annotations

import collections
from typing import Any

__all__ = ["FAST_TASK_S", "KeyQueue", "Lease", "TaskRecord"]

FAST_TASK_S = 0.002  # tasks shorter than this on average are pipelined on a worker


class TaskRecord:
    """An owner's record of one submitted task (also its lineage)."""

    __slots__ = (
        "task_id",
        "spec",
        "key",
        "resources",
        "strategy",
        "return_ids",
        "retries_left",
        "dep_ids",
        "nested_ids",
        "pending_deps",
        "cancelled",
        "force_cancel",
        "lease",
        "name",
        "done",
        "submitted_at",
        "context",
        "actor",
        "route",
        "locality",
        "oom_retries_left",
        "resolved",
        "generator",
        "lineage",
    )

    def __init__(self) -> None:
        self.pending_deps = 0
        self.cancelled = False
        self.force_cancel = False
        self.lease: Lease | None = None
        self.done = False
        self.context: Any = None  # who submitted it (e.g. the notebook cell), for output
        self.actor = False  # an actor call: ordered by the actor submitter, not leased
        self.route: tuple[Any, ...] | None = None  # how its strategy picks nodes
        self.locality = ""  # node manager holding most of its argument bytes
        self.oom_retries_left: int | None = None  # separate budget for memory-monitor kills
        self.resolved = False  # arguments ready (actor calls wait in order until then)
        self.generator: Any = None  # generator tasks: their stream (core/generators.py)
        self.lineage: dict[bytes, TaskRecord] | None = None  # makers of its task-made args


class KeyQueue:
    """Ready tasks of one scheduling key and the leases that run them."""

    def __init__(
        self,
        key: tuple[Any, ...],
        resources: dict[str, float],
        strategy: str,
        pipeline: bool = True,
        route: tuple[Any, ...] | None = None,
        runtime_env: str = "",
    ) -> None:
        self.key = key
        self.runtime_env = runtime_env  # resolved JSON: leases come from this env's pool
        self.route = route  # ("spread",), ("node", node_id, soft) or ("pg", pg_id, index)
        self.rr = 0  # round-robin position over the route's nodes
        self.pipeline = pipeline  # False for tasks whose workers exit after max_calls
        self.resources = resources
        self.strategy = strategy
        self.queue: collections.deque[TaskRecord] = collections.deque()
        self.leases: list[Lease] = []
        self.requests: dict[bytes, str] = {}  # request id -> node address
        self.cancelling: set[bytes] = set()  # requests we asked the node to drop
        self.avg_duration = 1.0  # unknown: assume slow (no pipelining) until measured
        self.warned = False

    def depth(self, max_depth: int) -> int:
        """How many tasks one lease may hold at once (pipelining only for fast tasks)."""
        if self.route == ("spread",):
            return 1  # every task gets its own round-robin placement
        return max_depth if self.pipeline and self.avg_duration < FAST_TASK_S else 1


class Lease:
    """A leased worker: what it runs now, and whether it may take more."""

    def __init__(self, kq: KeyQueue, grant: Any, node_address: str) -> None:
        # ``grant``: the node manager's GRANTED ``LeaseReply``.
        self.kq = kq
        self.lease_id: bytes = grant.lease_id
        self.worker_id: bytes = grant.worker_id
        self.worker_address: str = grant.worker_address
        self.channel_address: str = grant.worker_channel_address  # "": ask the worker
        self.worker_pid: int = grant.worker_pid
        self.gpu_ids = list(grant.gpu_ids)
        self.node_address = node_address
        self.node_id: bytes = grant.node_id
        self.inflight: dict[bytes, TaskRecord] = {}
        self.dead = False
        self.exiting = False
        self.returned = False
        # Its worker answered "requeued" (its task blocks in get): nothing more goes to it
        # until what it runs is done (the task it waits for may be the one sent back).
        self.blocked = False
        self.idle = False  # an idle-return timer is set (the shell holds its handle)
        self.idle_gen = 0  # which idle timer is current (a stale one does nothing)
        # The shell's side: the stream, what waits to be written, whether a writer runs,
        # the idle timer's handle. The state machine never reads these.
        self.call: Any = None
        self.outbox: list[Any] = []
        self.writing = False
        self.idle_handle: Any = None
        # Thread I/O (``thread_tasks.py``): a caller's thread reads the channel (the loop's
        # reading is paused), how many threads wait reading it, when a thread last wrote or
        # the channel went to the threads, a write a thread left half done to the loop.
        self.thread_reads = False
        self.readers = 0
        self.last_direct = 0.0
        self.handoff = False
