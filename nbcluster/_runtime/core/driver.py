"""The in-process :class:`~nbcluster._runtime.driver.Driver`: this process owns its work.

A thin layer over the :class:`~nbcluster._runtime.core.client.CoreClient`: submissions go
to :mod:`~nbcluster._runtime.core.calls`, placement groups to
:mod:`~nbcluster._runtime.core.placement_groups`, objects to the client's ownership table.
Head calls made here translate their gRPC errors into nbcluster's exceptions.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Sequence
from typing import Any

from nbcluster._runtime import exceptions as exc
from nbcluster._runtime.config import Config
from nbcluster._runtime.core import calls
from nbcluster._runtime.core import placement_groups as pgs
from nbcluster._runtime.core.client import CoreClient
from nbcluster._runtime.driver import ActorRecord, FunctionDescriptor
from nbcluster._runtime.options import ActorOptions, TaskOptions
from nbcluster._runtime.protocol.rpc import pb
from nbcluster._runtime.ref_generators import wait_mixed
from nbcluster._runtime.refs import ObjectRef
from nbcluster._runtime.serialization import deserialize, serialize

__all__ = ["CoreDriver"]

_ACTOR_STATES = {0: "PENDING", 1: "ALIVE", 2: "RESTARTING", 3: "DEAD"}


class CoreDriver:
    """The driver of a process connected to the cluster itself (a driver or a worker)."""

    def __init__(self, client: CoreClient) -> None:
        self.client = client

    @property
    def address(self) -> str:
        """Owner address of this process's refs."""
        return self.client.address

    @property
    def namespace(self) -> str:
        """The job's namespace."""
        return self.client.namespace

    @property
    def config(self) -> Config:
        """The configuration the client runs with."""
        return self.client.config

    @property
    def closed(self) -> bool:
        """True once the client stopped."""
        return self.client.closed

    def shutdown(self) -> None:
        """Tell the head the job is over (best effort) and stop the client."""
        client = self.client
        with contextlib.suppress(Exception):
            client.run(
                lambda: client.head_once().FinishJob(pb.JobRef(job_id=client.job_id), timeout=2),
                timeout=3,
            )
        client.stop()

    # -- tasks and actors ---------------------------------------------------------------------
    def submit_task(
        self,
        function: FunctionDescriptor,
        opts: TaskOptions,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> Any:
        """Submit one task (see :func:`~nbcluster._runtime.core.calls.submit_task`)."""
        return calls.submit_task(self.client, function, opts, args, kwargs)

    def create_actor(
        self,
        cls: FunctionDescriptor,
        opts: ActorOptions,
        methods: dict[str, Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        creation: tuple[Any, ...] | None = None,
    ) -> ActorRecord:
        """Register an actor; ``creation`` is kept for ``%cluster restart-actors``."""
        return calls.create_actor(self.client, cls, opts, methods, args, kwargs, creation)

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
        """Queue one actor call (see :func:`~nbcluster._runtime.core.calls.call_actor`)."""
        return calls.call_actor(
            self.client, actor, method, args, kwargs, num_returns, backpressure, call_options
        )

    def get_named_actor(self, name: str, namespace: str | None) -> ActorRecord:
        """The live actor called ``name`` (in ``namespace``, default: the job's)."""
        client = self.client
        ns = namespace if namespace is not None else client.namespace
        info = client.call_head(
            "GetNamedActor",
            lambda head: head.GetNamedActor(
                pb.NamedActorRequest(name=name, namespace=ns), timeout=10
            ),
            not_found=f"Failed to look up actor with name {name!r} in namespace {ns!r}",
        )
        return ActorRecord(info.actor_id, deserialize(info.handle_meta), owned=False)

    def kill_actor(self, actor_id: bytes, no_restart: bool) -> None:
        """End an actor now (the head ends the actors it created too)."""
        client = self.client
        request = pb.KillActorRequest(
            actor_id=actor_id,
            no_restart=no_restart,
            reason="it was killed with nbcluster.kill()",
            kind="killed",
        )
        if no_restart:  # a call this breaks says the actor was killed (F07)
            client.actor_submitter.killing(actor_id)
        try:
            # (a head busy ending hundreds of actors may take seconds: the kill is idempotent
            # and the grace period is what a user waits for any head call)
            client.call_head(
                "KillActor",
                lambda head: head.KillActor(request, timeout=client.config.head_grace_period_s),
            )
        except BaseException:
            if no_restart:
                client.actor_submitter.kill_aborted(actor_id)
            raise
        # Calls made from now on fail at once (on the I/O loop, before any later call is
        # queued): the actor's, and those of the actors it created, which the head ended.
        client.actor_submitter.killed(actor_id, no_restart)

    def add_actor_handle(self, actor_id: bytes) -> None:
        """Count an owned handle."""
        handles = self.client.actor_handles
        handles[actor_id] = handles.get(actor_id, 0) + 1

    def remove_actor_handle(self, actor_id: bytes) -> None:
        """Uncount an owned handle; the last one lets the actor go once it is idle."""
        client = self.client
        if client.closed:
            return
        n = client.actor_handles.get(actor_id, 0) - 1
        if n > 0:
            client.actor_handles[actor_id] = n
            return
        client.actor_handles.pop(actor_id, None)
        if actor_id not in client.escaped_actors:
            client.actor_submitter.release_when_idle(actor_id)

    def actor_escaped(self, actor_id: bytes) -> None:
        """An owned handle was pickled: the actor lives until this process exits."""
        self.client.escaped_actors.add(actor_id)

    # -- objects --------------------------------------------------------------------------------
    def add_local_ref(self, object_id: bytes, owner: str, borrowed: bool) -> None:
        """A ref was created in this process."""
        self.client.add_local_ref(object_id, owner, borrowed)

    def remove_local_ref(self, object_id: bytes) -> None:
        """A ref was dropped."""
        self.client.remove_local_ref(object_id)

    def put(self, value: Any) -> ObjectRef:
        """Store ``value``: inline when small, in the node's shared-memory store when large."""
        return calls.put_serialized(self.client, serialize(value))

    def _wait(self, entries: Any, n: int, deadline: float | None) -> None:
        client = self.client
        try:
            client.wait_entries(entries, n, deadline)
        except KeyboardInterrupt:
            handler = client.interrupt_handler
            if handler is not None:
                handler()
            raise

    def get(self, refs: Sequence[ObjectRef], timeout: float | None) -> list[Any]:
        """The values of ``refs``; ``GetTimeoutError`` when some are not ready in time."""
        client = self.client
        entries = client.ensure_tracked(refs)
        deadline = None if timeout is None else time.monotonic() + timeout
        self._wait(entries, len(entries), deadline)
        missing = sum(1 for e in entries if e.state != 1)
        if missing:
            raise exc.GetTimeoutError(
                f"get() timed out after {timeout}s: {missing} of {len(entries)} object(s) are "
                "not ready. The tasks keep running; call get() again later, or cancel() them."
            )
        return [client.get_value(r, e, deadline) for r, e in zip(refs, entries, strict=True)]

    def wait(
        self, refs: Sequence[ObjectRef], num_returns: int, timeout: float | None
    ) -> list[bytes]:
        """Ids of the first ``num_returns`` ready refs (fewer when the timeout passed)."""
        entries = self.client.ensure_tracked(refs)
        deadline = None if timeout is None else time.monotonic() + timeout
        self._wait(entries, num_returns, deadline)
        ready = [r.binary() for r, e in zip(refs, entries, strict=True) if e.state == 1]
        return ready[:num_returns]

    def wait_mixed(
        self, items: Sequence[Any], num_returns: int, timeout: float | None
    ) -> tuple[list[Any], list[Any]]:
        """``wait`` over refs and ``ObjectRefGenerator``s (ready: ``next`` would not block)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        return wait_mixed(self.client, items, num_returns, deadline)

    def cancel(self, ref: ObjectRef, force: bool) -> None:
        """Cancel the task (or actor call) that makes ``ref``; only its owner can."""
        client = self.client
        if ref.owner_address != client.address:
            raise ValueError("only the process that submitted a task can cancel it")
        rec = client.submitter.tasks.get(ref.task_id()) or client.actor_submitter.sent_call(
            ref.task_id()
        )
        if force and rec is not None and rec.actor:  # Ray: actors keep state; kill the actor
            raise ValueError(
                "force=True is not supported for actor tasks: cancel the call without force, "
                "or end the whole actor with nbcluster.kill(actor)"
            )
        client.submitter.cancel(ref.task_id(), force)

    # -- placement groups -----------------------------------------------------------------------
    def create_placement_group(
        self, bundles: list[dict[str, float]], strategy: str, name: str, detached: bool
    ) -> bytes:
        """Reserve ``bundles`` (see :func:`~nbcluster._runtime.core.placement_groups.create`)."""
        return pgs.create(self.client, os.urandom(16), bundles, strategy, name, detached)

    def remove_placement_group(self, pg_id: bytes) -> None:
        """Release a group."""
        pgs.remove(self.client, pg_id)

    def get_placement_group(self, name: str) -> tuple[bytes, list[dict[str, float]], str]:
        """(id, bundles, name) of the group called ``name``."""
        return pgs.get_by_name(self.client, name)

    def placement_group_table(self, pg_id: bytes | None) -> list[dict[str, Any]]:
        """Rows of one group or of all of them."""
        return pgs.table(self.client, pg_id)

    def placement_group_ready(self, pg_id: bytes) -> ObjectRef:
        """A ref that becomes ``True`` once the group is created."""
        return pgs.ready_ref(self.client, pg_id)

    # -- cluster queries ------------------------------------------------------------------------
    def _nodes_raw(self) -> list[Any]:
        request = pb.GetNodesRequest(include_dead=True)
        reply = self.client.call_head("GetNodes", lambda head: head.GetNodes(request, timeout=10))
        return list(reply.nodes)

    def nodes(self) -> list[dict[str, Any]]:
        """Every node the cluster has known, alive or dead (Ray's ``nodes()`` rows)."""
        out = []
        for n in self._nodes_raw():
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

    def resources(self, kind: str) -> dict[str, float]:
        """Sum of the live nodes' ``"total"`` or ``"available"`` resources."""
        total: dict[str, float] = {}
        for n in self._nodes_raw():
            if not n.alive:
                continue
            for k, v in getattr(n, kind).items():
                total[k] = total.get(k, 0.0) + v
        return total

    def call_head(self, what: str, call: Callable[[Any], Any]) -> Any:
        """``call(head stub)`` on the I/O loop (see :meth:`CoreClient.call_head`)."""
        return self.client.call_head(what, call)

    def actor_state(self, actor_id: bytes) -> dict[str, Any] | None:
        """The head's record of an actor, or None when it is unknown or unreachable."""
        client = self.client
        try:
            info = client.run(
                lambda: client.head_once().WaitActor(
                    pb.WaitActorRequest(actor_id=actor_id, after_version=1 << 62, timeout=0.001),
                    timeout=5,
                ),
                timeout=6,
            )
        except Exception:  # noqa: BLE001 - a repr must not raise
            return None
        return {
            "class_name": info.class_name,
            "state": _ACTOR_STATES.get(info.state, str(info.state)),
            "node_id": info.node_id.hex(),
            "pid": info.worker_pid,
            "restarts": info.num_restarts,
            "max_restarts": info.max_restarts,
            "name": info.name,
            "death_cause": info.death_cause,
        }
