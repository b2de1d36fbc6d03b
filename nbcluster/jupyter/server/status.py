"""A cluster's load, read without becoming a driver of it.

The server extension must not call ``nbcluster.init()`` for every cluster it shows (a
driver registers a job, owns objects and keeps streams open). It reads the load with
``nbcluster.state.cluster_status(address, token_file)``, a public read-only call that
asks the head once and returns a :class:`HeadStatus`.

Until nbcluster has that function, :func:`read_load` falls back to what this server
knows without asking the head: the number of live node managers and, for clusters it
started, their CPU total. Such loads say ``source="local"`` and leave the rest None.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from typing import Any, NotRequired, TypedDict

from nbcluster.jupyter.server.models import LoadModel

__all__ = ["HeadStatus", "NodeStatus", "StatusReader", "head_status_reader", "load_from_status", "local_load", "read_load"]


class NodeStatus(TypedDict):
    """One node in :class:`HeadStatus` (the fields of ``nbcluster.state.NodeStats``)."""

    node_id: str
    name: str
    address: str
    alive: bool
    total: dict[str, float]
    available: dict[str, float]
    store_used: int
    store_capacity: int


class HeadStatus(TypedDict):
    """What ``nbcluster.state.cluster_status(address, token_file)`` returns."""

    address: str
    nodes: list[NodeStatus]
    #: Resources of the live nodes, summed (``{"CPU": 4.0, "GPU": 0.0, ...}``).
    total: dict[str, float]
    available: dict[str, float]
    store_used: int
    store_capacity: int
    #: Lease requests waiting for resources (tasks queued).
    pending_leases: int
    #: Tasks executing right now, when the head knows it.
    running_tasks: NotRequired[int]


StatusReader = Callable[[str, "str | os.PathLike[str]"], Mapping[str, Any]]


def head_status_reader() -> StatusReader | None:
    """``nbcluster.state.cluster_status`` when this nbcluster has it, else None."""
    from nbcluster import state  # imports the wire layer: only when a load is asked for

    return getattr(state, "cluster_status", None)


def _num(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _whole(value: Any) -> int | None:
    return int(value) if isinstance(value, int) and not isinstance(value, bool) else None


def load_from_status(cluster_id: str, status: Mapping[str, Any], now: float | None = None) -> LoadModel:
    """Turn a :class:`HeadStatus` into the :class:`LoadModel` the lab extension shows."""
    nodes = [n for n in status.get("nodes", []) if n.get("alive", True)]
    total: Mapping[str, Any] = status.get("total") or {}
    available: Mapping[str, Any] = status.get("available") or {}
    if not total and nodes:  # older shape: only per-node numbers
        summed_total: dict[str, float] = {}
        summed_avail: dict[str, float] = {}
        for n in nodes:
            for k, v in n.get("total", {}).items():
                summed_total[k] = summed_total.get(k, 0.0) + float(v)
            for k, v in n.get("available", {}).items():
                summed_avail[k] = summed_avail.get(k, 0.0) + float(v)
        total, available = summed_total, summed_avail

    def used(resource: str) -> float | None:
        t = _num(total.get(resource, 0.0))
        a = _num(available.get(resource, t))
        return None if t is None or a is None else max(0.0, t - a)

    store_used = _whole(status.get("store_used"))
    store_capacity = _whole(status.get("store_capacity"))
    if store_used is None and nodes:
        store_used = sum(int(n.get("store_used", 0)) for n in nodes)
        store_capacity = sum(int(n.get("store_capacity", 0)) for n in nodes)
    return LoadModel(
        cluster_id=cluster_id,
        address=str(status.get("address", "")),
        source="head",
        nodes=len(nodes),
        cpu_used=used("CPU"),
        cpu_total=_num(total.get("CPU", 0.0)),
        gpu_used=used("GPU"),
        gpu_total=_num(total.get("GPU", 0.0)),
        store_used=store_used,
        store_capacity=store_capacity,
        tasks_running=_whole(status.get("running_tasks")),
        tasks_queued=_whole(status.get("pending_leases")),
        time=time.time() if now is None else now,
    )


def local_load(
    cluster_id: str, address: str, nodes: int | None, cpus_per_node: int | None
) -> LoadModel:
    """The load as far as this server knows it without asking the head."""
    known = nodes is not None
    return LoadModel(
        cluster_id=cluster_id,
        address=address,
        source="local" if known else "none",
        nodes=nodes,
        cpu_used=None,
        cpu_total=float(nodes * cpus_per_node) if known and cpus_per_node is not None else None,
        gpu_used=None,
        gpu_total=None,
        store_used=None,
        store_capacity=None,
        tasks_running=None,
        tasks_queued=None,
        time=time.time(),
    )


def read_load(
    cluster_id: str,
    address: str,
    token_file: str | os.PathLike[str],
    *,
    nodes: int | None,
    cpus_per_node: int | None,
    reader: StatusReader | None = None,
) -> LoadModel:
    """Ask the head at ``address`` for its load (blocking; run it off the event loop).

    ``reader`` defaults to :func:`head_status_reader`; without one, the load is
    :func:`local_load`. Errors of the reader (head gone, refused) propagate.
    """
    reader = reader if reader is not None else head_status_reader()
    if reader is None:
        return local_load(cluster_id, address, nodes, cpus_per_node)
    return load_from_status(cluster_id, reader(address, token_file))
