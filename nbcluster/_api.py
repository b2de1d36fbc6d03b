"""The driver API: ``init``, ``shutdown``, ``get``, ``put``, ``wait``, ``cancel`` and friends.

Names, defaults and errors follow Ray's. The process's core client lives in one slot
(``_runtime/context.py``), filled by :func:`init` and emptied by :func:`shutdown`.
"""

from __future__ import annotations

import dataclasses
import os
import threading
from collections.abc import Sequence
from typing import Any

from nbcluster import exceptions as exc
from nbcluster._generator import ObjectRefGenerator
from nbcluster._refs import ObjectRef
from nbcluster._runtime import context, proc
from nbcluster._runtime.core.connect import connect_driver
from nbcluster._runtime.core.driver import CoreDriver
from nbcluster._runtime.driver import Driver
from nbcluster._runtime.proxy.client import ProxyClient
from nbcluster._runtime.runtime_env import driver as runtime_env_driver
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
            client = connect_driver(config, head_address, token, namespace or "")
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
        context.set_client(client, CoreDriver(client))
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
    context.set_client(client, client)  # type: ignore[arg-type]
    return client.info  # type: ignore[return-value]


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


def shutdown() -> None:
    """Disconnect; if :func:`init` started the cluster, stop it (no process is left)."""
    with _init_lock:
        client = context.current_client()
        driver = context.current_driver()
        if client is None or driver is None:
            return
        context.set_client(None)
        driver.shutdown()
        cluster: LocalCluster | None = getattr(client, "cluster", None)
        if cluster is not None:
            cluster.stop()


def is_initialized() -> bool:
    """True after :func:`init` and before :func:`shutdown`."""
    return context.current_client() is not None


def _driver_or_autoinit() -> Driver:
    driver = context.current_driver()
    if driver is None:
        init(ignore_reinit_error=True)
        driver = context.require_driver()
    return driver


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
    driver = context.require_driver()
    refs, single = _as_ref_list(object_refs, "get")
    if timeout is not None and timeout < 0:
        raise ValueError(f"timeout must be >= 0 or None, got {timeout}")
    values = driver.get(refs, timeout)
    return values[0] if single else values


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
    return _driver_or_autoinit().put(value)


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
    driver = context.require_driver()
    if isinstance(object_refs, ObjectRef):
        raise TypeError("wait() expects a list of ObjectRefs; wrap a single ref in a list")
    if isinstance(object_refs, (list, tuple)) and any(
        isinstance(r, ObjectRefGenerator) for r in object_refs
    ):
        return _wait_generators(driver, object_refs, num_returns, timeout)
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
    ready_ids = set(driver.wait(refs, num_returns, timeout))
    ready = [r for r in refs if r.binary() in ready_ids][:num_returns]
    return ready, [r for r in refs if r not in ready]


def _wait_generators(
    driver: Driver, items: Sequence[Any], num_returns: int, timeout: float | None
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
    return driver.wait_mixed(items, num_returns, timeout)


def cancel(object_ref: ObjectRef, *, force: bool = False, recursive: bool = True) -> None:
    """Cancel the task that produces ``object_ref``.

    A queued task never runs; a running one gets ``KeyboardInterrupt`` (``force=True``
    kills its worker instead). ``get`` on it raises :class:`TaskCancelledError`.
    Cancelled tasks are not retried. Only the process that submitted the task can cancel it.

    An actor call (Ray's rules): a queued one never runs; a running async one gets
    ``asyncio.CancelledError`` at its ``await``; a running sync one is not interrupted, it
    only sees ``get_runtime_context().is_canceled()`` turn True. ``force=True`` is refused.
    """
    driver = context.require_driver()
    if isinstance(object_ref, ObjectRefGenerator):  # cancels the generator task
        object_ref = object_ref.completed()
    if not isinstance(object_ref, ObjectRef):
        raise TypeError(f"cancel() expects an ObjectRef, got {type(object_ref).__name__}")
    driver.cancel(object_ref, force)


def nodes() -> list[dict[str, Any]]:
    """Every node the cluster has known, alive or dead, with its resources."""
    return context.require_driver().nodes()


def _sum(kind: str) -> dict[str, float]:
    return context.require_driver().resources(kind)


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
