"""A task's arguments on the worker: inline values, and large ones read in place.

The owner sends a task's top-level ``ObjectRef`` arguments already resolved
(``spec.resolved_args``): a small value travels inline in the spec, a large one as the
location of its object in the node's store. A stored argument is mapped read-only
(``objects.store.read_object``) and deserialized from that mapping, so a numpy array
argument is a read-only view of the store's shared memory: no copy, however large (as in
Ray, writing to it raises ``ValueError``; copy it first to modify it). The worker keeps
the file's mapping after the task (``objects.readers``): tasks sharing an argument (``put``
once, many tasks), and a new object written into a file the worker read before, need no
new mapping and fault no page in; the argument's view holds the file's read lock only
while the task's values use it, so the file is free for reuse as soon as they are gone.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from nbcluster._runtime.core.args import ArgPlaceholder
from nbcluster._runtime.protocol.rpc import pb
from nbcluster._runtime.serialization import deserialize

__all__ = ["resolve_task_args"]


def resolve_task_args(
    spec: pb.TaskSpec,
    map_location: Callable[[pb.ObjectLocation], memoryview],
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The ``(args, kwargs)`` a task is called with.

    ``spec.args`` holds the pickled ``(args, kwargs)`` with an :class:`ArgPlaceholder`
    for each top-level ref argument; the i-th placeholder becomes the value of
    ``spec.resolved_args[i]``. A stored value is deserialized straight from its read-only
    mapping (``map_location``).
    """
    args, kwargs = deserialize(spec.args)
    if not spec.resolved_args:
        return args, kwargs
    values = []
    for loc in spec.resolved_args:
        if loc.in_store:
            values.append(deserialize(map_location(loc)))
        else:
            values.append(deserialize(loc.data))

    def sub(v: Any) -> Any:
        return values[v.index] if isinstance(v, ArgPlaceholder) else v

    return tuple(sub(a) for a in args), {k: sub(v) for k, v in kwargs.items()}
