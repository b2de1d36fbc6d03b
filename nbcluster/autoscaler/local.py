"""The cluster config behind ``%cluster start --max-nodes N`` (``LocalCluster(max_nodes=N)``).

A notebook's cluster starts with its first node manager(s); the autoscaler may add node
managers shaped like the first one (same CPUs, GPUs, custom resources and store size) up
to ``max_nodes`` in total, and removes them after ``idle_timeout_s`` without work.
"""

from __future__ import annotations

import os
from typing import Any

from nbcluster.autoscaler.config import parse_config

__all__ = ["local_cluster_config"]


def local_cluster_config(
    *,
    max_workers: int,
    idle_timeout_s: float,
    num_cpus: float | None = None,
    num_gpus: float | None = None,
    resources: dict[str, float] | None = None,
    object_store_memory: int | None = None,
) -> dict[str, Any]:
    """The config (plain data, validated) of a local autoscaling cluster."""
    shape: dict[str, float] = {
        "CPU": float(num_cpus if num_cpus is not None else len(os.sched_getaffinity(0)) or 1)
    }
    if num_gpus:
        shape["GPU"] = float(num_gpus)
    shape.update({k: float(v) for k, v in (resources or {}).items()})
    worker: dict[str, Any] = {"resources": shape, "min_workers": 0, "max_workers": max_workers}
    if object_store_memory:
        worker["object_store_memory"] = int(object_store_memory)
    cfg = {
        "cluster_name": "local",
        "max_workers": max_workers,
        "idle_timeout_minutes": idle_timeout_s / 60.0,
        "provider": {"type": "local"},
        "available_node_types": {"worker": worker},
        "update_interval_s": 0.5,
        "launch_timeout_s": 60.0,
        "launch_backoff_s": 2.0,
        "launch_backoff_max_s": 60.0,
    }
    return parse_config(cfg).to_dict()
