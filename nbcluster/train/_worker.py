"""The worker actor: runs one rank's training function in a thread and hands out its
reports when the driver polls.

The driver (``_controller.py``) keeps one ``run(ack, timeout)`` call pending on every
worker. ``run`` blocks until the training function reports, returns or raises, and
returns every event the driver has not acknowledged yet (see
:class:`~nbcluster.train._session.Outbox`). The function itself runs in a daemon thread,
so the actor stays responsive (``stop`` and ``run`` are served while it trains).

What the function prints goes to the driver with the ``run`` replies and is printed under
the cell that called ``fit()``, each line prefixed ``[rank N]`` and rate-limited
(``sys.stdout``/``sys.stderr`` are wrapped; see :class:`_OutputGate`).
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import io
import os
import socket
import sys
import threading
import time
import traceback
from collections.abc import Callable, Mapping
from typing import Any

import cloudpickle

import nbcluster
from nbcluster.train._checkpoint import Checkpoint
from nbcluster.train._session import Outbox, Session, StopTraining, TrainContext, use_session

__all__ = ["TrainWorker", "WorkerSetup"]

#: Text a rank may hold for the driver, at most (the rest is counted and reported).
MAX_HELD_CHARS = 256 * 1024
#: Lines per second a rank sends to the driver; the rest are folded into a count.
OUTPUT_LINES_PER_S = 100
#: How long an unfinished line (no newline yet) waits for its end before it goes out alone.
PARTIAL_LINE_S = 0.5

Chunk = tuple[str, str]  # (stream name, text)


class _OutputGate:
    """What the training function prints, held for the driver's next poll.

    The text travels back with the poll's reply (``TrainWorker.run``), and the driver
    prints it under the cell that called ``fit()`` in the same step that handles the
    poll's events: when ``fit()`` has handled a rank's last event, it has printed all of
    that rank's output too (no wait for output to arrive). At most
    :data:`OUTPUT_LINES_PER_S` lines a second go to the driver and at most
    :data:`MAX_HELD_CHARS` wait for it; the rest are counted and reported as folded.
    Every line is also written to the worker's own log (its original stream).

    A line goes out whole: ``print`` writes a line's text and its newline in two calls,
    and a poll between them must not send the text alone (the driver would print another
    rank's lines after it, on the same line). The unfinished end of a stream's output
    waits for its newline, for the function's end (``take(final=True)``, which ends it
    with one), or :data:`PARTIAL_LINE_S` (a progress line printed without one).
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.rank = 0
        self.held: list[Chunk] = []
        self.held_chars = 0
        self.dropped = 0
        self.dropped_partial = False
        self.window_start = time.monotonic()
        self.window_lines = 0
        self.last_stream = "stdout"
        self.at_line_start = True
        #: Per stream, when its output stopped being at a line's start (absent: it is).
        self.partial_since: dict[str, float] = {}

    def write(self, stream: str, text: str, log: Any = None) -> None:
        """Hold ``text`` (prefixed lines) for the driver, within the rate limit."""
        if log is not None:
            with contextlib.suppress(Exception):
                log.write(text)  # the worker's log keeps everything
        lines = text.count("\n")
        with self.lock:
            now = time.monotonic()
            if now - self.window_start >= 1.0:
                self.window_start, self.window_lines = now, 0
            over_rate = self.window_lines >= OUTPUT_LINES_PER_S
            if over_rate or self.held_chars + len(text) > MAX_HELD_CHARS:
                self.dropped += lines  # (a print's text and its newline come apart)
                self.dropped_partial = self.dropped_partial or not lines
                return
            self.window_lines += lines
            self.held.append((stream, text))
            self.held_chars += len(text)
            self.last_stream = stream
            self.at_line_start = text.endswith("\n")
            if self.at_line_start:
                self.partial_since.pop(stream, None)
            else:
                self.partial_since.setdefault(stream, now)

    def take(self, final: bool = False) -> list[Chunk]:
        """What is held (oldest first), with a note of what was folded: whole lines, and
        an unfinished one only if ``final`` (the function has ended) or it is old."""
        with self.lock:
            held, self.held = self._whole_lines(final)
            self.held_chars = sum(len(text) for _, text in self.held)
            dropped = self.dropped or int(self.dropped_partial)
            if dropped:
                start = "" if self.at_line_start else "\n"
                held.append(
                    (
                        self.last_stream,
                        f"{start}[rank {self.rank}] [... {dropped} more lines folded by the "
                        "output rate limit ...]\n",
                    )
                )
                self.dropped, self.dropped_partial = 0, False
                self.at_line_start = True
        return held

    def _whole_lines(self, final: bool) -> tuple[list[Chunk], list[Chunk]]:
        """Split ``held`` into what goes out now and the unfinished ends of streams that
        wait for their newline. Called with the lock held."""
        held = list(self.held)
        kept: list[Chunk] = []
        now = time.monotonic()
        for stream, since in list(self.partial_since.items()):
            last = max((i for i, (s, _) in enumerate(held) if s == stream), default=None)
            if final:  # end the last line (already sent, if it went out as old)
                if last is None:
                    held.append((stream, "\n"))
                else:
                    held[last] = (stream, held[last][1] + "\n")
                del self.partial_since[stream]
                self.at_line_start = True
                continue
            if last is None:
                continue
            if now - since >= PARTIAL_LINE_S:
                continue  # old: out as it is (its end will follow unprefixed)
            # Keep the stream's text after its last newline, which may span chunks.
            keep: list[str] = []
            for i in range(last, -1, -1):
                s, text = held[i]
                if s != stream:
                    continue
                cut = text.rfind("\n") + 1
                keep.append(text[cut:])
                held[i] = (s, text[:cut])
                if cut:
                    break
            kept.append((stream, "".join(reversed(keep))))
        out: list[Chunk] = []
        for stream, text in held:  # one chunk per run of a stream's text
            if out and out[-1][0] == stream:
                out[-1] = (stream, out[-1][1] + text)
            elif text:
                out.append((stream, text))
        return out, kept


class _FdLog:
    """Writes to a file descriptor (the worker's log file) with ``os.write``: no Python
    stream object, so no buffer lock that a fork may have left held."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def write(self, text: str) -> None:
        data = text.encode("utf-8", "replace")
        while data:
            data = data[os.write(self.fd, data) :]

    def flush(self) -> None:
        """Nothing to flush: every write went to the descriptor."""

    def fileno(self) -> int:
        return self.fd


def _log_of(stream: Any) -> _FdLog | None:
    try:
        return _FdLog(stream.fileno())
    except (AttributeError, OSError, ValueError):
        return None


class _RankStream(io.TextIOBase):
    """A text stream that prefixes each line with ``[rank N]`` and goes through the gate."""

    def __init__(self, name: str, original: Any, gate: _OutputGate) -> None:
        self.name_ = name
        # Keep the stream this one replaces alive: dropping the last reference to it could
        # close the descriptor it writes to (fd 1 or 2), which the log below writes to.
        self.original = original
        self.log = _log_of(original)
        self.gate = gate
        self._line_start = True

    def write(self, text: str) -> int:  # type: ignore[override]
        if not isinstance(text, str):
            raise TypeError(f"write() argument must be str, not {type(text).__name__}")
        if not text:
            return 0
        prefix = f"[rank {self.gate.rank}] "
        parts = text.splitlines(keepends=True)
        out = []
        for part in parts:
            out.append(prefix + part if self._line_start else part)
            self._line_start = part.endswith("\n")
        self.gate.write(self.name_, "".join(out), self.log)
        return len(text)

    def flush(self) -> None:
        flush = getattr(self.log, "flush", None)
        if flush is not None:
            with contextlib.suppress(Exception):
                flush()

    def isatty(self) -> bool:
        return False

    def writable(self) -> bool:
        return True

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return "utf-8"

    def fileno(self) -> int:
        if self.log is None:
            raise io.UnsupportedOperation("fileno")
        return self.log.fileno()  # type: ignore[no-any-return]


class WorkerSetup:
    """What a backend needs to set a worker up (see ``BackendConfig.on_worker_setup``)."""

    def __init__(
        self,
        world_rank: int,
        world_size: int,
        local_rank: int,
        local_world_size: int,
        node_rank: int,
        master_addr: str,
        master_port: int,
        use_gpu: bool,
        num_cpus: float,
    ) -> None:
        self.world_rank = world_rank
        self.world_size = world_size
        self.local_rank = local_rank
        self.local_world_size = local_world_size
        self.node_rank = node_rank
        self.master_addr = master_addr
        self.master_port = master_port
        self.use_gpu = use_gpu
        self.num_cpus = num_cpus

    def env(self) -> dict[str, str]:
        """The usual distributed-training environment variables."""
        return {
            "RANK": str(self.world_rank),
            "WORLD_SIZE": str(self.world_size),
            "LOCAL_RANK": str(self.local_rank),
            "LOCAL_WORLD_SIZE": str(self.local_world_size),
            "NODE_RANK": str(self.node_rank),
            "MASTER_ADDR": self.master_addr,
            "MASTER_PORT": str(self.master_port),
        }


def _takes_config(fn: Callable[..., Any]) -> bool:
    try:
        return len(inspect.signature(fn).parameters) > 0
    except (TypeError, ValueError):
        return True


class TrainWorker:
    """One rank of a worker group (an actor). Created by ``_group.WorkerGroup``."""

    def __init__(self, preload: tuple[str, ...] = ()) -> None:
        self._preload_error: BaseException | None = None
        self._preloader = threading.Thread(
            target=self._preload, args=(preload,), name="train-preload", daemon=True
        )
        self._preloader.start()
        self._gate = _OutputGate()
        if not isinstance(sys.stdout, _RankStream):
            # The training function's output goes to the driver with the poll replies
            # (see _OutputGate), and to the worker's log file (the descriptor under the
            # task-output stream), not through the task-output path, so that it reaches
            # the cell in order with the run's events.
            sys.stdout = _RankStream("stdout", sys.stdout, self._gate)
            sys.stderr = _RankStream("stderr", sys.stderr, self._gate)
        self._outbox: Outbox | None = None
        self._thread: threading.Thread | None = None
        self._backend: Any = None
        self._backend_state: Any = None

    def _preload(self, modules: tuple[str, ...]) -> None:
        try:
            for name in modules:
                importlib.import_module(name)
        except BaseException as err:  # noqa: BLE001 - reported by setup()
            self._preload_error = err

    # -- set-up -----------------------------------------------------------------------------
    def info(self) -> dict[str, Any]:
        """Where this worker runs: pid, node id, host name, GPU ids."""
        ctx = nbcluster.get_runtime_context()
        return {
            "pid": os.getpid(),
            "node_id": ctx.get_node_id(),
            "hostname": socket.gethostname(),
            "gpu_ids": list(nbcluster.get_gpu_ids()),
        }

    def free_port(self, host: str) -> int:
        """A port that is free on ``host`` now (rank 0 picks the rendezvous port)."""
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind((host, 0))
            return int(s.getsockname()[1])

    def setup(self, setup: WorkerSetup, backend: Any) -> None:
        """Set the environment and run the backend's set-up (e.g. join the process group)."""
        self._preloader.join()
        if self._preload_error is not None:
            raise self._preload_error
        os.environ.update(setup.env())
        self._gate.rank = setup.world_rank
        if self._backend is not None and self._backend_state is not None:
            self._backend.on_worker_shutdown(self._backend_state)
        self._backend = backend
        self._backend_state = backend.on_worker_setup(setup) if backend is not None else None

    def teardown(self) -> None:
        """Run the backend's shutdown (leave the process group)."""
        if self._backend is not None and self._backend_state is not None:
            self._backend.on_worker_shutdown(self._backend_state)
        self._backend = self._backend_state = None

    # -- a run ------------------------------------------------------------------------------
    def start(
        self,
        fn: Callable[..., Any],
        config: Mapping[str, Any] | None,
        context: TrainContext,
        next_index: int,
        checkpoint_path: str | None,
        dataset_shards: Mapping[str, Any],
        attempt: str = "0",
    ) -> None:
        """Start the training function in a thread and return at once.

        ``attempt`` names the run's attempt (its checkpoints are staged under it)."""
        previous = self._thread
        if previous is not None and previous.is_alive():
            # The previous function has sent its last event (the driver saw the run end)
            # and only its thread's clean-up is left: wait for that, briefly.
            previous.join(timeout=10.0)
            if previous.is_alive():
                raise RuntimeError("this worker is still running a training function")
        outbox = Outbox()
        self._outbox = outbox
        self._gate.rank = context.world_rank
        session = Session(
            context=context,
            outbox=outbox,
            next_index=next_index,
            checkpoint=Checkpoint(checkpoint_path) if checkpoint_path else None,
            dataset_shards=dict(dataset_shards),
            attempt=attempt,
        )
        rank = context.world_rank

        def main() -> None:
            with use_session(session):
                run_loop()

        def run_loop() -> None:
            try:
                value = fn(config if config is not None else {}) if _takes_config(fn) else fn()
                if rank != 0:
                    value = None
                else:
                    try:
                        cloudpickle.dumps(value)
                    except Exception as err:  # noqa: BLE001 - name the problem
                        raise TypeError(
                            "the training function returned a value that cannot be pickled "
                            f"({type(value).__name__}: {err}); return plain data, or save "
                            "the object in a checkpoint"
                        ) from None
                outbox.put(("done", value))
            except StopTraining:
                outbox.put(("stopped",))
            except BaseException as err:  # noqa: BLE001 - reported to the driver
                tb = err.__traceback__.tb_next if err.__traceback__ is not None else None
                text = "".join(traceback.format_exception(type(err), err, tb))
                try:
                    cloudpickle.dumps(err)
                    payload: BaseException | None = err
                except Exception:  # noqa: BLE001 - unpicklable: the text will do
                    payload = None
                outbox.put(("error", text, payload))
            finally:
                for stream in (sys.stdout, sys.stderr):
                    if isinstance(stream, _RankStream):
                        stream._line_start = True

        self._thread = threading.Thread(target=main, name=f"train-rank-{rank}", daemon=True)
        self._thread.start()

    def run(
        self, ack: int, timeout: float
    ) -> tuple[list[tuple[int, tuple[Any, ...]]], list[tuple[str, str]]]:
        """Wait up to ``timeout`` s for events after ``ack``; return them (oldest first)
        and the output printed since the last call (``(stream, text)`` chunks), which
        includes everything printed before the last of those events."""
        outbox = self._outbox
        if outbox is None:
            raise RuntimeError("no training function was started on this worker")
        events = outbox.take(ack, timeout)
        # The function has printed all it will once its end is among the events.
        ended = any(event[0] != "report" for _, event in events)
        return events, self._gate.take(final=ended)

    def stop(self) -> bool:
        """Ask the training function to stop at its next report; True if it still runs."""
        if self._outbox is not None:
            self._outbox.request_stop()
        return self._thread is not None and self._thread.is_alive()
