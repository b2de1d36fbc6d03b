"""gRPC shell around :class:`HeadState`, with SQLite persistence of KV, functions and jobs.

The head never unpickles user data: function payloads and KV values are opaque bytes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import sqlite3
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import grpc

from nbcluster._runtime.head.actor_service import ActorManager, actor_info
from nbcluster._runtime.head.drivers import DriverWatch
from nbcluster._runtime.head.events import EventPublisher, Snapshot, node_key
from nbcluster._runtime.head.placement import PlacementGroupManager
from nbcluster._runtime.head.reachability import NodeReachability
from nbcluster._runtime.head.state import HeadState, JobRecord, NodeRecord
from nbcluster._runtime.protocol.errors import RpcFailure
from nbcluster._runtime.protocol.rpc import AuthedStub, Channels, make_channel, pb, pb_grpc
from nbcluster._runtime.version import __version__

log = logging.getLogger(__name__)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS kv (ns TEXT, key BLOB, value BLOB, PRIMARY KEY (ns, key));
CREATE TABLE IF NOT EXISTS functions (id BLOB PRIMARY KEY, name TEXT, payload BLOB);
CREATE TABLE IF NOT EXISTS jobs (id BLOB PRIMARY KEY, info BLOB);
CREATE TABLE IF NOT EXISTS actors (id BLOB PRIMARY KEY, info BLOB, spec BLOB, extra TEXT);
CREATE TABLE IF NOT EXISTS placement_groups (id BLOB PRIMARY KEY, info BLOB);
CREATE TABLE IF NOT EXISTS dead_nodes (id BLOB PRIMARY KEY, reason TEXT);
CREATE TABLE IF NOT EXISTS nodes (id BLOB PRIMARY KEY, info BLOB);
"""


class HeadStore:
    """Write-through SQLite (WAL) store so a restarted head recovers KV, functions and jobs."""

    def __init__(self, path: Path) -> None:
        self.db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=NORMAL")
        self.db.executescript(_SCHEMA)

    def load(self, state: HeadState) -> None:
        """Fill ``state`` from disk."""
        for ns, key, value in self.db.execute("SELECT ns, key, value FROM kv"):
            state.kv[(ns, bytes(key))] = bytes(value)
        for fid, name, payload in self.db.execute("SELECT id, name, payload FROM functions"):
            state.functions[bytes(fid)] = (name, bytes(payload))
        for _jid, info in self.db.execute("SELECT id, info FROM jobs"):
            job = pb.JobInfo.FromString(info)
            state.jobs[job.job_id] = _job_record(job)

    def kv_put(self, ns: str, key: bytes, value: bytes) -> None:
        self.db.execute("INSERT OR REPLACE INTO kv VALUES (?, ?, ?)", (ns, key, value))

    def kv_del(self, ns: str, keys: list[bytes]) -> None:
        self.db.executemany("DELETE FROM kv WHERE ns = ? AND key = ?", [(ns, k) for k in keys])

    def put_function(self, fid: bytes, name: str, payload: bytes) -> None:
        self.db.execute("INSERT OR IGNORE INTO functions VALUES (?, ?, ?)", (fid, name, payload))

    def put_job(self, job: JobRecord) -> None:
        self.db.execute(
            "INSERT OR REPLACE INTO jobs VALUES (?, ?)",
            (job.job_id, _job_info(job).SerializeToString()),
        )

    def put_actor(self, rec: Any) -> None:
        from nbcluster._runtime.head.actor_service import actor_info

        extra = json.dumps(
            {
                "resources": rec.resources,
                "preferred_node": rec.preferred_node,
                "strategy": rec.strategy,
                "node_address": rec.node_address,
                "lease_id": rec.lease_id.hex(),
            }
        )
        self.db.execute(
            "INSERT OR REPLACE INTO actors VALUES (?, ?, ?, ?)",
            (
                rec.actor_id,
                actor_info(rec).SerializeToString(),
                rec.spec.SerializeToString(),
                extra,
            ),
        )

    def load_actors(self) -> list[tuple[pb.ActorInfo, pb.TaskSpec, dict[str, Any]]]:
        out = []
        for _aid, info, spec, extra in self.db.execute("SELECT id, info, spec, extra FROM actors"):
            out.append(
                (pb.ActorInfo.FromString(info), pb.TaskSpec.FromString(spec), json.loads(extra))
            )
        return out

    def put_pg(self, pg: pb.PlacementGroupInfo) -> None:
        self.db.execute(
            "INSERT OR REPLACE INTO placement_groups VALUES (?, ?)",
            (pg.pg_id, pg.SerializeToString()),
        )

    def delete_pgs(self, pg_ids: Iterable[bytes]) -> None:
        self.db.executemany("DELETE FROM placement_groups WHERE id = ?", [(i,) for i in pg_ids])

    def load_pgs(self) -> list[pb.PlacementGroupInfo]:
        return [
            pb.PlacementGroupInfo.FromString(b)
            for (b,) in self.db.execute("SELECT info FROM placement_groups")
        ]

    def put_dead_node(self, node_id: bytes, reason: str) -> None:
        self.db.execute("INSERT OR REPLACE INTO dead_nodes VALUES (?, ?)", (node_id, reason))

    def put_node(self, node: NodeRecord) -> None:
        """Persist a node record (at registration and at death, not per heartbeat)."""
        self.db.execute(
            "INSERT OR REPLACE INTO nodes VALUES (?, ?)",
            (node.node_id, node_info(node).SerializeToString()),
        )

    def load_nodes(self) -> list[NodeRecord]:
        """The node records of before a restart (liveness as last recorded)."""
        return [
            _node_record(pb.NodeInfo.FromString(b))
            for (b,) in self.db.execute("SELECT info FROM nodes")
        ]

    def load_dead_nodes(self) -> dict[bytes, str]:
        return {bytes(i): r for i, r in self.db.execute("SELECT id, reason FROM dead_nodes")}

    def close(self) -> None:
        self.db.close()


def _job_record(job: pb.JobInfo) -> JobRecord:
    return JobRecord(
        job_id=job.job_id,
        driver_address=job.driver_address,
        driver_pid=job.driver_pid,
        namespace=job.namespace,
        entrypoint=job.entrypoint,
        start_time=job.start_time,
        driver_hostname=job.driver_hostname,
        end_time=job.end_time,
        alive=job.alive,
    )


def _job_info(job: JobRecord) -> pb.JobInfo:
    return pb.JobInfo(
        job_id=job.job_id,
        driver_address=job.driver_address,
        driver_pid=job.driver_pid,
        namespace=job.namespace,
        entrypoint=job.entrypoint,
        start_time=job.start_time,
        end_time=job.end_time,
        alive=job.alive,
        driver_hostname=job.driver_hostname,
    )


def _node_record(n: pb.NodeInfo) -> NodeRecord:
    return NodeRecord(
        node_id=n.node_id,
        node_name=n.node_name,
        address=n.address,
        hostname=n.hostname,
        store_dir=n.store_dir,
        total=dict(n.total),
        available=dict(n.available),
        store_capacity=n.store_capacity,
        pid=n.pid,
        start_time=n.start_time,
        last_heartbeat=n.last_heartbeat,
        alive=n.alive,
        death_reason=n.death_reason,
    )


def node_info(n: NodeRecord) -> pb.NodeInfo:
    """The wire form of a node record."""
    return pb.NodeInfo(
        node_id=n.node_id,
        node_name=n.node_name,
        address=n.address,
        hostname=n.hostname,
        store_dir=n.store_dir,
        total=n.total,
        available=n.available,
        alive=n.alive,
        start_time=n.start_time,
        store_capacity=n.store_capacity,
        store_used=n.store_used,
        num_workers=n.num_workers,
        pid=n.pid,
        death_reason=n.death_reason,
        last_heartbeat=n.last_heartbeat,
        store_spilled=n.store_spilled,
        pending_leases=n.pending_leases,
        leased_workers=n.leased_workers,
    )


class HeadService(pb_grpc.HeadServicer):
    """The Head gRPC service."""

    def __init__(
        self,
        state: HeadState,
        store: HeadStore,
        *,
        token: str,
        session_name: str,
        session_dir: str,
        on_shutdown: Callable[[], None],
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.state = state
        self.store = store
        self.token = token
        self.session_name = session_name
        self.session_dir = session_dir
        self.on_shutdown = on_shutdown
        self.clock = clock
        self.start_time = clock()
        self.channels = Channels(token, 512 * 2**20)
        self.events = EventPublisher(self._snapshot, node_info, _job_info, clock=clock)
        self.actors = ActorManager(state, self.channels, clock, persist=self._actor_changed)
        self.placement = PlacementGroupManager(
            state, self.channels, persist=store.put_pg, forget=store.delete_pgs
        )
        self.drivers = DriverWatch(state, self.channels, self.finish_job)
        self.dead_nodes = store.load_dead_nodes()
        self.reachability = NodeReachability(state, token)
        self._confirming: asyncio.Task[None] | None = None  # probes of restored nodes
        # jobs (issue 17): links a driver to the submitted job whose entrypoint it runs in
        self.driver_registered: Callable[[bytes, int, str], None] | None = None

    # -- nodes --------------------------------------------------------------------------
    async def RegisterNode(
        self, request: pb.RegisterNodeRequest, context: grpc.aio.ServicerContext
    ):
        n = request.node
        if len(n.node_id) != 16:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "node_id must be 16 bytes")
        if n.node_id in self.dead_nodes:
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                "this node id was declared dead; register under a new id",
            )
        now = self.clock()
        record = NodeRecord(
            node_id=n.node_id,
            node_name=n.node_name,
            address=n.address,
            hostname=n.hostname,
            store_dir=n.store_dir,
            total=dict(n.total),
            available=dict(n.available) or dict(n.total),
            store_capacity=n.store_capacity,
            pid=n.pid,
            start_time=now,
            last_heartbeat=now,
        )
        self.state.register_node(record)
        self.store.put_node(record)
        await self.reachability.check(record)  # no work for a node nobody can reach
        self.events.node_joined(self.state.nodes[n.node_id])
        log.info("node %s (%s) registered at %s", n.node_id.hex()[:8], n.node_name, n.address)
        self.placement.resources_changed()
        return pb.RegisterNodeReply(session_name=self.session_name)

    async def Heartbeat(self, request: pb.HeartbeatRequest, context: grpc.aio.ServicerContext):
        before = node_key(self.state.nodes.get(request.node_id))
        ok = self.state.heartbeat(
            request.node_id,
            self.clock(),
            dict(request.available),
            request.store_used,
            request.num_workers,
            request.store_spilled,
            request.pending_leases,
            dict(request.total),
            request.leased_workers,
        )
        if not ok:
            known = self.state.nodes.get(request.node_id)
            fenced = (known is not None and not known.alive) or request.node_id in self.dead_nodes
            return pb.HeartbeatReply(reregister=True, fenced=fenced)
        self.placement.resources_changed()
        self.events.node_heartbeat(before, self.state.nodes.get(request.node_id))
        return pb.HeartbeatReply(nodes=[node_info(n) for n in self.state.live_nodes()])

    async def UnregisterNode(self, request: pb.NodeRef, context: grpc.aio.ServicerContext):
        died = self.state.unregister_node(
            request.node_id, request.reason or "node left the cluster"
        )
        if died is not None:
            self.node_died(died.node_id, died.reason)
        return pb.Empty()

    def node_died(self, node_id: bytes, reason: str) -> None:
        """Record a dead node (so it is fenced if it comes back) and restart its actors."""
        self.dead_nodes[node_id] = reason
        self.store.put_dead_node(node_id, reason)
        node = self.state.nodes.get(node_id)
        if node is not None:
            self.store.put_node(node)
        self.events.node_died(node)
        self.state.live_tasks.node_died(node_id)
        self.actors.node_died(node_id, reason)
        self.placement.resources_changed()

    def _actor_changed(self, rec: Any) -> None:
        """An actor changed state: persist it and tell the event subscribers."""
        self.events.actor_changed(actor_info(rec))
        self.store.put_actor(rec)

    def _snapshot(self) -> Snapshot:
        """The current nodes, actors and jobs, for a new event subscriber."""
        return Snapshot(
            nodes=[node_info(n) for n in self.state.live_nodes()],
            actors=list(self.actors.list().actors),
            jobs=[_job_info(j) for j in self.state.jobs.values()],
        )

    def recover(self) -> None:
        """After a restart: bring back nodes, actors and placement groups from SQLite.

        Nodes that were alive must show themselves again within the death timeout (see
        :meth:`HeadState.restore_node`); actors recorded ALIVE are verified.
        """
        now = self.clock()
        for node in self.store.load_nodes():
            self.state.restore_node(node, now)
        restored = [n for n in self.state.nodes.values() if n.alive and not n.confirmed]
        if restored:
            self._confirming = asyncio.get_running_loop().create_task(
                self._confirm_restored(restored)
            )
        self.actors.recover(self.store.load_actors())
        self.placement.recover(self.store.load_pgs())
        for job in list(self.state.jobs.values()):
            if job.alive:
                self.drivers.job_registered(job)

    async def _confirm_restored(self, nodes: list[NodeRecord]) -> None:
        """Ask each restored node whether it is still there. One that answers at its
        address as itself is confirmed at once: it need not wait for its next heartbeat,
        which an idle node sends only every ``node_death_timeout_s / 4`` (meanwhile drivers
        on its host would find no node there). The others wait for the death timeout."""
        results = await asyncio.gather(
            *(self.reachability.probe(n) for n in nodes), return_exceptions=True
        )
        confirmed = 0
        for node, detail in zip(nodes, results, strict=True):
            if detail == "" and node.alive and not node.confirmed:
                node.confirmed = True
                node.last_heartbeat = self.clock()
                confirmed += 1
        if confirmed:
            log.info("%d restored node(s) answered: back in the cluster", confirmed)
            self.placement.resources_changed()

    async def GetNodes(self, request: pb.GetNodesRequest, context: grpc.aio.ServicerContext):
        nodes = self.state.nodes.values() if request.include_dead else self.state.live_nodes()
        return pb.GetNodesReply(nodes=[node_info(n) for n in nodes])

    # -- KV -----------------------------------------------------------------------------
    async def KVPut(self, request: pb.KVRequest, context: grpc.aio.ServicerContext):
        added = self.state.kv_put(request.ns, request.key, request.value, request.overwrite)
        if added or request.overwrite:
            self.store.kv_put(request.ns, request.key, request.value)
        return pb.KVReply(added=added)

    async def KVGet(self, request: pb.KVRequest, context: grpc.aio.ServicerContext):
        value = self.state.kv_get(request.ns, request.key)
        if value is None:
            return pb.KVReply(found=False)
        return pb.KVReply(found=True, value=value)

    async def KVDel(self, request: pb.KVRequest, context: grpc.aio.ServicerContext):
        prefix = bool(request.prefix)
        doomed = self.state.kv_del(request.ns, request.prefix if prefix else request.key, prefix)
        self.store.kv_del(request.ns, doomed)
        return pb.KVReply(deleted=len(doomed))

    async def KVKeys(self, request: pb.KVRequest, context: grpc.aio.ServicerContext):
        return pb.KVReply(keys=self.state.kv_keys(request.ns, request.prefix))

    # -- functions ----------------------------------------------------------------------
    async def ExportFunction(
        self, request: pb.ExportFunctionRequest, context: grpc.aio.ServicerContext
    ):
        if self.state.export_function(request.function_id, request.name, request.payload):
            self.store.put_function(request.function_id, request.name, request.payload)
        return pb.Empty()

    async def GetFunction(self, request: pb.GetFunctionRequest, context: grpc.aio.ServicerContext):
        entry = self.state.functions.get(request.function_id)
        if entry is None:
            return pb.GetFunctionReply(found=False)
        return pb.GetFunctionReply(found=True, name=entry[0], payload=entry[1])

    # -- jobs ---------------------------------------------------------------------------
    async def RegisterJob(self, request: pb.RegisterJobRequest, context: grpc.aio.ServicerContext):
        job = _job_record(request.job)
        job.start_time = self.clock()
        job.alive = True
        self.state.register_job(job)
        self.store.put_job(job)
        self.events.job_changed(job)
        if self.driver_registered is not None:
            self.driver_registered(job.job_id, job.driver_pid, job.driver_hostname)
        self.drivers.job_registered(job)
        return pb.RegisterJobReply(job_id=job.job_id)

    async def FinishJob(self, request: pb.JobRef, context: grpc.aio.ServicerContext):
        self.finish_job(request.job_id)
        return pb.Empty()

    def finish_job(self, job_id: bytes) -> None:
        """A driver detached or died: its non-detached actors end with it."""
        self.drivers.job_finished(job_id)
        job = self.state.finish_job(job_id, self.clock())
        if job is not None:
            self.state.live_tasks.owner_gone(job.driver_address)
            self.store.put_job(job)
            self.events.job_changed(job)
            self.actors.job_finished(job_id)
            self.placement.job_finished(job_id)
            shared = any(
                j.alive and j.driver_address == job.driver_address for j in self.state.jobs.values()
            )  # client mode: one proxy drives the jobs of several clients
            if not shared:
                self.owner_gone(job.driver_address)

    # -- actors -------------------------------------------------------------------------
    async def RegisterActor(
        self, request: pb.RegisterActorRequest, context: grpc.aio.ServicerContext
    ):
        return await self.actors.register(request, context)

    async def WaitActor(self, request: pb.WaitActorRequest, context: grpc.aio.ServicerContext):
        return await self.actors.wait(request, context)

    async def GetNamedActor(self, request: pb.NamedActorRequest, context: grpc.aio.ServicerContext):
        return await self.actors.named(request, context)

    async def KillActor(self, request: pb.KillActorRequest, context: grpc.aio.ServicerContext):
        return await self.actors.kill(request, context)

    async def ListActors(self, request: pb.Empty, context: grpc.aio.ServicerContext):
        return self.actors.list()

    async def ReportWorkerDeath(
        self, request: pb.WorkerDeathReport, context: grpc.aio.ServicerContext
    ):
        self.actors.worker_died(request)
        self.state.live_tasks.worker_died(request.worker_id, request.worker_address)
        # Its node freed what it owned there; the copies elsewhere go too.
        self.owner_gone(request.worker_address, skip_node=request.node_id)
        return pb.Empty()

    def owner_gone(self, address: str, skip_node: bytes = b"") -> None:
        """An owner (a worker or a driver) died: every live node frees the objects it owned,
        spilled ones included (an owner's objects die with it, as in Ray)."""
        if not address:
            return
        loop = asyncio.get_running_loop()
        for node in self.state.nodes.values():
            if node.alive and node.node_id != skip_node:
                loop.create_task(self._free_owned(node.address, address))

    async def _free_owned(self, node_address: str, owner: str) -> None:
        with contextlib.suppress(RpcFailure):
            await self.channels.stub(node_address, "node").FreeOwnedObjects(
                pb.OwnerRef(owner_address=owner), timeout=10
            )

    # -- placement groups ------------------------------------------------------------------
    async def CreatePlacementGroup(
        self, request: pb.CreatePlacementGroupRequest, context: grpc.aio.ServicerContext
    ):
        return await self.placement.create(request, context)

    async def WaitPlacementGroup(
        self, request: pb.PlacementGroupRequest, context: grpc.aio.ServicerContext
    ):
        return await self.placement.wait(request, context)

    async def GetPlacementGroup(
        self, request: pb.PlacementGroupRequest, context: grpc.aio.ServicerContext
    ):
        return await self.placement.get(request, context)

    async def RemovePlacementGroup(
        self, request: pb.PlacementGroupRequest, context: grpc.aio.ServicerContext
    ):
        return await self.placement.remove(request, context)

    async def ListPlacementGroups(self, request: pb.Empty, context: grpc.aio.ServicerContext):
        return self.placement.list()

    async def GetJobs(self, request: pb.Empty, context: grpc.aio.ServicerContext):
        return pb.GetJobsReply(jobs=[_job_info(j) for j in self.state.jobs.values()])

    # -- task events --------------------------------------------------------------------
    async def ReportTaskEvents(
        self, request: pb.TaskEventsRequest, context: grpc.aio.ServicerContext
    ):
        ended = self.state.add_task_events(request.events)
        self.events.tasks(ended)  # the stream carries finished attempts (RUNNING is polled)
        return pb.Empty()

    async def GetTaskEvents(
        self, request: pb.GetTaskEventsRequest, context: grpc.aio.ServicerContext
    ):
        events = list(self.state.task_events)
        if request.job_id:
            events = [e for e in events if e.job_id == request.job_id]
        if request.limit > 0:
            events = events[-request.limit :]
        return pb.GetTaskEventsReply(events=events, dropped=self.state.dropped_events)

    # -- cluster ------------------------------------------------------------------------
    async def GetClusterInfo(self, request: pb.Empty, context: grpc.aio.ServicerContext):
        return pb.ClusterInfoReply(
            session_name=self.session_name,
            session_dir=self.session_dir,
            start_time=self.start_time,
            version=__version__,
            nodes=[node_info(n) for n in self.state.live_nodes()],
        )

    async def Shutdown(self, request: pb.ShutdownRequest, context: grpc.aio.ServicerContext):
        if request.stop_nodes:
            await self.stop_nodes()
        asyncio.get_running_loop().call_soon(self.on_shutdown)
        return pb.Empty()

    async def stop_nodes(self) -> None:
        """Ask every live node manager to shut down (best effort, bounded)."""

        async def stop(address: str) -> None:
            channel = make_channel(address, self.token)
            try:
                stub = AuthedStub(pb_grpc.NodeManagerStub(channel), self.token)
                with contextlib.suppress(RpcFailure):
                    await stub.Shutdown(pb.Empty(), timeout=5)
            finally:
                await channel.close()

        await asyncio.gather(*(stop(n.address) for n in self.state.live_nodes()))
