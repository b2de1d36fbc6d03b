"""``JobSubmissionClient``: submit commands to a cluster as jobs, follow and manage them.

Talks to the head's job service on its authenticated port (the address of the cluster,
``"auto"`` for the newest one on this host). Local ``working_dir`` and ``py_modules`` are
packed and uploaded (once per content) before the job is submitted.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

from nbcluster import _connect
from nbcluster.job_submission._models import JobDetails, JobStatus, from_driver, from_wire

__all__ = ["JobSubmissionClient"]


def _runtime_error(err: Exception) -> RuntimeError:
    return RuntimeError(str(err))


class JobSubmissionClient:
    """A client of one cluster's jobs (Ray's ``ray.job_submission.JobSubmissionClient``).

    ``address``: ``"host:port"`` of the head, ``"nbcluster://host:port"``, ``"auto"``, or
    None (the cluster this process is connected to, else ``NBCLUSTER_ADDRESS``, else
    ``"auto"``). The cluster token is read as for ``nbcluster.init()``, unless given as
    ``token`` (nbcluster only). Ray's HTTP options (``headers``, ``cookies``, ...) are
    accepted and ignored: the head's port speaks gRPC with the cluster token.
    """

    def __init__(
        self, address: str | None = None, *, token: str | None = None, **_ray_http_options: Any
    ) -> None:
        self._head = _connect.connect(address, token=token)
        self.address = self._head.address
        self._uploader = _connect.uploader(self._head)

    def close(self) -> None:
        """Close the connection to the head."""
        self._head.close()

    def __enter__(self) -> JobSubmissionClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"JobSubmissionClient(address={self.address!r})"

    # -- submitting -------------------------------------------------------------------------
    def submit_job(
        self,
        *,
        entrypoint: str,
        job_id: str | None = None,
        runtime_env: dict[str, Any] | None = None,
        metadata: dict[str, str] | None = None,
        submission_id: str | None = None,
        entrypoint_num_cpus: float | None = None,
        entrypoint_num_gpus: float | None = None,
        entrypoint_memory: int | None = None,
        entrypoint_resources: dict[str, float] | None = None,
    ) -> str:
        """Run ``entrypoint`` (a command line) on the cluster; return the submission id.

        It runs under a supervisor on the head's host, in a process group of its own, as a
        driver of the cluster (``nbcluster.init()`` inside it joins this cluster), and keeps
        running when this process goes away. The command is split like a shell would but
        not run by one: write ``sh -c '...'`` for pipes or ``&&``.

        Raises ``ValueError``/``TypeError`` for a bad ``runtime_env`` (a missing or
        oversize ``working_dir`` among them) and ``RuntimeError`` when the cluster refuses
        the job (a duplicate ``submission_id``).
        """
        if not isinstance(entrypoint, str) or not entrypoint.strip():
            raise TypeError(f"entrypoint must be a non-empty command string, got {entrypoint!r}")
        if metadata is not None and not (
            isinstance(metadata, dict)
            and all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items())
        ):
            raise TypeError("metadata must be a dict of str to str")
        resources = dict(entrypoint_resources or {})
        if entrypoint_memory:
            resources["memory"] = float(entrypoint_memory)
        request = _connect.job_request(
            self._uploader,
            entrypoint=entrypoint,
            runtime_env=runtime_env,
            submission_id=submission_id or job_id or "",
            metadata=metadata or {},
            num_cpus=float(entrypoint_num_cpus or 0),
            num_gpus=float(entrypoint_num_gpus or 0),
            resources=resources,
        )
        try:
            return str(self._head.submit_job(request).submission_id)
        except (ValueError, RuntimeError) as err:
            raise _runtime_error(err) from None

    # -- reading ----------------------------------------------------------------------------
    def get_job_info(self, job_id: str) -> JobDetails:
        """Status, times, exit code and message of a job (RuntimeError if it does not exist)."""
        try:
            return from_wire(self._head.get_job(job_id))
        except LookupError as err:
            raise _runtime_error(err) from None

    def get_job_status(self, job_id: str) -> JobStatus:
        """The job's current status."""
        return self.get_job_info(job_id).status

    def list_jobs(self) -> list[JobDetails]:
        """Every submitted job, then every other driver that attached to the cluster."""
        submitted = [from_wire(d) for d in self._head.list_jobs()]
        linked = {d.job_id for d in submitted if d.job_id}
        drivers = [from_driver(j) for j in self._head.drivers() if j.job_id.hex() not in linked]
        return submitted + drivers

    def get_job_logs(self, job_id: str) -> str:
        """Everything the job has printed so far."""
        try:
            return b"".join(c.data for c in self._head.job_logs(job_id)).decode(errors="replace")
        except LookupError as err:
            raise _runtime_error(err) from None

    def read_job_logs(self, job_id: str, offset: int = 0) -> tuple[str, int]:
        """What the job printed from byte ``offset`` on, and the offset to read from next."""
        data = b""
        end = offset
        try:
            for chunk in self._head.job_logs(job_id, offset=offset):
                data += chunk.data
                end = chunk.offset + len(chunk.data)
        except LookupError as err:
            raise _runtime_error(err) from None
        return data.decode(errors="replace"), end

    def iter_job_logs(self, job_id: str, offset: int = 0) -> Iterator[str]:
        """The job's output as it is written, until the job has ended (blocking)."""
        try:
            for chunk in self._head.job_logs(job_id, offset=offset, follow=True):
                if chunk.data:
                    yield chunk.data.decode(errors="replace")
        except LookupError as err:
            raise _runtime_error(err) from None

    async def tail_job_logs(self, job_id: str) -> AsyncIterator[str]:
        """Follow the job's output (``async for lines in client.tail_job_logs(id)``)."""
        it = self.iter_job_logs(job_id)
        sentinel = object()
        try:
            while True:
                text = await asyncio.to_thread(next, it, sentinel)
                if text is sentinel:
                    return
                yield text  # type: ignore[misc]
        finally:
            with contextlib.suppress(Exception):
                it.close()  # type: ignore[attr-defined]

    # -- managing -------------------------------------------------------------------------
    def stop_job(self, job_id: str) -> bool:
        """Ask the job to stop: its process group gets SIGTERM, then SIGKILL after 3 s.

        Returns False when the job had already ended.
        """
        try:
            return self._head.stop_job(job_id)
        except LookupError as err:
            raise _runtime_error(err) from None

    def delete_job(self, job_id: str) -> bool:
        """Forget a job that has ended, with its logs (RuntimeError while it runs)."""
        try:
            return self._head.delete_job(job_id)
        except (LookupError, RuntimeError) as err:
            raise _runtime_error(err) from None

    def wait_until_finished(self, job_id: str, timeout: float | None = None) -> JobStatus:
        """Block until the job reaches a terminal status; return it (TimeoutError on timeout)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        delay = 0.02
        while True:
            status = self.get_job_status(job_id)
            if status.is_terminal():
                return status
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"job {job_id} is still {status.value} after {timeout}s")
            time.sleep(delay)
            delay = min(delay * 1.5, 0.5)
