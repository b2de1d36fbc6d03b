"""Errors of objects: lost, freed, not reconstructable, the store or memory full."""

from __future__ import annotations

from nbcluster._runtime.exceptions.base import (
    NbclusterError,
    _fmt_bytes,
    _where,
)

# --------------------------------------------------------------------------- objects


class ObjectLostError(NbclusterError):
    """No copy of an object can be reached, so ``get`` cannot return it.

    Subclasses say why. Attributes: ``object_ref_hex`` (the object's id), ``reason`` (what
    the runtime observed, free text), and ``owner_address`` and ``call_site`` (where the ref
    was created), when known. Unlike Ray, the second positional argument is ``reason``.
    """

    def __init__(
        self,
        object_ref_hex: str,
        reason: str | None = None,
        *,
        owner_address: str | None = None,
        call_site: str | None = None,
    ) -> None:
        super().__init__(object_ref_hex, *([reason] if reason else []))
        self.object_ref_hex = object_ref_hex
        self.reason = reason
        self.owner_address = owner_address
        self.call_site = call_site

    def _base_str(self) -> str:
        text = f"Failed to retrieve object {self.object_ref_hex}"
        text += f": {self.reason.rstrip('.')}." if self.reason else "."
        if self.call_site:
            text += f" The ObjectRef was created at:\n  {self.call_site.strip()}"
        return text

    def _detail(self) -> str:
        return (
            f"All copies of {self.object_ref_hex} were lost, usually because the node that "
            "held them died. Objects made by tasks with retries left are rebuilt "
            "automatically; for others, get() important results while their node is alive, "
            "or create them again."
        )

    def __str__(self) -> str:
        return f"{self._base_str()}\n\n{self._detail()}"


class OwnerDiedError(ObjectLostError):
    """The process that owns the object (it called ``.remote()`` or ``put``) has died.

    nbcluster never recovers from owner failure.
    """

    def _detail(self) -> str:
        owner = f" ({self.owner_address})" if self.owner_address else ""
        return (
            f"The object's owner{owner} has exited. The owner is the process that created "
            "the ObjectRef with .remote() or put(), and nbcluster cannot recover an object "
            "whose owner died. Keep the owner (a driver or actor) alive while others use the "
            "object, or pass the value instead of the ref. Check the owner's log for why it "
            "exited."
        )


class ObjectReconstructionFailedError(ObjectLostError):
    """The object was lost and cannot be rebuilt by re-running the task that made it."""

    def _detail(self) -> str:
        return (
            "The object was lost and cannot be rebuilt, because it was created by put() or "
            "by an actor, or its ObjectRef came from another process. Keep such objects "
            "where they stay alive (get() the value on the driver), or create them again."
        )


class ObjectReconstructionFailedMaxAttemptsExceededError(ObjectReconstructionFailedError):
    """The object cannot be rebuilt because its task has used all its retries."""

    def _detail(self) -> str:
        return (
            "The object was lost and cannot be rebuilt, because the task that creates it "
            "has used all its retries. Set @remote(max_retries=N) (default 3) to allow more."
        )


class ObjectReconstructionFailedLineageEvictedError(ObjectReconstructionFailedError):
    """The object cannot be rebuilt because its lineage was evicted to save memory."""

    def _detail(self) -> str:
        return (
            "The object was lost and cannot be rebuilt, because its lineage (the record of "
            "the task that made it) was evicted to reduce the owner's memory use. Keep fewer "
            "refs alive at once, or get() important results while their node is alive."
        )


class ObjectFetchTimedOutError(ObjectLostError):
    """Fetching the object from another node timed out: no reachable node has a copy."""

    def _detail(self) -> str:
        return (
            f"Fetching object {self.object_ref_hex} timed out because no reachable node has "
            "a copy. This usually points to a network partition or an nbcluster bug; check "
            "the node logs and `nbcluster status`."
        )


class ObjectFreedError(ObjectLostError):
    """The object was freed explicitly and can no longer be read."""

    def _detail(self) -> str:
        return (
            "The object was freed explicitly, so it can no longer be read. Free objects only "
            "after every user of their refs is done with them."
        )


class ReferenceCountingAssertionError(ObjectLostError, AssertionError):
    """The object was deleted while a reference to it still existed (a bug in nbcluster)."""

    def _detail(self) -> str:
        return (
            "The object was already deleted by reference counting while a reference to it "
            "existed. This should not happen; please report it as an nbcluster bug."
        )


class ObjectStoreFullError(NbclusterError):
    """The node's object store cannot fit an object, even after evicting and spilling."""

    def __init__(
        self,
        message: str | None = None,
        *,
        requested_bytes: int | None = None,
        capacity_bytes: int | None = None,
        used_bytes: int | None = None,
        node_id: str | None = None,
        spilling_enabled: bool | None = None,
    ) -> None:
        super().__init__(*([message] if message else []))
        self.message = message
        self.requested_bytes = requested_bytes
        self.capacity_bytes = capacity_bytes
        self.used_bytes = used_bytes
        self.node_id = node_id
        self.spilling_enabled = spilling_enabled

    def __str__(self) -> str:
        node = f" on node {self.node_id}" if self.node_id else ""
        text = self.message or f"The object store{node} is full"
        if not self.message:
            if self.used_bytes is not None and self.capacity_bytes is not None:
                text += (
                    f" ({_fmt_bytes(self.used_bytes)} of {_fmt_bytes(self.capacity_bytes)} in use)"
                )
            if self.requested_bytes is not None:
                text += f" and cannot fit an object of {_fmt_bytes(self.requested_bytes)}"
            text += " after evicting every object that nobody references."
        if self.spilling_enabled is False:
            spill = (
                "turn spilling on (NBCLUSTER_SPILLING_ENABLED=1) so objects in use can move to disk"
            )
        else:
            spill = "make sure spilling has room (spill_dir, NBCLUSTER_SPILL_DIR)"
        return (
            f"{text}\nTip: delete ObjectRefs you no longer need (`del ref`) so their objects "
            "can be freed, start the cluster with a larger object_store_memory "
            f"(NBCLUSTER_OBJECT_STORE_MEMORY), or {spill}."
        )


class OutOfDiskError(NbclusterError):
    """The disk used for spilling or for the file-backed store is full."""

    def __init__(
        self, message: str | None = None, *, path: str | None = None, node_id: str | None = None
    ) -> None:
        super().__init__(*([message] if message else []))
        self.message = message
        self.path = path
        self.node_id = node_id

    def __str__(self) -> str:
        where = f" at {self.path}" if self.path else ""
        node = f" on node {self.node_id}" if self.node_id else ""
        text = self.message or f"The local disk{where}{node} is full (over 95% used)."
        return f"{text} Free disk space, or point spill_dir (NBCLUSTER_SPILL_DIR) at a larger disk."


class OutOfMemoryError(NbclusterError):
    """The memory monitor killed the worker because its node was running low on memory."""

    def __init__(
        self,
        message: str | None = None,
        *,
        task_id: str | None = None,
        node_id: str | None = None,
        pid: int | None = None,
        memory_used_bytes: int | None = None,
        memory_total_bytes: int | None = None,
    ) -> None:
        super().__init__(*([message] if message else []))
        self.message = message
        self.task_id = task_id
        self.node_id = node_id
        self.pid = pid
        self.memory_used_bytes = memory_used_bytes
        self.memory_total_bytes = memory_total_bytes

    def __str__(self) -> str:
        if self.message:
            return self.message
        where = _where(pid=self.pid, node_id=self.node_id, task_id=self.task_id)
        text = "Task was killed due to the node running low on memory"
        text += f" ({where})." if where else "."
        if self.memory_used_bytes is not None and self.memory_total_bytes is not None:
            text += (
                f" Memory in use: {_fmt_bytes(self.memory_used_bytes)} of "
                f"{_fmt_bytes(self.memory_total_bytes)}."
            )
        return text + (
            " Reduce the task's memory use, declare it with @remote(memory=...) so fewer such "
            "tasks run at once, or add memory to the node."
        )
