"""The head's key-value store (Ray's ``ray.experimental.internal_kv``).

Keys and values are bytes (str is encoded as UTF-8); ``namespace`` separates users of the
store. It lives in the head's database, so it survives a head restart. Needs a connected
driver (``nbcluster.init()``), like Ray's.
"""

from __future__ import annotations

import threading

from nbcluster import _connect
from nbcluster._connect import HeadClient as HeadJobsClient

__all__ = [
    "_internal_kv_del",
    "_internal_kv_exists",
    "_internal_kv_get",
    "_internal_kv_initialized",
    "_internal_kv_list",
    "_internal_kv_put",
]

_USER_NS = "user:"


def _bytes(value: str | bytes, what: str) -> bytes:
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value)
    raise TypeError(f"{what} must be str or bytes, got {type(value).__name__}")


def _ns(namespace: str | bytes | None) -> str:
    if namespace is None:
        return _USER_NS
    return _USER_NS + (namespace.decode() if isinstance(namespace, bytes) else str(namespace))


_CLIENTS: dict[tuple[str, str], HeadJobsClient] = {}
_LOCK = threading.Lock()


def _head() -> HeadJobsClient:
    if not _connect.connected():
        raise RuntimeError("internal_kv needs a connected driver: call nbcluster.init() first")
    key = _connect.resolve(None)
    with _LOCK:
        head = _CLIENTS.get(key)
        if head is None:
            for old in _CLIENTS.values():
                old.close()
            _CLIENTS.clear()
            head = _CLIENTS[key] = HeadJobsClient(*key)
        return head


def _internal_kv_initialized() -> bool:
    """True when this process is connected to a cluster."""
    return _connect.connected()


def _internal_kv_put(
    key: str | bytes,
    value: str | bytes,
    overwrite: bool = True,
    *,
    namespace: str | bytes | None = None,
) -> bool:
    """Set ``key`` to ``value`` (kept when it exists and ``overwrite`` is False).

    Returns True when the key already existed (Ray's ``already_exists``).
    """
    k, v = _bytes(key, "key"), _bytes(value, "value")
    added = _head().kv_put(_ns(namespace), k, v, overwrite)
    return not added


def _internal_kv_get(key: str | bytes, *, namespace: str | bytes | None = None) -> bytes | None:
    """The value of ``key``, or None."""
    return _head().kv_get(_ns(namespace), _bytes(key, "key"))


def _internal_kv_exists(key: str | bytes, *, namespace: str | bytes | None = None) -> bool:
    """True when ``key`` has a value."""
    return _internal_kv_get(key, namespace=namespace) is not None


def _internal_kv_del(
    key: str | bytes, *, del_by_prefix: bool = False, namespace: str | bytes | None = None
) -> int:
    """Delete ``key`` (or every key that starts with it); return how many were deleted."""
    return _head().kv_del(_ns(namespace), _bytes(key, "key"), del_by_prefix)


def _internal_kv_list(prefix: str | bytes, *, namespace: str | bytes | None = None) -> list[bytes]:
    """Every key that starts with ``prefix``."""
    return _head().kv_keys(_ns(namespace), _bytes(prefix, "prefix"))
