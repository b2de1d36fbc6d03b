"""Submitted jobs as a state machine: events in, records and decisions out, no I/O.

::

    PENDING ──(supervisor started the entrypoint)──▶ RUNNING
       │                                               │
       └──────────────┬────────────────────────────────┘
                      ▼
     SUCCEEDED (exit 0) · FAILED (exit ≠ 0, setup failed, supervisor died) · STOPPED

A terminal status is final. ``stop`` marks the job; the supervisor reports STOPPED, and a
job still not terminal :data:`STOP_GRACE_S` seconds later is reported by :meth:`overdue`
so the head can kill its process groups itself. Time is passed in, never read.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Mapping

__all__ = [
    "MESSAGES",
    "STOP_GRACE_S",
    "TERMINAL",
    "BadJobRequest",
    "DuplicateJob",
    "JobTable",
    "NotTerminal",
    "Submission",
    "UnknownJob",
]

PENDING, RUNNING, STOPPED, SUCCEEDED, FAILED = (
    "PENDING",
    "RUNNING",
    "STOPPED",
    "SUCCEEDED",
    "FAILED",
)
STATUSES = (PENDING, RUNNING, STOPPED, SUCCEEDED, FAILED)
TERMINAL = frozenset({STOPPED, SUCCEEDED, FAILED})
STOP_GRACE_S = 4.5  # the supervisor escalates SIGTERM → SIGKILL after 3 s; the head after this
MESSAGES = {
    PENDING: "Job has not started yet. It may be waiting for resources (CPUs, GPUs, custom "
    "resources) or for its runtime environment to be set up.",
    RUNNING: "Job is currently running.",
    STOPPED: "Job was intentionally stopped.",
    SUCCEEDED: "Job finished successfully.",
}
_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:\-]{0,127}$")


class UnknownJob(LookupError):
    """No job has this submission id."""


class DuplicateJob(ValueError):
    """A job with this submission id exists already."""


class BadJobRequest(ValueError):
    """A submission that cannot run (the message says what to change)."""


class NotTerminal(RuntimeError):
    """The job is still pending or running."""


@dataclasses.dataclass
class Submission:
    """What the head records about one submitted job."""

    submission_id: str
    entrypoint: str
    runtime_env: str = ""
    metadata: dict[str, str] = dataclasses.field(default_factory=dict)
    entrypoint_num_cpus: float = 0.0
    entrypoint_num_gpus: float = 0.0
    entrypoint_resources: dict[str, float] = dataclasses.field(default_factory=dict)
    status: str = PENDING
    message: str = MESSAGES[PENDING]
    start_time: float = 0.0
    end_time: float = 0.0
    run_time: float = 0.0
    has_exit_code: bool = False
    exit_code: int = 0
    job_id: str = ""
    supervisor_pid: int = 0
    supervisor_start: int = 0  # process start time of the supervisor (tells PIDs apart)
    driver_pid: int = 0
    error_type: str = ""
    node_id: str = ""
    hostname: str = ""
    lease_node: str = ""
    lease_id: bytes = b""
    stop_requested: float = 0.0  # when stop was asked (0: never); not persisted

    @property
    def terminal(self) -> bool:
        """True once the job has ended."""
        return self.status in TERMINAL


def _check_resources(name: str, value: float) -> None:
    if value < 0 or value != value:
        raise BadJobRequest(f"{name} must be a non-negative number, got {value!r}")


class JobTable:
    """Every submitted job, by submission id (insertion ordered)."""

    def __init__(self) -> None:
        self.jobs: dict[str, Submission] = {}

    def get(self, submission_id: str) -> Submission:
        """The job, or :class:`UnknownJob` with a hint."""
        job = self.jobs.get(submission_id)
        if job is None:
            raise UnknownJob(
                f"Job {submission_id!r} does not exist; `nbcluster job list` shows the submitted jobs"
            )
        return job

    def submit(
        self,
        *,
        entrypoint: str,
        submission_id: str,
        runtime_env: str,
        metadata: Mapping[str, str],
        num_cpus: float,
        num_gpus: float,
        resources: Mapping[str, float],
        now: float,
        new_id: Callable[[], str],
    ) -> Submission:
        """Record a new PENDING job (the caller then starts its supervisor)."""
        if not entrypoint.strip():
            raise BadJobRequest(
                "the entrypoint is empty; give the command to run, e.g. 'python job.py'"
            )
        if "\0" in entrypoint:
            raise BadJobRequest("the entrypoint contains a NUL byte")
        sid = submission_id or new_id()
        if not _ID_RE.fullmatch(sid):  # fullmatch: '$' also matches before a final '\n'
            raise BadJobRequest(
                f"submission_id {sid!r} is not valid: use 1-128 letters, digits and _ . : - "
                "(starting with a letter or digit)"
            )
        if sid in self.jobs:
            raise DuplicateJob(
                f"Job with submission_id {sid!r} already exists. Please use a different submission_id."
            )
        _check_resources("entrypoint_num_cpus", num_cpus)
        _check_resources("entrypoint_num_gpus", num_gpus)
        for k, v in resources.items():
            if k in ("CPU", "GPU"):
                raise BadJobRequest(
                    f"use entrypoint_num_{k.lower()}s instead of entrypoint_resources[{k!r}]"
                )
            _check_resources(f"entrypoint_resources[{k!r}]", v)
        job = Submission(
            submission_id=sid,
            entrypoint=entrypoint,
            runtime_env=runtime_env,
            metadata=dict(metadata),
            entrypoint_num_cpus=num_cpus,
            entrypoint_num_gpus=num_gpus,
            entrypoint_resources=dict(resources),
            start_time=now,
        )
        self.jobs[sid] = job
        return job

    def update(
        self,
        submission_id: str,
        status: str,
        now: float,
        *,
        message: str = "",
        driver_pid: int = 0,
        exit_code: int | None = None,
        error_type: str = "",
        lease: tuple[str, bytes] | None = None,
        node_id: str = "",
    ) -> Submission:
        """The supervisor reports progress. Updates to a finished job are ignored."""
        job = self.get(submission_id)
        if status not in STATUSES:
            raise BadJobRequest(f"unknown job status {status!r}")
        if job.terminal:
            return job
        if driver_pid:
            job.driver_pid = driver_pid
        if lease is not None:
            job.lease_node, job.lease_id = lease
        if node_id:
            job.node_id = node_id
        if status == PENDING:
            if message:
                job.message = message
            return job
        if status == RUNNING:
            if job.status == PENDING:
                job.status, job.run_time = RUNNING, now
                job.message = message or MESSAGES[RUNNING]
            return job
        if status == FAILED and job.stop_requested:
            status = STOPPED  # killed because it was asked to stop
        job.status = status
        job.end_time = now
        job.message = message or MESSAGES.get(status, "")
        job.error_type = error_type if status == FAILED else ""
        if exit_code is not None:
            job.has_exit_code, job.exit_code = True, exit_code
        return job

    def stop(self, submission_id: str, now: float) -> bool:
        """Ask a job to stop; False when it had already ended."""
        job = self.get(submission_id)
        if job.terminal:
            return False
        if not job.stop_requested:
            job.stop_requested = now
        return True

    def supervisor_gone(self, submission_id: str, now: float, detail: str) -> Submission | None:
        """The supervisor process vanished without a final report."""
        job = self.jobs.get(submission_id)
        if job is None or job.terminal:
            return None
        if job.stop_requested:
            return self.update(submission_id, STOPPED, now)
        return self.update(
            submission_id,
            FAILED,
            now,
            message=f"The job's supervisor exited unexpectedly ({detail}).",
            error_type="SUPERVISOR_DIED",
        )

    def overdue(self, now: float) -> list[Submission]:
        """Jobs asked to stop more than :data:`STOP_GRACE_S` ago that have not ended."""
        return [
            j
            for j in self.jobs.values()
            if j.stop_requested and not j.terminal and now - j.stop_requested >= STOP_GRACE_S
        ]

    def active(self) -> list[Submission]:
        """Jobs that are pending or running."""
        return [j for j in self.jobs.values() if not j.terminal]

    def delete(self, submission_id: str) -> Submission:
        """Forget a finished job (:class:`NotTerminal` while it runs)."""
        job = self.get(submission_id)
        if not job.terminal:
            raise NotTerminal(
                f"job {submission_id!r} is {job.status}; stop it first (`nbcluster job stop "
                f"{submission_id}`), then delete it"
            )
        return self.jobs.pop(submission_id)
