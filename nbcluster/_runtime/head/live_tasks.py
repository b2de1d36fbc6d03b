"""The head's table of live task attempts: running ones and the owners' pending ones.

No I/O; the head's servicer feeds it and the state API reads it (``TaskState/GetLiveTasks``,
``task_state.proto``). Finished attempts live in the head's ring of task events instead.

- **Running** attempts, keyed by ``(task_id, attempt)``: a worker reports ``RUNNING`` for
  an attempt still running at its next flush (so short tasks cost nothing here). The
  attempt's terminal event (``FINISHED``/``FAILED`` from the worker, or ``FAILED`` from its
  owner when the worker crashed) removes it, and so do the death of its worker or its node:
  a ``RUNNING`` row never outlives the process that runs it. A ``RUNNING`` report that
  arrives after its worker was declared dead is ignored.
- **Pending** tasks: each owner sends, every flush period while it has tasks that waited
  longer than that, a snapshot of them which replaces its previous one; an empty snapshot
  withdraws it. A snapshot not renewed within ``pending_ttl_s`` (the owner died, or its
  report was lost) is dropped, as is an owner's snapshot when the head learns it died.
"""

from __future__ import annotations

import collections
from collections.abc import Iterable
from typing import Any

__all__ = [
    "PENDING_STATES",
    "RUNNING",
    "TERMINAL_STATES",
    "LiveTasks",
]

RUNNING = "RUNNING"
TERMINAL_STATES = frozenset({"FINISHED", "FAILED"})
#: Ray's names for a task that has not started running, in the order a task goes through.
PENDING_STATES = (
    "PENDING_ARGS_AVAIL",
    "PENDING_NODE_ASSIGNMENT",
    "PENDING_ACTOR_TASK_ORDERING_OR_CONCURRENCY",
    "SUBMITTED_TO_WORKER",
)


class LiveTasks:
    """Running attempts and pending-task snapshots (see the module doc).

    ``events`` are ``TaskEvent`` messages (anything with their fields works in tests).
    """

    def __init__(
        self,
        pending_ttl_s: float = 5.0,
        max_running: int = 100_000,
        dead_workers_memory: int = 4096,
    ) -> None:
        self.pending_ttl_s = pending_ttl_s
        self.max_running = max_running
        self.running: dict[tuple[bytes, int], Any] = {}
        # owner address -> (time received, its pending tasks, how many it did not list)
        self.pending: dict[str, tuple[float, list[Any], int]] = {}
        self._dead: set[bytes] = set()
        self._dead_order: collections.deque[bytes] = collections.deque()
        self._dead_memory = dead_workers_memory

    # -- reports ----------------------------------------------------------------------------
    def report(self, events: Iterable[Any]) -> list[Any]:
        """Apply a worker's (or owner's) batch; return the events that end an attempt.

        ``RUNNING`` events enter the table; every other event ends its attempt (it leaves
        the table) and is returned, for the ring of finished attempts.
        """
        running = self.running
        ended = []
        for ev in events:
            if ev.state == RUNNING:
                if ev.worker_id in self._dead or len(running) >= self.max_running:
                    continue
                running[(ev.task_id, ev.attempt)] = ev
            else:
                if running:
                    running.pop((ev.task_id, ev.attempt), None)
                ended.append(ev)
        return ended

    def report_pending(
        self, owner: str, events: Iterable[Any], not_listed: int, now: float
    ) -> None:
        """An owner's snapshot of its waiting tasks replaces its previous one."""
        tasks = list(events)
        if tasks or not_listed:
            self.pending[owner] = (now, tasks, not_listed)
        else:
            self.pending.pop(owner, None)

    # -- deaths -----------------------------------------------------------------------------
    def worker_died(self, worker_id: bytes, address: str = "") -> None:
        """A worker died: its running attempts end, and so does what it owned and waited."""
        if worker_id:
            self._remember_dead(worker_id)
            self._drop_running(lambda ev: ev.worker_id == worker_id)
        if address:
            self.pending.pop(address, None)

    def node_died(self, node_id: bytes) -> None:
        """A node died: no attempt runs there any more."""
        self._drop_running(lambda ev: ev.node_id == node_id)

    def owner_gone(self, address: str) -> None:
        """A driver detached or died: its snapshot of pending tasks goes."""
        self.pending.pop(address, None)

    def _drop_running(self, match: Any) -> None:
        doomed = [key for key, ev in self.running.items() if match(ev)]
        for key in doomed:
            del self.running[key]

    def _remember_dead(self, worker_id: bytes) -> None:
        if worker_id in self._dead:
            return
        self._dead.add(worker_id)
        self._dead_order.append(worker_id)
        if len(self._dead_order) > self._dead_memory:
            self._dead.discard(self._dead_order.popleft())

    # -- queries ----------------------------------------------------------------------------
    def expire(self, now: float) -> None:
        """Drop snapshots their owner did not renew within ``pending_ttl_s``."""
        stale = [o for o, (t, _, _) in self.pending.items() if now - t > self.pending_ttl_s]
        for owner in stale:
            del self.pending[owner]

    def live(self, now: float, job_id: bytes = b"") -> tuple[list[Any], int]:
        """``(running attempts + pending tasks, pending tasks the owners did not list)``.

        A pending task that a worker already reports running shows once, as running.
        """
        self.expire(now)
        running = list(self.running.values())
        out = [ev for ev in running if not job_id or ev.job_id == job_id]
        not_listed = 0
        for _, tasks, hidden in self.pending.values():
            not_listed += hidden
            for ev in tasks:
                if (ev.task_id, ev.attempt) in self.running:
                    continue
                if not job_id or ev.job_id == job_id:
                    out.append(ev)
        return out, not_listed
