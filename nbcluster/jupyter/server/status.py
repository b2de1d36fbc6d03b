"""A cluster's load, read without becoming a driver of it.

The server extension must not call ``nbcluster.init()`` for every cluster it shows (a
driver registers a job, owns objects and keeps streams open). It reads the load with
:func:`nbcluster.state.cluster_status`, a public read-only call that asks the head once
over a blocking channel and returns a :class:`HeadStatus`. Clusters known only by an
address the user added are never contacted: their load is :func:`unknown_load`.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from typing import Any, NotRequired, TypedDict

from nbcluster.jupyter.server.models import LoadModel, ScalingEventModel

__all__ = [
    "HeadStatus",
    "NodeStatus",
    "StatusReader",
    "load_from_status",
    "unknown_load",
    "read_load",
]


class NodeStatus(TypedDict):
    """One node in :class:`HeadStatus` (the fields of ``nbcluster.state.NodeStats``)."""

    node_id: str
    name: str
    address: str
    alive: NotRequired[bool]
    total: dict[str, float]
    available: dict[str, float]
    store_used: int
    store_capacity: int


class HeadStatus(TypedDict):
    """What ``nbcluster.state.cluster_status(address, token_file)`` returns."""

    address: str
    session_dir: str
    nodes: list[NodeStatus]
    #: Resources of the live nodes, summed (``{"CPU": 4.0, "GPU": 0.0, ...}``).
    total: dict[str, float]
    available: dict[str, float]
    store_used: int
    store_capacity: int
    num_workers: int
    actors: int
    #: Lease requests waiting for resources (tasks queued), when the head reports it.
    pending_leases: NotRequired[int]
    #: Tasks executing right now, when the head reports it.
    running_tasks: NotRequired[int]
    #: The autoscaler: ``{"summary": str, "events": [{"time", "kind", "message"}]}``, or
    #: None when the cluster has none.
    autoscaler: NotRequired[dict[str, Any] | None]


StatusReader = Callable[[str, "str | os.PathLike[str]"], Mapping[str, Any]]


def _num(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _whole(value: Any) -> int | None:
    return int(value) if isinstance(value, int) and not isinstance(value, bool) else None


def load_from_status(
    cluster_id: str, status: Mapping[str, Any], now: float | None = None
) -> LoadModel:
    """Turn a :class:`HeadStatus` into the :class:`LoadModel` the lab extension shows."""
    nodes = [n for n in status.get("nodes", []) if n.get("alive", True)]
    total: Mapping[str, Any] = status.get("total") or {}
    available: Mapping[str, Any] = status.get("available") or {}

    def used(resource: str) -> float | None:
        t = _num(total.get(resource, 0.0))
        a = _num(available.get(resource, t))
        return None if t is None or a is None else max(0.0, t - a)

    return LoadModel(
        cluster_id=cluster_id,
        address=str(status.get("address", "")),
        source="head",
        nodes=len(nodes),
        cpu_used=used("CPU"),
        cpu_total=_num(total.get("CPU", 0.0)),
        gpu_used=used("GPU"),
        gpu_total=_num(total.get("GPU", 0.0)),
        store_used=_whole(status.get("store_used")),
        store_capacity=_whole(status.get("store_capacity")),
        tasks_running=_whole(status.get("running_tasks")),
        tasks_queued=_whole(status.get("pending_leases")),
        time=time.time() if now is None else now,
        autoscaler=_autoscaler_text(status.get("autoscaler")),
        scaling_events=_scaling_events(status.get("autoscaler")),
    )


def _autoscaler_text(info: Any) -> str | None:
    if not isinstance(info, Mapping) or not isinstance(info.get("summary"), str):
        return None
    return str(info["summary"])


def _scaling_events(info: Any) -> list[ScalingEventModel]:
    if not isinstance(info, Mapping) or not isinstance(info.get("events"), list):
        return []
    out: list[ScalingEventModel] = []
    for e in info["events"][-5:]:
        if isinstance(e, Mapping) and _num(e.get("time")) is not None:
            out.append(
                ScalingEventModel(
                    time=float(e["time"]),
                    kind=str(e.get("kind", "")),
                    message=str(e.get("message", "")),
                )
            )
    return out


def unknown_load(cluster_id: str, address: str) -> LoadModel:
    """The load of a cluster this server may not ask (an added address): all None."""
    return LoadModel(
        cluster_id=cluster_id,
        address=address,
        source="none",
        nodes=None,
        cpu_used=None,
        cpu_total=None,
        gpu_used=None,
        gpu_total=None,
        store_used=None,
        store_capacity=None,
        tasks_running=None,
        tasks_queued=None,
        time=time.time(),
        autoscaler=None,
        scaling_events=[],
    )


def read_load(
    cluster_id: str,
    address: str,
    token_file: str | os.PathLike[str],
    *,
    reader: StatusReader | None = None,
) -> LoadModel:
    """Ask the head at ``address`` for its load (blocking: run it off the event loop).

    ``reader`` defaults to :func:`nbcluster.state.cluster_status`; its errors (the head
    is gone or refuses the token) propagate.
    """
    if reader is None:
        from nbcluster.state import cluster_status  # the wire layer: only when asked

        reader = cluster_status
    return load_from_status(cluster_id, reader(address, os.fspath(token_file)))
