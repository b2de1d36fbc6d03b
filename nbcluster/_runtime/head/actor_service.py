"""The head's actor manager: places actors on workers, runs ``__init__``, restarts them.

It carries out what :class:`ActorTable` decides: leasing a dedicated worker from a node
manager, sending the creation task to it, killing workers, and waking callers that
long-poll an actor's state. Creation payloads stay opaque bytes here.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import logging
import os
import time
from collections.abc import Callable
from typing import Any

import grpc

from nbcluster._runtime.head.actors import (
    DEAD,
    ActorInstruction,
    ActorRecord,
    ActorTable,
    Changed,
    NameTakenError,
    Place,
    StopWorker,
    Verify,
)
from nbcluster._runtime.head.state import HeadState
from nbcluster._runtime.protocol import tls
from nbcluster._runtime.protocol.ctrl import open_async
from nbcluster._runtime.protocol.errors import RpcFailure, RpcUnavailable, is_unavailable
from nbcluster._runtime.protocol.rpc import Channels, pb
from nbcluster._runtime.scheduling.policy import ACTOR_LEASE_OWNER, NodeView, fits, load

log = logging.getLogger(__name__)

#: Rounds of the channel's retry budget a creation call gets while its worker is alive.
_CREATE_ATTEMPTS = 20


def actor_info(rec: ActorRecord) -> pb.ActorInfo:
    """The wire form of an actor record."""
    return pb.ActorInfo(
        actor_id=rec.actor_id,
        state=rec.state,
        address=rec.address,
        channel_address=rec.channel_address,
        node_id=rec.node_id,
        worker_pid=rec.worker_pid,
        name=rec.name,
        namespace=rec.namespace,
        class_name=rec.class_name,
        num_restarts=rec.num_restarts,
        max_restarts=rec.max_restarts,
        death_cause=rec.death_cause,
        init_error=rec.init_error,
        version=rec.version,
        owner_address=rec.owner_address,
        job_id=rec.job_id,
        detached=rec.detached,
        worker_id=rec.worker_id,
        death_kind=rec.death_kind,
        start_time=rec.start_time,
        end_time=rec.end_time,
        handle_meta=rec.handle_meta,
    )


class ActorManager:
    """Owns the actor table of the head and the I/O it needs."""

    def __init__(
        self,
        state: HeadState,
        channels: Channels,
        clock: Callable[[], float] = time.time,
        persist: Callable[[ActorRecord], None] | None = None,
    ) -> None:
        self.persist = persist
        self.state = state
        self.table = ActorTable()
        self.channels = channels
        self.clock = clock
        self.waiters: dict[bytes, list[asyncio.Future[None]]] = {}
        self.placing: set[bytes] = set()

    # -- instructions -------------------------------------------------------------------------
    def apply(self, instructions: list[ActorInstruction]) -> None:
        loop = asyncio.get_running_loop()
        for ins in instructions:
            if isinstance(ins, Place):
                if ins.actor_id not in self.placing:
                    self.placing.add(ins.actor_id)
                    loop.create_task(self._place(ins.actor_id))
            elif isinstance(ins, StopWorker):
                loop.create_task(self._stop_worker(ins.node_address, ins.worker_id))
            elif isinstance(ins, Verify):
                loop.create_task(self._verify(ins))
            elif isinstance(ins, Changed):
                rec = self.table.actors.get(ins.actor_id)
                if rec is not None and self.persist is not None:
                    try:
                        self.persist(rec)
                    except Exception:  # noqa: BLE001 - persistence must not stop the head
                        log.exception("could not persist actor %s", ins.actor_id.hex()[:8])
                for fut in self.waiters.pop(ins.actor_id, []):
                    if not fut.done():
                        fut.set_result(None)

    async def _stop_worker(self, node_address: str, worker_id: bytes, attempts: int = 5) -> None:
        """Have the node end an actor's process. A busy node may miss a deadline: ask again
        (the kill is idempotent); a node that stays unreachable is declared dead by its
        missed heartbeats, which ends its workers' actors anyway."""
        if not node_address or not worker_id:
            return
        for attempt in range(attempts):
            try:
                await self.channels.stub(node_address, "node").KillWorker(
                    pb.WorkerRef(worker_id=worker_id, force=True), timeout=10
                )
                return
            except RpcFailure as err:
                if not is_unavailable(err) or attempt == attempts - 1:
                    log.warning(
                        "could not have node %s end worker %s: %r",
                        node_address,
                        worker_id.hex()[:8],
                        err,
                    )
                    return
            await asyncio.sleep(0.2 * 2**attempt)

    async def _verify(self, ins: Verify, attempts: int = 3) -> None:
        """Ping the worker of an actor restored as ALIVE; restart the actor if it is gone.

        Each attempt retries an unreachable worker for the channel's retry budget, so a
        worker that is merely slow (or a node that is still coming back) is not killed.
        """
        for attempt in range(attempts):
            try:
                await self.channels.stub(ins.address, "core").Ping(pb.Empty(), timeout=10)
                return
            except RpcFailure as err:
                if not is_unavailable(err) or attempt == attempts - 1:
                    log.warning(
                        "actor %s: its worker %s did not answer after the head restarted (%s)",
                        ins.actor_id.hex()[:8],
                        ins.address,
                        err.code().name,
                    )
                    break
            await asyncio.sleep(0.5)
        self.apply(
            self.table.verify_failed(
                ins.actor_id,
                ins.worker_id,
                "its worker did not answer after the head restarted",
                self.clock(),
            )
        )

    # -- placement ------------------------------------------------------------------------------
    def _pick_node(self, rec: ActorRecord) -> str | None:
        nodes = [
            NodeView(n.node_id, n.address, n.total, n.available) for n in self.state.live_nodes()
        ]
        if not nodes:
            return None
        if rec.strategy.startswith("NODE_AFFINITY:"):
            _, node_hex, soft = rec.strategy.split(":")
            for n in nodes:
                if n.node_id.hex() == node_hex:
                    return n.address
            if soft != "1":
                return None  # stays pending until that node is back
        if rec.strategy != "SPREAD" and rec.preferred_node:
            for n in nodes:
                if n.address == rec.preferred_node and fits(rec.resources, n.available):
                    return n.address
        free = [n for n in nodes if fits(rec.resources, n.available)]
        if free and rec.strategy == "SPREAD":
            # Spread by how many live actors each node hosts: load alone cannot tell nodes
            # apart for actors that hold no CPU (num_cpus=0), so they all went to one node.
            hosted = collections.Counter(
                r.node_address
                for r in self.table.actors.values()
                if r.state != DEAD and r.node_address and r.actor_id != rec.actor_id
            )
            return min(free, key=lambda n: (hosted[n.address], load(n))).address
        if free:
            return min(free, key=load).address
        could = [n for n in nodes if fits(rec.resources, n.total)]
        if could:
            return min(could, key=load).address
        return None

    def _hard_affinity_lost(self, rec: ActorRecord) -> str | None:
        """The node a hard node affinity names, when it is dead or unknown (node ids are
        never reused: it will not come back); None otherwise.

        Any live record counts, not only the nodes that take work now: after a head restart
        a restored node stays unconfirmed until its first heartbeat, and an actor restarted
        before then (its worker's death was reported first) waits for it instead of failing.
        """
        if not (rec.strategy.startswith("NODE_AFFINITY:") and rec.strategy.endswith(":0")):
            return None
        node_hex = rec.strategy.split(":")[1]
        if any(n.alive and n.node_id.hex() == node_hex for n in self.state.nodes.values()):
            return None
        return node_hex

    def _charge(self, address: str, resources: dict[str, float]) -> None:
        """Count a placed actor against the (heartbeat-old) view so the next placement,
        SPREAD in particular, sees it at once."""
        for n in self.state.live_nodes():
            if n.address == address:
                for k, v in resources.items():
                    n.available[k] = n.available.get(k, 0.0) - v
                return

    async def _place(self, actor_id: bytes) -> None:
        try:
            await self._place_inner(actor_id)
        finally:
            self.placing.discard(actor_id)

    async def _place_inner(self, actor_id: bytes) -> None:
        warned = False
        while True:
            rec = self.table.actors.get(actor_id)
            if rec is None or rec.state == DEAD:
                return
            node_hex = self._hard_affinity_lost(rec)
            if node_hex is not None:
                self.apply(
                    self.table.unschedulable(
                        actor_id,
                        f"its hard node affinity names node {node_hex}, which is dead or "
                        "unknown; use soft=True to run elsewhere",
                        self.clock(),
                    )
                )
                return
            address = self._pick_node(rec)
            if address is None:
                if not warned:
                    warned = True
                    rec.death_cause = (
                        f"pending: no node can fit the actor's resources {rec.resources}; "
                        "it will be placed when a node that fits joins"
                    )
                    self.apply([self.table._bump(rec)])
                await asyncio.sleep(1.0)
                continue
            self._charge(address, rec.resources)  # actors placed together then spread out
            rec.node_address = address  # counted as hosted there while the lease is asked for
            reply = await self._lease(rec, address)
            if reply is None:
                await asyncio.sleep(0.5)
                continue
            if reply.status == pb.LeaseReply.RUNTIME_ENV_FAILED:  # issue 17
                msg = f"RuntimeEnvSetupError: its runtime_env could not be set up: {reply.message}"
                self.apply(self.table.unschedulable(actor_id, msg, self.clock()))
                return
            rec = self.table.actors.get(actor_id)
            node = self.channels.stub(address, "node")
            if rec is None or rec.state == DEAD:
                with contextlib.suppress(RpcFailure):
                    await node.ReturnWorkerLease(
                        pb.ReturnLeaseRequest(lease_id=reply.lease_id), timeout=10
                    )
                return
            self.apply(
                self.table.placed(
                    actor_id,
                    node_id=reply.node_id,
                    node_address=rec.node_address or address,
                    worker_id=reply.worker_id,
                    worker_pid=reply.worker_pid,
                    lease_id=reply.lease_id,
                    address=reply.worker_address,
                    channel_address=reply.worker_channel_address,
                )
            )
            spec = pb.TaskSpec()
            spec.CopyFrom(rec.spec)
            spec.lease_id = reply.lease_id
            del spec.gpu_ids[:]
            spec.gpu_ids.extend(reply.gpu_ids)
            spec.resources.clear()  # get_runtime_context().get_assigned_resources()
            spec.resources.update(rec.resources)
            spec.attempt = rec.num_restarts
            try:
                result = await self._create(actor_id, reply, spec)
            except RpcFailure as err:
                log.info("actor %s creation call failed: %s", actor_id.hex()[:8], err.code().name)
                # The worker died while running __init__. The node's death report may already
                # have marked it RESTARTING (its Place was dropped while we were busy here), so
                # decide again at the top of the loop rather than rely on that Place.
                self.apply(
                    [
                        ins
                        for ins in self.table.worker_died(
                            reply.worker_id, "its process died during __init__", self.clock()
                        )
                        if not isinstance(ins, Place)
                    ]
                )
                await asyncio.sleep(0.05)
                continue
            if result.is_error:
                data = result.returns[0].data if result.returns else b""
                self.apply(self.table.init_failed(actor_id, data, self.clock()))
            else:
                self.apply(self.table.created(actor_id, self.clock()))
            return

    async def _create(self, actor_id: bytes, lease: pb.LeaseReply, spec: pb.TaskSpec) -> Any:
        """Run the creation task on the leased worker; ask again while the worker lives.

        The worker's ``CreateActor`` is idempotent (one ``__init__`` however often it is
        asked), so a call that failed UNAVAILABLE (lost requests or replies beyond the
        channel's retry budget) is repeated as long as no death report took the worker
        from the actor; a worker that really died is reported by its node, and then the
        error goes to the caller, which decides on a restart.
        """
        if lease.worker_ctrl_address:
            reply = await self._create_over_ctrl(lease.worker_ctrl_address, spec)
            if reply is not None:
                return reply
        stub = self.channels.stub(lease.worker_address, "core")
        for attempt in itertools.count(1):
            try:
                return await stub.CreateActor(spec, timeout=None)
            except RpcFailure as err:
                rec = self.table.actors.get(actor_id)
                ours = rec is not None and rec.state != DEAD and rec.worker_id == lease.worker_id
                if not is_unavailable(err) or not ours or attempt >= _CREATE_ATTEMPTS:
                    raise
                log.info("actor %s: creation call unanswered; asking again", actor_id.hex()[:8])
                await asyncio.sleep(min(0.05 * attempt, 1.0))
        raise AssertionError("unreachable")

    async def _create_over_ctrl(self, address: str, spec: pb.TaskSpec) -> Any:
        """``CreateActor`` on the worker's control channel (``protocol/ctrl.py``), closed
        after: the head opens no gRPC channel to each new actor's worker. None when the
        channel fails or the call is lost (``UNAVAILABLE``); the caller then asks over gRPC
        (``__init__`` runs once however often the worker is asked, and a worker that died
        fails there as it always did)."""
        settings = tls.current()
        try:
            conn = await open_async(
                address,
                self.channels.token,
                max_frame=self.channels.max_message_bytes,
                ssl_context=tls.ssl_context(settings, server=False) if settings else None,
                server_hostname=settings.server_name if settings else None,
                timeout=10,
            )
        except RpcFailure as err:
            log.info("actor creation over %s: no control channel (%s)", address, err.details())
            return None
        try:
            return await conn.call("CreateActor", spec, pb.TaskReply, None)
        except RpcUnavailable:  # broken, or the reply was lost: ask again over gRPC
            return None
        finally:
            conn.close()

    async def _lease(self, rec: ActorRecord, address: str) -> pb.LeaseReply | None:
        hops = 0
        while hops < 4:
            try:
                reply = await self.channels.stub(address, "node").RequestWorkerLease(
                    pb.LeaseRequest(
                        request_id=os.urandom(16),
                        resources=rec.resources,
                        owner_address=ACTOR_LEASE_OWNER + rec.actor_id.hex(),
                        job_id=rec.job_id,
                        no_spillback=hops > 0
                        or rec.strategy.startswith("NODE_AFFINITY:")
                        and rec.strategy.endswith(":0"),
                        strategy="DEFAULT",
                        runtime_env=rec.spec.runtime_env,
                    ),
                    timeout=None,
                )
            except RpcFailure as err:
                log.warning("actor lease request to %s failed: %s", address, err.code().name)
                return None
            if reply.status == pb.LeaseReply.GRANTED:
                rec.node_address = address  # where the lease really is (after spillbacks)
                return reply
            if reply.status == pb.LeaseReply.SPILLBACK:
                address = reply.spill_address
                hops += 1
                continue
            if reply.status == pb.LeaseReply.RUNTIME_ENV_FAILED:  # issue 17
                return reply
            return None
        return None

    # -- RPC handlers ------------------------------------------------------------------------------
    async def register(
        self, request: pb.RegisterActorRequest, context: grpc.aio.ServicerContext
    ) -> pb.RegisterActorReply:
        spec = request.spec
        rec = ActorRecord(
            actor_id=spec.actor_id,
            spec=spec,
            resources=dict(request.resources),
            name=request.name,
            namespace=request.namespace,
            class_name=request.class_name,
            detached=request.detached,
            max_restarts=request.max_restarts,
            owner_address=spec.owner_address,
            job_id=spec.job_id,
            preferred_node=request.preferred_node,
            strategy=request.strategy or "DEFAULT",
            handle_meta=request.handle_meta,
        )
        try:
            rec, existed, ins = self.table.register(rec, request.get_if_exists)
        except NameTakenError as e:
            await context.abort(grpc.StatusCode.ALREADY_EXISTS, str(e))
        self.apply(ins)
        return pb.RegisterActorReply(actor=actor_info(rec), existing=existed)

    async def wait(
        self, request: pb.WaitActorRequest, context: grpc.aio.ServicerContext
    ) -> pb.ActorInfo:
        rec = self.table.actors.get(request.actor_id)
        if rec is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, "no such actor")
        if rec.version <= request.after_version and rec.state != DEAD:
            fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self.waiters.setdefault(rec.actor_id, []).append(fut)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(fut, timeout=request.timeout or 30.0)
        return actor_info(rec)

    async def named(
        self, request: pb.NamedActorRequest, context: grpc.aio.ServicerContext
    ) -> pb.ActorInfo:
        rec = self.table.lookup(request.name, request.namespace)
        if rec is None:
            await context.abort(
                grpc.StatusCode.NOT_FOUND,
                f"no live actor named {request.name!r} in namespace {request.namespace!r}",
            )
        return actor_info(rec)

    async def kill(
        self, request: pb.KillActorRequest, context: grpc.aio.ServicerContext
    ) -> pb.Empty:
        self.apply(
            self.table.kill(
                request.actor_id,
                request.no_restart,
                request.reason or "the actor was killed by nbcluster.kill()",
                self.clock(),
                request.kind or "killed",
            )
        )
        return pb.Empty()

    def list(self) -> pb.ListActorsReply:
        return pb.ListActorsReply(actors=[actor_info(r) for r in self.table.actors.values()])

    def worker_died(self, report: pb.WorkerDeathReport) -> None:
        now = self.clock()
        ins = self.table.worker_died(report.worker_id, report.detail or "its process died", now)
        if report.worker_address:
            ins += self.table.owner_gone(owner_address=report.worker_address, now=now)
        self.apply(ins)

    def job_finished(self, job_id: bytes) -> None:
        self.apply(self.table.owner_gone(job_id=job_id, now=self.clock()))

    def node_died(self, node_id: bytes, reason: str) -> None:
        self.apply(self.table.node_died(node_id, reason, self.clock()))

    def recover(self, rows: list[tuple[pb.ActorInfo, pb.TaskSpec, dict[str, Any]]]) -> None:
        """Rebuild the table after a head restart (see :meth:`ActorTable.restore`)."""
        now = self.clock()
        ins: list[ActorInstruction] = []
        for info, spec, extra in rows:
            rec = ActorRecord(
                actor_id=info.actor_id,
                spec=spec,
                resources=dict(extra.get("resources", {})),
                name=info.name,
                namespace=info.namespace,
                class_name=info.class_name,
                detached=info.detached,
                max_restarts=info.max_restarts,
                owner_address=info.owner_address,
                job_id=info.job_id,
                preferred_node=extra.get("preferred_node", ""),
                strategy=extra.get("strategy", "DEFAULT"),
                handle_meta=info.handle_meta,
                state=info.state,
                version=info.version + 1,
                address=info.address,
                node_id=info.node_id,
                node_address=extra.get("node_address", ""),
                worker_id=info.worker_id,
                worker_pid=info.worker_pid,
                lease_id=bytes.fromhex(extra.get("lease_id", "")),
                num_restarts=info.num_restarts,
                death_cause=info.death_cause,
                death_kind=info.death_kind,
                init_error=info.init_error,
                start_time=info.start_time,
                end_time=info.end_time,
            )
            ins += self.table.restore(rec, now)
        self.apply(ins)
        log.info("recovered %d actors", len(rows))

    def close(self) -> None:
        for futs in self.waiters.values():
            for f in futs:
                if not f.done():
                    f.cancel()


def unused(_: Any) -> None:  # pragma: no cover - keeps imports honest for type checkers
    pass
