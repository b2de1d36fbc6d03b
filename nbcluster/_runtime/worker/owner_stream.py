"""One owner's ``PushTasks`` stream, as the worker's executor sees it.

A leaf module: the executor (``main.py``), the actor call runner (``actor_runner.py``)
and an actor's own exit (``actor_exit.py``) all put replies on it.
"""

from __future__ import annotations

import asyncio
import os

from nbcluster._runtime.protocol.rpc import pb

__all__ = ["OwnerStream"]


class OwnerStream:
    """One owner's PushTasks stream: where replies (and output) for its tasks go."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.replies: asyncio.Queue[pb.TaskReply | pb.LogRecord | None] = asyncio.Queue()
        self.open = True
        self.cut = False  # testing (F13): the fault injector broke this stream mid-batch
        self.retried: set[bytes] = set()  # testing (F13): retried tasks not answered yet

    def send_logs(self, task_id: bytes, chunks: list[tuple[str, str, int]]) -> None:
        """Queue output records (call on the loop)."""
        pid = os.getpid()
        for name, text, dropped in chunks:
            self.replies.put_nowait(
                pb.LogRecord(
                    task_id=task_id, stream=name, text=text, dropped_lines=dropped, pid=pid
                )
            )
