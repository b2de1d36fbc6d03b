"""What the driver sends the controller for one deployment of an application."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Any

from nbcluster.serve.config import DeploymentConfig

__all__ = ["AppSpec", "DeploymentSpec", "code_version", "light_config"]


@dataclasses.dataclass(frozen=True)
class DeploymentSpec:
    """One deployment: its pickled class/function and arguments, config and versions."""

    name: str
    blob: bytes
    config: DeploymentConfig
    version: str
    class_name: str = ""

    def light(self) -> dict[str, Any]:
        """The part of the config a running replica can take without restarting."""
        return light_config(self.config)


@dataclasses.dataclass(frozen=True)
class AppSpec:
    """One application: name, HTTP route, ingress deployment, and every deployment."""

    name: str
    route_prefix: str | None
    ingress: str
    deployments: tuple[DeploymentSpec, ...]


def light_config(config: DeploymentConfig) -> dict[str, Any]:
    """Options applied to running replicas in place (Ray's lightweight update)."""
    return {
        "user_config": config.user_config,
        "max_ongoing_requests": config.max_ongoing_requests,
        "graceful_shutdown_wait_loop_s": config.graceful_shutdown_wait_loop_s,
        "graceful_shutdown_timeout_s": config.graceful_shutdown_timeout_s,
    }


def code_version(blob: bytes, config: DeploymentConfig) -> str:
    """A replica's version: the code and arguments plus what the actor is created with."""
    h = hashlib.sha256(blob)
    h.update(json.dumps(dict(config.ray_actor_options), sort_keys=True, default=repr).encode())
    return h.hexdigest()[:16]
