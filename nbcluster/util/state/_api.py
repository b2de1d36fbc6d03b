"""``list_*``, ``get_*`` and ``summarize_*``: what the cluster is running and has run.

Each call asks the cluster's head (``address`` as for the job client: None means the
connected cluster, else ``NBCLUSTER_ADDRESS``, else the newest local one). ``filters`` is
a list of ``(key, "=" | "!=", value)`` tuples compared as strings (case-insensitive),
``limit`` caps the result (default 100), ``detail=True`` fills the detail-only fields.
"""

from __future__ import annotations

import dataclasses
import json
import warnings
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

from nbcluster import _connect
from nbcluster._connect import HeadClient as HeadJobsClient
from nbcluster.util.state._models import (
    ActorState,
    JobState,
    NodeState,
    ObjectState,
    PlacementGroupState,
    StateRecord,
    TaskState,
    WorkerState,
)

__all__ = [
    "DEFAULT_LIMIT",
    "get_actor",
    "get_job",
    "get_node",
    "get_placement_group",
    "get_task",
    "get_worker",
    "list_actors",
    "list_jobs",
    "list_nodes",
    "list_objects",
    "list_placement_groups",
    "list_tasks",
    "list_workers",
    "summarize_actors",
    "summarize_objects",
    "summarize_tasks",
]

DEFAULT_LIMIT = 100
Filter = tuple[str, str, Any]
R = TypeVar("R", bound=StateRecord)

_ACTOR_STATES = {0: "PENDING_CREATION", 1: "ALIVE", 2: "RESTARTING", 3: "DEAD"}
_PG_STATES = {0: "PENDING", 1: "CREATED", 2: "REMOVED"}


def _ms(seconds: float) -> int | None:
    return int(seconds * 1000) if seconds else None


def _with_head(address: str | None, timeout: float, fn: Callable[[HeadJobsClient], Any]) -> Any:
    head = _connect.connect(address, timeout=timeout)
    try:
        return fn(head)
    finally:
        head.close()


def _check_filters(cls: type[StateRecord], filters: Sequence[Filter] | None) -> list[Filter]:
    names = [f.name for f in dataclasses.fields(cls)]
    out = []
    for item in filters or ():
        if not isinstance(item, tuple | list) or len(item) != 3:
            raise ValueError(
                f"a filter is a (key, predicate, value) tuple such as ('state', '=', 'ALIVE'), got {item!r}"
            )
        key, pred, value = item
        if key not in names:
            raise ValueError(
                f"Given filter column {key!r} is not supported for {cls.__name__}. "
                f"Supported filter columns: {', '.join(names)}"
            )
        if pred not in ("=", "!="):
            raise ValueError(f"filter predicate must be '=' or '!=', got {pred!r}")
        out.append((key, pred, value))
    return out


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return "" if value is None else str(value).lower()


def _select(
    records: Iterable[R], cls: type[R], filters: Sequence[Filter] | None, limit: int, detail: bool
) -> list[R]:
    checked = _check_filters(cls, filters)
    if not isinstance(limit, int) or isinstance(limit, bool) or limit < 0:
        raise ValueError(f"limit must be a non-negative integer, got {limit!r}")
    out: list[R] = []
    for rec in records:
        keep = True
        for key, pred, value in checked:
            equal = _text(getattr(rec, key)) == _text(value)
            if equal != (pred == "="):
                keep = False
                break
        if keep:
            out.append(rec if detail else rec.brief())  # type: ignore[arg-type]
            if len(out) >= limit:
                break
    return out


# -- conversions -----------------------------------------------------------------------------
def _actor(a: Any) -> ActorState:
    return ActorState(
        actor_id=a.actor_id.hex(),
        class_name=a.class_name,
        state=_ACTOR_STATES.get(a.state, str(a.state)),
        job_id=a.job_id.hex(),
        name=a.name,
        node_id=a.node_id.hex(),
        pid=a.worker_pid,
        ray_namespace=a.namespace,
        num_restarts=a.num_restarts,
        is_detached=a.detached,
        death_cause=a.death_cause or None,
        max_restarts=a.max_restarts,
        worker_id=a.worker_id.hex() or None,
        start_time_ms=_ms(a.start_time),
        end_time_ms=_ms(a.end_time),
    )


# How far along an attempt is (Ray's TaskStatus names): of two records of one attempt
# (the owner's snapshot may lag the worker's report), the one further along wins.
_STATE_RANK = {
    "PENDING_ARGS_AVAIL": 0,
    "PENDING_NODE_ASSIGNMENT": 0,
    "PENDING_ACTOR_TASK_ORDERING_OR_CONCURRENCY": 0,
    "SUBMITTED_TO_WORKER": 1,
    "RUNNING": 2,
}
_LAST = 2**62  # live attempts sort after the finished ones


def _progress(e: Any) -> tuple[int, float]:
    return (_STATE_RANK.get(e.state, 3), e.end_time or e.start_time)


def _tasks(events: Iterable[Any]) -> list[TaskState]:
    latest: dict[tuple[bytes, int], Any] = {}
    for e in events:
        key = (e.task_id, e.attempt)
        prev = latest.get(key)
        if prev is None or _progress(e) >= _progress(prev):
            latest[key] = e
    out = []
    for e in latest.values():
        out.append(
            TaskState(
                task_id=e.task_id.hex(),
                attempt_number=e.attempt,
                name=e.name,
                state=e.state,
                job_id=e.job_id.hex(),
                actor_id=e.actor_id.hex() or None,
                type="ACTOR_TASK" if e.actor_id else "NORMAL_TASK",
                func_or_class_name=e.name,
                parent_task_id=e.parent_task_id.hex(),
                node_id=e.node_id.hex() or None,
                worker_id=e.worker_id.hex() or None,
                worker_pid=e.worker_pid or None,
                error_type=e.error_type or None,
                error_message=e.error_message or None,
                start_time_ms=_ms(e.start_time),
                end_time_ms=_ms(e.end_time),
            )
        )
    out.sort(key=lambda t: (t.end_time_ms or t.start_time_ms or _LAST, t.attempt_number))
    return out


def _all_tasks(head: HeadJobsClient) -> list[TaskState]:
    finished, _ = head.task_events()
    live, not_listed = head.live_tasks()
    if not_listed:
        warnings.warn(
            f"{not_listed} waiting task(s) are not listed: an owner reports its "
            "1000 oldest waiting tasks only",
            stacklevel=4,
        )
    return _tasks([*finished, *live])


def _nodes(nodes: Sequence[Any], head_address: str) -> list[NodeState]:
    head_host = head_address.rsplit(":", 1)[0]
    head_node = next(
        (
            n.node_id
            for n in sorted(nodes, key=lambda n: n.start_time)
            if n.address.rsplit(":", 1)[0] == head_host
        ),
        b"",
    )
    return [
        NodeState(
            node_id=n.node_id.hex(),
            node_ip=n.address.rsplit(":", 1)[0],
            is_head_node=n.node_id == head_node,
            state="ALIVE" if n.alive else "DEAD",
            state_message=n.death_reason or None,
            node_name=n.node_name,
            resources_total=dict(n.total),
            resources_available=dict(n.available),
            object_store_used_bytes=n.store_used,
            num_workers=n.num_workers,
            start_time_ms=_ms(n.start_time),
        )
        for n in nodes
    ]


def _jobs(head: HeadJobsClient) -> list[JobState]:
    out = []
    linked = set()
    for d in head.list_jobs():
        if d.job_id:
            linked.add(d.job_id)
        out.append(
            JobState(
                submission_id=d.submission_id,
                job_id=d.job_id or None,
                type="SUBMISSION",
                status=d.status,
                entrypoint=d.entrypoint,
                message=d.message or None,
                error_type=d.error_type or None,
                driver_exit_code=d.driver_exit_code if d.has_exit_code else None,
                start_time=_ms(d.start_time),
                end_time=_ms(d.end_time),
                metadata=dict(d.metadata),
                runtime_env=json.loads(d.runtime_env) if d.runtime_env else {},
            )
        )
    for j in head.drivers():
        if j.job_id.hex() in linked:
            continue
        out.append(
            JobState(
                submission_id=None,
                job_id=j.job_id.hex(),
                type="DRIVER",
                status="RUNNING" if j.alive else "SUCCEEDED",
                entrypoint=j.entrypoint,
                start_time=_ms(j.start_time),
                end_time=_ms(j.end_time),
                metadata={},
                runtime_env={},
            )
        )
    return out


def _workers(head: HeadJobsClient) -> list[WorkerState]:
    return [
        WorkerState(
            worker_id=w.worker_id.hex(),
            is_alive=True,
            worker_type="WORKER",
            state=w.state,
            node_id=w.node_id.hex(),
            ip=w.address.rsplit(":", 1)[0],
            pid=w.pid,
            runtime_env_hash=w.runtime_env_hash or None,
            job_id=w.lease_owner_job.hex() or None,
        )
        for w in head.workers()
    ]


def _objects(head: HeadJobsClient) -> list[ObjectState]:
    ips = {n.node_id: n.address.rsplit(":", 1)[0] for n in head.nodes()}
    return [
        ObjectState(
            object_id=o.object_id.hex(),
            object_size=o.size,
            task_status=o.state,
            reference_type="PRIMARY_COPY" if o.primary else "SECONDARY_COPY",
            node_id=o.node_id.hex(),
            ip=ips.get(o.node_id, ""),
            owner_address=o.owner_address or None,
        )
        for o in head.objects()
    ]


def _pgs(head: HeadJobsClient) -> list[PlacementGroupState]:
    return [
        PlacementGroupState(
            placement_group_id=g.pg_id.hex(),
            name=g.name,
            creator_job_id=g.job_id.hex(),
            state=_PG_STATES.get(g.state, str(g.state)),
            strategy=g.strategy,
            bundles=[
                {
                    "bundle_id": i,
                    "unit_resources": dict(b.resources),
                    "node_id": (g.bundle_node_ids[i].hex() if i < len(g.bundle_node_ids) else None),
                }
                for i, b in enumerate(g.bundles)
            ],
            is_detached=g.detached,
            state_message=g.message or None,
        )
        for g in head.placement_groups()
    ]


# -- list ------------------------------------------------------------------------------------
def list_actors(
    address: str | None = None,
    filters: Sequence[Filter] | None = None,
    limit: int = DEFAULT_LIMIT,
    timeout: int = 30,
    detail: bool = False,
    raise_on_missing_output: bool = True,
) -> list[ActorState]:
    """Every actor of the cluster (alive and dead)."""
    actors = _with_head(address, timeout, lambda h: [_actor(a) for a in h.actors()])
    return _select(actors, ActorState, filters, limit, detail)


def list_tasks(
    address: str | None = None,
    filters: Sequence[Filter] | None = None,
    limit: int = DEFAULT_LIMIT,
    timeout: int = 30,
    detail: bool = False,
    raise_on_missing_output: bool = True,
) -> list[TaskState]:
    """Task attempts, finished ones first (oldest first), then live ones.

    ``state`` is Ray's: ``FINISHED``, ``FAILED`` (with the cause, also for an attempt whose
    worker was killed, which its owner records), ``RUNNING`` (an attempt still running when
    its worker reports, once a second), and for tasks that have waited more than a second
    ``PENDING_ARGS_AVAIL``, ``PENDING_NODE_ASSIGNMENT``,
    ``PENDING_ACTOR_TASK_ORDERING_OR_CONCURRENCY`` or ``SUBMITTED_TO_WORKER``.
    """
    tasks = _with_head(address, timeout, _all_tasks)
    return _select(tasks, TaskState, filters, limit, detail)


def list_nodes(
    address: str | None = None,
    filters: Sequence[Filter] | None = None,
    limit: int = DEFAULT_LIMIT,
    timeout: int = 30,
    detail: bool = False,
    raise_on_missing_output: bool = True,
) -> list[NodeState]:
    """Every node the cluster has known, alive or dead."""
    nodes = _with_head(address, timeout, lambda h: _nodes(h.nodes(), h.address))
    return _select(nodes, NodeState, filters, limit, detail)


def list_jobs(
    address: str | None = None,
    filters: Sequence[Filter] | None = None,
    limit: int = DEFAULT_LIMIT,
    timeout: int = 30,
    detail: bool = False,
    raise_on_missing_output: bool = True,
) -> list[JobState]:
    """Submitted jobs, then the other drivers that attached to the cluster."""
    jobs = _with_head(address, timeout, _jobs)
    return _select(jobs, JobState, filters, limit, detail)


def list_workers(
    address: str | None = None,
    filters: Sequence[Filter] | None = None,
    limit: int = DEFAULT_LIMIT,
    timeout: int = 30,
    detail: bool = False,
    raise_on_missing_output: bool = True,
) -> list[WorkerState]:
    """The worker processes of every live node."""
    workers = _with_head(address, timeout, _workers)
    return _select(workers, WorkerState, filters, limit, detail)


def list_objects(
    address: str | None = None,
    filters: Sequence[Filter] | None = None,
    limit: int = DEFAULT_LIMIT,
    timeout: int = 30,
    detail: bool = False,
    raise_on_missing_output: bool = True,
) -> list[ObjectState]:
    """Objects in the nodes' stores (values under 100 KiB live in their owner, unlisted)."""
    objects = _with_head(address, timeout, _objects)
    return _select(objects, ObjectState, filters, limit, detail)


def list_placement_groups(
    address: str | None = None,
    filters: Sequence[Filter] | None = None,
    limit: int = DEFAULT_LIMIT,
    timeout: int = 30,
    detail: bool = False,
    raise_on_missing_output: bool = True,
) -> list[PlacementGroupState]:
    """Every placement group the head knows."""
    groups = _with_head(address, timeout, _pgs)
    return _select(groups, PlacementGroupState, filters, limit, detail)


# -- get -------------------------------------------------------------------------------------
def _one(records: list[R], key: str, value: str) -> R | None:
    value = value.lower()
    exact = [r for r in records if str(getattr(r, key)).lower() == value]
    if exact:
        return exact[-1]
    prefix = [r for r in records if len(value) >= 6 and str(getattr(r, key)).startswith(value)]
    return prefix[-1] if len(prefix) == 1 or (prefix and key == "task_id") else None


def get_actor(id: str, address: str | None = None, timeout: int = 30) -> ActorState | None:
    """One actor by id (a unique prefix of at least 6 hex digits works too), or None."""
    return _one(list_actors(address, limit=10**9, timeout=timeout, detail=True), "actor_id", id)


def get_task(id: str, address: str | None = None, timeout: int = 30) -> TaskState | None:
    """The latest recorded attempt of a task, or None."""
    tasks = list_tasks(address, limit=10**9, timeout=timeout, detail=True)
    found = [
        t
        for t in tasks
        if t.task_id == id.lower() or (len(id) >= 6 and t.task_id.startswith(id.lower()))
    ]
    return max(found, key=lambda t: t.attempt_number) if found else None


def get_node(id: str, address: str | None = None, timeout: int = 30) -> NodeState | None:
    """One node by id, or None."""
    return _one(list_nodes(address, limit=10**9, timeout=timeout, detail=True), "node_id", id)


def get_job(id: str, address: str | None = None, timeout: int = 30) -> JobState | None:
    """One job by submission id or driver job id, or None."""
    jobs = list_jobs(address, limit=10**9, timeout=timeout, detail=True)
    return _one(jobs, "submission_id", id) or _one(jobs, "job_id", id)


def get_placement_group(
    id: str, address: str | None = None, timeout: int = 30
) -> PlacementGroupState | None:
    """One placement group by id, or None."""
    groups = list_placement_groups(address, limit=10**9, timeout=timeout, detail=True)
    return _one(groups, "placement_group_id", id)


def get_worker(id: str, address: str | None = None, timeout: int = 30) -> WorkerState | None:
    """One live worker by id, or None."""
    return _one(list_workers(address, limit=10**9, timeout=timeout, detail=True), "worker_id", id)


# -- summaries ---------------------------------------------------------------------------------
def summarize_tasks(
    address: str | None = None, timeout: int = 30, raise_on_missing_output: bool = True
) -> dict[str, Any]:
    """Task counts by function and state (each task's latest attempt)."""
    tasks = list_tasks(address, limit=10**9, timeout=timeout)
    latest: dict[str, TaskState] = {}
    for t in tasks:
        if t.task_id not in latest or t.attempt_number >= latest[t.task_id].attempt_number:
            latest[t.task_id] = t
    summary: dict[str, dict[str, Any]] = {}
    for t in latest.values():
        entry = summary.setdefault(
            t.func_or_class_name,
            {"func_or_class_name": t.func_or_class_name, "type": t.type, "state_counts": {}},
        )
        entry["state_counts"][t.state] = entry["state_counts"].get(t.state, 0) + 1
    return {
        "cluster": {
            "summary": summary,
            "total_tasks": sum(1 for t in latest.values() if t.type == "NORMAL_TASK"),
            "total_actor_tasks": sum(1 for t in latest.values() if t.type == "ACTOR_TASK"),
            "total_actor_scheduled": 0,
            "summary_by": "func_name",
        }
    }


def summarize_actors(
    address: str | None = None, timeout: int = 30, raise_on_missing_output: bool = True
) -> dict[str, Any]:
    """Actor counts by class and state."""
    actors = list_actors(address, limit=10**9, timeout=timeout)
    summary: dict[str, dict[str, Any]] = {}
    for a in actors:
        entry = summary.setdefault(a.class_name, {"class_name": a.class_name, "state_counts": {}})
        entry["state_counts"][a.state] = entry["state_counts"].get(a.state, 0) + 1
    return {"cluster": {"summary": summary, "total_actors": len(actors), "summary_by": "class"}}


def summarize_objects(
    address: str | None = None, timeout: int = 30, raise_on_missing_output: bool = True
) -> dict[str, Any]:
    """Objects in the stores: count and bytes per node and state."""
    objects = list_objects(address, limit=10**9, timeout=timeout)
    summary: dict[str, dict[str, Any]] = {}
    for o in objects:
        entry = summary.setdefault(
            o.node_id,
            {"node_id": o.node_id, "total_objects": 0, "total_size_bytes": 0, "state_counts": {}},
        )
        entry["total_objects"] += 1
        entry["total_size_bytes"] += o.object_size
        entry["state_counts"][o.task_status] = entry["state_counts"].get(o.task_status, 0) + 1
    return {
        "cluster": {
            "summary": summary,
            "total_objects": len(objects),
            "total_size_mb": sum(o.object_size for o in objects) / 2**20,
            "summary_by": "node",
        }
    }
