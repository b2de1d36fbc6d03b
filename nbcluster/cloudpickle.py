"""``nbcluster.cloudpickle``: the cloudpickle nbcluster serializes with (Ray's
``ray.cloudpickle``).

``dumps``/``dump`` here also apply the serializers registered with
``nbcluster.util.register_serializer``. Pickling an ``ObjectRef`` this way passes it out
of band: the cluster cannot count that copy (see ``ObjectRef``).
"""

from __future__ import annotations

import io
from typing import Any

from cloudpickle import (
    CloudPickler,
    Pickler,
    load,
    loads,
    register_pickle_by_value,
    unregister_pickle_by_value,
)

from nbcluster._runtime.serialization import PICKLE_PROTOCOL, make_pickler

__all__ = [
    "CloudPickler",
    "DEFAULT_PROTOCOL",
    "Pickler",
    "dump",
    "dumps",
    "load",
    "loads",
    "register_pickle_by_value",
    "unregister_pickle_by_value",
]

#: The pickle protocol nbcluster uses (5: buffers can go out of band).
DEFAULT_PROTOCOL = PICKLE_PROTOCOL


def dumps(obj: Any, protocol: int | None = None, buffer_callback: Any = None) -> bytes:
    """Pickle ``obj`` (functions and classes by value where needed) to bytes."""
    with io.BytesIO() as file:
        dump(obj, file, protocol, buffer_callback)
        return file.getvalue()


def dump(obj: Any, file: Any, protocol: int | None = None, buffer_callback: Any = None) -> None:
    """Pickle ``obj`` into the binary ``file``."""
    if protocol is not None and protocol != PICKLE_PROTOCOL:
        CloudPickler(file, protocol=protocol, buffer_callback=buffer_callback).dump(obj)
        return
    make_pickler(file, buffer_callback).dump(obj)
