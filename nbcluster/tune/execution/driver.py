"""The I/O shell around the controller: runner actors, their calls, storage, display, signals.

:class:`ExperimentDriver` owns the runner actors. It keeps one ``step`` call in flight per
runner and waits on all of them at once (``nbcluster.wait``), so it sleeps until some
runner has events, and wakes at least every ``TICK_S`` to redraw the display and check
the time budget. Each batch of events goes to the controller; the controller's outbox
is then carried out: messages ride on the runner's next ``step`` call (or go at once with
``notify`` when a ``step`` is in flight), runners are created and killed, results and
checkpoints go to storage, and the display is told.

Interrupts: during ``run`` the SIGINT handler (main thread only) records the interrupt
instead of raising. The first one stops the trials gracefully (they end PAUSED and can be
continued by ``fit()`` or ``Tuner.restore``); trials that do not stop within
``STOP_GRACE_S`` have their runner killed; a second interrupt kills them at once.
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

import nbcluster
from nbcluster.exceptions import ActorDiedError, ActorError, NbclusterError
from nbcluster.tune._display import Reporter
from nbcluster.tune.callback import Callback
from nbcluster.tune.execution.controller import TuneController
from nbcluster.tune.execution.runner import TrialRunner
from nbcluster.tune.execution.storage import ExperimentStorage

__all__ = ["ExperimentDriver", "RunnerActor"]

TICK_S = 0.25
STOP_GRACE_S = 10.0
STEP_TIMEOUT_S = 10.0

#: The runner actor: two calls at a time (a waiting ``step`` and a ``notify``).
RunnerActor = nbcluster.remote(max_concurrency=2)(TrialRunner)


class ExperimentDriver:
    """Runs one ``fit()``: moves events and instructions between runners and the controller."""

    def __init__(
        self,
        controller: TuneController,
        trainable_ref: Any,
        kind: str,
        storage: ExperimentStorage,
        reporter: Reporter,
        make_state: Callable[[], dict[str, Any]],
        callbacks: list[Callback] | None = None,
        actor_resources: Callable[[dict[str, float]], dict[str, float]] | None = None,
    ) -> None:
        self.ctrl = controller
        self.trainable_ref = trainable_ref
        self.kind = kind
        self.storage = storage
        self.reporter = reporter
        self.make_state = make_state
        self.callbacks = list(callbacks or [])
        self.actor_resources = actor_resources
        self.handles: dict[str, Any] = {}
        self.inflight: dict[Any, str] = {}
        self.step_of: dict[str, Any] = {}
        self.outgoing: dict[str, list[tuple[Any, ...]]] = {}
        self.interrupts = 0
        self._interrupt_handled = 0
        self._stop_since: float | None = None
        self._iteration = 0

    # ------------------------------------------------------------------ main loop
    def run(self) -> None:
        """Run until the controller is finished (or the user interrupts twice)."""
        previous = self._install_sigint()
        try:
            self.ctrl.on_start()
            self._drain()
            self.reporter.start(self.ctrl.get_trials())
            while not self.ctrl.is_finished():
                try:
                    self._loop_once()
                except KeyboardInterrupt:
                    self.interrupts += 1
                self._handle_interrupts()
        finally:
            self._shutdown()
            self._restore_sigint(previous)

    def _loop_once(self) -> None:
        self._iteration += 1
        self._wait_and_process()
        self.ctrl.on_tick()
        self._drain()
        if self.ctrl.stopping and self._stop_since is None:
            self._stop_since = time.monotonic()
        if self._stop_since is not None and time.monotonic() - self._stop_since > STOP_GRACE_S:
            self._kill_busy_runners(f"its trial did not stop within {STOP_GRACE_S:g} s")
        self.reporter.update(self.ctrl.get_trials())
        self.storage.maybe_save_state(self.make_state)

    def _wait_and_process(self) -> None:
        refs = list(self.inflight)
        if not refs:
            time.sleep(TICK_S / 5)
            return
        ready, rest = nbcluster.wait(refs, num_returns=1, timeout=TICK_S)
        if ready and rest:
            more, _ = nbcluster.wait(rest, num_returns=len(rest), timeout=0)
            ready += more
        for ref in ready:
            runner_id = self.inflight.pop(ref, None)
            if runner_id is None:
                continue
            self.step_of.pop(runner_id, None)
            try:
                events = nbcluster.get(ref)
            except ActorDiedError as e:
                if e.actor_init_failed:
                    # Every runner would fail the same way (e.g. the trainable's module
                    # cannot be imported on the workers): stop with the cause.
                    self.ctrl.on_runner_failed_to_start(runner_id, str(e.cause or e))
                else:
                    why = e.reason or "it was killed or crashed"
                    self.ctrl.on_runner_died(runner_id, f"pid {e.pid or '?'}: {why}")
                self._forget(runner_id)
            except ActorError as e:
                self.ctrl.on_runner_died(runner_id, _first_line(e))
                self._forget(runner_id)
            except NbclusterError as e:
                # The runner's own code failed (not the trial's): end it; its trial retries.
                self._kill(runner_id)
                self.ctrl.on_runner_died(runner_id, _first_line(e))
            else:
                self.ctrl.on_runner_events(runner_id, events)
            self._drain()

    # ------------------------------------------------------------------ outbox
    def _drain(self) -> None:
        ctrl = self.ctrl
        while ctrl.outbox:
            batch, ctrl.outbox = ctrl.outbox, []
            for cmd in batch:
                self._do(cmd)
        for runner_id, messages in self.outgoing.items():
            handle = self.handles.get(runner_id)
            if handle is None:
                continue
            if runner_id in self.step_of:
                if messages:
                    handle.notify.remote(messages)
                    self.outgoing[runner_id] = []
                continue
            ref = handle.step.remote(messages, STEP_TIMEOUT_S)
            self.outgoing[runner_id] = []
            self.inflight[ref] = runner_id
            self.step_of[runner_id] = ref

    def _do(self, cmd: tuple[Any, ...]) -> None:
        kind = cmd[0]
        storage = self.storage
        if kind == "send":
            self.outgoing.setdefault(cmd[1], []).append(cmd[2])
        elif kind == "result":
            storage.add_result(cmd[1], cmd[2])
            self._callback("on_trial_result", trial=cmd[1], result=cmd[2])
        elif kind == "output":
            self.reporter.output(cmd[1], cmd[2])
        elif kind == "create_runner":
            self._create_runner(cmd[1], cmd[2])
        elif kind in ("end_runner", "runner_dead"):
            self._kill(cmd[1])
        elif kind == "trial_added":
            storage.init_trial(cmd[1])
            storage.state_dirty = True
        elif kind == "trial_config":
            storage.update_params(cmd[1])
            storage.state_dirty = True
        elif kind == "delete_checkpoint":
            storage.delete_checkpoint(cmd[1])
        elif kind == "trial_error":
            storage.write_error(cmd[1], cmd[2])
            storage.state_dirty = True
            self.reporter.trial_failed(cmd[1], retrying=not cmd[1].is_finished())
            self._callback("on_trial_error", trial=cmd[1])
        elif kind == "trial_end":
            storage.state_dirty = True
            self.reporter.trial_ended(cmd[1])
            if cmd[1].status == "TERMINATED":
                self._callback("on_trial_complete", trial=cmd[1])
        elif kind == "trial_running":
            storage.state_dirty = True
            self._callback("on_trial_start", trial=cmd[1])
        elif kind == "stopping":
            self.reporter.note(f"stopping: {cmd[1]}")
            storage.state_dirty = True
        elif kind in ("checkpoint", "trial_paused", "trial_retry"):
            storage.state_dirty = True
            if kind == "checkpoint":
                self._callback("on_checkpoint", trial=cmd[1], checkpoint=cmd[2])

    def _callback(self, hook: str, **info: Any) -> None:
        for cb in self.callbacks:
            getattr(cb, hook)(iteration=self._iteration, trials=self.ctrl.get_trials(), **info)

    # ------------------------------------------------------------------ runners
    def _create_runner(self, runner_id: str, resources: dict[str, float]) -> None:
        res = self.actor_resources(resources) if self.actor_resources else resources
        custom = {k: v for k, v in res.items() if k not in ("CPU", "GPU", "memory") and v > 0}
        handle = RunnerActor.options(
            num_cpus=res.get("CPU", 0.0),
            num_gpus=res.get("GPU", 0.0),
            memory=res.get("memory", 0.0),
            resources=custom,
        ).remote(self.trainable_ref, self.kind, runner_id)
        self.handles[runner_id] = handle
        self.outgoing.setdefault(runner_id, [])

    def _forget(self, runner_id: str) -> None:
        self.handles.pop(runner_id, None)
        self.outgoing.pop(runner_id, None)
        ref = self.step_of.pop(runner_id, None)
        if ref is not None:
            self.inflight.pop(ref, None)

    def _kill(self, runner_id: str) -> None:
        handle = self.handles.get(runner_id)
        self._forget(runner_id)
        if handle is not None:
            with contextlib.suppress(NbclusterError):
                nbcluster.kill(handle)

    def _kill_busy_runners(self, reason: str) -> None:
        for runner_id, rec in list(self.ctrl.runners.items()):
            if rec.state != "dead" and rec.trial_id is not None:
                self._kill(runner_id)
                self.ctrl.on_runner_died(runner_id, reason)
        self._drain()

    def _shutdown(self) -> None:
        self.ctrl.end_all_runners()
        with contextlib.suppress(NbclusterError):
            self._drain()
        for runner_id in list(self.handles):
            self._kill(runner_id)
        self.storage.maybe_save_state(self.make_state, force=True)
        self.storage.flush()
        self.reporter.finish(self.ctrl.get_trials())
        for cb in self.callbacks:
            cb.on_experiment_end(trials=self.ctrl.get_trials())

    # ------------------------------------------------------------------ interrupts
    def _install_sigint(self) -> Any:
        if threading.current_thread() is not threading.main_thread():
            return None

        def on_sigint(signum: int, frame: Any) -> None:
            self.interrupts += 1

        try:
            return signal.signal(signal.SIGINT, on_sigint)
        except ValueError:
            return None

    def _restore_sigint(self, previous: Any) -> None:
        if previous is not None:
            signal.signal(signal.SIGINT, previous)

    def _handle_interrupts(self) -> None:
        if self.interrupts == self._interrupt_handled:
            return
        self._interrupt_handled = self.interrupts
        if self.interrupts == 1:
            self.reporter.note(
                "interrupted: stopping the trials (interrupt again to end them at once)"
            )
            self.ctrl.on_interrupt()
            self._drain()
        else:
            self._kill_busy_runners("interrupted twice")


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__
