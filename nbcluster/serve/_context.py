"""Where a replica's code runs: the replica context and the per-request context.

Set by the replica actor (``_replica.py``) and read by ``serve.get_replica_context()``,
``serve.get_multiplexed_model_id()`` and handles created inside a replica (which default
to the replica's own application).
"""

from __future__ import annotations

import contextvars
import dataclasses
from typing import Any

from nbcluster.serve.exceptions import ServeException

__all__ = [
    "DeploymentID",
    "ReplicaContext",
    "ReplicaID",
    "RequestContext",
    "current_replica",
    "get_multiplexed_model_id",
    "get_replica_context",
    "request_context",
    "set_replica",
]


@dataclasses.dataclass(frozen=True)
class DeploymentID:
    """A deployment's name and the application it belongs to."""

    name: str
    app_name: str

    def __str__(self) -> str:
        return f"{self.app_name}#{self.name}"


@dataclasses.dataclass(frozen=True)
class ReplicaID:
    """One replica: a unique id within its deployment."""

    unique_id: str
    deployment_id: DeploymentID

    def to_full_id_str(self) -> str:
        """``app#deployment#unique_id``."""
        return f"{self.deployment_id}#{self.unique_id}"


@dataclasses.dataclass
class ReplicaContext:
    """What ``serve.get_replica_context()`` returns inside a replica (Ray's fields)."""

    replica_id: ReplicaID
    servable_object: Any
    rank: int = 0
    world_size: int = 1

    @property
    def app_name(self) -> str:
        """The application's name."""
        return self.replica_id.deployment_id.app_name

    @property
    def deployment(self) -> str:
        """The deployment's name."""
        return self.replica_id.deployment_id.name

    @property
    def replica_tag(self) -> str:
        """The replica's unique id."""
        return self.replica_id.unique_id


@dataclasses.dataclass(frozen=True)
class RequestContext:
    """The request being handled: its id, route, and multiplexed model id."""

    request_id: str = ""
    route: str = ""
    app_name: str = ""
    multiplexed_model_id: str = ""


_replica: ReplicaContext | None = None
_NO_REQUEST = RequestContext()
request_context: contextvars.ContextVar[RequestContext] = contextvars.ContextVar(
    "nbcluster_serve_request",
    default=_NO_REQUEST,  # noqa: B039 - frozen, never mutated
)


def set_replica(ctx: ReplicaContext | None) -> None:
    """Mark this process as the replica ``ctx`` (done once by the replica actor)."""
    global _replica
    _replica = ctx


def current_replica() -> ReplicaContext | None:
    """The replica this process hosts, or None outside replicas."""
    return _replica


def get_replica_context() -> ReplicaContext:
    """The deployment and replica this code runs in (only inside a replica)."""
    if _replica is None:
        raise ServeException(
            "`serve.get_replica_context()` may only be called from within a Serve deployment "
            "(in a replica's constructor or methods)."
        )
    return _replica


def get_multiplexed_model_id() -> str:
    """The multiplexed model id of the request being handled ('' when none was given).

    Set with ``handle.options(multiplexed_model_id=...)`` or, over HTTP, the
    ``serve_multiplexed_model_id`` header.
    """
    return request_context.get().multiplexed_model_id
