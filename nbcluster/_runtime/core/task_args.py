"""Pure helpers about a task's arguments: whether their maker can rebuild them (lineage),
the error of a task whose argument is lost, and the node that holds most of their bytes."""

from __future__ import annotations

from typing import Any

from nbcluster._runtime import exceptions as exc
from nbcluster._runtime.core.ownership import READY, Entry
from nbcluster._runtime.core.records import TaskRecord
from nbcluster._runtime.protocol.rpc import pb

__all__ = ["LOCALITY_MIN_BYTES", "locality", "lost_argument", "pins_lineage", "rebuildable"]


def rebuildable(maker: Any) -> bool:
    """A task whose outputs lineage reconstruction can make again (a plain task, retries left)."""
    return (
        isinstance(maker, TaskRecord)
        and not maker.actor
        and maker.generator is None
        and maker.retries_left != 0
    )


def pins_lineage(entry: Entry) -> bool:
    """Whether a task taking ``entry`` keeps its maker's record, to make it again if it is
    lost or freed before the task reruns: an owned object made by a rebuildable task, not
    yet made or made into a store. A value the owner holds cannot be lost, and pinning its
    maker would pin the maker's own lineage too: a loop ``x = step.remote(x)`` would keep
    every record it ever made (Ray releases the lineage of a task with no store output)."""
    return entry.owned and rebuildable(entry.task) and (entry.state != READY or entry.in_store)


def lost_argument(rec: TaskRecord, error: BaseException) -> BaseException:
    """The error of a task whose argument cannot be read. As in Ray, a lost argument
    (``ObjectLostError`` or a subclass) fails the task with a ``TaskError`` whose ``cause``
    is the loss; other errors (a cancelled or failed upstream task) pass on unchanged."""
    if not isinstance(error, exc.ObjectLostError):
        return error
    text = f"an argument of {rec.name} cannot be read:\n{type(error).__name__}: {error}"
    return exc.TaskError(rec.name, text, error, task_id=rec.task_id.hex())


LOCALITY_MIN_BYTES = 1 << 20


def locality(spec: pb.TaskSpec, local: str) -> str:
    """The node holding the most argument bytes, when that is worth a detour (else '')."""
    by_node: dict[str, int] = {}
    for loc in spec.resolved_args:
        if loc.in_store and loc.node_address:
            by_node[loc.node_address] = by_node.get(loc.node_address, 0) + loc.size
    if not by_node:
        return ""
    best, size = max(by_node.items(), key=lambda kv: kv[1])
    return best if size >= LOCALITY_MIN_BYTES and best != local else ""
