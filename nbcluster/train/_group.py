"""The worker group: ``num_workers`` actors placed by one placement group, with ranks,
a rendezvous chosen by rank 0, and a cache that keeps the last group warm.

A run reserves its resources with a placement group (one bundle per worker, strategy
``ScalingConfig.placement_strategy``) and each worker actor runs on its bundle's node.
CPU-only workers are actors that reserve nothing themselves, pinned to their bundle's
node: the group's reservation is the placement group, and it is removed when the run
ends, so the cluster gets its CPUs back at once while the worker processes (with torch
imported and the process group joined) stay warm for the next ``fit()`` with the same
scaling config. Workers that use GPUs are created inside their bundles (they need their
GPU assigned) and are ended with the run.

Ranks follow Ray: workers on the same node get consecutive ranks, the driver's node
first; ``LOCAL_RANK``/``LOCAL_WORLD_SIZE``/``NODE_RANK`` follow from that
(:func:`assign_ranks`, a pure function). Rank 0 picks a free port on its node for the
rendezvous (``MASTER_ADDR``/``MASTER_PORT``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import nbcluster
from nbcluster.train._config import ScalingConfig
from nbcluster.train._worker import TrainWorker, WorkerSetup
from nbcluster.util import (
    NodeAffinitySchedulingStrategy,
    PlacementGroupSchedulingStrategy,
    placement_group,
    placement_group_table,
    remove_placement_group,
)

__all__ = [
    "RankInfo",
    "WorkerGroup",
    "assign_ranks",
    "infeasible_reason",
    "release_warm_groups",
]

#: Seconds an idle warm group is kept (``NBCLUSTER_TRAIN_WARM_S``; 0 turns reuse off).
WARM_IDLE_S = 600.0
#: After this long waiting for resources, the run says what it waits for.
WAIT_NOTICE_S = 2.0


def warm_idle_seconds() -> float:
    """How long an idle group stays warm (``$NBCLUSTER_TRAIN_WARM_S``, default 600)."""
    try:
        return max(0.0, float(os.environ.get("NBCLUSTER_TRAIN_WARM_S", WARM_IDLE_S)))
    except ValueError:
        return WARM_IDLE_S


@dataclasses.dataclass(frozen=True)
class RankInfo:
    """A worker's ranks: in the world, on its node, and its node's."""

    world_rank: int
    local_rank: int
    local_world_size: int
    node_rank: int


def assign_ranks(worker_nodes: Sequence[str], driver_node: str) -> list[RankInfo]:
    """Ranks for workers on ``worker_nodes`` (index i: worker i's node id).

    Workers on one node get consecutive world ranks; nodes are ordered with the driver's
    node first, then in the order they first appear. Returns one :class:`RankInfo` per
    worker, in the input order.
    """
    order: list[str] = []
    for node in ([driver_node] if driver_node in worker_nodes else []) + list(worker_nodes):
        if node not in order:
            order.append(node)
    per_node = {node: [i for i, n in enumerate(worker_nodes) if n == node] for node in order}
    out: list[RankInfo | None] = [None] * len(worker_nodes)
    rank = 0
    for node_rank, node in enumerate(order):
        members = per_node[node]
        for local_rank, i in enumerate(members):
            out[i] = RankInfo(rank, local_rank, len(members), node_rank)
            rank += 1
    return [r for r in out if r is not None]


def _fmt(res: Mapping[str, float]) -> str:
    return ", ".join(f"{v:g} {k}" for k, v in sorted(res.items())) or "nothing"


def infeasible_reason(
    bundles: Sequence[Mapping[str, float]],
    strategy: str,
    nodes: Sequence[Mapping[str, float]],
    num_workers: int,
) -> str | None:
    """Why ``bundles`` can never be placed on ``nodes`` (each node's total resources), or
    None when they could be (once the resources are free). Conservative: it only says
    "never" when that is certain."""

    def fits(bundle: Mapping[str, float], node: Mapping[str, float]) -> bool:
        return all(node.get(k, 0.0) + 1e-9 >= v for k, v in bundle.items())

    total_need: dict[str, float] = {}
    for b in bundles:
        for k, v in b.items():
            total_need[k] = total_need.get(k, 0.0) + v
    have: dict[str, float] = {}
    for n in nodes:
        for k, v in n.items():
            if k in total_need or k in ("CPU", "GPU"):
                have[k] = have.get(k, 0.0) + v
    cluster = f"the cluster has {_fmt(have)} ({len(nodes)} node{'s' * (len(nodes) != 1)})"
    ask = (
        f"ScalingConfig(num_workers={num_workers}) needs {len(bundles)} bundle"
        f"{'s' * (len(bundles) != 1)} ({_fmt(total_need)} in total)"
    )
    fix = (
        "Lower num_workers or resources_per_worker, or add nodes to the cluster "
        "(%cluster scale N, or nbcluster start --address on another machine)"
    )
    for b in bundles:
        if not any(fits(b, n) for n in nodes):
            return f"{ask}, but no node can hold a bundle of {_fmt(b)}: {cluster}. {fix}"
    short = {k: v for k, v in total_need.items() if have.get(k, 0.0) + 1e-9 < v}
    if short:
        return f"{ask}, but {cluster}. {fix}"
    if strategy == "STRICT_PACK" and not any(fits(total_need, n) for n in nodes):
        return f"{ask} on one node (STRICT_PACK), but no node holds that: {cluster}. {fix}"
    if strategy == "STRICT_SPREAD" and len(nodes) < len(bundles):
        return f"{ask} on {len(bundles)} different nodes (STRICT_SPREAD), but {cluster}. {fix}"
    workers = bundles[:num_workers]
    if (
        workers
        and all(dict(b) == dict(workers[0]) for b in workers)
        and len(workers) == len(bundles)
    ):
        per = workers[0]
        slots = 0
        for n in nodes:
            counts = [math.floor(n.get(k, 0.0) / v + 1e-9) for k, v in per.items() if v > 0]
            slots += min(counts) if counts else 0
        if slots < len(workers):
            return f"{ask}, but the nodes can hold only {slots} such bundles: {cluster}. {fix}"
    return None


def _driver_node() -> str:
    return nbcluster.get_runtime_context().get_node_id()


def _alive_nodes() -> list[dict[str, Any]]:
    return [n for n in nbcluster.nodes() if n.get("Alive")]


class WorkerGroup:
    """The actors of one run (see the module docstring). Not thread-safe."""

    def __init__(self, key: tuple[Any, ...], scaling: ScalingConfig, backend: Any) -> None:
        self.key = key
        self.scaling = scaling
        self.backend = backend
        self.workers: list[Any] = []  # actor handles, in rank order
        self.infos: list[dict[str, Any]] = []  # pid, node_id, hostname, address, ranks
        self.pg: Any = None
        self.in_pg = scaling.num_gpus_per_worker > 0
        self.ready = False  # rendezvous done, backend set up

    # -- reservation --------------------------------------------------------------------------
    def check_feasible(self) -> None:
        """Raise ``ValueError`` now if the cluster can never hold the group."""
        nodes = [dict(n.get("Resources") or {}) for n in _alive_nodes()]
        reason = infeasible_reason(
            self.scaling.bundles(),
            self.scaling.placement_strategy,
            nodes,
            self.scaling.num_workers,
        )
        if reason:
            raise ValueError(reason)

    def reserve(self, notice: Callable[[str], None] | None = None) -> list[str]:
        """Create the placement group and wait for it; return the workers' node ids."""
        bundles = self.scaling.bundles()
        self.pg = placement_group(bundles, strategy=self.scaling.placement_strategy)
        start = time.monotonic()
        told = False
        while not self.pg.wait(timeout_seconds=0.5):
            if notice is not None and not told and time.monotonic() - start > WAIT_NOTICE_S:
                told = True
                avail = nbcluster.available_resources()
                notice(
                    f"waiting for resources: the run needs {_fmt(self.scaling.total_resources)}, "
                    f"available now: {_fmt({k: v for k, v in avail.items() if k in ('CPU', 'GPU')})}"
                )
        table = placement_group_table(self.pg)
        nodes = table["bundles_to_node_id"]
        return [nodes[i] for i in range(self.scaling.num_workers)]

    def release_reservation(self) -> None:
        """Remove the placement group (the CPU-only workers stay alive)."""
        pg, self.pg = self.pg, None
        if pg is not None:
            with contextlib.suppress(nbcluster.exceptions.NbclusterError):
                remove_placement_group(pg)  # fails only when the cluster is going away

    # -- workers ----------------------------------------------------------------------------
    def matches(self, worker_nodes: Sequence[str]) -> bool:
        """True if this (warm) group's workers sit on exactly these nodes."""
        mine = sorted(i["node_id"] for i in self.infos)
        return not self.in_pg and self.ready and mine == sorted(worker_nodes)

    def alive(self, timeout: float = 10.0) -> bool:
        """Ask every worker for its info; False if one does not answer."""
        try:
            nbcluster.get([w.info.remote() for w in self.workers], timeout=timeout)
        except nbcluster.exceptions.NbclusterError:
            return False
        return True

    def start_workers(self, worker_nodes: Sequence[str], preload: tuple[str, ...]) -> None:
        """Create the actors, give them ranks and run the backend's set-up on each."""
        cls = nbcluster.remote(TrainWorker)
        scaling = self.scaling
        per = scaling._worker_resources()
        handles = []
        for i, node in enumerate(worker_nodes):
            if self.in_pg:
                opts = cls.options(
                    num_cpus=per.get("CPU", 0.0),
                    num_gpus=per.get("GPU", 0.0),
                    resources={k: v for k, v in per.items() if k not in ("CPU", "GPU", "memory")},
                    scheduling_strategy=PlacementGroupSchedulingStrategy(self.pg, i),
                )
            else:
                opts = cls.options(
                    num_cpus=0,
                    scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False),
                )
            handles.append(opts.remote(preload))
        self.workers = handles
        infos = nbcluster.get([w.info.remote() for w in handles])
        ranks = assign_ranks([info["node_id"] for info in infos], _driver_node())
        addresses = {n["NodeID"]: n["NodeManagerAddress"] for n in nbcluster.nodes()}
        for info, r in zip(infos, ranks, strict=True):
            info["address"] = addresses.get(info["node_id"], "127.0.0.1")
            info.update(dataclasses.asdict(r))
        order = sorted(range(len(handles)), key=lambda i: ranks[i].world_rank)
        self.workers = [handles[i] for i in order]
        self.infos = [infos[i] for i in order]
        master = self.infos[0]["address"]
        port = nbcluster.get(self.workers[0].free_port.remote(master))
        setups = [
            WorkerSetup(
                world_rank=info["world_rank"],
                world_size=len(self.workers),
                local_rank=info["local_rank"],
                local_world_size=info["local_world_size"],
                node_rank=info["node_rank"],
                master_addr=master,
                master_port=port,
                use_gpu=scaling.use_gpu,
                num_cpus=per.get("CPU", 0.0),
            )
            for info in self.infos
        ]
        nbcluster.get(
            [w.setup.remote(s, self.backend) for w, s in zip(self.workers, setups, strict=True)]
        )
        self.ready = True

    def kill(self) -> None:
        """End every worker and the reservation."""
        for w in self.workers:
            with contextlib.suppress(nbcluster.exceptions.NbclusterError):
                nbcluster.kill(w)
        self.workers = []
        self.ready = False
        self.release_reservation()


# -- the warm cache ---------------------------------------------------------------------------

_lock = threading.Lock()
_warm: dict[tuple[Any, ...], WorkerGroup] = {}
_timers: dict[int, threading.Timer] = {}


def group_key(scaling: ScalingConfig, backend: Any) -> tuple[Any, ...]:
    """What must be equal for a warm group to be reused."""
    return (
        nbcluster.get_runtime_context().get_job_id(),
        scaling.num_workers,
        tuple(sorted(scaling._worker_resources().items())),
        scaling.placement_strategy,
        scaling.use_gpu,
        repr(backend),
    )


def take_warm(key: tuple[Any, ...]) -> WorkerGroup | None:
    """The warm group for ``key`` (removed from the cache), else None; a warm group for
    another key is ended, so that it does not keep worker processes."""
    with _lock:
        group = _warm.pop(key, None)
        others = list(_warm.values())
        _warm.clear()
        for g in [group, *others]:
            if g is not None:
                timer = _timers.pop(id(g), None)
                if timer is not None:
                    timer.cancel()
    for g in others:
        if g.key[0] == key[0]:
            g.kill()
    return group


def put_warm(group: WorkerGroup) -> None:
    """Keep ``group`` for the next run with the same key (it is ended after an idle time)."""
    idle = warm_idle_seconds()
    if idle <= 0 or group.in_pg or not group.ready:
        group.kill()
        return
    timer = threading.Timer(idle, _expire, args=(group,))
    timer.daemon = True
    with _lock:
        old = _warm.pop(group.key, None)
        _warm[group.key] = group
        _timers[id(group)] = timer
    if old is not None and old is not group:
        old.kill()
    timer.start()


def _expire(group: WorkerGroup) -> None:
    with _lock:
        if _warm.get(group.key) is not group:
            return
        del _warm[group.key]
        _timers.pop(id(group), None)
    if nbcluster.is_initialized():
        group.kill()


def release_warm_groups() -> int:
    """End every idle warm worker group now; return how many there were."""
    with _lock:
        groups = list(_warm.values())
        _warm.clear()
        for t in _timers.values():
            t.cancel()
        _timers.clear()
    for g in groups:
        if nbcluster.is_initialized():
            g.kill()
    return len(groups)
