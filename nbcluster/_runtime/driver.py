"""The driver interface: everything the public API asks of the runtime, in one typed Protocol.

The API modules (``nbcluster._api``, ``_remote``, ``_actor``, ``util.placement_group``)
validate the user's call, then call one :class:`Driver`. Two classes implement it: the
in-process :class:`~nbcluster._runtime.core.driver.CoreDriver` (this process owns its
tasks, actors and objects) and the client-mode
:class:`~nbcluster._runtime.proxy.client.ProxyClient` (every call travels through the head
to a proxy driver on the cluster, which runs it with its own ``CoreDriver``). ``init()``
builds one and puts it in the slot of :mod:`nbcluster._runtime.context`; nothing else
chooses between them.

The records here pickle, because client mode sends them across.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from nbcluster._runtime.config import Config
    from nbcluster._runtime.options import ActorOptions, TaskOptions
    from nbcluster._runtime.refs import ObjectRef

__all__ = ["DRIVER_CALLS", "ActorRecord", "Driver", "FunctionDescriptor"]


@dataclasses.dataclass(frozen=True, slots=True)
class FunctionDescriptor:
    """A function or class as the cluster knows it: its pickle, exported once per cluster."""

    function_id: bytes  # content hash of ``payload``
    name: str
    payload: bytes


@dataclasses.dataclass(frozen=True, slots=True)
class ActorRecord:
    """An actor a handle points at; ``owned`` when this process created it (not detached)."""

    actor_id: bytes
    meta: dict[str, Any]
    owned: bool = False


class Driver(Protocol):
    """What the API layer needs from the runtime (see the module docstring)."""

    #: Owner address of the refs this driver creates (refs count themselves with it).
    address: str
    #: The job's namespace (named actors and placement groups live in it).
    namespace: str
    config: Config
    closed: bool

    # -- life cycle ---------------------------------------------------------------------------
    def shutdown(self) -> None:
        """Disconnect (the caller stops a cluster it started)."""

    # -- tasks and actors -----------------------------------------------------------------------
    def submit_task(
        self,
        function: FunctionDescriptor,
        opts: TaskOptions,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> Any:
        """Submit one call; its ref, list of refs, ``None`` (``num_returns=0``) or generator."""

    def create_actor(
        self,
        cls: FunctionDescriptor,
        opts: ActorOptions,
        methods: dict[str, Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> ActorRecord:
        """Register an actor with the head; return at once (it starts in its own worker)."""

    def call_actor(
        self,
        actor: ActorRecord,
        method: str,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        num_returns: int | str,
        backpressure: int,
        call_options: dict[str, Any],
    ) -> Any:
        """Queue one call on an actor (calls from one caller run in order)."""

    def get_named_actor(self, name: str, namespace: str | None) -> ActorRecord:
        """The live actor called ``name``; ``ValueError`` when there is none."""

    def kill_actor(self, actor_id: bytes, no_restart: bool) -> None:
        """End an actor now; its pending calls fail with ``ActorDiedError``."""

    def add_actor_handle(self, actor_id: bytes) -> None:
        """An owned handle was made (the actor lives while owned handles do)."""

    def remove_actor_handle(self, actor_id: bytes) -> None:
        """An owned handle was dropped (from ``__del__``: must not raise)."""

    def actor_escaped(self, actor_id: bytes) -> None:
        """An owned handle was pickled: keep the actor for this process's lifetime."""

    # -- objects -------------------------------------------------------------------------------
    def add_local_ref(self, object_id: bytes, owner: str, borrowed: bool) -> None:
        """A ref to ``object_id`` was created in this process."""

    def remove_local_ref(self, object_id: bytes) -> None:
        """A ref was dropped; must not block or take locks (it runs from the collector)."""

    def put(self, value: Any) -> ObjectRef:
        """Store ``value`` as a new object owned by this process."""

    def get(self, refs: Sequence[ObjectRef], timeout: float | None) -> list[Any]:
        """The values of ``refs`` (raising the first error); ``GetTimeoutError`` on timeout."""

    def wait(
        self, refs: Sequence[ObjectRef], num_returns: int, timeout: float | None
    ) -> list[bytes]:
        """Ids of the refs ready once ``num_returns`` are (or the timeout passed)."""

    def cancel(self, ref: ObjectRef, force: bool) -> None:
        """Cancel the task that makes ``ref``."""

    # -- placement groups ------------------------------------------------------------------------
    def create_placement_group(
        self, bundles: list[dict[str, float]], strategy: str, name: str, detached: bool
    ) -> bytes:
        """Ask the head to reserve ``bundles``; the group's id (returns at once)."""

    def remove_placement_group(self, pg_id: bytes) -> None:
        """Release a group (ending the work running in it)."""

    def get_placement_group(self, name: str) -> tuple[bytes, list[dict[str, float]], str]:
        """(id, bundles, name) of the group called ``name``; ``ValueError`` when unknown."""

    def placement_group_table(self, pg_id: bytes | None) -> list[dict[str, Any]]:
        """Rows (Ray's ``placement_group_table`` format) of one group, or of all of them."""

    def placement_group_ready(self, pg_id: bytes) -> ObjectRef:
        """A ref that becomes ``True`` once the group is created."""

    # -- cluster queries -------------------------------------------------------------------------
    def nodes(self) -> list[dict[str, Any]]:
        """Every node the cluster has known, alive or dead, with its resources."""

    def resources(self, kind: str) -> dict[str, float]:
        """Sum over live nodes of their ``"total"`` or ``"available"`` resources."""

    def call_head(self, what: str, call: Callable[[Any], Any]) -> Any:
        """``call(head stub)`` for a read-only query (``nbcluster.state``); a gRPC error is
        raised as nbcluster's exception (``what`` names the call in it)."""

    def actor_state(self, actor_id: bytes) -> dict[str, Any] | None:
        """The head's record of an actor (class, state, node, pid, restarts...), or None
        when it is unknown or cannot be asked; never raises (reprs call it)."""


#: The Driver calls a client-mode proxy forwards to its own CoreDriver (by name).
DRIVER_CALLS: frozenset[str] = frozenset(
    {
        "submit_task",
        "create_actor",
        "call_actor",
        "get_named_actor",
        "kill_actor",
        "put",
        "get",
        "wait",
        "cancel",
        "create_placement_group",
        "remove_placement_group",
        "get_placement_group",
        "placement_group_table",
        "placement_group_ready",
        "nodes",
        "resources",
    }
)
