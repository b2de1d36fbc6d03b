"""What ``serve.status()`` returns, with Ray Serve's names (``ray.serve.schema``).

``ServeStatus.applications[name]`` is an :class:`ApplicationStatusOverview` whose
``deployments[name]`` is a :class:`DeploymentStatusOverview` with the count of replicas
per :class:`ReplicaState`. nbcluster adds ``replicas`` (one :class:`ReplicaDetails`
each, for the widget and ``nbcluster serve status``) and live request statistics.
"""

from __future__ import annotations

import dataclasses
from enum import Enum, StrEnum
from typing import Any

__all__ = [
    "ApplicationStatus",
    "ApplicationStatusOverview",
    "DeploymentStatus",
    "DeploymentStatusOverview",
    "DeploymentStatusTrigger",
    "ProxyStatus",
    "ReplicaDetails",
    "ReplicaState",
    "ServeStatus",
]


class ApplicationStatus(StrEnum):
    """The state of an application."""

    NOT_STARTED = "NOT_STARTED"
    DEPLOYING = "DEPLOYING"
    DEPLOY_FAILED = "DEPLOY_FAILED"
    RUNNING = "RUNNING"
    UNHEALTHY = "UNHEALTHY"
    DELETING = "DELETING"


class DeploymentStatus(StrEnum):
    """The state of a deployment."""

    UPDATING = "UPDATING"
    HEALTHY = "HEALTHY"
    UNHEALTHY = "UNHEALTHY"
    DEPLOY_FAILED = "DEPLOY_FAILED"
    UPSCALING = "UPSCALING"
    DOWNSCALING = "DOWNSCALING"


class DeploymentStatusTrigger(StrEnum):
    """Why a deployment is in its state."""

    UNSPECIFIED = "UNSPECIFIED"
    CONFIG_UPDATE_STARTED = "CONFIG_UPDATE_STARTED"
    CONFIG_UPDATE_COMPLETED = "CONFIG_UPDATE_COMPLETED"
    UPSCALE_COMPLETED = "UPSCALE_COMPLETED"
    DOWNSCALE_COMPLETED = "DOWNSCALE_COMPLETED"
    AUTOSCALING = "AUTOSCALING"
    REPLICA_STARTUP_FAILED = "REPLICA_STARTUP_FAILED"
    HEALTH_CHECK_FAILED = "HEALTH_CHECK_FAILED"
    DELETING = "DELETING"


class ReplicaState(StrEnum):
    """The state of one replica."""

    STARTING = "STARTING"
    UPDATING = "UPDATING"
    RECOVERING = "RECOVERING"
    RUNNING = "RUNNING"
    STOPPING = "STOPPING"


class ProxyStatus(StrEnum):
    """The state of an HTTP proxy."""

    STARTING = "STARTING"
    HEALTHY = "HEALTHY"
    UNHEALTHY = "UNHEALTHY"
    DRAINING = "DRAINING"


@dataclasses.dataclass(frozen=True)
class ReplicaDetails:
    """One replica: id, state, where it runs, and its load as last reported."""

    replica_id: str
    state: ReplicaState
    actor_name: str
    version: str
    pid: int | None = None
    node_id: str | None = None
    start_time_s: float = 0.0
    ongoing_requests: float = 0.0


@dataclasses.dataclass(frozen=True)
class DeploymentStatusOverview:
    """One deployment: status, why, replica counts per state, and a message.

    ``requests_per_s``, ``p50_ms``, ``p99_ms`` and ``errors`` are nbcluster's additions
    (the last seconds of traffic, from the replicas' reports).
    """

    status: DeploymentStatus
    status_trigger: DeploymentStatusTrigger
    replica_states: dict[ReplicaState, int]
    message: str = ""
    target_replicas: int = 0
    replicas: tuple[ReplicaDetails, ...] = ()
    requests_per_s: float = 0.0
    p50_ms: float | None = None
    p99_ms: float | None = None
    errors: int = 0


@dataclasses.dataclass(frozen=True)
class ApplicationStatusOverview:
    """One application: status, message, when it was deployed, and its deployments."""

    status: ApplicationStatus
    message: str
    last_deployed_time_s: float
    deployments: dict[str, DeploymentStatusOverview]
    route_prefix: str | None = None
    ingress_deployment: str = ""


@dataclasses.dataclass(frozen=True)
class ServeStatus:
    """Serve as a whole: proxies by node, applications by name.

    ``proxy_urls`` and ``proxy_pids`` (nbcluster's additions) map node ids to the URL each
    proxy serves and its process id.
    """

    proxies: dict[str, ProxyStatus] = dataclasses.field(default_factory=dict)
    applications: dict[str, ApplicationStatusOverview] = dataclasses.field(default_factory=dict)
    target_capacity: float | None = None
    proxy_urls: dict[str, str] = dataclasses.field(default_factory=dict)
    proxy_pids: dict[str, int] = dataclasses.field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (enums as their names), for ``nbcluster serve status``."""
        return _plain(dataclasses.asdict(self))


def _plain(value: Any) -> Any:
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, dict):
        return {_plain(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value
