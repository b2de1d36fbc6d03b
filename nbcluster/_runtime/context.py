"""The slot holding this process's core client (driver or worker) and its driver.

There is no other process-global runtime state: ``init()`` (or a worker's start) fills the
slot and ``shutdown()`` empties it. The :class:`~nbcluster._runtime.driver.Driver` is what
the API layer calls: a ``CoreDriver`` over the core client, or in client mode the
``ProxyClient`` (which is the client too); it is chosen once, when the slot is filled.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from nbcluster._runtime.exceptions import NbclusterError

if TYPE_CHECKING:
    from nbcluster._runtime.core.client import CoreClient
    from nbcluster._runtime.driver import Driver

_lock = threading.Lock()
_client: CoreClient | None = None
_driver: Driver | None = None

# Set by the client-mode proxy: turns a client's ref id back into the real ObjectRef.
client_ref_resolver: Callable[[bytes], Any] | None = None
CLIENT_OWNER = "client-proxy"


def current_client() -> CoreClient | None:
    """The core client of this process, or None before ``init()``."""
    return _client


def require_client() -> CoreClient:
    """The core client, or a clear error saying to call ``nbcluster.init()``."""
    client = _client
    if client is None:
        raise NbclusterError(
            "nbcluster is not initialized: call nbcluster.init() (or %cluster start) first"
        )
    return client


def current_driver() -> Driver | None:
    """The driver of this process, or None before ``init()``."""
    return _driver


def require_driver() -> Driver:
    """The driver, or a clear error saying to call ``nbcluster.init()``."""
    driver = _driver
    if driver is None:
        raise NbclusterError(
            "nbcluster is not initialized: call nbcluster.init() (or %cluster start) first"
        )
    return driver


def set_client(client: CoreClient | None, driver: Driver | None = None) -> None:
    """Fill the slot with a client and the driver over it (both None: empty it)."""
    global _client, _driver
    with _lock:
        _client = client
        _driver = driver
