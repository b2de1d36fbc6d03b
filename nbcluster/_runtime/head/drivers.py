"""Noticing drivers that went away without saying so (killed kernels), without polling.

A driver that exits cleanly calls ``FinishJob``; one that is killed does not, and its
non-detached actors and placement groups must still end with it. A driver on the head's
own host is watched through a *pidfd* (``os.pidfd_open``): the kernel makes it readable
when the process exits, so the head learns of the death at once and spends nothing until
then. A driver elsewhere (or where pidfds are unavailable) is pinged every ``interval``
seconds, only while such drivers exist; it is dead once ``failures_allowed`` pings in a
row were refused (a stopped or busy driver times out instead, and is kept).

A pidfd's exit is confirmed by one ping before the job is finished: in a container that
shares the host name but not the PID namespace, the PID could name another process.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from collections.abc import Callable

from nbcluster._runtime import proc
from nbcluster._runtime.head.state import HeadState, JobRecord
from nbcluster._runtime.protocol.errors import RpcFailure, RpcUnavailable
from nbcluster._runtime.protocol.rpc import Channels, pb

log = logging.getLogger(__name__)


class DriverWatch:
    """Finishes the jobs of drivers that died without ``FinishJob``."""

    def __init__(
        self,
        state: HeadState,
        channels: Channels,
        finish: Callable[[bytes], None],
        *,
        interval: float = 2.0,
        failures_allowed: int = 3,
        hostname: str | None = None,
    ) -> None:
        self.state = state
        self.channels = channels
        self.finish = finish
        self.interval = interval
        self.failures_allowed = failures_allowed
        self.hostname = hostname if hostname is not None else socket.gethostname()
        self.pidfds: dict[bytes, int] = {}  # job id -> pidfd of its (local) driver
        self.pinged_only: set[bytes] = set()  # local drivers whose pidfd could not be trusted
        self.wake = asyncio.Event()
        self._misses: dict[bytes, int] = {}

    def job_registered(self, job: JobRecord) -> None:
        """Start watching a new job's driver."""
        if job.driver_hostname == self.hostname and job.driver_pid > 0:
            fd = _pidfd(job.driver_pid)
            if fd is not None:
                self.pidfds[job.job_id] = fd
                asyncio.get_running_loop().add_reader(fd, self._exited, job.job_id)
                return
        self.wake.set()  # one more driver to ping

    def job_finished(self, job_id: bytes) -> None:
        """Stop watching (the job finished)."""
        fd = self.pidfds.pop(job_id, None)
        if fd is not None:
            asyncio.get_running_loop().remove_reader(fd)
            os.close(fd)
        self._misses.pop(job_id, None)

    def close(self) -> None:
        """Stop watching every driver."""
        for job_id in list(self.pidfds):
            with contextlib.suppress(Exception):
                self.job_finished(job_id)

    def _exited(self, job_id: bytes) -> None:
        """A local driver's process ended: confirm, then finish its job."""
        fd = self.pidfds.pop(job_id, None)
        if fd is not None:
            asyncio.get_running_loop().remove_reader(fd)
            os.close(fd)
        job = self.state.jobs.get(job_id)
        if job is not None and job.alive:
            asyncio.get_running_loop().create_task(self._confirm(job))

    async def _confirm(self, job: JobRecord) -> None:
        if await self._ping(job) == "refused":
            log.info("driver of job %s exited; finishing it", job.job_id.hex()[:8])
            self.finish(job.job_id)
        else:  # the PID was not our driver's after all: ping it from now on
            self.pinged_only.add(job.job_id)
            self.wake.set()

    def _pinged_jobs(self) -> list[JobRecord]:
        return [j for j in self.state.jobs.values() if j.alive and j.job_id not in self.pidfds]

    async def run(self) -> None:
        """Ping the drivers that no pidfd watches; sleep (no timer) while there are none."""
        while True:
            if not self._pinged_jobs():
                self.wake.clear()
                await self.wake.wait()
                continue
            await asyncio.sleep(self.interval)
            for job in self._pinged_jobs():
                outcome = await self._ping(job)
                local = job.driver_hostname == self.hostname
                if outcome != "refused" or (local and proc.pid_alive(job.driver_pid)):
                    self._misses.pop(job.job_id, None)
                    continue
                misses = self._misses.get(job.job_id, 0) + 1
                self._misses[job.job_id] = misses
                if misses >= self.failures_allowed:
                    log.info("driver of job %s is gone; finishing it", job.job_id.hex()[:8])
                    self._misses.pop(job.job_id, None)
                    self.finish(job.job_id)

    async def _ping(self, job: JobRecord) -> str:
        """``"ok"``, ``"refused"`` (nothing listens: dead) or ``"slow"`` (other errors)."""
        try:
            await self.channels.stub(job.driver_address, "core").Ping(
                pb.Empty(), timeout=self.interval
            )
        except RpcFailure as err:
            return "refused" if isinstance(err, RpcUnavailable) else "slow"
        return "ok"


def _pidfd(pid: int) -> int | None:
    """A pidfd for ``pid`` (readable once it exits), or None where that is unavailable."""
    opener = getattr(os, "pidfd_open", None)
    if opener is None:
        return None
    try:
        return opener(pid)
    except OSError:  # no such process (already gone, or another PID namespace), or no pidfds
        return None
