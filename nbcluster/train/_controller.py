"""The driver side of a run: the thin shell around :class:`~nbcluster.train._state.RunState`.

:func:`run_trainer` is the one entry point (``fit()`` calls it; so does Tune, to run a
trainer as a trial): it reserves and starts the worker group (``_group.py``), starts the
training function on every rank, polls the workers, feeds what they send to the state
machine and carries out its instructions (stream the report to the display, the
callbacks and ``on_report``; delete checkpoints; restart; fail; finish), and returns a
:class:`~nbcluster.train.Result`. What the workers printed comes with their poll replies
and is printed here, before the events of the same reply, so by the time ``fit()``
returns every line the loops printed is under the cell (no wait for output to arrive). It never raises for a failed run: the error is in
``Result.error`` (``fit()`` raises it).

Interrupting the kernel (``KeyboardInterrupt``) stops the run: every worker is asked to
stop at its next ``report()``; workers that have not stopped within
:data:`STOP_GRACE_S` seconds are ended. The checkpoints stay, and the result says it was
interrupted. A second interrupt ends the workers at once.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
import time
import uuid
from collections.abc import Callable, Mapping
from typing import Any

import nbcluster
from nbcluster.exceptions import ActorDiedError, NbclusterError, TaskCancelledError
from nbcluster.train._callbacks import CallbackRunner, RunInfo
from nbcluster.train._checkpoint import Checkpoint
from nbcluster.train._config import RunConfig
from nbcluster.train._display import RunView, WorkerRow, make_display
from nbcluster.train._errors import ControllerError, WorkerFailure, WorkerGroupError
from nbcluster.train._group import WorkerGroup, group_key, put_warm, take_warm
from nbcluster.train._result import Result
from nbcluster.train._session import StorageContext, TrainContext
from nbcluster.train._state import (
    CheckpointRecord,
    DeleteCheckpoints,
    Fail,
    Finished,
    Instruction,
    Reported,
    Restart,
    RunState,
    Stopped,
)
from nbcluster.train._storage import RunDir, default_run_name

__all__ = ["STOP_GRACE_S", "TrainingReport", "run_trainer"]

#: Seconds the workers get to stop at a report after an interrupt, before they are ended.
STOP_GRACE_S = 3.0
#: How long one poll of a worker waits for an event (seconds).
POLL_S = 0.5
#: How often the driver wakes to refresh the display while nothing happens (seconds).
TICK_S = 0.25
#: The state file is written at most this often, and whenever a checkpoint is kept.
SAVE_EVERY_S = 1.0

_UNSET: Any = object()


@dataclasses.dataclass(frozen=True)
class TrainingReport:
    """One complete report, as ``on_report`` gets it."""

    iteration: int
    metrics: Mapping[str, Any]
    checkpoint: Checkpoint | None


OnReport = Callable[[TrainingReport], bool | None]


class _Controller:
    def __init__(
        self,
        trainer: Any,
        config: Any,
        run_config: RunConfig,
        on_report: OnReport | None,
        show: bool | None,
    ) -> None:
        self.trainer = trainer
        self.config = config
        self.run_config = run_config
        self.on_report = on_report
        self.scaling = trainer.scaling_config
        self.backend = trainer._backend_config()
        self.name = run_config.name or default_run_name(type(trainer).__name__)
        self.rundir = RunDir(run_config.resolved_storage_path(), self.name)
        self.trial_id = uuid.uuid4().hex[:8]
        cc = run_config.checkpoint_config
        fc = run_config.failure_config
        assert cc is not None and fc is not None
        self.rundir.create()
        saved = self.rundir.load_state() if run_config.name else None
        records = [CheckpointRecord.from_json(r) for r in (saved or {}).get("checkpoints", [])]
        self.state = RunState(
            self.scaling.num_workers,
            cc,
            fc.max_failures,
            history=(saved or {}).get("history", []) if records else [],
            checkpoints=records,
            now=time.monotonic(),
            wall_offset=time.time() - time.monotonic(),
        )
        if saved is not None:
            self.rundir.remove_unregistered({r.name for r in self.state.book.records})
        latest = self.state.book.latest
        self.resumed_from: Checkpoint | None = (
            Checkpoint(self.rundir.checkpoint_path(latest.name))
            if latest is not None
            else trainer.resume_from_checkpoint
        )
        self.view = RunView(
            trainer=type(trainer).__name__,
            name=self.name,
            path=self.rundir.path,
            num_workers=self.scaling.num_workers,
            max_failures=fc.max_failures,
            history=self.state.history,
            checkpoints=self.state.book.records,
        )
        verbose = 0 if show is False else run_config.verbose
        self.display = make_display(verbose, self.view, widget=None if show is None else show)
        self.callbacks = CallbackRunner(
            run_config.callbacks or [],
            RunInfo(self.trial_id, self.name, dict(config or {}), self.rundir.path),
        )
        self.group: WorkerGroup | None = None
        self.return_value: Any = None
        self.error: BaseException | None = None
        self.stop_reason: str | None = None
        self.interrupted = False
        self.last_save = 0.0
        self.acks: list[int] = []
        self.pending: dict[int, Any] = {}
        self.ended_ranks: set[int] = set()
        self.worker_errors: dict[int, BaseException] = {}

    def _sync_view(self) -> None:
        self.view.history = self.state.history
        self.view.checkpoints = self.state.book.records
        self.view.failures = self.state.failures
        for row in self.view.workers:
            row.state = self.state.worker_state.get(row.rank, row.state)

    # -- the run ----------------------------------------------------------------------------
    def run(self) -> Result:
        if self.resumed_from is not None and self.state.book.latest is not None:
            self.view.notice(f"resuming from {os.path.basename(self.resumed_from.path)}")
        self.display.update(self.view, force=True)
        try:
            self.callbacks.start()
            self._attempts()
        except KeyboardInterrupt:
            self._interrupt_while_starting()
        except BaseException as err:  # noqa: BLE001 - a controller failure ends the run
            self._end_group(warm=False)
            if isinstance(err, Exception):
                self.error = ControllerError(err)
                self.error.__cause__ = err
            else:
                raise
        return self._finish()

    def _attempts(self) -> None:
        while True:
            terminal = self._attempt()
            if isinstance(terminal, Restart):
                self._end_group(warm=False)
                continue
            if isinstance(terminal, Finished):
                self.return_value = terminal.return_value
                self._end_group(warm=True)
            elif isinstance(terminal, Fail):
                self._end_group(warm=False)
                self.error = self._failure_error(terminal.failures)
            elif isinstance(terminal, Stopped):
                clean = all(s in ("DONE", "STOPPED") for s in self.state.worker_state.values())
                self._end_group(warm=clean)
                self.stop_reason = terminal.reason
            return

    def _attempt(self) -> Instruction:
        group = self._acquire_group()
        index = self.state.start_attempt(time.monotonic())
        if self.state.attempt > 1:
            self.rundir.remove_unregistered({r.name for r in self.state.book.records})
        self.view.workers = [
            WorkerRow(i["world_rank"], i["node_id"], i["pid"], "RUNNING") for i in group.infos
        ]
        self.view.status = "RUNNING"
        failures = self._start_loops(group, index)
        self.display.update(self.view, force=True)
        if failures:
            return self.state.on_failures(failures)[0]
        try:
            return self._poll_until_over(group)
        except KeyboardInterrupt:
            self.interrupted = True
            return self._stop(group, "interrupted")

    def _acquire_group(self) -> WorkerGroup:
        key = group_key(self.scaling, self.backend)
        warm = take_warm(key)
        group = warm or WorkerGroup(key, self.scaling, self.backend)
        self.group = group
        self.view.status = "WAITING FOR RESOURCES"
        nodes = group.reserve(notice=self._notice)
        if warm is not None and not (warm.matches(nodes) and warm.alive()):
            pg, warm.pg = warm.pg, None  # keep the reservation, end the old workers
            warm.kill()
            group = WorkerGroup(key, self.scaling, self.backend)
            group.pg = pg
            self.group = group
            warm = None
        if warm is None:
            self.view.status = "STARTING"
            self.display.update(self.view, force=True)
            t0 = time.monotonic()
            group.start_workers(nodes, tuple(getattr(self.backend, "preload", ()) or ()))
            self._notice(
                f"started {self.scaling.num_workers} worker(s) in {time.monotonic() - t0:.1f} s"
            )
        else:
            self._notice(f"reusing the warm worker group ({self.scaling.num_workers} worker(s))")
        return group

    def _notice(self, text: str) -> None:
        self.view.notice(text)
        self.display.update(self.view, force=True)

    def _start_loops(self, group: WorkerGroup, index: int) -> dict[int, str]:
        latest = self.state.book.latest
        ckpt: str | None = None
        if latest is not None:
            ckpt = self.rundir.checkpoint_path(latest.name)
        elif self.trainer.resume_from_checkpoint is not None:
            ckpt = self.trainer.resume_from_checkpoint.path
        shards = self.trainer._dataset_shards(len(group.workers))
        storage = StorageContext(self.rundir.storage_path, self.name)
        resources = self.scaling._worker_resources()
        refs = []
        for info, worker, shard in zip(group.infos, group.workers, shards, strict=True):
            ctx = TrainContext(
                world_size=len(group.workers),
                world_rank=info["world_rank"],
                local_rank=info["local_rank"],
                local_world_size=info["local_world_size"],
                node_rank=info["node_rank"],
                experiment_name=self.name,
                trial_id=self.trial_id,
                storage=storage,
                trial_resources=resources,
                metadata=dict(self.trainer.metadata or {}),
            )
            refs.append(
                worker.start.remote(
                    self.trainer.train_loop_per_worker,
                    self.config,
                    ctx,
                    index,
                    ckpt,
                    shard,
                    self._attempt_token(),
                )
            )
        self.acks = [0] * len(group.workers)
        self.pending = {}
        self.ended_ranks = set()
        failures: dict[int, str] = {}
        for rank, ref in enumerate(refs):
            try:
                nbcluster.get(ref)
            except NbclusterError as err:  # the worker died as its loop started
                failures[rank] = self._died(group, rank, err)
        return failures

    def _attempt_token(self) -> str:
        """Names the current attempt's staging directories (see ``_storage``)."""
        return f"{self.trial_id}-{self.state.attempt}"

    def _died(self, group: WorkerGroup, rank: int, err: BaseException) -> str:
        info = group.infos[rank]
        self.worker_errors[rank] = err
        self.ended_ranks.add(rank)
        return (
            f"[Rank {rank}] (pid {info['pid']} on node {info['node_id'][:8]}): the worker "
            f"process died: {err}"
        )

    # -- polling ----------------------------------------------------------------------------
    def _poll_until_over(self, group: WorkerGroup) -> Instruction:
        while True:
            terminal = self._poll_once(group, TICK_S)
            if terminal is not None:
                return terminal

    def _poll_once(self, group: WorkerGroup, wait_s: float) -> Instruction | None:
        for rank, worker in enumerate(group.workers):
            if rank not in self.pending and rank not in self.ended_ranks:
                self.pending[rank] = worker.run.remote(self.acks[rank], POLL_S)
        refs = list(self.pending.values())
        ready, _ = nbcluster.wait(refs, num_returns=1, timeout=wait_s) if refs else ([], [])
        if ready:
            # Take whatever else is ready now too, so failures of several ranks come together.
            ready, _ = nbcluster.wait(refs, num_returns=len(refs), timeout=0)
        ready_set = set(ready)
        failures: dict[int, str] = {}
        terminal: list[Instruction] = []

        def carry_out(instructions: list[Instruction]) -> None:
            # One event at a time: a stop decided on a report applies to the next event.
            for instr in instructions:
                result = self._carry_out(instr, group)
                if result is not None and not terminal:
                    terminal.append(result)

        now = time.monotonic
        for rank, ref in list(self.pending.items()):
            if ref not in ready_set:
                continue
            del self.pending[rank]
            try:
                events, output = nbcluster.get(ref)
            except TaskCancelledError:
                continue  # an interrupt cancelled the poll; the next one asks again
            except (ActorDiedError, NbclusterError) as err:
                failures[rank] = self._died(group, rank, err)
                continue
            _print_output(output)  # before its events: a rank's last lines precede its end
            for seq, event in events:
                if seq <= self.acks[rank]:
                    continue
                self.acks[rank] = seq
                kind = event[0]
                if kind == "report":
                    _, index, metrics, ckpt_name = event
                    self.view.workers[rank].iteration = index + 1
                    carry_out(self.state.on_report(rank, index, metrics, ckpt_name, now()))
                elif kind == "done":
                    self.ended_ranks.add(rank)
                    carry_out(self.state.on_done(rank, event[1], now()))
                elif kind == "stopped":
                    self.ended_ranks.add(rank)
                    carry_out(self.state.on_stopped(rank, now()))
                elif kind == "error":
                    self.ended_ranks.add(rank)
                    info = group.infos[rank]
                    failures[rank] = (
                        f"[Rank {rank}] (pid {info['pid']} on node {info['node_id'][:8]})\n"
                        + event[1].rstrip()
                    )
                    self.worker_errors[rank] = (
                        event[2] if event[2] is not None else WorkerFailure(rank, event[1])
                    )
        if failures:
            carry_out(self.state.on_failures(failures))
        self._sync_view()
        self.display.update(self.view)
        return terminal[0] if terminal else None

    def _carry_out(self, instr: Instruction, group: WorkerGroup) -> Instruction | None:
        if isinstance(instr, Reported):
            if instr.checkpoint is not None:
                # Every rank has written its files: the checkpoint becomes visible whole.
                self.rundir.commit_checkpoint(instr.checkpoint.name, self._attempt_token())
            ckpt = (
                Checkpoint(self.rundir.checkpoint_path(instr.checkpoint.name))
                if instr.checkpoint
                else None
            )
            self.callbacks.result(instr.metrics, ckpt)
            self._save(force=instr.checkpoint is not None)
            if self.on_report is not None:
                stop = self.on_report(TrainingReport(instr.iteration, instr.metrics, ckpt))
                if stop and self.state.stop_reason is None:
                    self.state.request_stop("stopped by on_report", keep_reports=False)
                    self._ask_to_stop(group)
            return None
        if isinstance(instr, DeleteCheckpoints):
            self.rundir.delete_checkpoints(instr.names)
            return None
        if isinstance(instr, Restart):
            failed = ", ".join(str(r) for r in sorted(instr.failures))
            limit = "no limit" if self.state.max_failures == -1 else f"of {self.state.max_failures}"
            where = f"from {instr.checkpoint.name}" if instr.checkpoint else "from the start"
            self._sync_view()
            self.view.status = "RESTARTING"
            self._notice(
                f"rank {failed} failed (failure {instr.failure_count} {limit}); restarting {where}"
            )
            for text in instr.failures.values():
                self.view.notice(text.splitlines()[-1][:200])
            return instr
        return instr  # Fail, Finished, Stopped

    def _save(self, force: bool = False) -> None:
        now = time.monotonic()
        if force or now - self.last_save >= SAVE_EVERY_S:
            self.last_save = now
            self.rundir.save_state(self.state.snapshot())

    # -- stopping ---------------------------------------------------------------------------
    def _ask_to_stop(self, group: WorkerGroup) -> None:
        for rank, worker in enumerate(group.workers):
            if rank not in self.ended_ranks:
                worker.stop.remote()

    def _stop(self, group: WorkerGroup, reason: str) -> Instruction:
        self.state.request_stop(reason)
        self.view.status = "STOPPING"
        self._notice(f"{reason}: asking the workers to stop at their next report")
        deadline = time.monotonic() + STOP_GRACE_S
        try:
            self._ask_to_stop(group)
            while time.monotonic() < deadline:
                terminal = self._poll_once(
                    group, min(TICK_S, max(0.0, deadline - time.monotonic()))
                )
                if terminal is not None:
                    return terminal
        except KeyboardInterrupt:
            pass  # a second interrupt: end them now
        group.kill()
        self._notice(f"ended the workers that had not stopped within {STOP_GRACE_S:g} s")
        out = self.state.on_killed()
        return out[0] if out else Stopped(reason)

    def _interrupt_while_starting(self) -> None:
        self.interrupted = True
        self.stop_reason = "interrupted"
        self._end_group(warm=False)
        self.state.request_stop("interrupted")
        self.state.on_killed()

    def _end_group(self, warm: bool) -> None:
        group, self.group = self.group, None
        if group is None:
            return
        group.release_reservation()
        if warm and group.ready and group.workers:
            put_warm(group)
        else:
            group.kill()

    # -- the result -------------------------------------------------------------------------
    def _failure_error(self, failures: Mapping[int, str]) -> BaseException:
        if -1 in failures:
            return ControllerError(ValueError(failures[-1]))
        errors = self.worker_errors
        text = "\n".join(failures[r] for r in sorted(failures))
        return WorkerGroupError(
            text, {r: errors.get(r, WorkerFailure(r, failures[r])) for r in failures}
        )

    def _finish(self) -> Result:
        state = self.state
        self.view.ended = time.monotonic()
        self._sync_view()
        if self.error is not None:
            self.view.status = "FAILED"
            self.view.notice(str(self.error).splitlines()[0])
        elif self.interrupted:
            self.view.status = "INTERRUPTED"
            kept = state.book.latest
            self.view.notice(
                f"interrupted; checkpoints kept (latest: {kept.name})" if kept else "interrupted"
            )
        elif self.stop_reason:
            self.view.status = "STOPPED"
        else:
            self.view.status = "FINISHED"
        with contextlib.suppress(OSError):
            self._save(force=True)
            self.rundir.remove_unregistered({r.name for r in state.book.records})
        if self.error is not None:
            self.callbacks.error()
        else:
            self.callbacks.complete()
        self.display.close(self.view)
        latest = state.book.latest
        return Result(
            metrics=state.metrics,
            checkpoint=Checkpoint(self.rundir.checkpoint_path(latest.name)) if latest else None,
            error=self.error,
            path=self.rundir.path,
            best_checkpoints=[
                (Checkpoint(self.rundir.checkpoint_path(r.name)), dict(r.metrics))
                for r in state.book.records
            ],
            return_value=self.return_value,
            interrupted=self.interrupted,
            stopped=self.stop_reason,
            resumed_from=self.resumed_from,
            num_failures=state.failures,
            metrics_history=[dict(h) for h in state.history],
        )


def _print_output(chunks: list[tuple[str, str]]) -> None:
    """Print what a worker's function printed (its lines carry their ``[rank N]`` prefix):
    in a notebook, under the cell that runs ``fit()``."""
    for stream, text in chunks:
        (sys.stderr if stream == "stderr" else sys.stdout).write(text)


def run_trainer(
    trainer: Any,
    *,
    train_loop_config: Any = _UNSET,
    run_config: RunConfig | None = None,
    on_report: OnReport | None = None,
    show: bool | None = None,
) -> Result:
    """Run ``trainer`` once and return its :class:`Result` (never raises for a failed run).

    ``train_loop_config`` and ``run_config`` replace the trainer's own for this run.
    ``on_report(report)`` is called on the driver after each complete report (a
    :class:`TrainingReport`: iteration, rank 0's metrics, the checkpoint kept with it);
    returning True asks the workers to stop at their next report (the result then has
    ``stopped="stopped by on_report"``). ``show``: None picks the live widget in a
    notebook and text elsewhere (``RunConfig(verbose=0)``: nothing); False shows nothing.
    """
    config = trainer.train_loop_config if train_loop_config is _UNSET else train_loop_config
    trainer._check_picklable(config)
    WorkerGroup(("check",), trainer.scaling_config, None).check_feasible()
    controller = _Controller(trainer, config, run_config or trainer.run_config, on_report, show)
    return controller.run()
