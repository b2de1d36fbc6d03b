"""The node manager's ``NodeAgent`` service and its runtime_env glue.

- ``PrepareRuntimeEnv`` sets up an environment on this node and streams the progress
  (job supervisors and drivers show it); workers are started in a prepared environment
  by :func:`prepare_worker_env`, and get its worker JSON when they register.
- ``ListLogs``/``StreamLog`` serve this host's session ``logs`` folder (the head forwards
  ``nbcluster logs --node-id`` here); ``ListWorkers``/``ListObjects`` feed the state API.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import grpc

from nbcluster._runtime.jobs import logfiles
from nbcluster._runtime.jobs.log_rpc import serve_log
from nbcluster._runtime.protocol.errors import RpcFailure
from nbcluster._runtime.protocol.protos import jobs_pb2 as jpb
from nbcluster._runtime.protocol.protos import jobs_pb2_grpc as jpb_grpc
from nbcluster._runtime.protocol.rpc import AuthedStub, make_channel
from nbcluster._runtime.runtime_env.agent import Progress, RuntimeEnvAgent, SetupFailed
from nbcluster._runtime.runtime_env.settings import RuntimeEnvSettings

# The node manager's service (``node/service.py``, which imports this module): only its
# ``agent``, ``state`` and ``store`` attributes are used here.
NodeService = Any

__all__ = [
    "NodeAgentServicer",
    "make_agent",
    "prepare_worker_env",
    "remember_env",
    "worker_env_json",
]


def remember_env(service: NodeService, resolved_json: str) -> str:
    """The pool key of a lease request's runtime_env ('' for none)."""
    if not resolved_json or service.agent is None:
        return ""
    return service.agent.remember(resolved_json)


async def prepare_worker_env(service: NodeService, key: str) -> str:
    """Set up the environment a new worker needs; return its python ('' for this one's)."""
    agent = service.agent
    if agent is None:
        raise SetupFailed("this node manager cannot set up runtime environments")
    local = await agent.prepare(agent.specs[key])
    return local.python


def worker_env_json(service: NodeService, key: str) -> str:
    """What a registering worker of pool ``key`` applies ('' for the plain pool)."""
    if not key or service.agent is None:
        return ""
    local = service.agent.local_env(key)
    return local.worker_json() if local is not None else ""


def make_agent(head_address: str, token: str, temp_dir: str) -> RuntimeEnvAgent:
    """A runtime_env agent that downloads packages from the head."""
    settings = RuntimeEnvSettings.from_env(temp_dir)
    holder: dict[str, Any] = {}

    async def download(uri: str, dest: Path, progress: Progress) -> None:
        if "stub" not in holder:
            holder["channel"] = make_channel(head_address, token)
            holder["stub"] = AuthedStub(jpb_grpc.JobServiceStub(holder["channel"]), token)
        received = 0
        with open(dest, "wb") as f:
            try:
                async for chunk in holder["stub"].DownloadPackage(
                    jpb.PackageRef(uri=uri), timeout=600
                ):
                    await asyncio.to_thread(f.write, chunk.data)
                    received += len(chunk.data)
            except RpcFailure as err:
                raise SetupFailed(
                    f"downloading {uri} from the head failed: {err.details()}"
                ) from None
        progress("download", f"downloaded {uri} ({received / 2**20:.1f} MiB)")

    return RuntimeEnvAgent(settings.cache_dir, download, settings.installer)


class NodeAgentServicer(jpb_grpc.NodeAgentServicer):
    """runtime_env setup, logs and listings of one node."""

    def __init__(self, service: NodeService, logs_dir: Path) -> None:
        self.service = service
        self.logs_dir = logs_dir

    async def PrepareRuntimeEnv(
        self, request: jpb.PrepareEnvRequest, context: grpc.aio.ServicerContext
    ):
        agent = self.service.agent
        if agent is None:
            await context.abort(grpc.StatusCode.UNIMPLEMENTED, "no runtime_env agent on this node")
        queue: asyncio.Queue[jpb.EnvProgress] = asyncio.Queue()

        def progress(phase: str, text: str) -> None:
            queue.put_nowait(jpb.EnvProgress(phase=phase, text=text))

        async def run() -> None:
            try:
                local = await agent.prepare(request.runtime_env, progress)  # type: ignore[union-attr]
                queue.put_nowait(
                    jpb.EnvProgress(phase="ready", done=True, worker_env=local.worker_json())
                )
            except SetupFailed as err:
                queue.put_nowait(jpb.EnvProgress(phase="failed", done=True, error=str(err)))
            except (ValueError, TypeError) as err:
                queue.put_nowait(
                    jpb.EnvProgress(phase="failed", done=True, error=f"bad runtime_env: {err}")
                )

        task = asyncio.get_running_loop().create_task(run())
        try:
            while True:
                msg = await queue.get()
                yield msg
                if msg.done:
                    return
        finally:
            if not task.done():  # the caller left: the setup goes on for other users
                task.add_done_callback(lambda t: t.exception() if not t.cancelled() else None)

    async def ListLogs(self, request: jpb.ListLogsRequest, context: grpc.aio.ServicerContext):
        node_id = self.service.state.node_id.hex()
        return jpb.ListLogsReply(
            files=[
                jpb.LogFile(node_id=node_id, filename=n, size=s, mtime=m)
                for n, s, m in logfiles.list_files(self.logs_dir, request.glob)
            ]
        )

    async def StreamLog(self, request: jpb.StreamLogRequest, context: grpc.aio.ServicerContext):
        async for chunk in serve_log(self.logs_dir, request, context):
            yield chunk

    async def ListWorkers(self, request: jpb.Empty, context: grpc.aio.ServicerContext):
        st = self.service.state
        out = []
        for w in list(st.workers.values()):
            lease = st.leases.get(w.lease_id) if w.lease_id else None
            out.append(
                jpb.WorkerState(
                    worker_id=w.worker_id,
                    pid=w.pid,
                    state=w.state.name,
                    address=w.address,
                    node_id=st.node_id,
                    runtime_env_hash=w.env,
                    lease_owner_job=lease.job_id if lease is not None else b"",
                )
            )
        return jpb.ListWorkersReply(workers=out)

    async def ListObjects(self, request: jpb.Empty, context: grpc.aio.ServicerContext):
        node_id = self.service.state.node_id
        out = [
            jpb.StoreObject(
                object_id=e.object_id,
                size=e.size,
                owner_address=e.owner,
                state={"sealed": "SEALED", "spilled": "SPILLED"}.get(e.phase, e.phase.upper()),
                node_id=node_id,
                primary=e.primary,
            )
            for e in self.service.objects.store.listing()
        ]
        return jpb.ListObjectsReply(objects=out)
