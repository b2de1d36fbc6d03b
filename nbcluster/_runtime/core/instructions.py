"""What the owner's state machine asks its shell to do.

Every event of :class:`~nbcluster._runtime.core.owner_state.OwnerState` returns a list of
these; :mod:`submitter` carries them out (an RPC, a write on a worker's stream, a timer,
writing a result into the object table). None holds a decision: the state machine has
made it already. They are named tuples: cheap to build on the hot path, easy to compare
in tests.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from nbcluster._runtime.core.records import KeyQueue, Lease, TaskRecord

__all__ = [
    "AskExitInfo",
    "CallDone",
    "CancelActorCall",
    "CancelActorRemote",
    "CancelLeaseRequest",
    "CancelRunning",
    "CloseActorStream",
    "Complete",
    "ConnectActor",
    "Fail",
    "ForgetPlacementGroup",
    "Instruction",
    "KillActor",
    "OpenStream",
    "PumpLater",
    "RecheckActor",
    "RecordCrashedAttempt",
    "RequestLease",
    "ResolveRoute",
    "ReturnGrant",
    "ReturnLease",
    "Send",
    "SendActorCalls",
    "StartIdleTimer",
    "StopIdleTimer",
    "WarnInfeasible",
    "WatchActor",
    "WatchNodes",
]


# -- leases ------------------------------------------------------------------------------------
class RequestLease(NamedTuple):
    """Ask the node manager at ``address`` for a worker of ``kq``'s shape; report the reply
    with ``lease_reply`` (or ``lease_request_failed``)."""

    kq: KeyQueue
    request_id: bytes
    address: str
    spill: bool  # the node may redirect the request to another node


class ResolveRoute(NamedTuple):
    """Find the node(s) ``kq``'s strategy names (SPREAD, node affinity, placement group),
    then report ``route_resolved`` / ``route_unschedulable`` / ``route_unreachable``."""

    kq: KeyQueue
    request_id: bytes


class CancelLeaseRequest(NamedTuple):
    """Tell the node manager we no longer want what ``request_id`` asked for."""

    address: str
    request_id: bytes


class OpenStream(NamedTuple):
    """Open the task stream to a newly leased worker (``stream_open_failed`` if it fails)."""

    lease: Lease


class ReturnLease(NamedTuple):
    """Close the lease's stream and give the worker back (``failed``: do not reuse it)."""

    lease: Lease
    failed: bool


class ReturnGrant(NamedTuple):
    """Give back a lease granted after the owner closed (no stream was opened)."""

    address: str
    lease_id: bytes


class StartIdleTimer(NamedTuple):
    """Report ``idle_expired(lease, gen)`` after ``delay`` seconds."""

    lease: Lease
    gen: int
    delay: float


class StopIdleTimer(NamedTuple):
    """The lease is busy again: drop its idle timer."""

    lease: Lease


class PumpLater(NamedTuple):
    """Report ``pump(kq)`` after ``delay`` seconds (after a failed or infeasible request)."""

    kq: KeyQueue
    delay: float


class WarnInfeasible(NamedTuple):
    """Warn the user (once per key) that some tasks cannot be scheduled yet."""

    text: str


class ForgetPlacementGroup(NamedTuple):
    """Drop the cached placement of ``pg_id`` (maybe another process removed the group)."""

    pg_id: bytes


class WatchNodes(NamedTuple):
    """Work is out in the cluster: make sure node deaths are watched for."""


# -- tasks -------------------------------------------------------------------------------------
class Send(NamedTuple):
    """Write these tasks to the lease's worker, in this order."""

    lease: Lease
    records: list[TaskRecord]


class AskExitInfo(NamedTuple):
    """The lease's worker died under ``records``: learn why from its node manager, then
    report ``crash_explained(lease, records, detail)``."""

    lease: Lease
    records: list[TaskRecord]


class RecordCrashedAttempt(NamedTuple):
    """Report the attempt a dead worker was running to the state API (it cannot)."""

    record: TaskRecord
    detail: str
    oom: bool
    attempt: int  # the attempt that died (the record may be retried before this is done)


class CancelRunning(NamedTuple):
    """Ask the worker running ``task_id`` to interrupt it (``force``: kill the worker)."""

    lease: Lease
    task_id: bytes
    force: bool


class CancelActorCall(NamedTuple):
    """An actor call was cancelled: its actor's queue, or the actor itself, decides."""

    record: TaskRecord


class Complete(NamedTuple):
    """The task finished (a value or its own error): place its returns."""

    record: TaskRecord
    reply: Any


class Fail(NamedTuple):
    """The task failed without running to the end: its returns hold ``error``. ``source``,
    when given, is the object table entry of a failed argument whose stored error the
    returns share."""

    record: TaskRecord
    error: BaseException | None
    source: Any = None


# -- actor calls -------------------------------------------------------------------------------
class WatchActor(NamedTuple):
    """Long-poll the head for the actor's state; report ``actor_info`` /
    ``actor_unknown`` for every change."""

    conn: Any  # actor_state.ActorConn


class ConnectActor(NamedTuple):
    """Close the actor's old stream (if any) and open stream number ``stream`` to
    ``address``; report its replies with ``replies(conn, stream, ...)`` and its end with
    ``stream_ended(conn, stream)``."""

    conn: Any
    address: str
    stream: int


class RecheckActor(NamedTuple):
    """The actor's stream broke but the head has not said it died (maybe a network fault):
    while the head still lists incarnation ``version`` as ALIVE and its process answers a
    ping, report ``reconnect(conn, version, address)``."""

    conn: Any
    version: int


class CloseActorStream(NamedTuple):
    """Close the actor's stream (the actor is dead, or this process stops)."""

    conn: Any


class SendActorCalls(NamedTuple):
    """Write these calls on the actor's current stream, in this order."""

    conn: Any
    records: list[TaskRecord]


class CancelActorRemote(NamedTuple):
    """Ask the actor at ``address`` to cancel the call ``task_id`` it is running."""

    address: str
    task_id: bytes


class KillActor(NamedTuple):
    """Ask the head to end the actor (every handle to it is gone)."""

    actor_id: bytes


class CallDone(NamedTuple):
    """The call left its actor's queue for good: it no longer counts against
    ``max_pending_calls``."""

    record: TaskRecord


Instruction = (
    RequestLease
    | ResolveRoute
    | CancelLeaseRequest
    | OpenStream
    | ReturnLease
    | ReturnGrant
    | StartIdleTimer
    | StopIdleTimer
    | PumpLater
    | WarnInfeasible
    | ForgetPlacementGroup
    | WatchNodes
    | Send
    | AskExitInfo
    | RecordCrashedAttempt
    | CancelRunning
    | CancelActorCall
    | Complete
    | Fail
    | WatchActor
    | ConnectActor
    | RecheckActor
    | CloseActorStream
    | SendActorCalls
    | CancelActorRemote
    | KillActor
    | CallDone
)
