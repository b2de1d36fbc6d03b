"""gRPC shell around :class:`NodeState` and the node's object store.

It carries out the state machine's instructions: it answers held lease requests, starts
and ends worker processes. The head hears from the node through ``head_link``; the
memory monitor is ``memory``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

import grpc

from nbcluster._runtime.node.agent_service import (
    prepare_worker_env,
    remember_env,
    worker_env_json,
)
from nbcluster._runtime.node.objects import NodeObjects
from nbcluster._runtime.node.state import (
    Grant,
    Instruction,
    KillWorker,
    NodeState,
    PendingReports,
    Redirect,
    StartWorker,
)
from nbcluster._runtime.node.zygote import Zygote, decode_status
from nbcluster._runtime.protocol.ctrl import Method
from nbcluster._runtime.protocol.errors import RpcFailure, is_unavailable
from nbcluster._runtime.protocol.protos import bundles_pb2, bundles_pb2_grpc
from nbcluster._runtime.protocol.rpc import AuthedStub, Channels, pb, pb_grpc
from nbcluster._runtime.running_mark import mark_dir, mark_path, read_mark
from nbcluster._runtime.runtime_env.agent import RuntimeEnvAgent
from nbcluster._runtime.runtime_env.venv_zygote import VenvZygote
from nbcluster._runtime.scheduling.policy import ACTOR_LEASE_OWNER

log = logging.getLogger(__name__)

_STATUS = {
    "SPILLBACK": pb.LeaseReply.SPILLBACK,
    "INFEASIBLE": pb.LeaseReply.INFEASIBLE,
    "CANCELLED": pb.LeaseReply.CANCELLED,
    "RUNTIME_ENV_FAILED": pb.LeaseReply.RUNTIME_ENV_FAILED,
}


class WorkerProcesses:
    """Starts worker processes through the zygote and reports their exits."""

    def __init__(
        self,
        *,
        zygote: Zygote,
        node_address: str,
        session_dir: Path,
        on_exit: Callable[[bytes, int], None],
    ) -> None:
        self.zygote = zygote
        self.node_address = node_address
        self.session_dir = session_dir
        self.on_exit = on_exit
        self.pids: dict[bytes, int] = {}
        self.by_pid: dict[int, bytes] = {}
        self.starting: set[bytes] = set()
        self.kill_on_start: dict[bytes, bool] = {}
        self.exit_info: dict[bytes, tuple[int, str, bytes]] = {}  # code, detail, started
        self.exited = asyncio.Event()
        self.stopping = False  # set by stop_all: no worker starts after it (not even a refill)
        self.oom_details: dict[bytes, str] = {}
        # runtime_env: workers started from a virtual environment's python (not the zygote)
        self.python_worker_env: dict[str, str] = {}
        self.venv_zygotes: dict[str, VenvZygote] = {}
        mark_dir(session_dir).mkdir(parents=True, exist_ok=True)  # workers' running marks
        os.set_blocking(zygote.ev_r, False)
        asyncio.get_running_loop().add_reader(zygote.ev_r, self._on_events)

    @property
    def procs(self) -> set[bytes]:
        """Ids of workers that are starting or running."""
        return self.starting | set(self.pids)

    async def start(self, worker_id: bytes) -> None:
        if self.stopping:
            return
        log_path = self.session_dir / "logs" / f"worker-{worker_id.hex()[:8]}.log"
        self.starting.add(worker_id)
        self.zygote.spawn(worker_id, self.node_address, str(log_path))

    def _on_events(self, source: Zygote | VenvZygote | None = None) -> None:
        zyg = source or self.zygote
        for ev in zyg.read_events():
            if ev[0] == "pid":
                wid, pid = bytes.fromhex(ev[1]), int(ev[2])
                self.starting.discard(wid)
                self.pids[wid] = pid
                self.by_pid[pid] = wid
                if wid in self.kill_on_start:
                    self.kill(wid, self.kill_on_start.pop(wid))
            elif ev[0] == "exit":
                self._exited(int(ev[1]), decode_status(int(ev[2])))
            elif ev[0] == "zygote-exited":
                asyncio.get_running_loop().remove_reader(zyg.ev_r)
                if isinstance(zyg, VenvZygote):  # started again on the next request
                    self.venv_zygotes.pop(zyg.python, None)
                    zyg.close()
                else:
                    log.error("the worker fork server exited")

    def start_python(self, worker_id: bytes, python: str) -> None:
        """Start a worker with another interpreter (a pip runtime_env's virtual environment).

        Such workers are forked by a fork server of their own running that interpreter
        (started on first use, then kept: later workers start in milliseconds).
        """
        if self.stopping:
            return
        vz = self.venv_zygotes.get(python)
        if vz is None:
            vz = VenvZygote(
                python,
                self.python_worker_env,
                self.session_dir
                / "logs"
                / f"venv-zygote-{os.path.basename(os.path.dirname(os.path.dirname(python)))}.log",
            )
            self.venv_zygotes[python] = vz
            os.set_blocking(vz.ev_r, False)
            asyncio.get_running_loop().add_reader(vz.ev_r, self._on_events, vz)
        log_path = self.session_dir / "logs" / f"worker-{worker_id.hex()[:8]}.log"
        self.starting.add(worker_id)
        vz.spawn(worker_id, self.node_address, str(log_path))

    def _exited(self, pid: int, code: int) -> None:
        """A worker process ended (``code`` negative for a signal)."""
        wid = self.by_pid.pop(pid, None)
        if wid is None:
            return
        self.pids.pop(wid, None)
        if code < 0:
            try:
                name = signal.Signals(-code).name
            except ValueError:
                name = f"signal {-code}"
            detail = f"worker process (pid {pid}) was killed by {name}"
            if wid in self.oom_details:
                detail = f"worker process (pid {pid}) was {self.oom_details.pop(wid)}"
        else:
            detail = f"worker process (pid {pid}) exited with code {code}"
        # what it began last: its owners charge the crash to that task (running_mark.py)
        started = read_mark(mark_path(self.session_dir, wid))
        self.exit_info[wid] = (code, detail, started)
        self.exited.set()
        self.on_exit(wid, code)

    def kill(self, worker_id: bytes, force: bool = True) -> None:
        pid = self.pids.get(worker_id)
        if pid is None:
            if worker_id in self.starting:
                self.kill_on_start[worker_id] = force
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL if force else signal.SIGTERM)

    def pid(self, worker_id: bytes) -> int:
        return self.pids.get(worker_id, 0)

    async def stop_all(self, grace: float = 1.0) -> None:
        """End every worker: SIGTERM, then SIGKILL after ``grace`` seconds; stop the zygote.

        No worker starts from here on: the node would otherwise replace each worker it ends
        (its pool refills on every exit), and wait out both graces for the replacements.
        """
        self.stopping = True
        deadline = time.monotonic() + 2 * grace
        while self.starting and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        for wid in list(self.pids):
            self.kill(wid, force=False)
        deadline = time.monotonic() + grace
        while self.pids and time.monotonic() < deadline:
            self.exited.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.exited.wait(), timeout=0.05)
        for wid in list(self.pids):
            self.kill(wid, force=True)
        deadline = time.monotonic() + grace
        while self.pids and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        with contextlib.suppress(Exception):
            asyncio.get_running_loop().remove_reader(self.zygote.ev_r)
        self.zygote.close()
        for vz in list(self.venv_zygotes.values()):
            with contextlib.suppress(Exception):
                asyncio.get_running_loop().remove_reader(vz.ev_r)
            vz.close()
        self.venv_zygotes.clear()


class NodeService(pb_grpc.NodeManagerServicer):
    """The NodeManager gRPC service of one node."""

    def __init__(
        self,
        state: NodeState,
        objects: NodeObjects,
        *,
        channels: Channels,
        head_address: str,
        session_dir: str,
        on_shutdown: Callable[[], None],
    ) -> None:
        self.state = state
        self.objects = objects
        self.channels = channels
        self.head_address = head_address
        self.session_dir = session_dir
        self.on_shutdown = on_shutdown
        self.waiters: dict[bytes, asyncio.Future[pb.LeaseReply]] = {}
        self.workers: WorkerProcesses | None = None
        self.head_stub: AuthedStub | None = None
        self.oom_killed: set[bytes] = set()
        self.granted: dict[bytes, pb.LeaseReply] = {}
        # Told about lease requests answered INFEASIBLE (autoscaling demand; node/autoscaling.py).
        self.on_infeasible: Callable[[dict[str, float], str], None] | None = None
        self.agent: RuntimeEnvAgent | None = None  # set by main: runtime_env setup and cache
        #: Set whenever the node's state may have changed (what the heartbeat waits for).
        self.changed = asyncio.Event()
        #: Set when a lease is granted (what the memory monitor waits for when idle).
        self.leased = asyncio.Event()
        #: Leases granted so far: the heartbeat reports after any grant, even when the state
        #: it reports looks as last sent (``HeadLink.run``).
        self.grants = 0
        #: Set with ``changed`` (what the idle load reporter waits for; node/autoscaling.py).
        self.load_changed: asyncio.Event | None = None
        self.death_reports = PendingReports()  # retried until the head acknowledges them
        self._reporting: asyncio.Task[None] | None = None

    # -- carrying out instructions -----------------------------------------------------------
    def apply(self, instructions: list[Instruction]) -> None:
        loop = asyncio.get_running_loop()
        self.changed.set()
        if self.load_changed is not None:
            self.load_changed.set()
        for ins in instructions:
            if isinstance(ins, Grant):
                if not ins.lease.owner.startswith(ACTOR_LEASE_OWNER):
                    self.leased.set()  # the memory monitor has a task it could choose
                self.grants += 1
                fut = self.waiters.pop(ins.request_id, None)
                reply = pb.LeaseReply(
                    status=pb.LeaseReply.GRANTED,
                    lease_id=ins.lease.lease_id,
                    worker_id=ins.worker.worker_id,
                    worker_address=ins.worker.address,
                    worker_channel_address=ins.worker.channel_address,
                    worker_ctrl_address=ins.worker.ctrl_address,
                    worker_pid=ins.worker.pid,
                    gpu_ids=ins.lease.gpu_ids,
                    node_id=self.state.node_id,
                )
                if fut is None or fut.done():
                    # The requester left; hand the worker back.
                    self.apply(self.state.return_lease(ins.lease.lease_id))
                else:
                    fut.set_result(reply)
                    self.granted[ins.request_id] = reply
                    if len(self.granted) > 4096:  # forget the oldest answers
                        for rid in list(self.granted)[:1024]:
                            del self.granted[rid]
            elif isinstance(ins, Redirect):
                fut = self.waiters.pop(ins.request_id, None)
                if fut is not None and not fut.done():
                    fut.set_result(
                        pb.LeaseReply(
                            status=_STATUS[ins.status],
                            spill_address=ins.address,
                            message=ins.message,
                        )
                    )
            elif isinstance(ins, StartWorker):
                assert self.workers is not None
                loop.create_task(self._start_worker(ins.worker_id, ins.env))
            elif isinstance(ins, KillWorker):
                assert self.workers is not None
                self.workers.kill(ins.worker_id)

    async def _start_worker(self, worker_id: bytes, env: str = "") -> None:
        assert self.workers is not None
        python = ""
        if env:  # set up the runtime_env first (cached after the first worker)
            try:
                python = await prepare_worker_env(self, env)
            except Exception as err:  # noqa: BLE001 - the env's requests fail with the reason
                self.apply(self.state.worker_start_failed(worker_id, str(err)))
                return
            if worker_id not in self.state.workers:  # dropped while its env was set up
                return
        try:
            if python:
                self.workers.start_python(worker_id, python)
            else:
                await self.workers.start(worker_id)
        except OSError:
            log.exception("could not start a worker")
            self.apply(self.state.worker_exited(worker_id))

    def worker_exited(self, worker_id: bytes, code: int) -> None:
        if code != 0:
            log.info("worker %s exited with %d", worker_id.hex()[:8], code)
        w = self.state.workers.get(worker_id)
        address = w.address if w is not None else ""
        registered = w is not None and bool(w.address)
        self.apply(self.state.worker_exited(worker_id))
        if registered and self.head_stub is not None:
            detail = ""
            if self.workers is not None:
                detail = self.workers.exit_info.get(worker_id, (0, "", b""))[1]
            self._report_death(worker_id, address, detail)

    def _report_death(self, worker_id: bytes, address: str, detail: str) -> None:
        """Tell the head (it restarts actors hosted there and ends actors the worker owned).

        The report is retried until the head acknowledges it: a death missed while the
        head was restarting would leave an actor marked alive, or an owner's actors running.
        """
        self.objects.free_owned_by(address)  # the head frees its objects on the other nodes
        report = pb.WorkerDeathReport(
            node_id=self.state.node_id, worker_id=worker_id, worker_address=address, detail=detail
        )
        self.death_reports.add(worker_id, report)
        if self._reporting is None or self._reporting.done():
            self._reporting = asyncio.get_running_loop().create_task(self._send_reports())

    async def _send_reports(self) -> None:
        assert self.head_stub is not None
        while self.death_reports:
            for key, report in self.death_reports.pending():
                try:
                    await self.head_stub.ReportWorkerDeath(report, timeout=10)
                except RpcFailure as err:
                    if not is_unavailable(err):  # refused, not lost: retrying cannot help
                        log.warning("the head refused a death report: %s", err.details())
                        self.death_reports.acked(key)
                        continue
                    if self.death_reports.delay == self.death_reports.base_delay:
                        log.warning(
                            "the head did not take %d worker death report(s) (%s); "
                            "retrying until it does",
                            len(self.death_reports),
                            err.code().name,
                        )
                    await asyncio.sleep(self.death_reports.failed())
                    break
                self.death_reports.acked(key)

    # -- leases ------------------------------------------------------------------------------
    async def RequestWorkerLease(self, request: pb.LeaseRequest, context: grpc.aio.ServicerContext):
        rid = request.request_id or os.urandom(16)
        # A retried request (its reply was lost) gets the same answer, not a second lease.
        granted = self.granted.get(rid)
        if granted is not None and granted.lease_id in self.state.leases:
            return granted
        existing = self.waiters.get(rid)
        if existing is not None:
            return await asyncio.shield(existing)
        fut: asyncio.Future[pb.LeaseReply] = asyncio.get_running_loop().create_future()
        self.waiters[rid] = fut
        self.apply(
            self.state.request_lease(
                rid,
                dict(request.resources),
                request.owner_address,
                request.job_id,
                strategy=request.strategy or "DEFAULT",
                allow_spill=not request.no_spillback,
                env=remember_env(self, request.runtime_env),
            )
        )
        try:
            reply = await fut
        except asyncio.CancelledError:
            self.waiters.pop(rid, None)
            self.apply(self.state.cancel_request(rid))
            raise
        if reply.status == pb.LeaseReply.INFEASIBLE and self.on_infeasible is not None:
            self.on_infeasible(dict(request.resources), request.owner_address)
        return reply

    async def CancelWorkerLease(
        self, request: pb.CancelLeaseRequest, context: grpc.aio.ServicerContext
    ):
        self.apply(self.state.cancel_request(request.request_id))
        return pb.Empty()

    async def ReturnWorkerLease(
        self, request: pb.ReturnLeaseRequest, context: grpc.aio.ServicerContext
    ):
        lease = self.state.leases.get(request.lease_id)
        w = self.state.workers.get(lease.worker_id) if lease is not None else None
        self.apply(self.state.return_lease(request.lease_id, request.worker_failed))
        if request.worker_failed and w is not None and w.address and self.head_stub is not None:
            # The record is gone now, so the process's exit will not be reported: do it here.
            self._report_death(w.worker_id, w.address, "its owner saw it fail")
        return pb.Empty()

    async def RegisterWorker(
        self, request: pb.WorkerRegisterRequest, context: grpc.aio.ServicerContext
    ):
        record = self.state.workers.get(request.worker_id)
        self.apply(
            self.state.worker_registered(
                request.worker_id,
                request.pid,
                request.address,
                request.channel_address,
                request.ctrl_address,
            )
        )
        return pb.WorkerRegisterReply(
            node_id=self.state.node_id,
            head_address=self.head_address,
            store_dir=self.objects.store_dir,
            session_dir=self.session_dir,
            runtime_env=worker_env_json(self, record.env if record is not None else ""),
        )

    async def NotifyBlocked(self, request: pb.BlockedRequest, context: grpc.aio.ServicerContext):
        self.apply(self.state.set_blocked(request.worker_id, request.blocked))
        return pb.Empty()

    # -- objects (node.objects) ----------------------------------------------------------------
    async def CreateObject(
        self, request: pb.CreateObjectRequest, context: grpc.aio.ServicerContext
    ):
        return await self.objects.create(request, context)

    async def SealObject(self, request: pb.SealObjectRequest, context: grpc.aio.ServicerContext):
        return await self.objects.seal(request, context)

    async def FreeObjects(self, request: pb.ObjectIds, context: grpc.aio.ServicerContext):
        return await self.objects.free(request, context)

    async def GetObjectInfo(self, request: pb.ObjectIds, context: grpc.aio.ServicerContext):
        return await self.objects.info(request, context)

    async def ReadObject(self, request: pb.ReadObjectRequest, context: grpc.aio.ServicerContext):
        async for chunk in self.objects.read(request, context):
            yield chunk

    async def FetchObject(self, request: pb.FetchObjectRequest, context: grpc.aio.ServicerContext):
        return await self.objects.fetch(request, context)

    async def GetStoreStats(self, request: pb.Empty, context: grpc.aio.ServicerContext):
        return self.objects.stats()

    # -- workers -----------------------------------------------------------------------------
    async def GetWorkerExitInfo(self, request: pb.WorkerRef, context: grpc.aio.ServicerContext):
        assert self.workers is not None
        deadline = time.monotonic() + 2.0
        while True:
            info = self.workers.exit_info.get(request.worker_id)
            if info is not None:
                code, detail, started = info
                return pb.WorkerExitInfo(
                    found=True,
                    exited=True,
                    exit_code=max(code, 0),
                    signal=-code if code < 0 else 0,
                    detail=detail,
                    started=started,
                )
            if request.worker_id not in self.workers.procs or time.monotonic() > deadline:
                return pb.WorkerExitInfo(found=request.worker_id in self.workers.procs)
            await asyncio.sleep(0.02)

    async def FreeOwnedObjects(self, request: pb.OwnerRef, context: grpc.aio.ServicerContext):
        self.objects.free_owned_by(request.owner_address)
        return pb.Empty()

    async def KillWorker(self, request: pb.WorkerRef, context: grpc.aio.ServicerContext):
        assert self.workers is not None
        self.workers.kill(request.worker_id, force=request.force)
        return pb.Empty()

    async def GetNodeStats(self, request: pb.Empty, context: grpc.aio.ServicerContext):
        st = self.state
        return pb.NodeStatsReply(
            node=pb.NodeInfo(
                node_id=st.node_id, address=st.address, total=st.total, available=st.available
            ),
            idle_workers=len(st.idle),
            leased_workers=len(st.leases),
            pending_leases=len(st.pending),
            store=self.objects.stats(),
        )

    async def PrepareBundle(self, request: pb.BundleRequest, context: grpc.aio.ServicerContext):
        ok = self.state.prepare_bundle(request.pg_id, request.index, dict(request.resources))
        return pb.BundleReply(
            ok=ok, message="" if ok else "resources are not free on this node now"
        )

    async def CommitBundle(self, request: pb.BundleRequest, context: grpc.aio.ServicerContext):
        self.apply(self.state.commit_bundle(request.pg_id, request.index))
        return pb.BundleReply(ok=True)

    async def CancelBundle(self, request: pb.BundleRequest, context: grpc.aio.ServicerContext):
        self.apply(self.state.cancel_bundle(request.pg_id, request.index))
        return pb.BundleReply(ok=True)

    async def reset_as_new_node(self) -> None:
        """Fencing: drop every worker, lease and object, and take a new node id.

        Owners already treated this node's work as lost (and retried it elsewhere), so
        nothing that ran here before may talk to them again.
        """
        assert self.workers is not None
        for fut in self.waiters.values():
            if not fut.done():
                fut.set_result(
                    pb.LeaseReply(status=pb.LeaseReply.CANCELLED, message="node was fenced")
                )
        self.waiters.clear()
        for wid in list(self.workers.pids):
            self.workers.kill(wid, force=True)
        old = self.state
        self.state = NodeState(
            os.urandom(16),
            old.address,
            {k: v for k, v in old.total.items() if "_group_" not in k},
            prestart=old.prestart,
        )
        self.objects.free_all()
        self.apply(self.state.start())

    async def Shutdown(self, request: pb.Empty, context: grpc.aio.ServicerContext):
        asyncio.get_running_loop().call_soon(self.on_shutdown)
        return pb.Empty()


class BundlesService(bundles_pb2_grpc.BundlesServicer):
    """Placement-group bundles, a whole group's share of this node per call."""

    def __init__(self, node: NodeService) -> None:
        self.node = node

    def ctrl_methods(self) -> dict[str, Method]:
        """The same calls for the control channel (``protocol/ctrl.py``)."""
        request = bundles_pb2.BundlesRequest
        return {
            "PrepareBundles": (self.PrepareBundles, request),
            "CommitBundles": (self.CommitBundles, request),
            "CancelBundles": (self.CancelBundles, request),
        }

    async def PrepareBundles(
        self, request: bundles_pb2.BundlesRequest, context: grpc.aio.ServicerContext
    ) -> bundles_pb2.BundlesReply:
        state = self.node.state
        for old in request.release:  # removed groups' bundles, released first
            self.node.apply(state.cancel_bundles(old.pg_id, [b.index for b in old.bundles]))
        specs = [(b.index, dict(b.resources)) for b in request.bundles]
        self.node.changed.set()
        if not specs:
            return bundles_pb2.BundlesReply(ok=True)
        if not state.prepare_bundles(request.pg_id, specs):
            return bundles_pb2.BundlesReply(
                ok=False, message="resources are not free on this node now"
            )
        if request.commit:
            self.node.apply(state.commit_bundles(request.pg_id, [i for i, _ in specs]))
        return bundles_pb2.BundlesReply(ok=True)

    async def CommitBundles(
        self, request: bundles_pb2.BundlesRequest, context: grpc.aio.ServicerContext
    ) -> bundles_pb2.BundlesReply:
        indexes = [b.index for b in request.bundles]
        self.node.apply(self.node.state.commit_bundles(request.pg_id, indexes))
        return bundles_pb2.BundlesReply(ok=True)

    async def CancelBundles(
        self, request: bundles_pb2.BundlesRequest, context: grpc.aio.ServicerContext
    ) -> bundles_pb2.BundlesReply:
        indexes = [b.index for b in request.bundles]
        self.node.apply(self.node.state.cancel_bundles(request.pg_id, indexes))
        return bundles_pb2.BundlesReply(ok=True)
