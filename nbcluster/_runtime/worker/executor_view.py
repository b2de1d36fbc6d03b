"""What the actor modules need of the worker's executor, as protocols (a leaf module).

``main.Executor`` runs tasks and owns the actor; ``actor_runner`` (threaded and async
actors) and ``actor_exit`` (an actor that ends itself) act on it. They name these
protocols rather than ``Executor``, and ``main`` imports them, so the three modules form
no import circle.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable
from typing import Any, Protocol

from nbcluster._runtime.core.client import CoreClient
from nbcluster._runtime.protocol.rpc import pb
from nbcluster._runtime.worker.output import OutputCapture
from nbcluster._runtime.worker.owner_stream import ReplySink

__all__ = ["CallRunner", "ExecutorView", "ExitRequest"]

#: A queued call and the stream its reply goes to.
Call = tuple[pb.TaskSpec, ReplySink]


@dataclasses.dataclass(frozen=True)
class ExitRequest:
    """The call ``task_id`` asked the actor to end (see ``actor_exit``)."""

    task_id: bytes
    intended: bool  #: ``exit_actor()`` or ``sys.exit(0)``: no restart
    code: int  #: the process's exit code
    reason: str  #: what was called, and where (the head records it)
    error: BaseException  #: what its callers get (an ``ActorDiedError``)


class CallRunner(Protocol):
    """The runner of a threaded or async actor's calls (``actor_runner.ActorCallRunner``)."""

    def cancel(self, task_id: bytes) -> None:
        """Cancel a call (I/O loop)."""

    def drain(self) -> list[Call]:
        """Drop every call that has not started; return them."""

    def wait_idle(self, timeout: float) -> bool:
        """Wait until no call runs; False at the deadline."""


class ExecutorView(Protocol):
    """The worker's executor (``main.Executor``) as the actor modules use it."""

    _lock: threading.Lock
    running: bytes
    cancelled: set[bytes]
    pending: dict[bytes, Call]
    output: OutputCapture
    actor_id: bytes

    @property
    def client(self) -> CoreClient:
        """The worker's core client."""

    @property
    def exit_request(self) -> ExitRequest | None:
        """Set once a call asked the actor to end."""

    @property
    def actor_calls(self) -> CallRunner | None:
        """The call runner of a threaded or async actor."""

    def execute(self, spec: pb.TaskSpec) -> pb.TaskReply:
        """Run one task or call on this thread."""

    async def execute_async(self, spec: pb.TaskSpec) -> pb.TaskReply:
        """Run one call of an async actor on the actor's loop."""

    def drain_pending(self) -> list[Call]:
        """Take every queued, not started call."""

    def _captured(
        self, spec: pb.TaskSpec, stream: ReplySink, run: Callable[[pb.TaskSpec], pb.TaskReply]
    ) -> pb.TaskReply:
        """``run(spec)`` with what it prints sent to the caller."""

    def _end_output(self, slot: Any, stream: ReplySink) -> None:
        """A call ended: its last output goes out before its reply."""

    def _error_returns(self, spec: pb.TaskSpec, error: BaseException, reply: pb.TaskReply) -> None:
        """Fill ``reply`` with ``error`` as every return value."""
