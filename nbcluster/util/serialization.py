"""Custom serializers for types that cannot be pickled (Ray's ``ray.util.serialization``).

``register_serializer(cls, serializer=..., deserializer=...)`` makes every value this
process sends (task arguments, return values, ``put``) pickle instances of exactly ``cls``
as ``deserializer(serializer(obj))``. The deserializer travels inside each value, so the
receiving worker needs no registration; register in each process that *sends* such values
(in a task, for its return values), as in Ray.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from nbcluster._runtime.serialization import register_reducer, unregister_reducer

__all__ = ["deregister_serializer", "register_serializer"]


def register_serializer(
    cls: type, *, serializer: Callable[[Any], Any], deserializer: Callable[[Any], Any]
) -> None:
    """Serialize instances of ``cls`` with ``serializer`` and rebuild them with
    ``deserializer``.

    Args:
        cls: A Python class (instances of exactly this class are affected, not of
            subclasses).
        serializer: Turns an instance into something serializable (e.g. a dict of basic
            values).
        deserializer: Builds the instance back from what ``serializer`` returned; it must
            itself be serializable (a module-level or notebook function).
    """
    if not isinstance(cls, type):
        raise TypeError(f"register_serializer() takes a class, not {cls!r}")
    if not callable(serializer) or not callable(deserializer):
        raise TypeError("register_serializer() needs callable serializer= and deserializer=")

    def reduce(obj: Any) -> tuple[Callable[[Any], Any], tuple[Any]]:
        return deserializer, (serializer(obj),)

    register_reducer(cls, reduce)


def deregister_serializer(cls: type) -> None:
    """Forget the serializer registered for ``cls``; nothing happens when there is none."""
    unregister_reducer(cls)
