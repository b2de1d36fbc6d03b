"""A worker's task events: each attempt's RUNNING, FINISHED or FAILED, sent to the head in
one ``ReportTaskEvents`` a second (the state API and the timeline read them there).

Recording costs the call almost nothing: an attempt that ends is kept as ``(spec, start,
end, error)`` and its event is built by the send, off the call's path. An attempt still
running at a send is reported RUNNING (``task_events.RunningAttempts``, issue 17). No timer
runs while no task does: the sender waits on a :class:`~nbcluster._runtime.worker.output.Wakeup`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from nbcluster._runtime.protocol.errors import RpcFailure
from nbcluster._runtime.protocol.rpc import pb
from nbcluster._runtime.task_events import RunningAttempts
from nbcluster._runtime.worker.output import Wakeup

if TYPE_CHECKING:
    from nbcluster._runtime.core.client import CoreClient

__all__ = ["EventLog", "task_event"]

#: Seconds of events batched into one report.
SEND_INTERVAL_S = 1.0


class EventLog:
    """The events of one worker's attempts, until they are sent (thread-safe)."""

    def __init__(self) -> None:
        self.events: list[Any] = []  # TaskEvent, or (spec, start, end, error): see task_event
        self.lock = threading.Lock()
        self.ready = Wakeup()
        self.live = RunningAttempts()  # reported RUNNING if still running at the next send

    def started(self, spec: pb.TaskSpec, start: float) -> None:
        """An attempt started running at ``start``."""
        with self.lock:
            self.live.started(spec, start)
        self.ready.set()  # the send a second from now reports it if still running

    def ended(self, spec: pb.TaskSpec, reply: pb.TaskReply, error: tuple[str, str] | None) -> None:
        """An attempt ended with ``reply``; ``error``: its ``(type, message)`` if it failed."""
        if spec.disable_task_events:  # enable_task_events=False (Ray's per-method option)
            with self.lock:
                self.live.ended(spec.task_id)  # no longer running (and never reported)
            return
        with self.lock:
            self.events.append((spec, reply.start_time, reply.end_time, error))
            self.live.ended(spec.task_id)
        self.ready.set()

    def running(self) -> bool:
        """Whether an attempt runs now."""
        return len(self.live) > 0

    async def send_forever(self, client: CoreClient, owner_check: Callable[[], bool]) -> None:
        """Send the events to the head once a second while there are any (on the I/O loop).

        ``owner_check`` is asked at each send; while it says a task still runs, the next
        send comes a second later whatever happens (so a long task is reported RUNNING).
        """
        while True:
            await self.ready.wait()  # no timer while no task runs
            await asyncio.sleep(SEND_INTERVAL_S)  # batch the events of a second
            with self.lock:
                events, self.events = self.events, []
                if len(self.live):  # issue 17: attempts still running now are RUNNING
                    events[:0] = self.live.due(client.node_id, client.worker_id, os.getpid())
            if owner_check():
                self.ready.set()  # look again in a second while the task runs
            if events:
                with contextlib.suppress(RpcFailure):
                    await client.head().ReportTaskEvents(
                        pb.TaskEventsRequest(events=[task_event(client, ev) for ev in events]),
                        timeout=10,
                    )


def task_event(client: CoreClient, ev: Any) -> pb.TaskEvent:
    """The FINISHED/FAILED event of an attempt recorded as ``(spec, start, end, error)``;
    RUNNING events come already built."""
    if isinstance(ev, pb.TaskEvent):
        return ev
    spec, start, end, error = ev
    out = pb.TaskEvent(
        task_id=spec.task_id,
        job_id=spec.job_id,
        name=spec.function_name,
        node_id=client.node_id,
        worker_id=client.worker_id,
        worker_pid=os.getpid(),
        state="FINISHED" if error is None else "FAILED",
        start_time=start,
        end_time=end,
        parent_task_id=spec.parent_task_id,
        attempt=spec.attempt,
        actor_id=spec.actor_id,
    )
    if error is not None:
        out.error_type, out.error_message = error
    return out
