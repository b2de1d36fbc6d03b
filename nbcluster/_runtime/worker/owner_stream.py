"""One owner's task stream, as the worker's executor sees it.

A leaf module: the executor (``main.py``), the actor call runner (``actor_runner.py``)
and an actor's own exit (``actor_exit.py``) all put replies on it. Two kinds exist:
:class:`OwnerStream` (served on the I/O loop: gRPC's ``PushTasks`` or a task channel the
loop reads) and :class:`~nbcluster._runtime.worker.direct.DirectStream` (a task channel
that the main thread reads and answers itself). Both offer ``send``,
``send_now``, ``send_rest``, ``send_logs`` and ``flushed``.
"""

from __future__ import annotations

import asyncio
import os
from typing import Protocol

from nbcluster._runtime.protocol.rpc import pb

__all__ = ["OwnerStream", "ReplySink", "log_records"]


class ReplySink(Protocol):
    """Where the replies and output of an owner's calls go (either kind of stream)."""

    def send(self, reply: pb.TaskReply) -> None:
        """Send a reply after the rest of its call's output (any thread)."""

    def send_now(self, reply: pb.TaskReply) -> None:
        """Send a reply without holding it for the replies of calls that came with it."""

    def send_rest(self, task_id: bytes, chunks: list[tuple[str, str, int]]) -> None:
        """A call's last output, to go before its reply (any thread)."""

    def send_logs(self, task_id: bytes, chunks: list[tuple[str, str, int]]) -> None:
        """Output of a running call (the I/O loop's periodic flush)."""

    def flushed(self) -> bool:
        """True when nothing waits to be sent."""


def log_records(task_id: bytes, chunks: list[tuple[str, str, int]]) -> list[pb.LogRecord]:
    """Output chunks ``(stream name, text, dropped lines)`` of a call as log records."""
    pid = os.getpid()
    return [
        pb.LogRecord(task_id=task_id, stream=name, text=text, dropped_lines=dropped, pid=pid)
        for name, text, dropped in chunks
    ]


class OwnerStream:
    """One owner's stream served on the I/O loop: where replies (and output) for its
    tasks go."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.replies: asyncio.Queue[pb.TaskReply | pb.LogRecord | None] = asyncio.Queue()
        self.open = True
        self.cut = False  # testing (F13): the fault injector broke this stream mid-batch
        self.retried: set[bytes] = set()  # testing (F13): retried tasks not answered yet

    def send(self, reply: pb.TaskReply) -> None:
        """Queue a reply (any thread)."""
        self.loop.call_soon_threadsafe(self.replies.put_nowait, reply)

    send_now = send  # nothing is held here

    def send_rest(self, task_id: bytes, chunks: list[tuple[str, str, int]]) -> None:
        """Queue a call's last output, before its reply (any thread)."""
        self.loop.call_soon_threadsafe(self.send_logs, task_id, chunks)

    def send_logs(self, task_id: bytes, chunks: list[tuple[str, str, int]]) -> None:
        """Queue output records (call on the loop)."""
        for record in log_records(task_id, chunks):
            self.replies.put_nowait(record)

    def flushed(self) -> bool:
        """True when nothing queued is left to send."""
        return self.replies.empty()
