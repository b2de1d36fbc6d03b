"""The runner: an actor that hosts trials one at a time, in a thread, and batches their events.

The controller talks to a runner with two methods:

- ``step(messages)`` applies the messages (start a trial, ack results, stop...) and then
  waits until the hosted trial has produced events (results, its end, output), returning
  them as one batch. The controller keeps one ``step`` call in flight per runner, so a
  runner is never idle while the controller works, and one round trip carries every
  result the trial produced meanwhile.
- ``notify(messages)`` applies messages at once while a ``step`` call waits (the actor
  runs two calls at a time: ``max_concurrency=2``).

A function trial's ``tune.report`` returns immediately while fewer than
``max_results_ahead`` of its results wait for the controller's acknowledgement; at that
bound (0 for lock-step schedulers), and for a report with a checkpoint, it blocks until
the controller answers. A stop or
pause makes the next ``report`` raise :class:`TrialStopped` (a ``BaseException``, so the
user's ``except Exception`` does not swallow it).

What a trial prints is captured per trial, written in full to ``output.log`` in its
folder, and sent to the driver rate-limited: at most ``OUTPUT_LINES_PER_S`` lines per
second per trial, the rest folded into a count.
"""

from __future__ import annotations

import contextlib
import copy
import io
import os
import shutil
import socket
import sys
import threading
import time
from typing import Any

from nbcluster.exceptions import TaskError
from nbcluster.tune._checkpoint import Checkpoint, checkpoint_index, persist_checkpoint
from nbcluster.tune._session import TrialSession, TrialStopped, use_session
from nbcluster.tune.trainable.trainable import Trainable

__all__ = ["OUTPUT_LINES_PER_S", "TrialRunner", "TrialStopped"]

OUTPUT_LINES_PER_S = 20
_OUTPUT_FLUSH_S = 0.2
_LINGER_S = 0.002
_HOSTNAME = socket.gethostname()
#: Frames of these files are left out of a trial's traceback.
_OWN_FILES = frozenset({__file__, contextlib.__file__})


def _node_ip() -> str:
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("10.255.255.255", 1))
            return str(s.getsockname()[0])
    except OSError:
        return "127.0.0.1"


class _Output:
    """A trial's captured output: everything for the log file, a rate-limited part for the driver."""

    def __init__(self, log_path: str) -> None:
        self.log_path = log_path
        self.parts: list[str] = []
        self.lines_sent_window = 0
        self.window_start = time.monotonic()
        self.dropped = 0
        self.pending: list[str] = []

    def write(self, text: str) -> None:
        self.parts.append(text)

    def drain(self, final: bool = False) -> str:
        """Text to send now (with a note of what was folded), writing everything to the log."""
        if not self.parts and not (final and self.dropped):
            return ""
        text = "".join(self.parts)
        self.parts = []
        if text and self.log_path:
            try:
                with open(self.log_path, "a") as f:
                    f.write(text)
            except OSError:
                pass
        out = ""
        now = time.monotonic()
        if now - self.window_start >= 1.0:
            out = self._fold_note()
            self.window_start = now
            self.lines_sent_window = 0
        lines = text.splitlines(keepends=True)
        room = max(0, OUTPUT_LINES_PER_S - self.lines_sent_window)
        self.lines_sent_window += min(room, len(lines))
        self.dropped += max(0, len(lines) - room)
        out += "".join(lines[:room])
        if final:
            out += self._fold_note()
        return out

    def _fold_note(self) -> str:
        if not self.dropped:
            return ""
        where = f" (all of it is in {self.log_path})" if self.log_path else ""
        note = f"... {self.dropped} more line(s) folded{where}\n"
        self.dropped = 0
        return note


class _CaptureStream(io.TextIOBase):
    """Routes writes from trial threads to the trial's output, the rest to ``fallback``."""

    def __init__(self, runner: TrialRunner, fallback: Any) -> None:
        self._runner = runner
        self._fallback = fallback

    def write(self, text: str) -> int:  # type: ignore[override]
        out = self._runner.current_output()
        if out is None:
            return int(self._fallback.write(text) or 0)
        out.write(text)
        return len(text)

    def flush(self) -> None:
        self._fallback.flush()

    def isatty(self) -> bool:
        return False

    def writable(self) -> bool:
        return True

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return "utf-8"

    def fileno(self) -> int:
        return int(self._fallback.fileno())


class _RunnerSession(TrialSession):
    """The session of one run of one trial inside a runner."""

    def __init__(
        self, runner: TrialRunner, trial_id: str, run_seq: int, spec: dict[str, Any]
    ) -> None:
        ckpt_path = spec.get("checkpoint")
        super().__init__(
            trial_id=trial_id,
            trial_name=spec.get("trial_name", trial_id),
            trial_dir=spec.get("trial_dir", ""),
            experiment_name=spec.get("experiment_name", ""),
            config=spec["config"],
            resources=spec.get("resources", {}),
            checkpoint=Checkpoint(ckpt_path) if ckpt_path else None,
        )
        self.runner = runner
        self.run_seq = run_seq
        self.spec = spec
        self.iteration = int(spec.get("iteration", 0))
        self.time_total = float(spec.get("time_total_s", 0.0))
        self.started = self.last = time.time()
        self.iters_since_restore = 0
        self.seq = 0
        self.acked = 0
        self.max_ahead = int(spec.get("max_results_ahead", 0))
        self.stop_kind = ""
        self.waiting = False
        self.save_requested = False
        self.next_checkpoint = self._first_free_checkpoint_index(
            int(spec.get("next_checkpoint_index", 0))
        )
        self.output = _Output(os.path.join(self.trial_dir, "output.log") if self.trial_dir else "")

    def _first_free_checkpoint_index(self, start: int) -> int:
        if not self.trial_dir or not os.path.isdir(self.trial_dir):
            return start
        used = [checkpoint_index(n) for n in os.listdir(self.trial_dir)]
        return max([start, *(i + 1 for i in used if i >= 0)])

    def persist(self, checkpoint: Checkpoint) -> tuple[int, str]:
        if not self.trial_dir:
            raise RuntimeError("this trial has no folder to persist checkpoints to")
        os.makedirs(self.trial_dir, exist_ok=True)
        index = self.next_checkpoint
        self.next_checkpoint += 1
        return index, persist_checkpoint(checkpoint, self.trial_dir, index).path

    def report(self, metrics: dict[str, Any], checkpoint: Checkpoint | None = None) -> None:
        if self.stop_kind:
            raise TrialStopped(self.stop_kind)
        now = time.time()
        self.iteration += 1
        self.iters_since_restore += 1
        elapsed = now - self.last
        self.last = now
        self.time_total += elapsed
        result = dict(metrics)
        result.update(
            training_iteration=self.iteration,
            time_this_iter_s=elapsed,
            time_total_s=self.time_total,
            time_since_restore=now - self.started,
            iterations_since_restore=self.iters_since_restore,
            timestamp=int(now),
            date=time.strftime("%Y-%m-%d_%H-%M-%S", time.localtime(now)),
            pid=self.runner.pid,
            hostname=_HOSTNAME,
            node_ip=self.runner.node_ip,
        )
        persisted = None
        if checkpoint is not None:
            persisted = self.persist(checkpoint)
            result["checkpoint_dir_name"] = os.path.basename(persisted[1])
        self.runner.push_result(self, result, persisted)


class TrialRunner:
    """The runner actor's class (created with ``max_concurrency=2`` by the driver)."""

    def __init__(self, trainable: Any, kind: str, runner_id: str) -> None:
        self.trainable = trainable
        self.kind = kind
        self.runner_id = runner_id
        self.pid = os.getpid()
        self.node_ip = _node_ip()
        self._cond = threading.Condition()
        self._events: list[tuple[Any, ...]] = []
        self._session: _RunnerSession | None = None
        self._queue: list[tuple[str, int, dict[str, Any]]] = []  # prefetched trials
        self._early: list[tuple[Any, ...]] = []  # messages that overtook their trial's start
        self._instance: Trainable | None = None
        self._last_output_flush = 0.0
        sys.stdout = _CaptureStream(self, sys.stdout)  # type: ignore[assignment]
        sys.stderr = _CaptureStream(self, sys.stderr)  # type: ignore[assignment]

    # ------------------------------------------------------------------ actor methods
    def step(self, messages: list[tuple[Any, ...]], timeout: float = 10.0) -> list[tuple[Any, ...]]:
        """Apply ``messages``, then return the events produced since the last call (waits)."""
        self._apply(messages)
        deadline = time.monotonic() + timeout
        linger_until = 0.0
        with self._cond:
            while True:
                now = time.monotonic()
                session = self._session
                if self._events:
                    # Let a busy trial add a few more events to this batch (a short linger),
                    # unless it waits for our answer or has ended.
                    if not linger_until:
                        linger_until = now + _LINGER_S
                    if session is None or session.waiting or now >= linger_until:
                        break
                    self._cond.wait(linger_until - now)
                    continue
                remaining = deadline - now
                if remaining <= 0:
                    break
                if session is not None and session.output.parts:
                    self._cond.wait(min(remaining, _OUTPUT_FLUSH_S))
                    self._flush_output_locked()
                else:
                    self._cond.wait(remaining)
            self._flush_output_locked()
            events, self._events = self._events, []
        return events

    def notify(self, messages: list[tuple[Any, ...]]) -> None:
        """Apply ``messages`` now (a ``step`` call may be waiting)."""
        self._apply(messages)

    def ping(self) -> int:
        """The runner's process id."""
        return self.pid

    # ------------------------------------------------------------------ internals
    def current_output(self) -> _Output | None:
        session = self._session
        return session.output if session is not None else None

    def _flush_output_locked(self, final: bool = False) -> None:
        session = self._session
        if session is None:
            return
        text = session.output.drain(final)
        if text:
            self._events.append(("output", session.trial_id, session.run_seq, text))
        self._last_output_flush = time.monotonic()

    def _emit(self, event: tuple[Any, ...]) -> None:
        with self._cond:
            self._events.append(event)
            self._cond.notify_all()

    def _apply(self, messages: list[tuple[Any, ...]]) -> None:
        for message in messages:
            kind, trial_id, run_seq = message[0], message[1], message[2]
            if kind == "start":
                self._start(trial_id, run_seq, message[3])
                continue
            with self._cond:
                session = self._session
                if session is None or session.trial_id != trial_id or session.run_seq != run_seq:
                    queued = [q for q in self._queue if q[0] == trial_id and q[1] == run_seq]
                    if queued and kind in ("stop", "pause"):
                        self._queue.remove(queued[0])
                        self._events.append(("stopped", trial_id, run_seq))
                        self._cond.notify_all()
                    elif not queued:
                        self._early = [*self._early[-63:], message]  # its start may follow
                    continue
                if kind == "ack":
                    session.acked = max(session.acked, message[3])
                elif kind in ("stop", "pause"):
                    session.stop_kind = session.stop_kind or kind
                elif kind == "save":
                    session.save_requested = True
                self._cond.notify_all()

    def push_result(
        self, session: _RunnerSession, result: dict[str, Any], checkpoint: tuple[int, str] | None
    ) -> None:
        """Queue a result; block while too many wait for the controller (called by report)."""
        with self._cond:
            session.seq += 1
            self._events.append(
                ("result", session.trial_id, session.run_seq, session.seq, result, checkpoint)
            )
            self._cond.notify_all()
            session.waiting = True
            # A result with a checkpoint waits for the controller's answer: a trial stopped
            # there writes no more checkpoints only to have them deleted.
            ahead = 0 if checkpoint is not None else session.max_ahead
            while session.seq - session.acked > ahead and not session.stop_kind:
                self._cond.wait()
            session.waiting = False
            if session.stop_kind:
                raise TrialStopped(session.stop_kind)

    def _start(self, trial_id: str, run_seq: int, spec: dict[str, Any]) -> None:
        with self._cond:
            if self._session is not None or self._queue:
                self._queue.append((trial_id, run_seq, spec))  # starts when the current ends
                return
            session = self._claim(trial_id, run_seq, spec)
        self._launch(session)

    def _claim(self, trial_id: str, run_seq: int, spec: dict[str, Any]) -> _RunnerSession:
        """Make the trial the runner's current one (the caller holds ``_cond``).

        The runner is never without a current trial between taking a queued trial and
        starting it, so a ``start`` that arrives meanwhile queues behind it: one trial at
        a time, always.
        """
        session = _RunnerSession(self, trial_id, run_seq, spec)
        self._session = session
        return session

    def _launch(self, session: _RunnerSession) -> None:
        """Start the claimed trial's thread (outside ``_cond``)."""
        trial_id, run_seq = session.trial_id, session.run_seq
        with self._cond:
            early = [m for m in self._early if m[1] == trial_id and m[2] == run_seq]
            self._early = [m for m in self._early if m[1] != trial_id]
        if session.trial_dir:
            os.makedirs(session.trial_dir, exist_ok=True)
        self._emit(("started", trial_id, run_seq, {"pid": self.pid, "hostname": _HOSTNAME}))
        if early:
            self._apply(early)
        target = self._run_class if self.kind == "class" else self._run_function
        thread = threading.Thread(
            target=self._run, args=(session, target), name=f"trial-{trial_id}", daemon=True
        )
        thread.start()

    def _run(self, session: _RunnerSession, target: Any) -> None:
        try:
            with use_session(session):
                target(session)
            final = ("done", session.trial_id, session.run_seq)
        except TrialStopped:
            final = ("stopped", session.trial_id, session.run_seq)
        except BaseException as e:  # noqa: BLE001 - any failure of user code is the trial's error
            tb = e.__traceback__
            while tb is not None and tb.tb_frame.f_code.co_filename in _OWN_FILES:
                tb = tb.tb_next  # the runner's own frames say nothing about the user's error
            err = TaskError.from_exception(e.with_traceback(tb), session.trial_name)
            final = ("error", session.trial_id, session.run_seq, err.traceback_str, err)
        following = None
        with self._cond:
            self._flush_output_locked(final=True)
            self._events.append(final)
            if self._session is session:
                self._session = None
                if self._queue:
                    following = self._claim(*self._queue.pop(0))
            self._cond.notify_all()
        if following is not None:
            self._launch(following)

    def _run_function(self, session: _RunnerSession) -> None:
        returned = self.trainable(session.config)
        if isinstance(returned, dict) and not session.stop_kind:
            session.report(returned)

    def _run_class(self, session: _RunnerSession) -> None:
        spec = session.spec
        info = {
            "trial_id": session.trial_id,
            "trial_name": session.trial_name,
            "trial_dir": session.trial_dir,
            "iteration": session.iteration,
            "time_total_s": session.time_total,
        }
        instance, self._instance = self._instance, None
        if instance is None or not instance.reset(copy.deepcopy(session.config), **info):
            if instance is not None:
                instance.stop()
            instance = self.trainable(copy.deepcopy(session.config), **info)
        if session.loaded_checkpoint is not None:
            instance.restore(session.loaded_checkpoint.path)
            instance._iteration = session.iteration
            instance._time_total = session.time_total
        freq = int(spec.get("checkpoint_frequency") or 0)
        at_end = bool(spec.get("checkpoint_at_end"))
        saved_at = -1
        try:
            while True:
                if session.stop_kind:
                    raise TrialStopped(session.stop_kind)
                result = instance.train()
                done = bool(result.get("done"))
                checkpoint = None
                wanted = session.save_requested or (done and at_end)
                if wanted or (freq and instance.iteration % freq == 0):
                    session.save_requested = False
                    checkpoint = self._save(session, instance)
                    saved_at = instance.iteration
                    result["checkpoint_dir_name"] = os.path.basename(checkpoint[1])
                session.iteration = instance.iteration
                result.update(node_ip=self.node_ip, date=time.strftime("%Y-%m-%d_%H-%M-%S"))
                self.push_result(session, result, checkpoint)
                if done:
                    break
        except TrialStopped as stop:
            pausing = bool(stop.args) and stop.args[0] == "pause"
            if (pausing or at_end) and saved_at != instance.iteration and instance.iteration:
                checkpoint = self._save(session, instance)
                self._emit(("checkpoint", session.trial_id, session.run_seq, checkpoint))
            self._retire(instance)
            raise
        except BaseException:
            instance.stop()
            raise
        self._retire(instance)

    def _save(self, session: _RunnerSession, instance: Trainable) -> tuple[int, str]:
        """Save a class trainable's state as the trial's next ``checkpoint_<index>``."""
        index = session.next_checkpoint
        session.next_checkpoint += 1
        os.makedirs(session.trial_dir, exist_ok=True)
        tmp = os.path.join(session.trial_dir, f".tmp_save_{index:06d}")
        if os.path.exists(tmp):
            shutil.rmtree(tmp)
        instance.save(tmp)
        dest = os.path.join(session.trial_dir, f"checkpoint_{index:06d}")
        if os.path.exists(dest):
            shutil.rmtree(dest)
        os.replace(tmp, dest)
        return index, dest

    def _retire(self, instance: Trainable) -> None:
        """Keep the instance for the next trial if it can take a new config, else end it."""
        if type(instance).reset_config is not Trainable.reset_config:
            self._instance = instance
        else:
            instance.stop()
