"""Serve's errors, with Ray Serve's names (``ray.serve.exceptions``).

``RayServeException`` is kept as an alias of :class:`ServeException`, so code that
catches Ray Serve's base class reads the same with only the import changed.
"""

from __future__ import annotations

__all__ = [
    "BackPressureError",
    "DeploymentUnavailableError",
    "RayServeException",
    "ReplicaUnavailableError",
    "RequestCancelledError",
    "ServeException",
]


class ServeException(Exception):
    """Base of Serve's errors (Ray: ``RayServeException``)."""


RayServeException = ServeException


class BackPressureError(ServeException):
    """A handle's queue is full (``max_queued_requests``); HTTP answers 503."""

    def __init__(self, *, num_queued_requests: int, max_queued_requests: int) -> None:
        self.num_queued_requests = num_queued_requests
        self.max_queued_requests = max_queued_requests
        super().__init__(
            f"Request dropped due to backpressure (num_queued_requests={num_queued_requests}, "
            f"max_queued_requests={max_queued_requests}). Add replicas, or raise "
            "max_queued_requests."
        )

    @property
    def message(self) -> str:
        """The error text."""
        return str(self)

    @property
    def status_code(self) -> int:
        """The HTTP status a proxy answers with."""
        return 503


class RequestCancelledError(ServeException):
    """The request was cancelled (``response.cancel()``) before it finished."""

    def __init__(self, request_id: str | None = None) -> None:
        self.request_id = request_id
        super().__init__(
            f"Request {request_id} was cancelled." if request_id else "Request was cancelled."
        )


class DeploymentUnavailableError(ServeException):
    """The deployment cannot take requests (it failed to deploy, or was deleted)."""

    def __init__(self, deployment: str, app: str, reason: str = "") -> None:
        self.deployment = deployment
        self.app = app
        super().__init__(
            f"Deployment {deployment!r} in application {app!r} is unavailable"
            + (f": {reason}" if reason else "")
        )

    @property
    def message(self) -> str:
        """The error text."""
        return str(self)


class ReplicaUnavailableError(ServeException):
    """The replica chosen for a request died before answering it."""

    def __init__(self, replica_id: str, reason: str = "") -> None:
        self.replica_id = replica_id
        super().__init__(f"Replica {replica_id} is unavailable" + (f": {reason}" if reason else ""))

    @property
    def message(self) -> str:
        """The error text."""
        return str(self)
