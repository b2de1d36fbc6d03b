"""Capture what tasks print and hand it to the I/O loop in rate-limited chunks.

``sys.stdout`` and ``sys.stderr`` of a worker are replaced by :class:`TaskStream` objects.
While a task runs, what it writes (from any thread, and through ``logging``) is buffered
for that task; :func:`flush_forever` on the I/O loop drains the buffers when there is
something in them (at most once per ``FLUSH_INTERVAL_S``) and the executor drains them at
the end of the task; both send them to the task's owner on the task stream. At most
``MAX_LINES_PER_FLUSH`` lines per stream and interval go out; the rest are counted and
reported as folded, so a task printing 100,000 lines cannot flood the notebook.
Everything is also written to the worker's log file (``nbcluster logs``).
Outside a task, writes go to the worker's log file.

Nothing here wakes up on a timer while nothing is written: the first write into empty
buffers sets a :class:`Wakeup`, and only then does the flusher run (an idle worker
costs no CPU).
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import logging
import threading
from collections.abc import Callable
from typing import Any, TextIO

#: Output goes to the notebook at most this often (and only when there is some).
FLUSH_INTERVAL_S = 0.1
MAX_LINES_PER_FLUSH = 200
MAX_CHARS_PER_FLUSH = 64 * 1024


class _Buffer:
    __slots__ = ("parts", "lines", "chars", "dropped")

    def __init__(self) -> None:
        self.parts: list[str] = []
        self.lines = 0
        self.chars = 0
        self.dropped = 0


class Wakeup:
    """A "there is something to send" signal, set from any thread, awaited on one loop.

    Setting it twice before the waiter runs costs one wake-up; setting it from the loop's
    own thread needs no cross-thread call.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._set = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._event: asyncio.Event | None = None

    def set(self) -> None:
        """Signal the waiter (from any thread)."""
        with self._lock:
            if self._set:
                return
            self._set = True
            loop, event = self._loop, self._event
        if loop is None or event is None:
            return  # nobody waits yet: wait() sees the flag
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            event.set()
        else:
            with contextlib.suppress(RuntimeError):  # the loop is closed: the process ends
                loop.call_soon_threadsafe(event.set)

    async def wait(self) -> None:
        """Return once :meth:`set` was called since the last return (on one loop only)."""
        if self._event is None:
            with self._lock:
                self._loop = asyncio.get_running_loop()
                self._event = asyncio.Event()
                if self._set:
                    self._event.set()
        await self._event.wait()
        self._event.clear()
        with self._lock:
            self._set = False


class OutputCapture:
    """Per-task output buffers shared by the two streams."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.task_id = b""
        self.sink: Any = None  # where the running task's output goes (its stream)
        self._bufs: dict[str, _Buffer] = {"stdout": _Buffer(), "stderr": _Buffer()}
        self._dirty = False
        #: Set on the first write into empty buffers (what :func:`flush_forever` waits for).
        self.wakeup = Wakeup()

    def begin(self, task_id: bytes, sink: Any) -> None:
        """A task starts: its output goes to ``sink``."""
        with self._lock:
            self.task_id = task_id
            self.sink = sink

    def end(self) -> tuple[bytes, Any, list[tuple[str, str, int]]]:
        """A task ended: return (task id, sink, the rest of its output)."""
        with self._lock:
            out = self._drain_locked()
            task_id, sink = self.task_id, self.sink
            self.task_id, self.sink = b"", None
        return task_id, sink, out

    def drain(self) -> tuple[bytes, Any, list[tuple[str, str, int]]]:
        """Take what the running task wrote since the last drain."""
        with self._lock:
            return self.task_id, self.sink, self._drain_locked()

    def _drain_locked(self) -> list[tuple[str, str, int]]:
        self._dirty = False
        out = []
        for name, buf in self._bufs.items():
            if buf.parts or buf.dropped:
                out.append((name, "".join(buf.parts), buf.dropped))
                self._bufs[name] = _Buffer()
        return out

    def write(self, name: str, text: str) -> bool:
        """Buffer ``text`` for the running task; False when no task runs."""
        with self._lock:
            if not self.task_id:
                return False
            first = not self._dirty
            self._dirty = True
            buf = self._bufs[name]
            if buf.lines >= MAX_LINES_PER_FLUSH or buf.chars >= MAX_CHARS_PER_FLUSH:
                buf.dropped += text.count("\n")
            else:
                buf.parts.append(text)
                buf.lines += text.count("\n")
                buf.chars += len(text)
        if first:
            self.wakeup.set()
        return True


async def flush_forever(
    capture: OutputCapture,
    interval: float = FLUSH_INTERVAL_S,
    send: Callable[[bytes, Any, list[tuple[str, str, int]]], None] | None = None,
) -> None:
    """Send the running task's buffered output to its sink whenever there is some.

    Waits (no timer) until something is written, sends it, then lets at least
    ``interval`` pass before the next send, so a chatty task is sent in chunks of at most
    ``MAX_LINES_PER_FLUSH`` lines per interval. ``send(task_id, sink, chunks)`` defaults
    to ``sink.send_logs(task_id, chunks)``.
    """
    while True:
        await capture.wakeup.wait()
        task_id, sink, chunks = capture.drain()
        if chunks and sink is not None:
            if send is None:
                sink.send_logs(task_id, chunks)
            else:
                send(task_id, sink, chunks)
        await asyncio.sleep(interval)


class TaskStream(io.TextIOBase):
    """A text stream that sends task output to the capture, and the rest to ``fallback``."""

    def __init__(self, name: str, capture: OutputCapture, fallback: TextIO) -> None:
        self.name_ = name
        self.capture = capture
        self.fallback = fallback

    def write(self, text: str) -> int:  # type: ignore[override]
        if not isinstance(text, str):
            raise TypeError(f"write() argument must be str, not {type(text).__name__}")
        self.capture.write(self.name_, text)
        # issue 17: the worker's log file keeps task output too (`nbcluster logs actor/task`)
        self.fallback.write(text)
        return len(text)

    def flush(self) -> None:
        self.fallback.flush()

    def isatty(self) -> bool:
        return False

    def writable(self) -> bool:
        return True

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return "utf-8"

    def fileno(self) -> int:
        return self.fallback.fileno()


class _CurrentStderr:
    """Resolves ``sys.stderr`` at write time, so ``logging`` output is captured too."""

    def write(self, text: str) -> int:
        import sys

        return sys.stderr.write(text)

    def flush(self) -> None:
        import sys

        sys.stderr.flush()


def install(capture: OutputCapture) -> None:
    """Route this process's stdout/stderr (and user ``logging``) through ``capture``."""
    import sys

    # The current streams (the worker's log file), not sys.__stdout__: replacing the last
    # reference to them would close fds 1 and 2 (issue 17: task output is written there too).
    sys.stdout = TaskStream("stdout", capture, sys.stdout)  # type: ignore[arg-type]
    sys.stderr = TaskStream("stderr", capture, sys.stderr)  # type: ignore[arg-type]
    root = logging.getLogger()
    root.handlers[:] = [logging.StreamHandler(_CurrentStderr())]  # type: ignore[arg-type]
    # nbcluster's own logs go to the worker's log file, never to the user.
    own = logging.getLogger("nbcluster")
    own.propagate = False
    own.handlers[:] = [logging.StreamHandler(sys.stderr.fallback)]  # type: ignore[attr-defined]
