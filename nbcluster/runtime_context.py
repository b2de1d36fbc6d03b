"""``get_runtime_context()``: where the calling code runs (Ray's ``ray.runtime_context``).

Both of Ray's spellings work: the ``get_xxx_id()`` methods return hex strings, and the
older ``node_id`` / ``job_id`` / ``task_id`` / ``actor_id`` / ``worker_id`` properties
return the same ids as :class:`HexId` strings (which also have Ray's ``.hex()``).
Inside a threaded or async actor, each concurrent call sees its own task id.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from nbcluster._runtime import context

if TYPE_CHECKING:
    from nbcluster._runtime.core.client import CoreClient

__all__ = ["HexId", "RuntimeContext", "get_runtime_context"]


class HexId(str):
    """An id as a hex string that also answers Ray's ``ID`` methods (``hex()``,
    ``binary()``, ``is_nil()``), for code that does ``ctx.node_id.hex()``."""

    __slots__ = ()

    def hex(self) -> str:
        """The id as hex (the string itself)."""
        return str(self)

    def binary(self) -> bytes:
        """The raw id bytes."""
        return bytes.fromhex(self)

    def is_nil(self) -> bool:
        """True for an empty or all-zero id."""
        return not self.strip("0")


def _original_resources(granted: dict[str, float]) -> dict[str, float]:
    """Placement-group resource names (``CPU_group_0_<pg>``, ``CPU_group_<pg>``) back to
    the names the user asked for, as Ray's ``get_assigned_resources`` reports them."""
    plain: dict[str, float] = {}
    indexed: dict[str, float] = {}
    wildcard: dict[str, float] = {}
    for name, amount in granted.items():
        if amount <= 0:
            continue
        if "_group_" not in name:
            plain[name] = amount
            continue
        base, rest = name.split("_group_", 1)
        if base == "bundle":
            continue  # the marker that points a task at the bundle's node
        (indexed if "_" in rest else wildcard)[base] = amount
    return {**plain, **wildcard, **indexed}


class RuntimeContext:
    """Where the calling code runs: node, job, task, actor, worker, and what it was given."""

    def __init__(self, client: CoreClient) -> None:
        self._client = client

    def _running(self) -> Any:
        hook = getattr(self._client, "running_task", None)  # a Ray-client proxy has none
        return hook() if hook is not None else None

    # -- ids (Ray's get_xxx methods) -------------------------------------------------------
    def get_node_id(self) -> str:
        """Hex id of the node this process belongs to."""
        return self._client.node_id.hex()

    def get_job_id(self) -> str:
        """Hex id of the driver's job."""
        return self._client.job_id.hex()

    def get_task_id(self) -> str | None:
        """Hex id of the running task or actor call (None in a driver)."""
        running = self._running()
        if running is not None:
            return str(running.task_id.hex())
        tid = self._client.current_task_id
        return tid.hex() if tid else None

    def get_actor_id(self) -> str | None:
        """Hex id of the actor this code runs in (None in a driver or a task)."""
        running = self._running()
        if running is not None and running.actor_id:
            return str(running.actor_id.hex())
        return None

    def get_worker_id(self) -> str:
        """Hex id of this worker or driver."""
        return self._client.worker_id.hex()

    def get_task_name(self) -> str | None:
        """Name of the running task or actor method (None in a driver)."""
        running = self._running()
        return str(running.spec.function_name) if running is not None else None

    # -- ids as properties (Ray's older spelling) --------------------------------------------
    @property
    def node_id(self) -> HexId:
        """Id of the node this process belongs to (``.hex()`` works too)."""
        return HexId(self.get_node_id())

    @property
    def job_id(self) -> HexId:
        """Id of the driver's job (``.hex()`` works too)."""
        return HexId(self.get_job_id())

    @property
    def task_id(self) -> HexId | None:
        """Id of the running task or actor call; None in a driver."""
        tid = self.get_task_id()
        return HexId(tid) if tid is not None else None

    @property
    def actor_id(self) -> HexId | None:
        """Id of the actor this code runs in; None in a driver or a task."""
        aid = self.get_actor_id()
        return HexId(aid) if aid is not None else None

    @property
    def worker_id(self) -> HexId:
        """Id of this worker or driver (``.hex()`` works too)."""
        return HexId(self.get_worker_id())

    # -- the running call --------------------------------------------------------------------
    def is_canceled(self) -> bool:
        """True once ``nbcluster.cancel()`` was called on the running task.

        Lets a task check for cancellation and clean up. Raises ``RuntimeError`` in a
        driver or an async actor (cancel an async call by awaiting: it raises there), as
        Ray does.
        """
        running = self._running()
        if running is None:
            raise RuntimeError("is_canceled() can only be called inside a task or actor call")
        if running.in_async_actor:
            raise RuntimeError(
                "is_canceled() is not available in async actors: cancelling an async call "
                "raises asyncio.CancelledError at its await"
            )
        return bool(running.is_canceled())

    def get_assigned_resources(self) -> dict[str, float]:
        """The resources reserved for the running task or actor, e.g. ``{"CPU": 1.0}``.

        A task asks for one CPU by default; an actor holds only what it asked for (Ray's
        default for actors is none while they run). Placement-group bundle names are
        reported by their original names. Empty in a driver.
        """
        running = self._running()
        if running is None:
            return {}
        return _original_resources(running.resources)

    def get_accelerator_ids(self) -> dict[str, list[str]]:
        """Accelerator ids visible to the running task or actor, by type: ``{"GPU": [...]}``."""
        running = self._running()
        gpus = list(running.gpu_ids) if running is not None else []
        return {"GPU": [str(g) for g in gpus]}

    # -- the job ---------------------------------------------------------------------------
    @property
    def namespace(self) -> str:
        """The namespace of the job."""
        return self._client.namespace

    @property
    def session_dir(self) -> Path:
        """The cluster's session directory."""
        return Path(self._client.session_dir)

    def get(self) -> dict[str, Any]:
        """The context as a dict (Ray's deprecated form): job, node, namespace, and the task
        and actor ids when there are some."""
        out: dict[str, Any] = {
            "job_id": self.job_id,
            "node_id": self.node_id,
            "namespace": self.namespace,
        }
        if self.task_id is not None:
            out["task_id"] = self.task_id
        if self.actor_id is not None:
            out["actor_id"] = self.actor_id
        return out

    def __repr__(self) -> str:
        return f"RuntimeContext(node={self.get_node_id()[:8]}, job={self.get_job_id()[:8]})"


def get_runtime_context() -> RuntimeContext:
    """Information about where the caller runs (driver, task or actor call)."""
    return RuntimeContext(context.require_client())
