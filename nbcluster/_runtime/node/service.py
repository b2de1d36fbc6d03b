"""gRPC shell around :class:`NodeState` and the node's object store.

It carries out the state machine's instructions: it answers held lease requests, starts
and ends worker processes, and keeps the head informed through heartbeats.
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
from nbcluster._runtime.objects import store as objstore
from nbcluster._runtime.objects.state import StoreState
from nbcluster._runtime.protocol.errors import RpcError, is_unavailable
from nbcluster._runtime.protocol.rpc import AuthedStub, Channels, make_channel, pb, pb_grpc
from nbcluster._runtime.runtime_env.agent import RuntimeEnvAgent
from nbcluster._runtime.runtime_env.venv_zygote import VenvZygote
from nbcluster._runtime.scheduling.policy import NodeView

log = logging.getLogger(__name__)

FETCH_STREAMS = 2

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
        self.exit_info: dict[bytes, tuple[int, str]] = {}
        self.exited = asyncio.Event()
        self.oom_details: dict[bytes, str] = {}
        # runtime_env: workers started from a virtual environment's python (not the zygote)
        self.python_worker_env: dict[str, str] = {}
        self.venv_zygotes: dict[str, VenvZygote] = {}
        os.set_blocking(zygote.ev_r, False)
        asyncio.get_running_loop().add_reader(zygote.ev_r, self._on_events)

    @property
    def procs(self) -> set[bytes]:
        """Ids of workers that are starting or running."""
        return self.starting | set(self.pids)

    async def start(self, worker_id: bytes) -> None:
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
        self.exit_info[wid] = (code, detail)
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
        """End every worker: SIGTERM, then SIGKILL after ``grace`` seconds; stop the zygote."""
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
        store_state: StoreState,
        *,
        store_dir: str,
        spill_dir: str,
        file_backed: bool,
        head_address: str,
        session_dir: str,
        on_shutdown: Callable[[], None],
    ) -> None:
        self.state = state
        self.store = store_state
        self.store_dir = store_dir
        self.spill_dir = spill_dir
        self.file_backed = file_backed
        self.head_address = head_address
        self.session_dir = session_dir
        self.on_shutdown = on_shutdown
        self.waiters: dict[bytes, asyncio.Future[pb.LeaseReply]] = {}
        self.workers: WorkerProcesses | None = None
        self.restored_bytes = 0
        self.head_stub: AuthedStub | None = None
        self.channels: Channels | None = None
        self.fetches: dict[bytes, asyncio.Task[pb.ObjectInfoReply]] = {}
        self.oom_killed: set[bytes] = set()
        self.granted: dict[bytes, pb.LeaseReply] = {}
        self.fetched_bytes = 0
        self.recycle_limit = min(store_state.capacity // 4, 2**30)
        # Told about lease requests answered INFEASIBLE (autoscaling demand; node/autoscaling.py).
        self.on_infeasible: Callable[[dict[str, float], str], None] | None = None
        self.agent: RuntimeEnvAgent | None = None  # set by main: runtime_env setup and cache
        self.death_reports = PendingReports()  # retried until the head acknowledges them
        self._reporting: asyncio.Task[None] | None = None

    # -- carrying out instructions -----------------------------------------------------------
    def apply(self, instructions: list[Instruction]) -> None:
        loop = asyncio.get_running_loop()
        for ins in instructions:
            if isinstance(ins, Grant):
                fut = self.waiters.pop(ins.request_id, None)
                reply = pb.LeaseReply(
                    status=pb.LeaseReply.GRANTED,
                    lease_id=ins.lease.lease_id,
                    worker_id=ins.worker.worker_id,
                    worker_address=ins.worker.address,
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
                detail = self.workers.exit_info.get(worker_id, (0, ""))[1]
            self._report_death(worker_id, address, detail)

    def _report_death(self, worker_id: bytes, address: str, detail: str) -> None:
        """Tell the head (it restarts actors hosted there and ends actors the worker owned).

        The report is retried until the head acknowledges it: a death missed while the
        head was restarting would leave an actor marked alive, or an owner's actors running.
        """
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
                except RpcError as err:
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
        self.apply(self.state.worker_registered(request.worker_id, request.pid, request.address))
        return pb.WorkerRegisterReply(
            node_id=self.state.node_id,
            head_address=self.head_address,
            store_dir=self.store_dir,
            session_dir=self.session_dir,
            runtime_env=worker_env_json(self, record.env if record is not None else ""),
        )

    async def NotifyBlocked(self, request: pb.BlockedRequest, context: grpc.aio.ServicerContext):
        self.apply(self.state.set_blocked(request.worker_id, request.blocked))
        return pb.Empty()

    # -- objects -----------------------------------------------------------------------------
    async def CreateObject(
        self, request: pb.CreateObjectRequest, context: grpc.aio.ServicerContext
    ):
        decision = self.store.create(request.object_id, request.size, request.owner_address)
        if not decision.ok:
            await context.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED, f"ObjectStoreFull: {decision.message}"
            )
        self._make_room(decision.spill, decision.evict)
        return pb.CreateObjectReply(path=objstore.object_path(self.store_dir, request.object_id))

    def _make_room(self, spill: tuple[bytes, ...], evict: tuple[bytes, ...]) -> None:
        for oid in evict:
            objstore.delete_object(self.store_dir, oid)
        for oid in spill:
            try:
                objstore.spill_object(self.store_dir, self.spill_dir, oid)
            except OSError:
                log.exception("spilling %s failed", oid.hex())
                self.store.cancel_spill(oid)
                continue
            if not self.store.mark_spilled(oid):  # freed meanwhile
                objstore.delete_object(self.spill_dir, oid)

    async def SealObject(self, request: pb.SealObjectRequest, context: grpc.aio.ServicerContext):
        if not self.store.seal(request.object_id):  # freed while it was being written
            objstore.delete_object(self.store_dir, request.object_id)
        return pb.Empty()

    async def FreeObjects(self, request: pb.ObjectIds, context: grpc.aio.ServicerContext):
        for oid, where in self.store.free(list(request.object_ids)):
            if where == "spilled":
                objstore.delete_object(self.spill_dir, oid)
            else:
                # Keep freed files for reuse: writing into allocated tmpfs pages is ~2x faster.
                objstore.delete_object(self.store_dir, oid, recycle_limit=self.recycle_limit)
        return pb.Empty()

    async def GetObjectInfo(self, request: pb.ObjectIds, context: grpc.aio.ServicerContext):
        if not request.object_ids:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "object_ids is empty")
        oid = request.object_ids[0]
        deadline = time.monotonic() + 60
        while True:
            access = self.store.access(oid)
            if access is None:
                return pb.ObjectInfoReply(found=False)
            if access.status != "pending" or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.01)
        if access.status == "full":
            await context.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED, f"ObjectStoreFull: {access.message}"
            )
        if access.restore:
            self._make_room(access.spill, access.evict)
            try:
                self.restored_bytes += objstore.restore_object(self.spill_dir, self.store_dir, oid)
            except OSError:
                self.store.cancel_restore(oid)
                raise
            if not self.store.mark_restored(oid):
                objstore.delete_object(self.store_dir, oid)
                return pb.ObjectInfoReply(found=False)
        return pb.ObjectInfoReply(
            found=True, path=objstore.object_path(self.store_dir, oid), size=access.size
        )

    async def ReadObject(self, request: pb.ReadObjectRequest, context: grpc.aio.ServicerContext):
        """Stream our copy of an object in chunks (restoring it from spill first)."""
        info = await self.GetObjectInfo(pb.ObjectIds(object_ids=[request.object_id]), context)
        if not info.found:
            await context.abort(grpc.StatusCode.NOT_FOUND, "object not in this node's store")
        chunk = min(max(request.chunk_bytes or 4 * 2**20, 64 * 1024), 64 * 2**20)
        fd = os.open(info.path, os.O_RDONLY)
        try:
            size = os.fstat(fd).st_size
            offset = request.offset
            end = min(size, offset + request.length) if request.length else size
            while offset < end:
                data = await asyncio.to_thread(os.pread, fd, min(chunk, end - offset), offset)
                if not data:
                    break
                yield pb.ObjectChunk(offset=offset, total_size=size, data=data)
                offset += len(data)
        finally:
            os.close(fd)

    async def FetchObject(self, request: pb.FetchObjectRequest, context: grpc.aio.ServicerContext):
        """Pull an object from another node into this node's store (once, even if asked twice)."""
        oid = request.object_id
        pending = self.fetches.get(oid)
        if pending is None:
            pending = asyncio.get_running_loop().create_task(self._fetch(request))
            self.fetches[oid] = pending
            pending.add_done_callback(lambda _: self.fetches.pop(oid, None))
        try:
            return await asyncio.shield(pending)
        except RpcError as err:
            await context.abort(
                err.code(), f"fetching from {request.from_address}: {err.details()}"
            )
        except OSError as err:
            await context.abort(grpc.StatusCode.INTERNAL, f"fetching the object failed: {err}")

    async def _fetch(self, request: pb.FetchObjectRequest) -> pb.ObjectInfoReply:
        oid = request.object_id
        access = self.store.access(oid)
        if access is not None and access.status in ("ok", "restore"):
            return await self.GetObjectInfo(pb.ObjectIds(object_ids=[oid]), _NoContext())
        decision = self.store.create(oid, request.size, request.owner_address, primary=False)
        if not decision.ok:
            raise OSError(f"ObjectStoreFull: {decision.message}")
        self._make_room(decision.spill, decision.evict)
        assert self.channels is not None
        remote = self.channels.stub(request.from_address, "node")
        size = request.size
        # Several ranges in parallel: one gRPC stream tops out well below memory bandwidth.
        parts = max(1, min(FETCH_STREAMS, size // (8 * 2**20)))
        step = -(-size // parts)

        async def pull(w: objstore.RawWriter, start: int) -> None:
            req = pb.ReadObjectRequest(object_id=oid, offset=start, length=min(step, size - start))
            async for chunk in remote.ReadObject(req, timeout=600):
                await asyncio.to_thread(w.write, chunk.offset, chunk.data)

        try:
            with objstore.RawWriter(self.store_dir, oid, size) as w:
                await asyncio.gather(*(pull(w, i * step) for i in range(parts) if i * step < size))
        except BaseException:
            self.store.free([oid])
            raise
        self.store.seal(oid)
        self.fetched_bytes += request.size
        return pb.ObjectInfoReply(
            found=True, path=objstore.object_path(self.store_dir, oid), size=request.size
        )

    async def GetStoreStats(self, request: pb.Empty, context: grpc.aio.ServicerContext):
        return self.store_stats()

    def store_stats(self) -> pb.StoreStatsReply:
        s = self.store.stats()
        return pb.StoreStatsReply(
            capacity=s.capacity,
            used=s.used,
            num_objects=s.num_objects,
            spilled_bytes=s.spilled_bytes,
            num_spilled=s.num_spilled,
            restored_bytes=s.restored_bytes,
            evicted_bytes=s.evicted_bytes,
            file_backed=self.file_backed,
        )

    # -- workers -----------------------------------------------------------------------------
    async def GetWorkerExitInfo(self, request: pb.WorkerRef, context: grpc.aio.ServicerContext):
        assert self.workers is not None
        deadline = time.monotonic() + 2.0
        while True:
            info = self.workers.exit_info.get(request.worker_id)
            if info is not None:
                code, detail = info
                return pb.WorkerExitInfo(
                    found=True,
                    exited=True,
                    exit_code=max(code, 0),
                    signal=-code if code < 0 else 0,
                    detail=detail,
                )
            if request.worker_id not in self.workers.procs or time.monotonic() > deadline:
                return pb.WorkerExitInfo(found=request.worker_id in self.workers.procs)
            await asyncio.sleep(0.02)

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
            store=self.store_stats(),
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
        for oid, where in self.store.free(list(self.store._entries)):  # noqa: SLF001
            objstore.delete_object(self.spill_dir if where == "spilled" else self.store_dir, oid)
        self.apply(self.state.start())

    async def Shutdown(self, request: pb.Empty, context: grpc.aio.ServicerContext):
        asyncio.get_running_loop().call_soon(self.on_shutdown)
        return pb.Empty()


class _NoContext:
    """Stands in for a servicer context when a handler is reused internally."""

    async def abort(self, code: grpc.StatusCode, details: str) -> None:
        raise OSError(f"{code.name}: {details}")


def memory_fraction() -> float:
    """Fraction of this machine's (or cgroup's) memory in use."""
    try:
        limit = open("/sys/fs/cgroup/memory.max").read().strip()  # noqa: SIM115
        if limit != "max":
            current = int(open("/sys/fs/cgroup/memory.current").read())  # noqa: SIM115
            stat = dict(
                line.split()
                for line in open("/sys/fs/cgroup/memory.stat")  # noqa: SIM115
            )
            reclaimable = int(stat.get("inactive_file", 0))
            return max(0, current - reclaimable) / int(limit)
    except (OSError, ValueError):
        pass
    info: dict[str, int] = {}
    with open("/proc/meminfo") as f:
        for line in f:
            key, _, rest = line.partition(":")
            info[key] = int(rest.split()[0])
    total = info.get("MemTotal", 1)
    return 1.0 - info.get("MemAvailable", total) / total


async def memory_monitor(
    service: NodeService,
    threshold: float,
    interval: float,
    measure: Callable[[], float] = memory_fraction,
) -> None:
    """Kill the newest retriable task's worker while memory use is over ``threshold``.

    Actors and idle workers are never chosen; the driver (a notebook kernel) is not a
    worker of this node, so it is never the one killed.
    """
    while True:
        await asyncio.sleep(interval)
        used = measure()
        if used < threshold:
            continue
        st = service.state
        victims = [
            lease
            for lease in st.leases.values()
            if not lease.owner.startswith("head-actor:")
            and lease.worker_id not in service.oom_killed
        ]
        if not victims or service.workers is None:
            continue
        lease = victims[-1]  # the newest lease
        service.oom_killed.add(lease.worker_id)
        detail = (
            f"killed by the memory monitor: node memory at {used:.0%} "
            f"(threshold {threshold:.0%}); the newest retriable task was chosen"
        )
        service.workers.oom_details[lease.worker_id] = detail
        log.warning("%s (worker %s)", detail, lease.worker_id.hex()[:8])
        service.workers.kill(lease.worker_id, force=True)


class HeadLink:
    """Registration and heartbeats to the head; feeds the cluster view back to the state."""

    def __init__(
        self, service: NodeService, token: str, info: pb.NodeInfo, interval: float
    ) -> None:
        self.service = service
        self.token = token
        self.info = info
        self.interval = interval
        self.channel = make_channel(service.head_address, token)
        self.stub = AuthedStub(pb_grpc.HeadStub(self.channel), token)

    async def register(self, budget_s: float = 30.0) -> None:
        """Register with the head, retrying while it is unreachable (it may be starting)."""
        deadline = time.monotonic() + budget_s
        delay = 0.02
        while True:
            try:
                await self.stub.RegisterNode(pb.RegisterNodeRequest(node=self.info), timeout=10)
                return
            except RpcError as err:
                if err.code() != grpc.StatusCode.UNAVAILABLE or time.monotonic() > deadline:
                    raise
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.5)

    async def run(self) -> None:
        st = self.service.state
        while True:
            await asyncio.sleep(self.interval)
            stats = self.service.store.stats()
            try:
                reply = await self.stub.Heartbeat(
                    pb.HeartbeatRequest(
                        node_id=st.node_id,
                        available=st.available,
                        store_used=stats.used,
                        store_spilled=stats.spilled_bytes,
                        num_workers=len(st.workers),
                        pending_leases=len(st.pending),
                        total=st.total,
                        leased_workers=len(st.leases),
                    ),
                    timeout=max(self.interval * 4, 2.0),
                )
            except RpcError as err:
                log.warning("heartbeat to head failed: %s", err.code().name)
                continue
            if reply.reregister:
                if reply.fenced:
                    log.warning(
                        "this node was declared dead while unreachable: starting over as a new node"
                    )
                    await self.service.reset_as_new_node()
                    self.info.node_id = self.service.state.node_id
                else:
                    log.warning(
                        "the head does not know this node (it restarted): registering again"
                    )
                with contextlib.suppress(RpcError):
                    await self.register()
                continue
            view = [
                NodeView(n.node_id, n.address, dict(n.total), dict(n.available), n.alive)
                for n in reply.nodes
            ]
            self.service.apply(st.update_cluster_view(view))

    async def unregister(self, reason: str = "node stopped") -> None:
        with contextlib.suppress(RpcError):
            await self.stub.UnregisterNode(
                pb.NodeRef(node_id=self.service.state.node_id, reason=reason), timeout=2
            )
        await self.channel.close()
