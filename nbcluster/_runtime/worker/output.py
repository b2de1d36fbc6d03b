"""Capture what tasks print and hand it to the I/O loop in rate-limited chunks.

``sys.stdout`` and ``sys.stderr`` of a worker are replaced by :class:`TaskStream` objects.
While a task or actor call runs, what it writes (through ``print``, ``sys.stderr`` or
``logging``) is buffered for that call: calls of threaded and async actors run at once,
and a ``contextvars`` variable tells which call a write belongs to (writes from threads the
user starts go to the call begun last); :func:`flush_forever` on the I/O loop drains the buffers when there is
something in them (at most once per ``FLUSH_INTERVAL_S``) and the executor drains them at
the end of the task; both send them to the task's owner on the task stream. At most
``MAX_LINES_PER_FLUSH`` lines per stream and interval go out; the rest are counted and
reported as folded, so a task printing 100,000 lines cannot flood the notebook.
Everything is also written to the worker's log file (``nbcluster logs``).
Outside a task, writes go to the worker's log file.

Nothing here wakes up on a timer while nothing is written: the first write into empty
buffers sets a :class:`Wakeup`, and only then does the flusher run (an idle worker
costs no CPU).

Rich output: ``display(obj)`` in a task (:mod:`.display_hook`) hands the capture a mime
bundle as JSON text (:meth:`OutputCapture.display`); it goes out as a chunk of the
``display`` stream (:data:`DISPLAY_STREAM`), after the text the call wrote before it, so
the notebook shows prints and displays in the order they happened. At most
``MAX_DISPLAYS_PER_FLUSH`` displays per call and interval go out; the rest are counted
(a ``display`` chunk with empty text and a dropped count).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import io
import logging
import threading
from collections.abc import Callable
from typing import Any, TextIO

from nbcluster._runtime.worker import display_hook

#: Output goes to the notebook at most this often (and only when there is some).
FLUSH_INTERVAL_S = 0.1
MAX_LINES_PER_FLUSH = 200
MAX_CHARS_PER_FLUSH = 64 * 1024
#: The stream name of rich display output (its text is a JSON ``{"data", "metadata"}``).
DISPLAY_STREAM = "display"
MAX_DISPLAYS_PER_FLUSH = 20


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


class _Slot:
    """One running task (or actor call): where its output goes and what is buffered."""

    __slots__ = ("task_id", "sink", "bufs", "queued", "displays", "displays_dropped")

    def __init__(self, task_id: bytes, sink: Any) -> None:
        self.task_id = task_id
        self.sink = sink
        self.bufs: dict[str, _Buffer] = {"stdout": _Buffer(), "stderr": _Buffer()}
        #: Chunks already cut, in order: display outputs and the text written before each.
        self.queued: list[tuple[str, str, int]] = []
        self.displays = 0  # display outputs queued since the last drain
        self.displays_dropped = 0

    def drain(self, whole: bool = True) -> list[tuple[str, str, int]]:
        """Take the buffered output; unless ``whole``, an unfinished last line (``print``
        writes the text and its newline separately) waits for its end."""
        out, self.queued = self.queued, []
        self.displays = 0
        out.extend(self._cut(whole))
        if self.displays_dropped:
            out.append((DISPLAY_STREAM, "", self.displays_dropped))
            self.displays_dropped = 0
        return out

    def add_display(self, text: str) -> None:
        """Queue a display output after the text written so far (or count it as folded)."""
        if self.displays >= MAX_DISPLAYS_PER_FLUSH:
            self.displays_dropped += 1
            return
        self.queued.extend(self._cut(True))
        self.queued.append((DISPLAY_STREAM, text, 0))
        self.displays += 1

    def _cut(self, whole: bool) -> list[tuple[str, str, int]]:
        out = []
        for name, buf in self.bufs.items():
            if not (buf.parts or buf.dropped):
                continue
            text = "".join(buf.parts)
            fresh = _Buffer()
            if not whole:
                cut = text.rfind("\n") + 1
                if len(text) - cut < MAX_CHARS_PER_FLUSH:
                    text, keep = text[:cut], text[cut:]
                    if keep:
                        fresh.parts.append(keep)
                        fresh.chars = len(keep)
            self.bufs[name] = fresh
            if text or buf.dropped:
                out.append((name, text, buf.dropped))
        return out


#: The call whose output a write belongs to. Each thread has its own context and each
#: asyncio task a copy of its creator's, so concurrent calls of a threaded or async actor
#: (and ``asyncio.to_thread`` helpers of a call) are told apart.
_current: contextvars.ContextVar[_Slot | None] = contextvars.ContextVar(
    "nbcluster_task_output", default=None
)


class OutputCapture:
    """Per-call output buffers shared by the two streams.

    Several calls may run at once (threaded and async actors): :meth:`begin` marks the
    calling context (thread, or asyncio task) as running a call, and writes made in that
    context are buffered for it. Writes from a context that runs no call (a thread the
    user started) go to the call begun last that is still running, which is exactly the
    running task when calls run one at a time.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        #: Held while output drained is handed to its sinks, and while a call's last output
        #: is: a call's output then reaches its owner in order even when two threads send
        #: (a direct stream: the loop sends output while the call runs, the main thread
        #: sends the rest with the reply).
        self.send_lock = threading.Lock()
        self._slots: dict[int, _Slot] = {}  # running calls, in the order they began
        self._dirty = False
        #: Set on the first write into empty buffers (what :func:`flush_forever` waits for).
        self.wakeup = Wakeup()

    @property
    def task_id(self) -> bytes:
        """The task id of the call begun last that still runs (b"" when none)."""
        with self._lock:
            slot = self._latest_locked()
            return slot.task_id if slot is not None else b""

    def begin(self, task_id: bytes, sink: Any) -> _Slot:
        """A call starts in this context: its output goes to ``sink``; pass the result to
        :meth:`end`."""
        slot = _Slot(task_id, sink)
        with self._lock:
            self._slots[id(slot)] = slot
        _current.set(slot)
        return slot

    def end(self, slot: _Slot | None = None) -> tuple[bytes, Any, list[tuple[str, str, int]]]:
        """A call ended: return (task id, sink, the rest of its output).

        ``slot`` defaults to the call begun in this context (or the latest one).
        """
        with self._lock:
            if slot is None:
                slot = self._slot_locked(_current.get())
            if slot is None:
                return b"", None, []
            self._slots.pop(id(slot), None)
            out = slot.drain()
        if _current.get() is slot:
            _current.set(None)
        return slot.task_id, slot.sink, out

    def drain(self) -> list[tuple[bytes, Any, list[tuple[str, str, int]]]]:
        """Take what every running call wrote since the last drain: (task id, sink, chunks)."""
        with self._lock:
            self._dirty = False
            out = []
            for slot in self._slots.values():
                chunks = slot.drain(whole=False)
                if chunks:
                    out.append((slot.task_id, slot.sink, chunks))
            return out

    def _latest_locked(self) -> _Slot | None:
        return next(reversed(self._slots.values()), None)

    def _slot_locked(self, slot: _Slot | None) -> _Slot | None:
        if slot is not None and id(slot) in self._slots:
            return slot
        return self._latest_locked()

    def running(self) -> bool:
        """True when a call runs whose output a write from this context would go to."""
        with self._lock:
            return self._slot_locked(_current.get()) is not None

    def display(self, text: str) -> bool:
        """Queue a display output (``text``: a JSON mime bundle) for the call running in
        this context, after what it wrote so far; False when none runs."""
        with self._lock:
            slot = self._slot_locked(_current.get())
            if slot is None:
                return False
            first = not self._dirty
            self._dirty = True
            slot.add_display(text)
        if first:
            self.wakeup.set()
        return True

    def write(self, name: str, text: str) -> bool:
        """Buffer ``text`` for the call running in this context; False when none runs."""
        with self._lock:
            slot = self._slot_locked(_current.get())
            if slot is None:
                return False
            first = not self._dirty
            self._dirty = True
            buf = slot.bufs[name]
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
    """Send the running calls' buffered output to their sinks whenever there is some.

    Waits (no timer) until something is written, sends it, then lets at least
    ``interval`` pass before the next send, so a chatty task is sent in chunks of at most
    ``MAX_LINES_PER_FLUSH`` lines per stream, call and interval. ``send(task_id, sink,
    chunks)`` defaults to ``sink.send_logs(task_id, chunks)``.
    """
    while True:
        await capture.wakeup.wait()
        with capture.send_lock:
            for task_id, sink, chunks in capture.drain():
                if sink is None:
                    continue
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
    """Route this process's stdout/stderr (and user ``logging``) through ``capture``, and
    ``IPython.display.display`` in tasks to the notebook (:mod:`.display_hook`)."""
    import sys

    # The current streams (the worker's log file), not sys.__stdout__: replacing the last
    # reference to them would close fds 1 and 2 (issue 17: task output is written there too).
    sys.stdout = TaskStream("stdout", capture, sys.stdout)  # type: ignore[arg-type]
    sys.stderr = TaskStream("stderr", capture, sys.stderr)  # type: ignore[arg-type]
    root = logging.getLogger()
    user = logging.StreamHandler(_CurrentStderr())  # type: ignore[arg-type]
    # "WARNING:name:message", as logging.basicConfig prints: the notebook's log area reads
    # the level from it (its level filter).
    user.setFormatter(logging.Formatter(logging.BASIC_FORMAT))
    root.handlers[:] = [user]
    # nbcluster's own logs go to the worker's log file, never to the user.
    own = logging.getLogger("nbcluster")
    own.propagate = False
    own.handlers[:] = [logging.StreamHandler(sys.stderr.fallback)]  # type: ignore[attr-defined]
    display_hook.install(capture)
