"""Task attempts for the state API: why one failed, and attempts whose worker crashed.

A worker records each attempt it ran (``FINISHED``/``FAILED``, with :func:`error_info`
for a failure). An attempt whose worker died never reports, so its *owner* records it
(:func:`record_crashed_attempt`), with the cause the node gave for the worker's death; the
records are batched to the head on the owner's I/O loop. ``nbcluster list tasks`` then
shows a killed worker's task as FAILED with its cause.

A worker also keeps its attempts that are running (:class:`RunningAttempts`) and reports
``RUNNING`` for those still running when it next flushes its events, once per attempt: a
short task reports only its end, so the hot path pays one dict insert and pop.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
import weakref
from typing import Any

from nbcluster._runtime.protocol.errors import RpcFailure
from nbcluster._runtime.protocol.rpc import pb

__all__ = ["RunningAttempts", "error_info", "record_crashed_attempt"]

FLUSH_S = 0.5
_MAX_MESSAGE = 2000


def error_info(error: BaseException) -> tuple[str, str]:
    """(error type, message) of a task's failure, as the state API shows them."""
    if type(error).__name__ == "TaskCancelledError":
        return "TASK_CANCELLED", str(error)[:_MAX_MESSAGE]
    cause = getattr(error, "cause", None)
    if isinstance(cause, BaseException):  # a TaskError: the user's exception, then where
        text = f"{type(cause).__name__}: {cause}"
        tb = getattr(error, "traceback_str", "")
        if tb:
            text += f"\n{tb}"
        return "TASK_EXECUTION_EXCEPTION", text[:_MAX_MESSAGE]
    return "TASK_EXECUTION_EXCEPTION", f"{type(error).__name__}: {error}"[:_MAX_MESSAGE]


class RunningAttempts:
    """The attempts running in one worker (call under the lock that guards its events)."""

    def __init__(self) -> None:
        self._live: dict[bytes, tuple[pb.TaskSpec, float]] = {}
        self._reported: set[bytes] = set()

    def __len__(self) -> int:
        return len(self._live)

    def started(self, spec: pb.TaskSpec, start_time: float) -> None:
        """An attempt began running."""
        self._live[spec.task_id] = (spec, start_time)

    def ended(self, task_id: bytes) -> None:
        """An attempt ended (its FINISHED/FAILED event is recorded in the same step)."""
        if self._live.pop(task_id, None) is not None and self._reported:
            self._reported.discard(task_id)

    def due(self, node_id: bytes, worker_id: bytes, pid: int) -> list[pb.TaskEvent]:
        """``RUNNING`` events for the attempts running now and not reported yet."""
        out = []
        for task_id, (spec, start) in self._live.items():
            if task_id in self._reported or spec.disable_task_events:
                continue
            self._reported.add(task_id)
            out.append(
                pb.TaskEvent(
                    task_id=task_id,
                    job_id=spec.job_id,
                    name=spec.function_name,
                    node_id=node_id,
                    worker_id=worker_id,
                    worker_pid=pid,
                    state="RUNNING",
                    start_time=start,
                    parent_task_id=spec.parent_task_id,
                    attempt=spec.attempt,
                    actor_id=spec.actor_id,
                )
            )
        return out


class _Buffer:
    def __init__(self) -> None:
        self.events: list[pb.TaskEvent] = []
        self.lock = threading.Lock()
        self.scheduled = False


_BUFFERS: weakref.WeakKeyDictionary[Any, _Buffer] = weakref.WeakKeyDictionary()


def record_crashed_attempt(
    client: Any, spec: pb.TaskSpec, name: str, detail: str, oom: bool, attempt: int | None = None
) -> None:
    """The worker running attempt ``attempt`` (default ``spec.attempt``) of a task died:
    record it as FAILED.

    Call on the owner's I/O loop (the submitter does, once it knows why the worker died).
    """
    ev = pb.TaskEvent(
        task_id=spec.task_id,
        job_id=spec.job_id,
        name=name,
        state="FAILED",
        end_time=time.time(),
        parent_task_id=spec.parent_task_id,
        attempt=spec.attempt if attempt is None else attempt,
        actor_id=spec.actor_id,
        error_type="OUT_OF_MEMORY" if oom else "WORKER_DIED",
        error_message=detail[:_MAX_MESSAGE],
    )
    buf = _BUFFERS.get(client)
    if buf is None:
        buf = _BUFFERS[client] = _Buffer()
    with buf.lock:
        buf.events.append(ev)
        if buf.scheduled:
            return
        buf.scheduled = True
    client.loop.create_task(_flush(client, buf))


async def _flush(client: Any, buf: _Buffer) -> None:
    await asyncio.sleep(FLUSH_S)
    with buf.lock:
        events, buf.events = buf.events, []
        buf.scheduled = False
    if events:
        with contextlib.suppress(RpcFailure):
            await client.head().ReportTaskEvents(pb.TaskEventsRequest(events=events), timeout=10)
