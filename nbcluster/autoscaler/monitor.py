"""The autoscaler process on the head's host: ``python -m nbcluster.autoscaler.monitor``.

Like Ray's monitor, it is a small process beside the head. Each round it long-polls the
head for demand (``GetDemand`` returns early when demand changes, else every
``update_interval_s``), lists the provider's nodes, lets the :class:`Tracker` merge the two,
asks :func:`decide` what to do, and does it: launches and removals run in worker threads
(provider calls block; an SSH start can take a minute), so a slow provider never stalls
the loop. A node is drained through the head before it is removed; a busy node refuses
and stays. The monitor then reports its status and new events to the head, where
``nbcluster status``, the widgets and the lab extension read them.

The monitor keeps no state of its own that matters: restarted, it adopts the provider's
nodes (their tags say their type). A head restart is ridden out: while the head is away the
monitor waits; nodes re-register and are matched again by name.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import contextlib
import json
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from nbcluster._runtime import proc
from nbcluster._runtime.node.autoscaling import busy_reason
from nbcluster._runtime.protocol.errors import RpcFailure
from nbcluster._runtime.protocol.protos import autoscaler_pb2 as apb
from nbcluster._runtime.protocol.protos import autoscaler_pb2_grpc as apb_grpc
from nbcluster._runtime.protocol.rpc import AuthedStub, make_channel
from nbcluster.autoscaler.config import ClusterConfig, load_config
from nbcluster.autoscaler.policy import Decision, Demand, PlacementGroupDemand, decide, summarize
from nbcluster.autoscaler.providers import (
    TAG_CLUSTER,
    TAG_LAUNCH_TIME,
    TAG_NODE_KIND,
    TAG_NODE_TYPE,
    NodeProvider,
    get_provider,
)
from nbcluster.autoscaler.tracker import Event, HeadNode, Tracker

__all__ = ["Monitor", "demand_from_reply", "head_nodes_from_reply", "main"]

log = logging.getLogger("nbcluster.autoscaler")

#: Fewest seconds between two decision rounds (demand can change many times a second).
MIN_TICK_S = 0.05
#: Exit when the head has been gone (process and port) this long.
HEAD_GONE_S = 120.0


def head_nodes_from_reply(reply: apb.DemandReply) -> list[HeadNode]:
    """The head's live nodes; a node without a load report yet counts as busy."""
    out = []
    for n in reply.nodes:
        if n.has_load:
            busy = busy_reason(n.load)
            out.append(
                HeadNode(
                    n.node_id.hex(),
                    n.node_name,
                    dict(n.load.total),
                    dict(n.load.available),
                    busy,
                    0.0 if busy else n.load.idle_s,
                )
            )
        else:
            out.append(HeadNode(n.node_id.hex(), n.node_name, {}, {}, "no load report yet"))
    return out


def demand_from_reply(reply: apb.DemandReply) -> Demand:
    """Queued and infeasible requests, pending groups and requested bundles, as a Demand."""
    pending: list[tuple[dict[str, float], int]] = []
    infeasible: list[tuple[dict[str, float], int]] = []
    for n in reply.nodes:
        if not n.has_load:
            continue
        pending.extend((dict(s.resources), int(s.count)) for s in n.load.pending)
        infeasible.extend((dict(s.resources), int(s.count)) for s in n.load.infeasible)
    groups = [
        PlacementGroupDemand([dict(b.resources) for b in g.bundles], g.strategy, g.name)
        for g in reply.placement_groups
    ]
    requested = [(dict(s.resources), int(s.count)) for s in reply.requested]
    return Demand(pending, infeasible, groups, requested)


def _shapes(counts: dict[Any, int]) -> list[apb.Shape]:
    return [apb.Shape(resources=dict(k), count=n) for k, n in counts.items()]


class Monitor:
    """One autoscaler: config, provider and head connection (see the module docstring)."""

    def __init__(
        self,
        config: ClusterConfig,
        provider: NodeProvider,
        head_address: str,
        token: str,
        *,
        clock: Callable[[], float] = time.time,
        stop_nodes_on_exit: bool = False,
        session_dir: Path | None = None,
    ) -> None:
        self.config = config
        self.provider = provider
        self.head_address = head_address
        self.token = token
        self.clock = clock
        self.stop_nodes_on_exit = stop_nodes_on_exit
        self.session_dir = session_dir
        self.tracker = Tracker(config)
        self.pool = concurrent.futures.ThreadPoolExecutor(8, thread_name_prefix="provider")
        self.wake = asyncio.Event()
        self.removing: set[str] = set()
        self.version = 0
        self.last_decision: Decision | None = None
        self.last_demand: Demand | None = None
        self.channel: Any = None
        self.stub: Any = None
        self.ticks = 0

    # -- provider calls (worker threads) -------------------------------------------------------
    def _listed(self) -> dict[str, dict[str, str]]:
        ids = self.provider.non_terminated_nodes({TAG_NODE_KIND: "worker"})
        return {iid: self.provider.node_tags(iid) for iid in ids}

    def _node_config(self, node_type: str) -> dict[str, Any]:
        t = self.config.available_node_types[node_type]
        cfg: dict[str, Any] = {**t.node_config, "resources": dict(t.resources)}
        if t.object_store_memory:
            cfg["object_store_memory"] = t.object_store_memory
        return cfg

    async def _launch(self, node_type: str, count: int) -> None:
        loop = asyncio.get_running_loop()
        tags = {
            TAG_CLUSTER: self.config.cluster_name,
            TAG_NODE_KIND: "worker",
            TAG_NODE_TYPE: node_type,
            TAG_LAUNCH_TIME: f"{self.clock():.0f}",
        }
        started = self.clock()
        try:
            ids = await loop.run_in_executor(
                self.pool, self.provider.create_node, self._node_config(node_type), tags, count
            )
        except Exception as err:  # noqa: BLE001 - any provider failure is a failed launch
            log.warning("launching %d x %s failed: %s", count, node_type, err)
            self.tracker.launch_failed(node_type, count, str(err), self.clock())
        else:
            self.tracker.launch_done(node_type, ids, count, self.clock(), started_at=started)
        self.wake.set()

    async def _remove(self, iid: str, reason: str, joined: bool) -> None:
        loop = asyncio.get_running_loop()
        try:
            if joined:
                reply = await self.stub.DrainNode(
                    apb.DrainRequest(node_name=iid, reason=reason), timeout=15
                )
                if not reply.accepted:
                    log.info("not removing %s: %s", iid, reply.message)
                    return
            self.tracker.terminate_started(iid, reason, self.clock())
            await self._report()
            try:
                await loop.run_in_executor(self.pool, self.provider.terminate_node, iid)
            except Exception as err:  # noqa: BLE001
                log.warning("removing %s failed: %s", iid, err)
                self.tracker.terminate_failed(iid, str(err), self.clock())
        except RpcFailure as err:
            log.warning("draining %s failed: %s", iid, err.code().name)
        finally:
            self.removing.discard(iid)
            self.wake.set()

    # -- one round ------------------------------------------------------------------------------
    async def tick(self, reply: apb.DemandReply) -> Decision:
        """Decide and act on one demand snapshot."""
        loop = asyncio.get_running_loop()
        listed = await loop.run_in_executor(self.pool, self._listed)
        now = self.clock()
        nodes = head_nodes_from_reply(reply)
        state = self.tracker.observe(now, listed, nodes, describe=self.provider.describe)
        demand = demand_from_reply(reply)
        decision = decide(state, demand, self.config, now)
        self.tracker.note_decision(decision, now)
        for node_type, count in decision.launch.items():
            self.tracker.launch_started(node_type, count, now, decision.reasons.get(node_type, ""))
            loop.create_task(self._launch(node_type, count))
        joined = {n.name for n in nodes}
        for iid, reason in decision.terminate:
            if iid in self.removing:
                continue
            self.removing.add(iid)
            loop.create_task(self._remove(iid, reason, iid in joined))
        self.last_decision, self.last_demand = decision, demand
        self.ticks += 1
        await self._report()
        return decision

    def report(self) -> apb.AutoscalerReport:
        """Status and new events for the head."""
        now = self.clock()
        rep = apb.AutoscalerReport(
            cluster_name=self.config.cluster_name,
            provider=self.config.provider_type,
            time=now,
            idle_timeout_s=self.config.idle_timeout_s,
            max_workers=self.config.max_workers,
            monitor_pid=os.getpid(),
            update_interval_s=self.config.update_interval_s,
        )
        counts = self.tracker.counts()
        for name, t in self.config.worker_types().items():
            running, launching = counts.get(name, (0, 0))
            bo = self.tracker.backoff.get(name)
            rep.node_types.add(
                name=name,
                resources=dict(t.resources),
                min_workers=t.min_workers,
                max_workers=t.max_workers,
                running=running,
                launching=launching,
                failures=bo.failures if bo else 0,
                retry_in_s=max(0.0, bo.retry_at - now) if bo else 0.0,
            )
        d = self.last_demand
        if d is not None:
            items = list(d.pending) + list(d.infeasible)
            items += [(b, 1) for g in d.placement_groups for b in g.bundles]
            rep.pending.extend(_shapes(summarize(items)))
        if self.last_decision is not None:
            rep.infeasible.extend(
                apb.Shape(resources=dict(i.shape), count=i.count)
                for i in self.last_decision.infeasible
            )
            for w in self.last_decision.waiting:
                rep.waiting.add(
                    shape=apb.Shape(resources=dict(w.shape), count=w.count), reason=w.reason
                )
        for ev in self.tracker.take_events():
            rep.events.add(
                time=ev.time,
                kind=ev.kind,
                message=ev.message,
                node_type=ev.node_type,
                instance_id=ev.instance_id,
                count=ev.count,
                shape=dict(ev.shape),
            )
        return rep

    async def _report(self) -> None:
        rep = self.report()
        try:
            await self.stub.ReportAutoscaler(rep, timeout=10)
        except RpcFailure as err:
            log.debug("status report failed: %s", err.code().name)
            # Keep the events for the next report.
            self.tracker.events[:0] = [
                Event(e.time, e.kind, e.message, e.node_type, e.instance_id, e.count, dict(e.shape))
                for e in rep.events
            ]

    # -- the loop -------------------------------------------------------------------------------
    async def run(self, stop: asyncio.Event) -> None:
        """Decide until ``stop`` is set."""
        self.channel = make_channel(self.head_address, self.token)
        self.stub = AuthedStub(apb_grpc.AutoscalingStub(self.channel), self.token)
        down_since: float | None = None
        interval = self.config.update_interval_s
        stopping = asyncio.ensure_future(stop.wait())
        try:
            while not stop.is_set():
                self.wake.clear()
                poll = asyncio.ensure_future(
                    self.stub.GetDemand(
                        apb.DemandRequest(after_version=self.version, timeout=interval),
                        timeout=interval + 10,
                    )
                )
                woken = asyncio.ensure_future(self.wake.wait())
                done, _ = await asyncio.wait(
                    {poll, woken, stopping}, return_when=asyncio.FIRST_COMPLETED
                )
                woken.cancel()
                if stopping in done:
                    poll.cancel()
                    break
                if poll not in done:  # a launch or removal finished: look again now
                    poll.cancel()
                    poll = asyncio.ensure_future(
                        self.stub.GetDemand(apb.DemandRequest(), timeout=10)
                    )
                try:
                    reply = await poll
                except RpcFailure as err:
                    now = time.monotonic()
                    down_since = down_since or now
                    log.info("head unavailable (%s); waiting", err.code().name)
                    if now - down_since > HEAD_GONE_S and not self._head_alive():
                        log.warning("the head is gone; the autoscaler stops")
                        break
                    await asyncio.sleep(min(1.0, interval))
                    continue
                down_since = None
                self.version = reply.version
                try:
                    await self.tick(reply)
                except Exception:  # noqa: BLE001 - one bad round must not end autoscaling
                    log.exception("autoscaler round failed")
                await asyncio.sleep(MIN_TICK_S)
        finally:
            stopping.cancel()
            if self.stop_nodes_on_exit:
                await self.stop_all_nodes()
            with contextlib.suppress(Exception):
                await self.channel.close(grace=0.2)
            self.pool.shutdown(wait=False, cancel_futures=True)

    def _head_alive(self) -> bool:
        if self.session_dir is None:
            return True
        try:
            return proc.pid_alive(int((self.session_dir / "head.pid").read_text()))
        except (OSError, ValueError):
            return False

    async def stop_all_nodes(self) -> None:
        """Remove every node this autoscaler launched (used when the cluster stops)."""
        loop = asyncio.get_running_loop()
        try:
            ids = list(await loop.run_in_executor(self.pool, self._listed))
        except Exception:  # noqa: BLE001
            log.exception("listing nodes to stop failed")
            return
        if ids:
            await asyncio.gather(
                *(loop.run_in_executor(self.pool, self.provider.terminate_node, i) for i in ids),
                return_exceptions=True,
            )


# -- process entry point ---------------------------------------------------------------------------
async def _serve(args: argparse.Namespace) -> None:
    session_dir = Path(args.session_dir)
    proc.setup_logging(args.log_level, session_dir / "logs" / "monitor.log", "monitor")
    config = load_config(args.config)
    head_address = (
        args.head_address
        or proc.wait_for_file(session_dir / proc.HEAD_ADDRESS_FILE, timeout=60).strip()
    )
    provider = get_provider(
        config,
        session_dir=session_dir,
        token_file=args.token_file,
        head_address=head_address,
        parent_fd=args.parent_fd,
    )
    monitor = Monitor(
        config,
        provider,
        head_address,
        proc.read_token(args.token_file),
        stop_nodes_on_exit=args.stop_nodes_on_exit,
        session_dir=session_dir,
    )
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    proc.install_signal_handlers(loop, stop.set)
    if args.parent_fd >= 0:
        proc.watch_parent(loop, args.parent_fd, stop.set)
    (session_dir / "autoscaler").mkdir(exist_ok=True)
    proc.write_atomic(
        session_dir / "autoscaler" / "monitor.json",
        json.dumps(
            {
                "pid": os.getpid(),
                "cluster_name": config.cluster_name,
                "provider": config.provider_type,
                "config": str(Path(args.config).resolve()),
            }
        ),
    )
    log.info(
        "autoscaler for %s (%s provider) watching %s",
        config.cluster_name,
        config.provider_type,
        head_address,
    )
    await monitor.run(stop)
    log.info("autoscaler stopped")


def main(argv: list[str] | None = None) -> None:
    """Parse arguments and run the autoscaler until it is stopped."""
    p = argparse.ArgumentParser(prog="nbcluster-monitor")
    p.add_argument("--session-dir", required=True)
    p.add_argument("--token-file", required=True)
    p.add_argument("--config", required=True, help="cluster config (YAML or JSON)")
    p.add_argument("--head-address", default="")
    p.add_argument("--parent-fd", type=int, default=-1)
    p.add_argument("--stop-nodes-on-exit", action="store_true")
    p.add_argument("--log-level", default=os.environ.get("NBCLUSTER_LOG_LEVEL", "INFO"))
    args = p.parse_args(argv)
    asyncio.run(_serve(args))


if __name__ == "__main__":
    main()
