"""The JSON of the job routes, mirrored by ``labextension/src/jobsModels.ts``.

Bodies are parsed strictly (unknown keys and wrong types are a 400 with the reason).
"""

from __future__ import annotations

import re
from typing import Any, TypedDict

from nbcluster.job_submission import JobDetails
from nbcluster.jupyter.server.models import BadRequest

__all__ = [
    "JobListModel",
    "JobLogsModel",
    "JobModel",
    "SubmitJobRequest",
    "job_model",
    "parse_submit_request",
    "valid_submission_id",
]

_SID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:\-]{0,127}$")


class JobModel(TypedDict):
    """One job of a cluster."""

    submission_id: str
    status: str
    entrypoint: str
    message: str | None
    error_type: str | None
    start_time: int | None
    end_time: int | None
    duration_s: float | None
    driver_exit_code: int | None
    source: str | None


class JobListModel(TypedDict):
    """``GET clusters/<id>/jobs``."""

    cluster_id: str
    jobs: list[JobModel]


class JobLogsModel(TypedDict):
    """``GET clusters/<id>/jobs/<sid>/logs?offset=N``: the log from byte ``offset`` on."""

    submission_id: str
    text: str
    offset: int
    status: str


class SubmitJobRequest(TypedDict):
    """``POST clusters/<id>/jobs``: run a notebook or script of the server's tree as a job."""

    path: str


def valid_submission_id(sid: str) -> bool:
    """True when ``sid`` has the shape of a submission id (full match)."""
    return _SID_RE.fullmatch(sid) is not None


def job_model(job: JobDetails) -> JobModel:
    """The model of a submitted job."""
    return JobModel(
        submission_id=job.submission_id or "",
        status=job.status.value,
        entrypoint=job.entrypoint,
        message=job.message,
        error_type=job.error_type,
        start_time=job.start_time,
        end_time=job.end_time,
        duration_s=job.duration_s,
        driver_exit_code=job.driver_exit_code,
        source=(job.metadata or {}).get("source"),
    )


def parse_submit_request(body: Any) -> SubmitJobRequest:
    """``{"path": "dir/notebook.ipynb"}`` (a ``.ipynb`` or ``.py`` file, relative to the root)."""
    if not isinstance(body, dict):
        raise BadRequest('the body must be a JSON object like {"path": "work/train.ipynb"}')
    unknown = set(body) - {"path"}
    if unknown:
        raise BadRequest(f"unknown key(s) {sorted(unknown)}; the body takes only 'path'")
    path = body.get("path")
    if not isinstance(path, str) or not path.strip():
        raise BadRequest(
            "'path' must be the notebook's or script's path, relative to the server root"
        )
    if not path.endswith((".ipynb", ".py")):
        raise BadRequest(f"only notebooks (.ipynb) and scripts (.py) can run as jobs, not {path!r}")
    if "\0" in path or len(path) > 4096:
        raise BadRequest("'path' is not a valid path")
    return SubmitJobRequest(path=path)
