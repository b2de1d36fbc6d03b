"""The ``JobService`` gRPC servicer of the head: jobs, packages, logs, cluster-wide listings.

Served on the head's own authenticated port (the token interceptor of ``make_server``
guards it like every other service). Node-local questions (a node's log files, its
workers, the objects in its store) are forwarded to that node's ``NodeAgent``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc

from nbcluster._runtime.config import Config
from nbcluster._runtime.head.jobs import JobManager, details
from nbcluster._runtime.head.packages import PackageStore, UploadRejected
from nbcluster._runtime.head.state import HeadState
from nbcluster._runtime.jobs import logfiles
from nbcluster._runtime.jobs.log_rpc import serve_log
from nbcluster._runtime.jobs.state import BadJobRequest, DuplicateJob, NotTerminal, UnknownJob
from nbcluster._runtime.protocol.errors import RpcFailure
from nbcluster._runtime.protocol.protos import jobs_pb2 as jpb
from nbcluster._runtime.protocol.protos import jobs_pb2_grpc as jpb_grpc
from nbcluster._runtime.protocol.rpc import AuthedStub, make_channel
from nbcluster._runtime.runtime_env import spec
from nbcluster._runtime.runtime_env.settings import RuntimeEnvSettings

__all__ = ["JobServicer"]

log = logging.getLogger(__name__)


class JobServicer(jpb_grpc.JobServiceServicer):
    """Jobs, packages, logs and node listings."""

    def __init__(
        self,
        jobs: JobManager,
        packages: PackageStore,
        state: HeadState,
        *,
        token: str,
        logs_dir: Path,
    ) -> None:
        self.jobs = jobs
        self.packages = packages
        self.state = state
        self.token = token
        self.logs_dir = logs_dir
        self._agents: dict[str, tuple[Any, AuthedStub]] = {}

    def agent(self, address: str) -> AuthedStub:
        """The NodeAgent stub of the node manager at ``address``."""
        entry = self._agents.get(address)
        if entry is None:
            channel = make_channel(address, self.token)
            entry = (channel, AuthedStub(jpb_grpc.NodeAgentStub(channel), self.token))
            self._agents[address] = entry
        return entry[1]

    async def close(self) -> None:
        """Close the channels to node managers."""
        for channel, _ in self._agents.values():
            with contextlib.suppress(Exception):
                await channel.close()
        self._agents.clear()

    # -- jobs --------------------------------------------------------------------------------
    async def SubmitJob(self, request: jpb.SubmitJobRequest, context: grpc.aio.ServicerContext):
        try:
            env = spec.from_json(request.runtime_env)
            spec.validate(env)
        except (ValueError, TypeError) as err:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"runtime_env: {err}")
        uris = [env["working_dir"]] if env.get("working_dir") else []
        uris += list(env.get("py_modules", []))
        for uri in uris:
            if not spec.is_package_uri(uri):
                await context.abort(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"runtime_env refers to the local path {uri!r}: the client must upload it first",
                )
            if self.packages.size(uri) is None:
                await context.abort(
                    grpc.StatusCode.FAILED_PRECONDITION,
                    f"runtime_env package {uri} was not uploaded to this cluster",
                )
        try:
            job = self.jobs.submit(request)
        except DuplicateJob as err:
            await context.abort(grpc.StatusCode.ALREADY_EXISTS, str(err))
        except BadJobRequest as err:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(err))
        return details(job)

    async def _job(self, submission_id: str, context: grpc.aio.ServicerContext) -> Any:
        try:
            return self.jobs.table.get(submission_id)
        except UnknownJob as err:
            await context.abort(grpc.StatusCode.NOT_FOUND, str(err))

    async def GetJob(self, request: jpb.JobRequest, context: grpc.aio.ServicerContext):
        return details(await self._job(request.submission_id, context))

    async def ListJobs(self, request: jpb.Empty, context: grpc.aio.ServicerContext):
        return jpb.JobList(jobs=[details(j) for j in self.jobs.table.jobs.values()])

    async def StopJob(self, request: jpb.JobRequest, context: grpc.aio.ServicerContext):
        await self._job(request.submission_id, context)
        return jpb.StopJobReply(stopped=self.jobs.stop(request.submission_id))

    async def DeleteJob(self, request: jpb.JobRequest, context: grpc.aio.ServicerContext):
        await self._job(request.submission_id, context)
        try:
            self.jobs.delete(request.submission_id)
        except NotTerminal as err:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(err))
        return jpb.DeleteJobReply(deleted=True)

    async def TailJobLogs(self, request: jpb.JobLogRequest, context: grpc.aio.ServicerContext):
        await self._job(request.submission_id, context)
        sid = request.submission_id

        def status() -> str:
            job = self.jobs.table.jobs.get(sid)
            return job.status if job is not None else "DELETED"

        def finished() -> bool:
            job = self.jobs.table.jobs.get(sid)
            return job is None or job.terminal

        offset = request.offset
        async for offset, data in logfiles.stream_file(
            self.jobs.log_path(sid), offset=request.offset, follow=request.follow, finished=finished
        ):
            yield jpb.LogChunk(data=data, offset=offset, status=status())
            offset += len(data)
        yield jpb.LogChunk(offset=offset, eof=True, status=status())

    async def UpdateJobStatus(
        self, request: jpb.JobStatusUpdate, context: grpc.aio.ServicerContext
    ):
        await self._job(request.submission_id, context)
        try:
            return details(self.jobs.report(request))
        except BadJobRequest as err:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(err))

    # -- packages ----------------------------------------------------------------------------
    async def UploadPackage(self, request_iterator: Any, context: grpc.aio.ServicerContext):
        try:
            uri, size = await self.packages.receive(request_iterator)
        except UploadRejected as err:
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(err))
        log.info("received package %s (%d bytes)", uri, size)
        return jpb.PackageInfo(exists=True, size=size)

    async def GetPackageInfo(self, request: jpb.PackageRef, context: grpc.aio.ServicerContext):
        try:
            size = self.packages.size(request.uri)
        except ValueError as err:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(err))
        return jpb.PackageInfo(exists=size is not None, size=size or 0)

    async def DownloadPackage(self, request: jpb.PackageRef, context: grpc.aio.ServicerContext):
        try:
            chunks = self.packages.read(request.uri)
            first = next(chunks)
        except ValueError as err:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(err))
        except FileNotFoundError:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"the head has no package {request.uri}")
        for offset, total, data in [first, *chunks]:
            yield jpb.PackageChunk(uri=request.uri, offset=offset, total_size=total, data=data)

    # -- logs --------------------------------------------------------------------------------
    async def _node_address(self, node_id: str, context: grpc.aio.ServicerContext) -> str:
        for node in self.state.nodes.values():
            if node.node_id.hex() == node_id or (
                len(node_id) >= 8 and node.node_id.hex().startswith(node_id)
            ):
                if not node.alive:
                    await context.abort(
                        grpc.StatusCode.FAILED_PRECONDITION,
                        f"node {node_id} is dead ({node.death_reason}); its logs are on its host",
                    )
                return node.address
        await context.abort(
            grpc.StatusCode.NOT_FOUND, f"no node {node_id!r}; `nbcluster list nodes` shows them"
        )
        return ""  # pragma: no cover

    async def ListLogs(self, request: jpb.ListLogsRequest, context: grpc.aio.ServicerContext):
        if request.node_id:
            address = await self._node_address(request.node_id, context)
            try:
                return await self.agent(address).ListLogs(request, timeout=10)
            except RpcFailure as err:
                await context.abort(err.code(), f"node {request.node_id}: {err.details()}")
        files = logfiles.list_files(self.logs_dir, request.glob)
        return jpb.ListLogsReply(
            files=[jpb.LogFile(filename=n, size=s, mtime=m) for n, s, m in files]
        )

    async def StreamLog(self, request: jpb.StreamLogRequest, context: grpc.aio.ServicerContext):
        if request.node_id:
            address = await self._node_address(request.node_id, context)
            try:
                async for chunk in self.agent(address).StreamLog(request):
                    yield chunk
            except RpcFailure as err:
                await context.abort(err.code(), f"node {request.node_id}: {err.details()}")
            return
        async for chunk in serve_log(self.logs_dir, request, context):
            yield chunk

    # -- listings ----------------------------------------------------------------------------
    async def _fan_out(self, method: str) -> list[Any]:
        async def one(address: str) -> Any:
            try:
                return await getattr(self.agent(address), method)(jpb.Empty(), timeout=10)
            except RpcFailure as err:
                log.info("%s on %s failed: %s", method, address, err.code().name)
                return None

        replies = await asyncio.gather(*(one(n.address) for n in self.state.live_nodes()))
        return [r for r in replies if r is not None]

    async def ListWorkers(self, request: jpb.Empty, context: grpc.aio.ServicerContext):
        replies = await self._fan_out("ListWorkers")
        return jpb.ListWorkersReply(workers=[w for r in replies for w in r.workers])

    async def ListObjects(self, request: jpb.Empty, context: grpc.aio.ServicerContext):
        replies = await self._fan_out("ListObjects")
        return jpb.ListObjectsReply(objects=[o for r in replies for o in r.objects])


def make_job_service(
    db: sqlite3.Connection,
    state: HeadState,
    session_dir: Path,
    token_file: str,
    token: str,
    head_address: Callable[[], str],
) -> tuple[JobManager, JobServicer]:
    """The head's job manager (loaded from SQLite) and the servicer around it."""
    settings = RuntimeEnvSettings.from_env(Config.from_env().temp_dir)
    jobs = JobManager(db, session_dir=session_dir, token_file=token_file, head_address=head_address)
    jobs.load()
    packages = PackageStore(session_dir / "runtime_env" / "packages", settings.max_package_bytes)
    servicer = JobServicer(jobs, packages, state, token=token, logs_dir=session_dir / "logs")
    return jobs, servicer
