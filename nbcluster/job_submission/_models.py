"""The job records the client returns: :class:`JobStatus`, :class:`JobDetails` and friends.

Names and fields follow Ray's ``ray.job_submission`` (times are Unix timestamps in
milliseconds, as in Ray).
"""

from __future__ import annotations

import dataclasses
import enum
import json
import time
from typing import Any

__all__ = ["DriverInfo", "JobDetails", "JobInfo", "JobStatus", "JobType"]


class JobStatus(enum.StrEnum):
    """The status of a submitted job."""

    PENDING = "PENDING"
    """Not started yet: waiting for resources or for its runtime environment."""
    RUNNING = "RUNNING"
    """The entrypoint is running."""
    STOPPED = "STOPPED"
    """Stopped on request (``stop_job``)."""
    SUCCEEDED = "SUCCEEDED"
    """The entrypoint exited with code 0."""
    FAILED = "FAILED"
    """The entrypoint exited with another code, or the job could not start."""

    def __str__(self) -> str:
        return f"{self.value}"

    def is_terminal(self) -> bool:
        """True once the job has ended (it will not change any more)."""
        return self.value in ("STOPPED", "SUCCEEDED", "FAILED")


class JobType(enum.StrEnum):
    """How a job came to the cluster: submitted, or a driver that called ``init()``."""

    SUBMISSION = "SUBMISSION"
    """Submitted with the job client or ``nbcluster job submit``."""
    DRIVER = "DRIVER"
    """A process that attached itself with ``nbcluster.init()`` (a notebook, a script)."""


@dataclasses.dataclass(frozen=True)
class DriverInfo:
    """The driver process of a job."""

    id: str
    """Hex id of the driver's job."""
    node_ip_address: str
    """Host of the driver."""
    pid: str
    """Process id of the driver."""


@dataclasses.dataclass(frozen=True)
class JobInfo:
    """Everything the cluster records about one job."""

    status: JobStatus
    """Where the job is in its life."""
    entrypoint: str
    """The command it runs."""
    message: str | None = None
    """A human-readable explanation of the status (the last log lines when it failed)."""
    error_type: str | None = None
    """Why it failed: ``JOB_ENTRYPOINT_COMMAND_ERROR``, ``RUNTIME_ENV_SETUP_FAILURE``, ..."""
    start_time: int | None = None
    """When it was submitted (Unix time in ms)."""
    end_time: int | None = None
    """When it reached a terminal status (Unix time in ms)."""
    metadata: dict[str, str] | None = None
    """What the submitter attached."""
    runtime_env: dict[str, Any] | None = None
    """The resolved runtime environment (local paths replaced by package URIs)."""
    entrypoint_num_cpus: float | None = None
    """CPUs reserved for the entrypoint."""
    entrypoint_num_gpus: float | None = None
    """GPUs reserved for the entrypoint."""
    entrypoint_memory: int | None = None
    """Memory reserved for the entrypoint (bytes)."""
    entrypoint_resources: dict[str, float] | None = None
    """Custom resources reserved for the entrypoint."""
    driver_agent_http_address: str | None = None
    """Not used by nbcluster (kept for Ray compatibility)."""
    driver_node_id: str | None = None
    """Hex id of the node whose host runs the entrypoint."""
    driver_exit_code: int | None = None
    """The entrypoint's exit code once it exited (negative: killed by that signal)."""

    def to_json(self) -> dict[str, Any]:
        """A JSON-serializable dict of the fields."""
        out = dataclasses.asdict(self)
        for key, value in out.items():
            if isinstance(value, enum.Enum):
                out[key] = value.value
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> JobInfo:
        """The inverse of :meth:`to_json`."""
        fields = {f.name for f in dataclasses.fields(cls)}
        kwargs = {k: v for k, v in data.items() if k in fields}
        kwargs["status"] = JobStatus(kwargs["status"])
        if "type" in kwargs:
            kwargs["type"] = JobType(kwargs["type"])
        if isinstance(kwargs.get("driver_info"), dict):
            kwargs["driver_info"] = DriverInfo(**kwargs["driver_info"])
        return cls(**kwargs)


@dataclasses.dataclass(frozen=True)
class JobDetails(JobInfo):
    """A job with its identity: what ``get_job_info`` and ``list_jobs`` return."""

    type: JobType = JobType.SUBMISSION
    """Submitted job or plain driver."""
    job_id: str | None = None
    """Hex id of the driver job its entrypoint started (None until it called ``init()``)."""
    submission_id: str | None = None
    """The submission id (None for a plain driver)."""
    driver_info: DriverInfo | None = None
    """The driver process, once known."""

    @property
    def duration_s(self) -> float | None:
        """Seconds from submission to the end (or to now while it runs)."""
        if self.start_time is None:
            return None
        end = self.end_time if self.end_time else time.time() * 1000
        return max(0.0, (end - self.start_time) / 1000)

    def __str__(self) -> str:
        return json.dumps(self.to_json(), default=str)


def from_wire(d: Any) -> JobDetails:
    """A submitted job from the head's ``JobDetails`` message."""
    env = json.loads(d.runtime_env) if d.runtime_env else {}
    return JobDetails(
        type=JobType.SUBMISSION,
        job_id=d.job_id or None,
        submission_id=d.submission_id,
        driver_info=DriverInfo(id=d.job_id, node_ip_address=d.hostname, pid=str(d.driver_pid))
        if d.job_id
        else None,
        status=JobStatus(d.status),
        entrypoint=d.entrypoint,
        message=d.message or None,
        error_type=d.error_type or None,
        start_time=int(d.start_time * 1000) if d.start_time else None,
        end_time=int(d.end_time * 1000) if d.end_time else None,
        metadata=dict(d.metadata),
        runtime_env=env,
        entrypoint_num_cpus=d.entrypoint_num_cpus or None,
        entrypoint_num_gpus=d.entrypoint_num_gpus or None,
        entrypoint_resources=dict(d.entrypoint_resources) or None,
        driver_node_id=d.node_id or None,
        driver_exit_code=d.driver_exit_code if d.has_exit_code else None,
    )


def from_driver(j: Any) -> JobDetails:
    """A plain driver (``nbcluster.init()``) from the head's ``JobInfo`` message."""
    return JobDetails(
        type=JobType.DRIVER,
        job_id=j.job_id.hex(),
        submission_id=None,
        driver_info=DriverInfo(
            id=j.job_id.hex(), node_ip_address=j.driver_hostname, pid=str(j.driver_pid)
        ),
        status=JobStatus.RUNNING if j.alive else JobStatus.SUCCEEDED,
        entrypoint=j.entrypoint,
        start_time=int(j.start_time * 1000) if j.start_time else None,
        end_time=int(j.end_time * 1000) if j.end_time else None,
        metadata={},
        runtime_env={},
    )
