"""The driver API: ``init``, ``shutdown``, ``get``, ``put``, ``wait``, ``cancel`` and friends.

Names, defaults and errors follow Ray's. The process's core client lives in one slot
(``_runtime/context.py``), filled by :func:`init` and emptied by :func:`shutdown`.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import socket
import threading
import time
from collections.abc import Sequence
from typing import Any

from nbcluster import exceptions as exc
from nbcluster._generator import ObjectRefGenerator, wait_mixed
from nbcluster._refs import ObjectRef
from nbcluster._runtime import context, proc
from nbcluster._runtime.core.client import CoreClient
from nbcluster._runtime.protocol.errors import Peer, RpcError, to_exception
from nbcluster._runtime.protocol.rpc import pb
from nbcluster._runtime.runtime_env import driver as runtime_env_driver
from nbcluster._runtime.serialization import SerializedValue, serialize
from nbcluster.cluster import LocalCluster, find_session
from nbcluster.config import Config
from nbcluster.runtime_context import RuntimeContext, get_runtime_context

__all__ = [
    "init",
    "shutdown",
    "is_initialized",
    "get",
    "put",
    "wait",
    "cancel",
    "nodes",
    "cluster_resources",
    "available_resources",
    "get_runtime_context",
    "get_gpu_ids",
    "RuntimeContext",
    "ClusterInfo",
]

_init_lock = threading.RLock()


@dataclasses.dataclass(frozen=True)
class ClusterInfo:
    """What :func:`init` connected to."""

    address: str
    session_dir: str
    node_id: str
    job_id: str
    started_here: bool

    def __repr__(self) -> str:
        where = "started by this process" if self.started_here else "joined"
        return f"ClusterInfo(address={self.address!r}, {where}, session_dir={self.session_dir!r})"


def init(
    address: str | None = None,
    *,
    num_cpus: float | None = None,
    num_gpus: float | None = None,
    resources: dict[str, float] | None = None,
    object_store_memory: int | None = None,
    namespace: str | None = None,
    ignore_reinit_error: bool = False,
    runtime_env: dict[str, Any] | None = None,
    _nodes: int = 1,
    _node_configs: list[dict[str, Any]] | None = None,
    _system_config: dict[str, Any] | None = None,
) -> ClusterInfo:
    """Connect this process to a cluster, starting a local one when no address is given.

    ``address``: ``None`` starts a new local cluster (head + one node manager + warm
    workers) that ends with this process; ``"auto"`` joins the newest cluster started on
    this host; ``"host:port"`` joins the cluster whose head listens there (the token is
    read from ``NBCLUSTER_TOKEN``, ``NBCLUSTER_TOKEN_FILE``, or the local session).
    The ``NBCLUSTER_ADDRESS`` environment variable is used when ``address`` is None.
    ``runtime_env`` is the job's runtime environment: every task and actor inherits it.

    A second call raises ``RuntimeError`` unless ``ignore_reinit_error=True``, in which
    case it returns the current connection.
    """
    with _init_lock:
        client = context.current_client()
        if client is not None:
            if ignore_reinit_error:
                return client.info  # type: ignore[attr-defined, no-any-return]
            raise RuntimeError(
                "nbcluster.init() was already called in this process. Call nbcluster.shutdown() "
                "first, or pass ignore_reinit_error=True to keep the current connection."
            )
        _check_resources_arg(num_cpus, "num_cpus")
        _check_resources_arg(num_gpus, "num_gpus")
        if resources is not None and not isinstance(resources, dict):
            raise TypeError(
                f"resources must be a dict of name -> amount, got {type(resources).__name__}"
            )
        config = Config.from_env(**(_system_config or {}))
        runtime_env_driver.check_job_env(runtime_env)  # issue 17: bad input fails first
        address = address or os.environ.get("NBCLUSTER_ADDRESS") or None
        if address is not None and address.startswith("nbcluster://"):
            return _connect_client(address, config, runtime_env)
        cluster: LocalCluster | None = None
        if address is None:
            cluster = LocalCluster(
                num_cpus=num_cpus,
                num_gpus=num_gpus,
                resources=resources,
                object_store_memory=object_store_memory,
                nodes=_nodes,
                node_configs=_node_configs,
                env=config.to_env(),
            ).start()
            head_address, token = cluster.address, cluster.token
            session_dir = str(cluster.session_dir)
        else:
            if num_cpus is not None or num_gpus is not None or resources or object_store_memory:
                raise ValueError(
                    "num_cpus, num_gpus, resources and object_store_memory describe a new cluster; "
                    "they cannot be given when joining an existing one (address=...)"
                )
            head_address, token, session_dir = _resolve_address(address, config)
        try:
            env_json = runtime_env_driver.resolve_job_env(
                head_address, token, config.temp_dir, runtime_env
            )
            client = _connect(config, head_address, token, namespace or "")
        except BaseException:
            if cluster is not None:
                cluster.stop()
            raise
        runtime_env_driver.set_job_env(client, env_json)
        client.cluster = cluster  # type: ignore[attr-defined]
        client.info = ClusterInfo(  # type: ignore[attr-defined]
            address=head_address,
            session_dir=session_dir,
            node_id=client.node_id.hex(),
            job_id=client.job_id.hex(),
            started_here=cluster is not None,
        )
        context.set_client(client)
        # A clean exit also tells the head the job is over (a killed process is noticed by
        # the head's driver pings, and its own cluster by the parent-death pipe).
        import atexit

        atexit.register(shutdown)
        return client.info  # type: ignore[attr-defined, no-any-return]


def _connect_client(
    address: str, config: Config, runtime_env: dict[str, Any] | None = None
) -> ClusterInfo:
    """Client mode: every call goes through the head to a proxy driver on the head's host.

    ``runtime_env`` is resolved here, as Ray Client does: a local ``working_dir`` or
    ``py_modules`` is packed and uploaded to the head from this machine; every task and
    actor this client submits runs in it (merged with the call's own, Ray's rules).
    """
    from nbcluster._runtime.proxy.client import ProxyClient

    head_address, token, _ = _resolve_address(address, config)
    env_json = runtime_env_driver.resolve_job_env(head_address, token, config.temp_dir, runtime_env)
    client = ProxyClient(head_address, token, config.head_grace_period_s)
    client.config = config
    reply = client.connect()
    runtime_env_driver.set_job_env(client, env_json)
    client.info = ClusterInfo(  # type: ignore[assignment]
        address=head_address,
        session_dir=reply.get("session_dir", ""),
        node_id=reply.get("node_id", ""),
        job_id=reply.get("job_id", ""),
        started_here=False,
    )
    client.node_id = bytes.fromhex(reply.get("node_id", ""))  # type: ignore[attr-defined]
    client.job_id = bytes.fromhex(reply.get("job_id", ""))  # type: ignore[attr-defined]
    client.worker_id = b""  # type: ignore[attr-defined]
    context.set_client(client)  # type: ignore[arg-type]
    return client.info  # type: ignore[return-value]


def _is_client(client: Any) -> bool:
    return getattr(client, "mode", "") == "client"


def _check_resources_arg(value: Any, name: str) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise TypeError(f"{name} must be a non-negative number, got {value!r}")


def _resolve_address(address: str, config: Config) -> tuple[str, str, str]:
    if address.startswith("nbcluster://"):
        address = address[len("nbcluster://") :]
    session = find_session(address, config.temp_dir)
    if address == "auto":
        if session is None:
            raise ConnectionError(
                "address='auto' found no running cluster on this host; start one with "
                "`nbcluster start --head` or call nbcluster.init() without an address"
            )
        address = (session / proc.HEAD_ADDRESS_FILE).read_text().strip()
    if address.startswith("nbcluster://"):
        address = address[len("nbcluster://") :]
    token = os.environ.get("NBCLUSTER_TOKEN", "")
    if not token and os.environ.get("NBCLUSTER_TOKEN_FILE"):
        token = proc.read_token(os.environ["NBCLUSTER_TOKEN_FILE"])
    if not token and session is not None:
        token = proc.read_token(session / proc.TOKEN_FILE)
    if not token:
        raise exc.AuthenticationError(
            f"no token for the cluster at {address}: set NBCLUSTER_TOKEN, or NBCLUSTER_TOKEN_FILE "
            "to the path `nbcluster start` printed"
        )
    return address, token, str(session or "")


def _connect(config: Config, head_address: str, token: str, namespace: str) -> CoreClient:
    job_id = proc.new_id()
    client = CoreClient(
        mode="driver",
        config=config,
        token=token,
        head_address=head_address,
        node_address="",
        job_id=job_id,
        namespace=namespace,
    )
    client.start()
    try:
        client.run(_attach(client), timeout=30)
    except BaseException:
        client.stop()
        raise
    return client


async def _attach(client: CoreClient) -> None:
    from nbcluster._runtime.protocol.rpc import RetryingStub

    head = RetryingStub(
        client.head_once(), budget_s=5.0
    )  # a short grace: a wrong address fails fast
    try:
        info = await head.GetClusterInfo(pb.Empty(), timeout=10)
        me = socket.gethostname()
        local = _local_nodes(info.nodes)
        if not local:
            raise ConnectionError(
                f"the cluster at {client.head_address} has no node on this host ({me}); "
                "joining from another machine (client mode) is not available in this build"
            )
        node = local[0]
        client.node_address = node.address
        client.node_id = node.node_id
        client.store_dir = node.store_dir
        client.session_dir = info.session_dir
        await client.head().RegisterJob(
            pb.RegisterJobRequest(
                job=pb.JobInfo(
                    job_id=client.job_id,
                    driver_address=client.address,
                    driver_pid=os.getpid(),
                    namespace=client.namespace,
                    driver_hostname=me,
                )
            ),
            timeout=10,
        )
    except RpcError as err:
        raise to_exception(err, Peer.HEAD, "connect") from None


def _local_ips() -> set[str]:
    import psutil

    ips = {"127.0.0.1", "::1", "localhost"}
    for addrs in psutil.net_if_addrs().values():
        for a in addrs:
            if a.family in (socket.AF_INET, socket.AF_INET6):
                ips.add(a.address.split("%")[0])
    return ips


def _local_nodes(nodes: Sequence[Any]) -> list[Any]:
    """Nodes whose manager listens on an address of this machine (or namespace) and whose
    store directory this process can see, so it can map their objects."""
    forced = os.environ.get("NBCLUSTER_NODE_ADDRESS")
    if forced:
        return [n for n in nodes if n.address == forced]
    ips = _local_ips()
    return [
        n
        for n in nodes
        if n.address.rsplit(":", 1)[0].strip("[]") in ips and os.path.isdir(n.store_dir)
    ]


def shutdown() -> None:
    """Disconnect; if :func:`init` started the cluster, stop it (no process is left)."""
    with _init_lock:
        client = context.current_client()
        if client is None:
            return
        context.set_client(None)
        if _is_client(client):
            client.stop()
            return
        with contextlib.suppress(Exception):
            client.run(
                lambda: client.head_once().FinishJob(pb.JobRef(job_id=client.job_id), timeout=2),
                timeout=3,
            )
        client.stop()
        cluster: LocalCluster | None = getattr(client, "cluster", None)
        if cluster is not None:
            cluster.stop()


def is_initialized() -> bool:
    """True after :func:`init` and before :func:`shutdown`."""
    return context.current_client() is not None


def _client_or_autoinit() -> CoreClient:
    client = context.current_client()
    if client is None:
        init(ignore_reinit_error=True)
        client = context.require_client()
    return client


def _as_ref_list(refs: Any, fn: str) -> tuple[list[ObjectRef], bool]:
    if isinstance(refs, ObjectRef):
        return [refs], True
    if isinstance(refs, ObjectRefGenerator):
        raise TypeError(
            f"{fn}() does not take an ObjectRefGenerator: iterate it (for ref in gen) and "
            f"pass the refs it gives, or {fn}(gen.completed()) for the end of its task"
        )
    if isinstance(refs, (list, tuple)):
        for i, r in enumerate(refs):
            if not isinstance(r, ObjectRef):
                raise TypeError(
                    f"{fn}() expects ObjectRefs, but item {i} is a {type(r).__name__}; "
                    "pass refs returned by f.remote() or nbcluster.put()"
                )
        return list(refs), False
    raise TypeError(
        f"{fn}() expects an ObjectRef or a list of ObjectRefs, got {type(refs).__name__}"
    )


def _self_resolving(refs: Any) -> Any:
    """For refs that resolve themselves (``_nbcluster_get_(timeout)``, such as
    ``CompiledDAGRef``), or a list of them: a function of the timeout giving the value(s)."""
    if hasattr(type(refs), "_nbcluster_get_"):
        return refs._nbcluster_get_
    if (
        isinstance(refs, (list, tuple))
        and refs
        and all(hasattr(type(r), "_nbcluster_get_") for r in refs)
    ):
        return lambda timeout: [r._nbcluster_get_(timeout) for r in refs]
    return None


def get(object_refs: ObjectRef | Sequence[ObjectRef], *, timeout: float | None = None) -> Any:
    """Block until the value(s) are ready and return them.

    A single ref gives a value; a list gives a list. A task's exception is raised as
    :class:`~nbcluster.exceptions.TaskError`, which is also an instance of the original
    exception class. ``timeout`` (seconds) raises :class:`GetTimeoutError`; the tasks keep
    running. Numpy arrays in the object store come back as read-only zero-copy views.
    """
    resolve = _self_resolving(object_refs)
    if resolve is not None:  # compiled-graph refs read their own channels
        return resolve(timeout)
    client = context.require_client()
    refs, single = _as_ref_list(object_refs, "get")
    if timeout is not None and timeout < 0:
        raise ValueError(f"timeout must be >= 0 or None, got {timeout}")
    if _is_client(client):
        values = client.get(refs, timeout)  # type: ignore[attr-defined]
        return values[0] if single else values
    entries = client.ensure_tracked(refs)
    deadline = None if timeout is None else time.monotonic() + timeout
    _interruptible_wait(client, entries, len(entries), deadline)
    missing = sum(1 for e in entries if e.state != 1)
    if missing:
        raise exc.GetTimeoutError(
            f"get() timed out after {timeout}s: {missing} of {len(entries)} object(s) are not ready. "
            "The tasks keep running; call get() again later, or cancel() them."
        )
    values = [client.get_value(r, e, deadline) for r, e in zip(refs, entries, strict=True)]
    return values[0] if single else values


async def get_async(ref: ObjectRef) -> Any:
    """Await a ref's value from asyncio code (``await ref`` uses this)."""
    client = context.require_client()
    getter = getattr(client, "get_async", None)
    if getter is not None:
        return await getter(ref)
    return await asyncio.wrap_future(client.as_future(ref))


def _interruptible_wait(client: CoreClient, entries: Any, n: int, deadline: float | None) -> None:
    try:
        client.wait_entries(entries, n, deadline)
    except KeyboardInterrupt:
        handler = getattr(client, "interrupt_handler", None)
        if handler is not None:
            handler()
        raise


def put(value: Any) -> ObjectRef:
    """Store ``value`` in the cluster and return a ref to it.

    Small values stay in this process; large ones (over 100 KiB) go to the local node's
    shared-memory store, from which ``get`` maps numpy arrays without copying.
    """
    if isinstance(value, ObjectRef):
        raise TypeError(
            "nbcluster.put() was given an ObjectRef; refs can be passed to tasks directly, "
            "or wrap it in a list if you need a ref to a ref"
        )
    client = _client_or_autoinit()
    if _is_client(client):
        return client.put(value)  # type: ignore[attr-defined, no-any-return]
    return _put_serialized(client, serialize(value))


def _put_serialized(client: CoreClient, sv: SerializedValue) -> ObjectRef:
    oid, _ = client.put_serialized(sv)
    return ObjectRef._new(oid, client.address, client)


def wait(
    object_refs: Sequence[ObjectRef],
    *,
    num_returns: int = 1,
    timeout: float | None = None,
    fetch_local: bool = True,
) -> tuple[list[ObjectRef], list[ObjectRef]]:
    """Wait until ``num_returns`` of the refs are ready or ``timeout`` seconds pass.

    Returns ``(ready, not_ready)``, each in the order of ``object_refs``; ``ready`` holds
    at most ``num_returns`` refs.
    """
    client = context.require_client()
    if isinstance(object_refs, ObjectRef):
        raise TypeError("wait() expects a list of ObjectRefs; wrap a single ref in a list")
    if isinstance(object_refs, (list, tuple)) and any(
        isinstance(r, ObjectRefGenerator) for r in object_refs
    ):
        return _wait_generators(client, object_refs, num_returns, timeout)
    refs, _ = _as_ref_list(object_refs, "wait")
    if len(set(refs)) != len(refs):
        raise ValueError("wait() was given the same ObjectRef more than once")
    if not isinstance(num_returns, int) or isinstance(num_returns, bool) or num_returns < 0:
        raise TypeError(f"num_returns must be a non-negative int, got {num_returns!r}")
    if num_returns > len(refs):
        raise ValueError(
            f"num_returns ({num_returns}) cannot exceed the number of refs passed to wait() ({len(refs)})"
        )
    if timeout is not None and timeout < 0:
        raise ValueError(f"timeout must be >= 0 or None, got {timeout}")
    if _is_client(client):
        ready_ids = set(client.wait(refs, num_returns, timeout))  # type: ignore[attr-defined]
        ready_refs = [r for r in refs if r.binary() in ready_ids][:num_returns]
        return ready_refs, [r for r in refs if r not in ready_refs]
    entries = client.ensure_tracked(refs)
    deadline = None if timeout is None else time.monotonic() + timeout
    _interruptible_wait(client, entries, num_returns, deadline)
    ready, not_ready = [], []
    for r, e in zip(refs, entries, strict=True):
        if e.state == 1 and len(ready) < num_returns:
            ready.append(r)
        else:
            not_ready.append(r)
    return ready, not_ready


def _wait_generators(
    client: CoreClient, items: Sequence[Any], num_returns: int, timeout: float | None
) -> tuple[list[Any], list[Any]]:
    """``wait`` over refs and ``ObjectRefGenerator``s (ready: ``next`` would not block)."""
    for i, r in enumerate(items):
        if not isinstance(r, (ObjectRef, ObjectRefGenerator)):
            raise TypeError(
                f"wait() expects ObjectRefs or ObjectRefGenerators, but item {i} is a "
                f"{type(r).__name__}"
            )
    refs = [r for r in items if isinstance(r, ObjectRef)]
    if len({id(r) for r in items}) != len(items) or len(set(refs)) != len(refs):
        raise ValueError("wait() was given the same ObjectRef more than once")
    if not isinstance(num_returns, int) or isinstance(num_returns, bool) or num_returns < 0:
        raise TypeError(f"num_returns must be a non-negative int, got {num_returns!r}")
    if num_returns > len(items):
        raise ValueError(
            f"num_returns ({num_returns}) cannot exceed the number of refs passed to wait() ({len(items)})"
        )
    if timeout is not None and timeout < 0:
        raise ValueError(f"timeout must be >= 0 or None, got {timeout}")
    deadline = None if timeout is None else time.monotonic() + timeout
    return wait_mixed(client, items, num_returns, deadline)


def cancel(object_ref: ObjectRef, *, force: bool = False, recursive: bool = True) -> None:
    """Cancel the task that produces ``object_ref``.

    A queued task never runs; a running one gets ``KeyboardInterrupt`` (``force=True``
    kills its worker instead). ``get`` on it raises :class:`TaskCancelledError`.
    Cancelled tasks are not retried. Only the process that submitted the task can cancel it.

    An actor call (Ray's rules): a queued one never runs; a running async one gets
    ``asyncio.CancelledError`` at its ``await``; a running sync one is not interrupted, it
    only sees ``get_runtime_context().is_canceled()`` turn True. ``force=True`` is refused.
    """
    client = context.require_client()
    if isinstance(object_ref, ObjectRefGenerator):  # cancels the generator task
        object_ref = object_ref.completed()
    if not isinstance(object_ref, ObjectRef):
        raise TypeError(f"cancel() expects an ObjectRef, got {type(object_ref).__name__}")
    if _is_client(client):
        client.call("cancel", (object_ref, force))  # type: ignore[attr-defined]
        return
    if object_ref.owner_address != client.address:
        raise ValueError("only the process that submitted a task can cancel it")
    rec = client.submitter.tasks.get(object_ref.task_id())
    if force and rec is not None and rec.actor:  # Ray: actors keep state; kill the actor
        raise ValueError(
            "force=True is not supported for actor tasks: cancel the call without force, "
            "or end the whole actor with nbcluster.kill(actor)"
        )
    client.submitter.cancel(object_ref.task_id(), force)


def _nodes_raw() -> list[Any]:
    client = context.require_client()
    try:
        reply = client.run(
            lambda: client.head().GetNodes(pb.GetNodesRequest(include_dead=True), timeout=10)
        )
    except RpcError as err:
        raise to_exception(err, Peer.HEAD, "GetNodes") from None
    return list(reply.nodes)


def nodes() -> list[dict[str, Any]]:
    """Every node the cluster has known, alive or dead, with its resources."""
    client = context.require_client()
    if _is_client(client):
        return client.call("nodes")  # type: ignore[attr-defined, no-any-return]
    out = []
    for n in _nodes_raw():
        host, _, port = n.address.rpartition(":")
        out.append(
            {
                "NodeID": n.node_id.hex(),
                "Alive": n.alive,
                "NodeName": n.node_name,
                "NodeManagerAddress": host,
                "NodeManagerPort": int(port or 0),
                "NodeManagerHostname": n.hostname,
                "Resources": dict(n.total),
                "Available": dict(n.available),
                "ObjectStoreCapacity": n.store_capacity,
                "ObjectStoreUsed": n.store_used,
                "DeathReason": n.death_reason,
            }
        )
    return out


def _sum(kind: str) -> dict[str, float]:
    client = context.require_client()
    if _is_client(client):
        op = "cluster_resources" if kind == "total" else "available_resources"
        return client.call(op)  # type: ignore[attr-defined, no-any-return]
    total: dict[str, float] = {}
    for n in _nodes_raw():
        if not n.alive:
            continue
        for k, v in getattr(n, kind).items():
            total[k] = total.get(k, 0.0) + v
    return total


def cluster_resources() -> dict[str, float]:
    """Total resources of the live nodes."""
    return _sum("total")


def available_resources() -> dict[str, float]:
    """Resources not held by running tasks, as of the nodes' last heartbeats."""
    return {k: v for k, v in _sum("available").items() if v > 0}


def get_gpu_ids() -> list[int]:
    """GPU indices assigned to the running task (from ``CUDA_VISIBLE_DEVICES``)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    return [int(x) for x in visible.split(",") if x.strip().isdigit()]
