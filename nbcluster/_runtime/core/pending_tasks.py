"""An owner's tasks that wait, reported to the head for the state API (``list_tasks``).

The owner alone knows its tasks before they run: waiting for their arguments, for a
worker lease, in an actor's ordered queue, or sent to a worker that has not started them.
While this process has unfinished tasks, :class:`PendingReporter` wakes once a second
and, if some have waited longer than that, sends the head a snapshot of them (at most
:data:`MAX_LISTED`, oldest first) which replaces its previous one; when none are left it
withdraws the snapshot and stops. Tasks that finish within a second never appear, so a
stream of short tasks costs one cheap check a second; the head drops a snapshot that is
not renewed (the owner died). What runs is reported by the workers (``RUNNING``).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from nbcluster._runtime.protocol.errors import RpcFailure
from nbcluster._runtime.protocol.protos import task_state_pb2 as tspb
from nbcluster._runtime.protocol.protos import task_state_pb2_grpc as tspb_grpc
from nbcluster._runtime.protocol.rpc import AuthedStub, pb

if TYPE_CHECKING:
    from nbcluster._runtime.core.ports import PendingHost

__all__ = ["FLUSH_S", "MAX_LISTED", "PendingReporter", "pending_events", "pending_state"]

FLUSH_S = 1.0  # as the workers' event flush
MAX_LISTED = 1000  # tasks per owner in one snapshot (the rest are counted)


def pending_state(rec: Any, actor_inflight: Callable[[Any], bool]) -> str:
    """Ray's ``TaskStatus`` name for a task its owner has not seen finish."""
    if rec.pending_deps > 0:
        return "PENDING_ARGS_AVAIL"
    if rec.actor:
        if actor_inflight(rec):
            return "SUBMITTED_TO_WORKER"
        return "PENDING_ACTOR_TASK_ORDERING_OR_CONCURRENCY"
    lease = rec.lease
    if lease is not None and not lease.dead and rec.task_id in lease.inflight:
        return "SUBMITTED_TO_WORKER"
    return "PENDING_NODE_ASSIGNMENT"


def pending_events(
    records: Iterable[Any],
    now: float,
    min_age: float,
    limit: int,
    actor_inflight: Callable[[Any], bool],
) -> tuple[list[pb.TaskEvent], bool]:
    """``(events, more)``: the unfinished ``records`` (in submission order) that are older
    than ``min_age``, at most ``limit`` of them; ``more`` when the limit cut the list.

    The scan stops at the first younger record: the ones after it are younger still.
    """
    out: list[pb.TaskEvent] = []
    for rec in records:
        if rec.done:
            continue
        submitted = getattr(rec, "submitted_at", None)
        if submitted is None or now - submitted < min_age:
            break
        if len(out) >= limit:
            return out, True
        spec = rec.spec
        out.append(
            pb.TaskEvent(
                task_id=rec.task_id,
                job_id=spec.job_id,
                name=spec.function_name,  # as the worker names it (a method: its name)
                state=pending_state(rec, actor_inflight),
                parent_task_id=spec.parent_task_id,
                attempt=spec.attempt,
                actor_id=spec.actor_id,
            )
        )
    return out, False


class PendingReporter:
    """Sends this owner's waiting tasks to the head once a second while it has any."""

    def __init__(self, client: PendingHost) -> None:
        self.client = client
        self.running = False
        self.reported = False  # the head holds a snapshot of ours
        self._stub: tuple[Any, AuthedStub] | None = None  # (channel, stub)

    def wake(self) -> None:
        """Tasks were submitted (on the I/O loop): make sure the reporter runs."""
        if not self.running:
            self.running = True
            self.client.loop.create_task(self._run())

    def _actor_inflight(self, rec: Any) -> bool:
        conn = self.client.actor_submitter.conns.get(rec.spec.actor_id)
        return conn is not None and rec.task_id in conn.inflight

    async def _run(self) -> None:
        try:
            while True:
                await asyncio.sleep(FLUSH_S)
                submitter = self.client.submitter
                if submitter.closed:
                    return
                # A snapshot, taken in one step: callers' threads add and finish tasks too
                # (core/thread_tasks.py).
                tasks = list(submitter.tasks.values())
                events, more = pending_events(
                    tasks, time.monotonic(), FLUSH_S, MAX_LISTED, self._actor_inflight
                )
                not_listed = max(0, len(tasks) - len(events)) if more else 0
                if events or self.reported:
                    await self._send(events, not_listed)
                    self.reported = bool(events)
                if not tasks and not self.reported:
                    return
        finally:
            self.running = False

    async def _send(self, events: list[pb.TaskEvent], not_listed: int) -> None:
        client = self.client
        channel = client.channels.channel(client.head_address)
        if self._stub is None or self._stub[0] is not channel:  # a worker's may be reopened
            self._stub = (channel, AuthedStub(tspb_grpc.TaskStateStub(channel), client.token))
        with contextlib.suppress(RpcFailure):  # the next second's snapshot replaces it
            await self._stub[1].ReportPendingTasks(
                tspb.PendingTasks(
                    owner_address=client.address, tasks=events, not_listed=not_listed
                ),
                timeout=10,
            )
