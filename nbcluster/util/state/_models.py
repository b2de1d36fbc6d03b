"""The records the state API returns (Ray's ``ray.util.state.common`` names and fields).

Fields listed in a class's ``DETAIL`` are filled only with ``detail=True`` (else None), as
Ray does. Times are Unix timestamps in milliseconds.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

__all__ = [
    "ActorState",
    "JobState",
    "NodeState",
    "ObjectState",
    "PlacementGroupState",
    "StateRecord",
    "TaskState",
    "WorkerState",
]


@dataclasses.dataclass(frozen=True)
class StateRecord:
    """Base of the state records: dict conversion and the detail-only fields."""

    DETAIL: ClassVar[frozenset[str]] = frozenset()

    def asdict(self) -> dict[str, Any]:
        """The record as a plain dict."""
        return dataclasses.asdict(self)

    def brief(self) -> StateRecord:
        """A copy with the detail-only fields set to None."""
        return dataclasses.replace(self, **{name: None for name in self.DETAIL})


@dataclasses.dataclass(frozen=True)
class ActorState(StateRecord):
    """An actor as the head knows it."""

    actor_id: str
    class_name: str
    state: str  # PENDING_CREATION, ALIVE, RESTARTING, DEAD
    job_id: str
    name: str
    node_id: str
    pid: int
    ray_namespace: str
    num_restarts: int = 0
    is_detached: bool | None = None
    death_cause: str | None = None
    max_restarts: int | None = None
    worker_id: str | None = None
    start_time_ms: int | None = None
    end_time_ms: int | None = None

    DETAIL: ClassVar[frozenset[str]] = frozenset(
        {"is_detached", "death_cause", "max_restarts", "worker_id", "start_time_ms", "end_time_ms"}
    )


@dataclasses.dataclass(frozen=True)
class TaskState(StateRecord):
    """One attempt of a task (its latest known state)."""

    task_id: str
    attempt_number: int
    name: str
    state: str  # FINISHED, FAILED, RUNNING, SUBMITTED_TO_WORKER, PENDING_* (Ray's names)
    job_id: str
    actor_id: str | None
    type: str  # NORMAL_TASK, ACTOR_TASK
    func_or_class_name: str
    parent_task_id: str
    node_id: str | None
    worker_id: str | None
    worker_pid: int | None
    error_type: str | None
    error_message: str | None = None
    start_time_ms: int | None = None
    end_time_ms: int | None = None

    DETAIL: ClassVar[frozenset[str]] = frozenset({"start_time_ms", "end_time_ms"})


@dataclasses.dataclass(frozen=True)
class NodeState(StateRecord):
    """A node manager."""

    node_id: str
    node_ip: str
    is_head_node: bool
    state: str  # ALIVE, DEAD
    state_message: str | None
    node_name: str
    resources_total: dict[str, float]
    resources_available: dict[str, float] | None = None
    object_store_used_bytes: int | None = None
    num_workers: int | None = None
    start_time_ms: int | None = None

    DETAIL: ClassVar[frozenset[str]] = frozenset(
        {"resources_available", "object_store_used_bytes", "num_workers", "start_time_ms"}
    )


@dataclasses.dataclass(frozen=True)
class JobState(StateRecord):
    """A job: a submission (``nbcluster job submit``) or a driver (``init()``)."""

    submission_id: str | None
    job_id: str | None
    type: str  # SUBMISSION, DRIVER
    status: str
    entrypoint: str
    message: str | None = None
    error_type: str | None = None
    driver_exit_code: int | None = None
    start_time: int | None = None
    end_time: int | None = None
    metadata: dict[str, str] | None = None
    runtime_env: dict[str, Any] | None = None

    DETAIL: ClassVar[frozenset[str]] = frozenset({"metadata", "runtime_env"})


@dataclasses.dataclass(frozen=True)
class WorkerState(StateRecord):
    """A worker process of a node."""

    worker_id: str
    is_alive: bool
    worker_type: str  # WORKER
    state: str  # STARTING, IDLE, LEASED
    node_id: str
    ip: str
    pid: int
    runtime_env_hash: str | None = None
    job_id: str | None = None

    DETAIL: ClassVar[frozenset[str]] = frozenset({"runtime_env_hash", "job_id"})


@dataclasses.dataclass(frozen=True)
class ObjectState(StateRecord):
    """An object in a node's store (small values live in their owner and are not listed)."""

    object_id: str
    object_size: int
    task_status: str  # SEALED, SPILLED, CREATING
    reference_type: str  # PRIMARY_COPY, SECONDARY_COPY
    node_id: str
    ip: str
    owner_address: str | None = None

    DETAIL: ClassVar[frozenset[str]] = frozenset({"owner_address"})


@dataclasses.dataclass(frozen=True)
class PlacementGroupState(StateRecord):
    """A placement group."""

    placement_group_id: str
    name: str
    creator_job_id: str
    state: str  # PENDING, CREATED, REMOVED
    strategy: str
    bundles: list[dict[str, Any]] | None = None
    is_detached: bool | None = None
    state_message: str | None = None

    DETAIL: ClassVar[frozenset[str]] = frozenset({"bundles", "is_detached", "state_message"})
