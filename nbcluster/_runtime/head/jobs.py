"""The head's side of jobs: records in SQLite, supervisor processes, stopping, restarts.

Each submitted job gets a supervisor process (``python -m nbcluster._runtime.jobs.supervisor``)
in its own session, started by the head on its host; the supervisor runs the entrypoint in
a process group of its own and reports to the head. The job's record lives in the head's
SQLite database, its log in ``<session>/logs/job-driver-<id>.log``, so both survive a head
restart: the new head finds the running supervisors by PID (checking their command line)
and they report to it once it is back.

Stopping: SIGTERM to the supervisor, which ends the entrypoint's group (SIGTERM, then
SIGKILL after 3 s). A job not ended :data:`~.state.STOP_GRACE_S` later has its groups
killed here. When the head itself stops, running jobs are stopped the same way.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from nbcluster._runtime.jobs import logfiles
from nbcluster._runtime.jobs.launcher import Launcher, process_start
from nbcluster._runtime.jobs.state import FAILED, STOPPED, JobTable, Submission
from nbcluster._runtime.protocol.protos import jobs_pb2 as jpb

__all__ = ["JobManager", "details"]

log = logging.getLogger(__name__)

_SCHEMA = "CREATE TABLE IF NOT EXISTS submissions (id TEXT PRIMARY KEY, seq INTEGER, info BLOB)"
SUPERVISOR_MODULE = "nbcluster._runtime.jobs.supervisor"


def details(job: Submission) -> jpb.JobDetails:
    """The wire form of a job record."""
    return jpb.JobDetails(
        submission_id=job.submission_id,
        entrypoint=job.entrypoint,
        status=job.status,
        message=job.message,
        metadata=job.metadata,
        runtime_env=job.runtime_env,
        start_time=job.start_time,
        end_time=job.end_time,
        has_exit_code=job.has_exit_code,
        driver_exit_code=job.exit_code,
        job_id=job.job_id,
        supervisor_pid=job.supervisor_pid,
        supervisor_start=job.supervisor_start,
        driver_pid=job.driver_pid,
        error_type=job.error_type,
        entrypoint_num_cpus=job.entrypoint_num_cpus,
        entrypoint_num_gpus=job.entrypoint_num_gpus,
        entrypoint_resources=job.entrypoint_resources,
        node_id=job.node_id,
        hostname=job.hostname,
        run_time=job.run_time,
        lease_node=job.lease_node,
        lease_id=job.lease_id,
    )


def _record(d: jpb.JobDetails) -> Submission:
    return Submission(
        submission_id=d.submission_id,
        entrypoint=d.entrypoint,
        runtime_env=d.runtime_env,
        metadata=dict(d.metadata),
        entrypoint_num_cpus=d.entrypoint_num_cpus,
        entrypoint_num_gpus=d.entrypoint_num_gpus,
        entrypoint_resources=dict(d.entrypoint_resources),
        status=d.status,
        message=d.message,
        start_time=d.start_time,
        end_time=d.end_time,
        run_time=d.run_time,
        has_exit_code=d.has_exit_code,
        exit_code=d.driver_exit_code,
        job_id=d.job_id,
        supervisor_pid=d.supervisor_pid,
        supervisor_start=d.supervisor_start,
        driver_pid=d.driver_pid,
        error_type=d.error_type,
        node_id=d.node_id,
        hostname=d.hostname,
        lease_node=d.lease_node,
        lease_id=d.lease_id,
    )


def _killpg(pgid: int, sig: int) -> None:
    if pgid > 1:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, sig)


class JobManager:
    """Submitted jobs of one head: the table, its persistence and the supervisors."""

    def __init__(
        self,
        db: sqlite3.Connection,
        *,
        session_dir: Path,
        token_file: str,
        head_address: Callable[[], str],
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.db = db
        self.session_dir = session_dir
        self.logs_dir = session_dir / "logs"
        self.token_file = token_file
        self.head_address = head_address
        self.clock = clock
        self.table = JobTable()
        self.popen: dict[str, subprocess.Popen[bytes]] = {}
        self.launcher: Launcher | None = None  # forks supervisors (started on first use)
        self.changed = asyncio.Event()
        #: Set when a job is submitted (supervision sleeps while no job is active).
        self.submitted = asyncio.Event()
        self.db.execute(_SCHEMA)
        self._seq = 0

    # -- persistence --------------------------------------------------------------------------
    def load(self) -> None:
        """Fill the table from SQLite (after a restart)."""
        for sid, seq, info in self.db.execute("SELECT id, seq, info FROM submissions ORDER BY seq"):
            self.table.jobs[sid] = _record(jpb.JobDetails.FromString(info))
            self._seq = max(self._seq, seq)

    def persist(self, job: Submission) -> None:
        """Write a job's record."""
        self._seq += 1
        self.db.execute(
            "INSERT INTO submissions VALUES (?, ?, ?) ON CONFLICT(id) DO UPDATE SET info=excluded.info",
            (job.submission_id, self._seq, details(job).SerializeToString()),
        )
        self.changed.set()

    def log_path(self, submission_id: str) -> Path:
        """Where the job's output goes."""
        return self.logs_dir / logfiles.job_log_name(submission_id)

    # -- events -----------------------------------------------------------------------------
    def submit(self, request: jpb.SubmitJobRequest) -> Submission:
        """Record the job and start its supervisor."""
        job = self.table.submit(
            entrypoint=request.entrypoint,
            submission_id=request.submission_id,
            runtime_env=request.runtime_env,
            metadata=dict(request.metadata),
            num_cpus=request.entrypoint_num_cpus,
            num_gpus=request.entrypoint_num_gpus,
            resources=dict(request.entrypoint_resources),
            now=self.clock(),
            new_id=lambda: f"nbcsubmit_{secrets.token_hex(8)}",
        )
        job.hostname = socket.gethostname()
        try:
            self._start_supervisor(job)
        except OSError as err:
            self.table.update(
                job.submission_id,
                FAILED,
                self.clock(),
                message=f"could not start the job supervisor: {err}",
                error_type="SUPERVISOR_DIED",
            )
        self.persist(job)
        self.submitted.set()
        return job

    def _start_supervisor(self, job: Submission) -> None:
        self.logs_dir.mkdir(parents=True, exist_ok=True)
        try:
            if self.launcher is None or not self.launcher.alive():
                if self.launcher is not None:
                    self.launcher.close()
                self.launcher = Launcher(self.session_dir, self.token_file)
            pid = self.launcher.spawn(
                job.submission_id, self.head_address(), self.log_path(job.submission_id)
            )
        except OSError:
            log.exception("the job launcher failed; starting the supervisor directly")
        else:
            job.supervisor_pid, job.supervisor_start = pid, process_start(pid)
            return
        out = open(self.log_path(job.submission_id), "ab")  # noqa: SIM115 - closed below
        try:
            p = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    SUPERVISOR_MODULE,
                    "--session-dir",
                    str(self.session_dir),
                    "--token-file",
                    self.token_file,
                    "--head-address",
                    self.head_address(),
                    "--submission-id",
                    job.submission_id,
                ],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=out,
                start_new_session=True,
            )
        finally:
            out.close()
        self.popen[job.submission_id] = p
        job.supervisor_pid, job.supervisor_start = p.pid, process_start(p.pid)

    def report(self, update: jpb.JobStatusUpdate) -> Submission:
        """A supervisor's report."""
        job = self.table.update(
            update.submission_id,
            update.status,
            self.clock(),
            message=update.message,
            driver_pid=update.driver_pid,
            exit_code=update.exit_code if update.has_exit_code else None,
            error_type=update.error_type,
            lease=(update.lease_node, update.lease_id) if update.lease_id else None,
            node_id=update.node_id,
        )
        self.persist(job)
        return job

    def stop(self, submission_id: str) -> bool:
        """Ask a job to stop (SIGTERM to its supervisor)."""
        if not self.table.stop(submission_id, self.clock()):
            return False
        job = self.table.get(submission_id)
        if job.supervisor_pid and self._alive(job):
            with contextlib.suppress(ProcessLookupError):
                os.kill(job.supervisor_pid, signal.SIGTERM)
        else:
            self._kill_groups(job)
            self.table.supervisor_gone(submission_id, self.clock(), "not running")
            self.persist(job)
        return True

    def delete(self, submission_id: str) -> None:
        """Forget a finished job and remove its log."""
        self.table.delete(submission_id)
        self.db.execute("DELETE FROM submissions WHERE id = ?", (submission_id,))
        self.log_path(submission_id).unlink(missing_ok=True)
        self.popen.pop(submission_id, None)
        self.changed.set()

    def driver_registered(self, job_id: bytes, driver_pid: int, hostname: str) -> None:
        """A driver attached: if it runs inside a job's entrypoint group, link the two."""
        if hostname != socket.gethostname():
            return
        try:
            pgid = os.getpgid(driver_pid)
        except (ProcessLookupError, PermissionError):
            return
        for job in self.table.active():
            if job.driver_pid and job.driver_pid == pgid and not job.job_id:
                job.job_id = job_id.hex()
                self.persist(job)

    # -- supervision ------------------------------------------------------------------------
    def _alive(self, job: Submission) -> bool:
        p = self.popen.get(job.submission_id)
        if p is not None:
            return p.poll() is None
        start = process_start(job.supervisor_pid) if job.supervisor_pid else 0
        return start != 0 and start == job.supervisor_start

    def _kill_groups(self, job: Submission) -> None:
        _killpg(job.driver_pid, signal.SIGKILL)
        if job.supervisor_pid and self._alive(job):
            _killpg(job.supervisor_pid, signal.SIGKILL)

    def check(self) -> None:
        """Reap exited supervisors; fail jobs whose supervisor vanished; kill overdue stops."""
        now = self.clock()
        for sid, p in list(self.popen.items()):
            if p.poll() is not None:
                del self.popen[sid]
                job = self.table.jobs.get(sid)
                if job is not None and not job.terminal:
                    self.table.supervisor_gone(sid, now, f"exit code {p.returncode}")
                    self.persist(job)
        for job in self.table.active():
            if job.submission_id not in self.popen and not self._alive(job):
                self.table.supervisor_gone(job.submission_id, now, "its process is gone")
                self.persist(job)
        for job in self.table.overdue(now):
            log.warning("job %s did not stop in time: killing its processes", job.submission_id)
            self._kill_groups(job)
            self.table.update(job.submission_id, STOPPED, now)
            self.persist(job)

    async def watch(self, interval: float = 0.5) -> None:
        """Run :meth:`check` periodically (a task of the head)."""
        while True:
            if not self.popen and not self.table.active():
                # Nothing to supervise: sleep until a submission (an idle head costs no CPU).
                self.submitted.clear()
                await self.submitted.wait()
            await asyncio.sleep(interval)
            try:
                self.check()
            except Exception:  # noqa: BLE001 - keep supervising
                log.exception("job supervision failed")

    async def shutdown(self, grace: float = 1.5) -> None:
        """The head is stopping: stop every running job, killing what is left after ``grace``."""
        active = self.table.active()
        for job in active:
            self.table.stop(job.submission_id, self.clock())
            if job.supervisor_pid and self._alive(job):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(job.supervisor_pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and any(self._alive(j) for j in active):
            await asyncio.sleep(0.05)
        for job in active:
            self._kill_groups(job)
            if not job.terminal:
                self.table.update(
                    job.submission_id, STOPPED, self.clock(), message="The cluster was shut down."
                )
                self.persist(job)
        for p in self.popen.values():
            with contextlib.suppress(Exception):
                p.wait(1)
        if self.launcher is not None:
            self.launcher.close()
            self.launcher = None
