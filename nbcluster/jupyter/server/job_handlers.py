"""The Jobs routes of the server extension: list, submit, follow, stop and delete jobs.

Same rules as :mod:`.handlers`: every verb is ``@web.authenticated`` + ``@authorized``
(XSRF on state changes), GETs have no side effects, errors are JSON without tracebacks.
Submitting runs a notebook (``python -m IPython nb.ipynb``) or a script of the server's
tree, with its folder as the job's ``working_dir``; the path must stay inside the
server's root (``commonpath`` after resolving links).
"""

from __future__ import annotations

import os
from pathlib import Path

from jupyter_server.auth.decorator import authorized
from tornado import web

from nbcluster.exceptions import NbclusterError
from nbcluster.job_submission import JobSubmissionClient
from nbcluster.jupyter.server.base import API_PREFIX, NbclusterHandler
from nbcluster.jupyter.server.job_models import (
    JobListModel,
    JobLogsModel,
    job_model,
    parse_submit_request,
    valid_submission_id,
)

__all__ = ["JobHandler", "JobLogsHandler", "JobStopHandler", "JobsHandler", "job_routes"]

_EXCLUDES = [".ipynb_checkpoints/", ".git/", "__pycache__/", "node_modules/"]


def _client(manager: object, cluster_id: str) -> JobSubmissionClient:
    address, token_file = manager.head_of(cluster_id)  # type: ignore[attr-defined]
    return JobSubmissionClient(address, token=Path(token_file).read_text().strip())


def _with_client(manager: object, cluster_id: str, fn: object, *args: object) -> object:
    client = _client(manager, cluster_id)
    try:
        return fn(client, *args)  # type: ignore[operator]
    except RuntimeError as err:
        raise web.HTTPError(404 if "does not exist" in str(err) else 409, str(err)) from None
    except ValueError as err:
        raise web.HTTPError(400, str(err)) from None
    except (ConnectionError, NbclusterError) as err:
        raise web.HTTPError(503, f"the cluster's head did not answer: {err}") from None
    finally:
        client.close()


class _JobsBase(NbclusterHandler):
    def submission_id(self, sid: str) -> str:
        if not valid_submission_id(sid):
            raise web.HTTPError(404, "no job with this id; GET .../jobs lists them")
        return sid

    async def jobs(self, cluster_id: str, fn: object, *args: object) -> object:
        cid = self.cluster_id(cluster_id)
        return await self.call(_with_client, self.manager, cid, fn, *args)


def _list(client: JobSubmissionClient) -> list:
    return [job_model(j) for j in client.list_jobs() if j.submission_id]


def _submit(client: JobSubmissionClient, root: str, rel: str) -> object:
    base = os.path.realpath(root)
    target = os.path.realpath(os.path.join(base, rel.lstrip("/")))
    if os.path.commonpath([base, target]) != base:
        raise web.HTTPError(400, "the path must stay inside the server's root directory")
    if not os.path.isfile(target):
        raise web.HTTPError(404, f"no file {rel!r} in the server's root directory")
    folder, name = os.path.split(target)
    runner = "python -m IPython" if name.endswith(".ipynb") else "python"
    sid = client.submit_job(
        entrypoint=f"{runner} {name}",
        runtime_env={"working_dir": folder, "excludes": _EXCLUDES},
        metadata={"source": "jupyterlab", "path": rel},
    )
    return job_model(client.get_job_info(sid))


class JobsHandler(_JobsBase):
    """``clusters/<id>/jobs``: the cluster's jobs (GET); run a notebook or script (POST)."""

    @web.authenticated
    @authorized
    async def get(self, cluster_id: str) -> None:
        """The submitted jobs of the cluster, oldest first."""
        jobs = await self.jobs(cluster_id, _list)
        self.reply(JobListModel(cluster_id=cluster_id, jobs=jobs))  # type: ignore[typeddict-item]

    @web.authenticated
    @authorized
    async def post(self, cluster_id: str) -> None:
        """``{"path": "dir/notebook.ipynb"}`` → the new job (201)."""
        req = self.parse(parse_submit_request)
        root = self.settings.get("server_root_dir", os.getcwd())
        self.reply(await self.jobs(cluster_id, _submit, os.path.expanduser(root), req["path"]), 201)


class JobHandler(_JobsBase):
    """``clusters/<id>/jobs/<sid>``: one job (GET); forget a finished one (DELETE)."""

    @web.authenticated
    @authorized
    async def get(self, cluster_id: str, sid: str) -> None:
        """The job's status."""
        sid = self.submission_id(sid)
        self.reply(await self.jobs(cluster_id, lambda c: job_model(c.get_job_info(sid))))

    @web.authenticated
    @authorized
    async def delete(self, cluster_id: str, sid: str) -> None:
        """Delete a finished job and its log (409 while it runs)."""
        sid = self.submission_id(sid)
        await self.jobs(cluster_id, lambda c: c.delete_job(sid))
        self.set_status(204)
        self.finish()


class JobStopHandler(_JobsBase):
    """``clusters/<id>/jobs/<sid>/stop``: stop the job (its whole process group)."""

    @web.authenticated
    @authorized
    async def post(self, cluster_id: str, sid: str) -> None:
        """Ask the job to stop; answers with its status."""
        sid = self.submission_id(sid)

        def stop(c: JobSubmissionClient) -> object:
            c.stop_job(sid)
            return job_model(c.get_job_info(sid))

        self.reply(await self.jobs(cluster_id, stop))


class JobLogsHandler(_JobsBase):
    """``clusters/<id>/jobs/<sid>/logs?offset=N``: the log from byte ``offset`` on."""

    @web.authenticated
    @authorized
    async def get(self, cluster_id: str, sid: str) -> None:
        """Text (treat as untrusted: the lab shows it as text), next offset and status."""
        sid = self.submission_id(sid)
        raw = self.get_argument("offset", "0")
        if not raw.isdigit() or len(raw) > 15:
            raise web.HTTPError(400, "offset must be a non-negative integer")
        offset = int(raw)

        def read(c: JobSubmissionClient) -> object:
            text, end = c.read_job_logs(sid, offset)
            return JobLogsModel(
                submission_id=sid, text=text, offset=end, status=c.get_job_status(sid).value
            )

        self.reply(await self.jobs(cluster_id, read))


def job_routes() -> list[tuple[str, type[NbclusterHandler]]]:
    """The job routes (part of :func:`.handlers.routes`)."""
    job = rf"{API_PREFIX}/clusters/([^/]+)/jobs/([^/]+)"
    return [
        (rf"{API_PREFIX}/clusters/([^/]+)/jobs", JobsHandler),
        (job, JobHandler),
        (rf"{job}/stop", JobStopHandler),
        (rf"{job}/logs", JobLogsHandler),
    ]
