"""``serve.status()``: the controller's state as the public status records.

A pure function of the controller's applications, deployment state machines and
statistics (``_controller.ControllerCore.status`` calls it on the controller's loop).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping

from nbcluster.serve._actors import replica_actor_name
from nbcluster.serve._controller_store import AppRecord, Key
from nbcluster.serve._metrics import DeploymentStats
from nbcluster.serve._proxy_manager import ProxyManager
from nbcluster.serve._reconcile import DeploymentState, app_status
from nbcluster.serve.schema import (
    ApplicationStatus,
    ApplicationStatusOverview,
    DeploymentStatus,
    DeploymentStatusOverview,
    ReplicaDetails,
    ServeStatus,
)

__all__ = ["serve_status"]


def serve_status(
    apps: Iterable[AppRecord],
    deps: Mapping[Key, DeploymentState],
    stats: Mapping[Key, DeploymentStats],
    proxies: ProxyManager,
) -> ServeStatus:
    """Every application's status, its deployments' and their replicas', and the proxies."""
    now = time.monotonic()
    wall = time.time()
    result: dict[str, ApplicationStatusOverview] = {}
    for app in apps:
        overviews: dict[str, DeploymentStatusOverview] = {}
        statuses: dict[str, tuple[DeploymentStatus, str]] = {}
        for d in app.deployments:
            ds = deps.get((app.name, d))
            if ds is None:
                continue
            st, trigger, msg = ds.status()
            statuses[d] = (st, msg)
            summary = stats[(app.name, d)].summary(now)
            replicas = tuple(
                ReplicaDetails(
                    replica_id=r.replica_id,
                    state=r.state,
                    actor_name=replica_actor_name(app.name, d, r.replica_id),
                    version=r.version,
                    pid=r.pid,
                    node_id=r.node_id,
                    start_time_s=wall - (now - r.since),
                    ongoing_requests=r.ongoing,
                )
                for r in sorted(ds.replicas.values(), key=lambda r: r.since)
            )
            overviews[d] = DeploymentStatusOverview(
                status=st,
                status_trigger=trigger,
                replica_states=ds.counts(),
                message=msg,
                target_replicas=ds.target.num_replicas if ds.target else 0,
                replicas=replicas,
                requests_per_s=summary["requests_per_s"],
                p50_ms=summary["p50_ms"],
                p99_ms=summary["p99_ms"],
                errors=summary["errors"],
            )
        st_app, msg_app = app_status(statuses, app.deleting)
        result[app.name] = ApplicationStatusOverview(
            status=st_app if overviews or app.deleting else ApplicationStatus.DEPLOYING,
            message=msg_app,
            last_deployed_time_s=app.deployed_at,
            deployments=overviews,
            route_prefix=app.route_prefix,
            ingress_deployment=app.ingress,
        )
    return ServeStatus(
        proxies=proxies.statuses(),
        applications=result,
        proxy_urls=proxies.urls(),
        proxy_pids=proxies.pids(),
    )
