"""Read-only introspection of the cluster, plus the hooks the Jupyter layer plugs into.

This module is what ``nbcluster.jupyter`` (magics, reprs, widgets) and the server
extension use; they never reach into ``nbcluster._runtime``. Everything here needs a
connected driver (``nbcluster.init()``), except :func:`is_connected`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from collections.abc import Callable
from typing import Any

from nbcluster._refs import ObjectRef
from nbcluster._runtime import context
from nbcluster._runtime.protocol.errors import Peer, RpcFailure, to_exception
from nbcluster._runtime.protocol.rpc import pb
from nbcluster._runtime.version import __version__ as VERSION
from nbcluster._state_records import (
    ActorChange,
    ClusterEvent,
    EventBatch,
    EventSubscription,
    JobChange,
    NodeChange,
    NodeStats,
    ObjectInfo,
    OutputRecord,
    StoreChange,
    TaskEvent,
    event_of,
)

__all__ = [
    "VERSION",
    "TaskEvent",
    "OutputRecord",
    "ObjectInfo",
    "NodeStats",
    "is_connected",
    "session_info",
    "local_cluster",
    "actor_info",
    "cluster_status",
    "task_events",
    "node_stats",
    "owned_objects",
    "task_lineage",
    "LineageNode",
    "ref_info",
    "when_ready",
    "set_output_handler",
    "set_submit_context_provider",
    "set_interrupt_handler",
    "cancel_tasks",
    "pending_tasks",
    "autoscaler_status",
    "ActorChange",
    "ClusterEvent",
    "EventBatch",
    "EventSubscription",
    "JobChange",
    "NodeChange",
    "StoreChange",
    "subscribe_events",
    "actor_handle_info",
    "cancel_unreferenced_tasks",
    "code_version",
    "set_task_observer",
    "refresh_exported_code",
]

VERSION: str
"""nbcluster's version in this process (what the Jupyter layer records in a notebook)."""


def is_connected() -> bool:
    """True when this process has a driver connection."""
    return context.current_client() is not None


def session_info() -> dict[str, Any]:
    """Address, session directory and ids of the current connection."""
    client = context.require_client()
    info = client.info  # type: ignore[attr-defined]
    return {
        "address": info.address,
        "session_dir": info.session_dir,
        "node_id": info.node_id,
        "job_id": info.job_id,
        "started_here": info.started_here,
    }


def cluster_status(address: str, token_file: str, timeout: float = 5.0) -> dict[str, Any]:
    """A snapshot of a cluster read from its head, without connecting a driver.

    Works from any thread and inside a running event loop (it uses a blocking channel).
    Returns ``{"address", "session_dir", "nodes": [...], "total": {...}, "available":
    {...}, "store_used", "store_capacity", "num_workers", "pending_leases", "actors",
    "autoscaler"}`` (``autoscaler``: ``{"summary", "events"}``, or None without one).
    Raises ``HeadUnavailableError`` when the head cannot be reached.
    """
    from nbcluster._runtime import proc
    from nbcluster._runtime.protocol.rpc import SyncStub, make_sync_channel, pb_grpc

    token = proc.read_token(token_file)
    channel = make_sync_channel(address, token)
    try:
        head = SyncStub(pb_grpc.HeadStub(channel), token, address)
        try:
            info = head.GetClusterInfo(pb.Empty(), timeout=timeout)
            actors = head.ListActors(pb.Empty(), timeout=timeout)
        except RpcFailure as err:
            raise to_exception(err, Peer.HEAD, "status") from None
        autoscaler = _autoscaler_summary(channel, token, address, timeout)
    finally:
        channel.close()
    nodes = []
    total: dict[str, float] = {}
    available: dict[str, float] = {}
    for n in info.nodes:
        nodes.append(
            {
                "node_id": n.node_id.hex(),
                "name": n.node_name,
                "address": n.address,
                "total": dict(n.total),
                "available": dict(n.available),
                "store_used": n.store_used,
                "store_capacity": n.store_capacity,
                "num_workers": n.num_workers,
                "pending_leases": n.pending_leases,
                "running_tasks": n.leased_workers,
            }
        )
        for k, v in n.total.items():
            total[k] = total.get(k, 0.0) + v
        for k, v in n.available.items():
            available[k] = available.get(k, 0.0) + v
    return {
        "address": address,
        "session_dir": info.session_dir,
        "nodes": nodes,
        "total": total,
        "available": available,
        "store_used": sum(n["store_used"] for n in nodes),
        "store_capacity": sum(n["store_capacity"] for n in nodes),
        "num_workers": sum(n["num_workers"] for n in nodes),
        "pending_leases": sum(n["pending_leases"] for n in nodes),
        "running_tasks": sum(n["running_tasks"] for n in nodes),
        "actors": sum(1 for a in actors.actors if a.state != pb.ActorInfo.DEAD),
        "autoscaler": autoscaler,
    }


def _autoscaler_summary(
    channel: Any, token: str, address: str, timeout: float
) -> dict[str, Any] | None:
    """``{"summary", "events": [{"time", "kind", "message"}]}`` (the last 5), or None when
    the cluster has no autoscaler (for :func:`cluster_status`)."""
    from nbcluster._runtime.protocol.protos import autoscaler_pb2, autoscaler_pb2_grpc
    from nbcluster._runtime.protocol.rpc import SyncStub
    from nbcluster.autoscaler.status import from_proto

    stub = SyncStub(autoscaler_pb2_grpc.AutoscalingStub(channel), token, address)
    try:
        reply = stub.GetAutoscalerStatus(autoscaler_pb2.StatusRequest(), timeout=timeout)
    except RpcFailure:
        return None
    st = from_proto(reply)
    if not st.enabled:
        return None
    events = [{"time": e.time, "kind": e.kind, "message": e.message} for e in st.events[-5:]]
    return {"summary": st.summary(), "events": events}


def actor_info(handle: Any) -> dict[str, Any] | None:
    """State, node, pid and restarts of an actor (None when the head does not know it)."""
    driver = context.current_driver()
    return None if driver is None else driver.actor_state(handle._actor_id)


def local_cluster() -> Any:
    """The :class:`~nbcluster.LocalCluster` this process started (None when it joined one)."""
    client = context.current_client()
    return None if client is None else getattr(client, "cluster", None)


def _call(fn: Callable[[Any], Any], what: str) -> Any:
    return context.require_driver().call_head(what, fn)


def task_events(job_id: str | None = None, limit: int = 0) -> tuple[list[TaskEvent], int]:
    """Finished task attempts known to the head (oldest first), and how many were dropped."""
    req = pb.GetTaskEventsRequest(job_id=bytes.fromhex(job_id) if job_id else b"", limit=limit)
    reply = _call(lambda h: h.GetTaskEvents(req, timeout=10), "GetTaskEvents")
    events = [
        TaskEvent(
            task_id=e.task_id.hex(),
            job_id=e.job_id.hex(),
            name=e.name,
            node_id=e.node_id.hex(),
            worker_id=e.worker_id.hex(),
            worker_pid=e.worker_pid,
            state=e.state,
            start_time=e.start_time,
            end_time=e.end_time,
            parent_task_id=e.parent_task_id.hex(),
            attempt=e.attempt,
        )
        for e in reply.events
    ]
    return events, reply.dropped


def node_stats() -> list[NodeStats]:
    """Every live node's resources and store use (as of its last heartbeat)."""
    reply = _call(lambda h: h.GetNodes(pb.GetNodesRequest(), timeout=10), "GetNodes")
    return [
        NodeStats(
            node_id=n.node_id.hex(),
            name=n.node_name,
            address=n.address,
            alive=n.alive,
            total=dict(n.total),
            available=dict(n.available),
            store_capacity=n.store_capacity,
            store_used=n.store_used,
            store_spilled=n.store_spilled,
            num_workers=n.num_workers,
        )
        for n in reply.nodes
    ]


def _object_info(oid: bytes, entry: Any) -> ObjectInfo:
    if entry.state == 0:
        state = "pending"
    elif entry.exc is not None or entry.is_error:
        state = "failed"
    else:
        state = "ready"
    return ObjectInfo(
        object_id=oid.hex(),
        state=state,
        size=entry.size,
        in_store=entry.in_store,
        node_id=entry.node_id.hex(),
        local_refs=entry.local,
    )


def owned_objects() -> list[ObjectInfo]:
    """Objects this driver owns, largest first."""
    client = context.require_client()
    with client.table.lock:
        items = [(oid, e) for oid, e in client.table.entries.items() if e.owned]
    infos = [_object_info(oid, e) for oid, e in items]
    infos.sort(key=lambda i: i.size, reverse=True)
    return infos


def when_ready(ref: ObjectRef, callback: Callable[[ObjectRef], None]) -> None:
    """Call ``callback(ref)`` once ``ref`` is ready (its value or its error is here).

    It runs at once when the ref is ready already, else on the runtime's I/O thread, at
    the moment the answer arrives: it must only hand off (set an event or a future, or
    ``loop.call_soon_threadsafe``), never block or ``get``. Libraries use it to learn of
    answers without a thread or a poll per ref.
    """
    client: Any = context.require_client()
    add = getattr(client, "add_ready_callback", None)
    if add is not None:
        add(ref, lambda: callback(ref))
        return

    def wait_then_call() -> None:  # client mode: the proxy holds the table; a thread waits
        with contextlib.suppress(Exception):
            client.wait([ref], 1, None)
        callback(ref)

    threading.Thread(target=wait_then_call, daemon=True, name="nbcluster-when-ready").start()


def ref_info(ref: ObjectRef) -> ObjectInfo | None:
    """State, size and location of ``ref`` as this process knows it (None if unknown)."""
    client = context.current_client()
    table = getattr(client, "table", None)  # client mode has no table here
    if table is None:
        return None
    entry = table.get(ref.binary())
    return None if entry is None else _object_info(ref.binary(), entry)


@dataclasses.dataclass(frozen=True)
class LineageNode:
    """A task in the graph behind some refs (from the owner's lineage records)."""

    task_id: str
    name: str
    state: str  # "pending", "running", "finished" or "failed"
    object_ids: tuple[str, ...]


def task_lineage(
    refs: list[ObjectRef], max_nodes: int = 2000
) -> tuple[list[LineageNode], list[tuple[str, str]]]:
    """The tasks that produce ``refs`` and, recursively, their arguments: (nodes, edges).

    Edges go from the task producing an argument to the task consuming it. Only what this
    process owns and still remembers is included (lineage ends at ``put`` objects and at
    arguments already freed).
    """
    client = context.require_client()
    table = client.table
    nodes: dict[bytes, LineageNode] = {}
    edges: set[tuple[str, str]] = set()
    todo = [r.binary() for r in refs]
    seen: set[bytes] = set()
    while todo and len(nodes) < max_nodes:
        oid = todo.pop()
        if oid in seen:
            continue
        seen.add(oid)
        entry = table.get(oid)
        rec = getattr(entry, "task", None) if entry is not None else None
        if rec is None or not hasattr(rec, "return_ids"):
            continue
        if rec.task_id not in nodes:
            entries = [table.get(o) for o in rec.return_ids]
            if any(e is not None and (e.exc is not None or e.is_error) for e in entries):
                st = "failed"
            elif all(e is not None and e.state == 1 for e in entries if e is not None):
                st = "finished"
            elif getattr(rec, "lease", None) is not None:
                st = "running"
            else:
                st = "pending"
            nodes[rec.task_id] = LineageNode(
                rec.task_id.hex(), rec.name, st, tuple(o.hex() for o in rec.return_ids)
            )
        for dep in rec.dep_ids + rec.nested_ids:
            dep_entry = table.get(dep)
            dep_rec = getattr(dep_entry, "task", None) if dep_entry is not None else None
            if dep_rec is not None and hasattr(dep_rec, "task_id"):
                edges.add((dep_rec.task_id.hex(), rec.task_id.hex()))
                todo.append(dep)
    return list(nodes.values()), sorted(edges)


def set_output_handler(handler: Callable[[Any, OutputRecord], None] | None) -> None:
    """Send task output to ``handler(submit_context, record)`` instead of printing it.

    ``submit_context`` is what the provider set with :func:`set_submit_context_provider`
    returned when the task was submitted (None for tasks submitted by other processes).
    The handler runs on the I/O thread; it must be quick and must not block.
    """
    from nbcluster._runtime.core.client import print_task_output

    client = context.require_client()
    if handler is None:
        client.output_handler = print_task_output
        return

    def adapt(ctx: Any, name: str, record: Any) -> None:
        handler(
            ctx,
            OutputRecord(
                task_name=name,
                stream=record.stream,
                text=record.text,
                dropped_lines=record.dropped_lines,
                pid=record.pid,
            ),
        )

    client.output_handler = adapt


def set_submit_context_provider(provider: Callable[[], Any] | None) -> None:
    """Record ``provider()`` with every task this driver submits (e.g. the current cell)."""
    context.require_client().submit_context = provider


def set_interrupt_handler(handler: Callable[[], None] | None) -> None:
    """Call ``handler()`` when ``get``/``wait`` is interrupted (KeyboardInterrupt)."""
    context.require_client().interrupt_handler = handler  # type: ignore[attr-defined]


def pending_tasks(predicate: Callable[[Any], bool] | None = None) -> list[str]:
    """Hex ids of this driver's unfinished tasks whose submit context matches ``predicate``."""
    client = context.require_client()
    while True:
        try:  # the I/O thread may change the table while we copy it
            with client.submitter._inbox_lock:  # just submitted, not yet on the loop
                inbox = list(client.submitter._inbox)
            recs = list(client.submitter.tasks.values()) + inbox
            break
        except RuntimeError:
            continue
    return [
        r.task_id.hex() for r in recs if not r.done and (predicate is None or predicate(r.context))
    ]


def cancel_tasks(predicate: Callable[[Any], bool], force: bool = False) -> int:
    """Cancel this driver's unfinished tasks whose submit context matches; return how many."""
    client = context.require_client()
    ids = pending_tasks(predicate)
    for tid in ids:
        client.submitter.cancel(bytes.fromhex(tid), force)
    return len(ids)


def autoscaler_status(
    address: str | None = None, token_file: str | None = None, *, after_seq: int = 0
) -> Any:
    """What the cluster's autoscaler is doing: node types, demand, decisions and the
    scaling events after ``after_seq`` (an ``nbcluster.autoscaler.AutoscalerStatus``;
    ``enabled`` is False when no autoscaler reports to the head).

    Without ``address`` it asks the head of the current connection; with ``address`` and
    ``token_file`` it reads any cluster's head without connecting a driver (any thread).
    """
    from nbcluster._runtime import proc
    from nbcluster.autoscaler.status import read_status

    if address is None:
        client = context.require_client()
        address, token = client.head_address, client.token  # type: ignore[attr-defined]
    else:
        if token_file is None:
            raise ValueError("autoscaler_status(address=...) needs token_file= as well")
        token = proc.read_token(token_file)
    return read_status(address, token, after_seq=after_seq)


# -- the event stream (its records: nbcluster._state_records) -------------------------------


def subscribe_events(
    callback: Callable[[EventBatch], None],
    *,
    kinds: tuple[str, ...] = (),
    snapshot: bool = True,
    buffer: int = 0,
    job_id: str | None = None,
    address: str | None = None,
    token_file: str | None = None,
) -> EventSubscription:
    """Call ``callback(batch)`` with every :class:`EventBatch` the head pushes.

    ``kinds``: any of ``"task"``, ``"node"``, ``"actor"``, ``"job"``, ``"object"``,
    ``"autoscaler"`` (none: all). ``snapshot``: start with the current nodes, actors and jobs. ``buffer``: how many
    events the head keeps for this subscriber when it reads too slowly (0: the head's
    default, 4096); beyond that the oldest are dropped and a ``"dropped"`` event says how
    many. ``job_id``: only that job's task events.

    Without ``address`` it subscribes to the current connection's head (client mode
    included); with ``address`` and ``token_file`` to any cluster's head without
    connecting a driver. The callback runs on the subscription's own thread.
    """
    from nbcluster._runtime import proc
    from nbcluster._runtime.events import EventStream

    if address is None:
        client = context.require_client()
        address, token = client.head_address, client.token  # type: ignore[attr-defined]
    else:
        if token_file is None:
            raise ValueError("subscribe_events(address=...) needs token_file= as well")
        token = proc.read_token(token_file)

    def on_batch(batch: Any) -> None:
        events = tuple(ev for ev in map(event_of, batch.events) if ev is not None)
        callback(EventBatch(events, batch.snapshot, batch.head_id))

    stream = EventStream(
        address,
        token,
        on_batch,
        kinds=kinds,
        snapshot=snapshot,
        buffer=buffer,
        job_id=bytes.fromhex(job_id) if job_id else b"",
        on_disconnect=lambda reason: callback(EventBatch((), connected=False, error="")),
        on_error=lambda message: callback(EventBatch((), connected=False, error=message)),
    )
    return EventSubscription(stream)


# -- notebooks: code versions, the cells tasks come from, actors to remake (issue 13) ------------


def set_task_observer(observer: Callable[[str, str, Any], None] | None) -> None:
    """Call ``observer(task_id_hex, name, submit_context)`` for every task and actor call
    this driver submits, on the submitting thread (it must be quick); None removes it."""
    client = context.require_client()
    if observer is None:
        client.task_observer = None  # type: ignore[attr-defined]
        return

    def adapt(task_id: bytes, name: str, ctx: Any) -> None:
        observer(task_id.hex(), name, ctx)

    client.task_observer = adapt  # type: ignore[attr-defined]


def code_version(obj: Any) -> str:
    """A hash of the code of a remote function or actor class (hex).

    For a function it is the hash of the pickled function (its source and what its closure
    and globals hold): the key ``.remote()`` exports it under, so a changed definition is
    exported anew and workers never run an older copy. For an actor class it is the hash
    of its methods' code, defaults and simple class attributes (each class object pickles
    to different bytes, so the same class defined again keeps its version).
    """
    from nbcluster._actor import ActorClass
    from nbcluster._remote import RemoteFunction
    from nbcluster._runtime.serialization import dumps_code, function_hash

    if isinstance(obj, RemoteFunction):
        return function_hash(dumps_code(obj._function)).hex()
    if not isinstance(obj, ActorClass):
        raise TypeError(f"code_version() takes a remote function or actor class, not {obj!r:.60}")
    return function_hash(_class_fingerprint(obj._cls)).hex()


def _code_key(code: Any) -> str:
    """The parts of a code object that make its behaviour, as text (nested code included)."""
    consts = [_code_key(c) if hasattr(c, "co_code") else repr(c) for c in code.co_consts]
    return (
        f"{code.co_filename}:{code.co_firstlineno}:{code.co_code.hex()}:{consts}:"
        f"{code.co_names}:{code.co_varnames}"
    )


def _class_fingerprint(cls: type) -> bytes:
    parts = [f"{cls.__module__}.{cls.__qualname__}({[b.__qualname__ for b in cls.__bases__]})"]
    for name, value in sorted(vars(cls).items()):
        fn = value.__func__ if isinstance(value, staticmethod | classmethod) else value
        fn = fn.fget if isinstance(fn, property) else fn
        code = getattr(fn, "__code__", None)
        if code is not None:
            parts.append(f"{name}:{_code_key(code)}:{getattr(fn, '__defaults__', None)!r}")
        elif isinstance(value, int | float | str | bytes | bool | type(None) | tuple):
            parts.append(f"{name}={value!r}")
    return "\n".join(parts).encode()


def actor_handle_info(handle: Any) -> dict[str, Any]:
    """What this process knows of an actor handle, without asking the cluster:
    ``{"actor_id", "class_name", "code_version", "creation"}``. For actors made here,
    ``code_version`` is :func:`code_version` of the class they were made from and
    ``creation`` is ``{"actor_class", "args", "kwargs", "name", "namespace", "lifetime"}``;
    otherwise both are None."""
    client = context.current_client()
    made = getattr(client, "actor_creations", {}).get(handle._actor_id) if client else None
    creation = None
    version = None
    if made is not None:
        actor_class, args, kwargs, name, namespace, lifetime = made
        creation = {
            "actor_class": actor_class,
            "args": args,
            "kwargs": kwargs,
            "name": name,
            "namespace": namespace,
            "lifetime": lifetime,
        }
        version = code_version(actor_class)
    return {
        "actor_id": handle._actor_id.hex(),
        "class_name": handle._meta["class_name"],
        "code_version": version,
        "creation": creation,
    }


def cancel_unreferenced_tasks(predicate: Callable[[Any], bool]) -> int:
    """Cancel this driver's unfinished tasks whose submit context matches and whose results
    nothing in this process refers to any more; return how many."""
    import threading

    client = context.require_client()
    # Dropped refs are settled on the I/O loop, in order: once a callback queued now has
    # run there, every ref dropped before this call has been counted.
    settled = threading.Event()
    client.loop.call_soon_threadsafe(settled.set)
    settled.wait(5.0)
    ids = []
    for tid in pending_tasks(predicate):
        rec = client.submitter.tasks.get(bytes.fromhex(tid))
        if rec is not None and all(client.table.get(oid) is None for oid in rec.return_ids):
            ids.append(tid)
    for tid in ids:
        client.submitter.cancel(bytes.fromhex(tid), False)
    return len(ids)


def refresh_exported_code() -> None:
    """Make every remote function and actor class pickle itself again when next used, e.g.
    after a module reload changed the code they refer to (each is exported under the
    hash of what it pickles to, so workers then run the new code)."""
    from nbcluster._remote import refresh_exported_code as refresh

    refresh()
