"""The slot holding this process's core client (driver or worker) and its driver.

There is no other process-global runtime state: ``init()`` (or a worker's start) fills the
slot and ``shutdown()`` empties it. The client half lives in
:mod:`~nbcluster._runtime.client_slot` (object refs read it, below the driver's types);
its readers are handed on from here. The :class:`~nbcluster._runtime.driver.Driver` is what
the API layer calls: a ``CoreDriver`` over the core client, or in client mode the
``ProxyClient`` (which is the client too); it is chosen once, when the slot is filled.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from nbcluster._runtime import client_slot
from nbcluster._runtime.client_slot import CLIENT_OWNER, current_client, require_client
from nbcluster._runtime.exceptions import NbclusterError

if TYPE_CHECKING:
    from nbcluster._runtime.core.client import CoreClient
    from nbcluster._runtime.driver import Driver

__all__ = [
    "CLIENT_OWNER",
    "current_client",
    "current_driver",
    "require_client",
    "require_driver",
    "set_client",
]

_lock = threading.Lock()
_driver: Driver | None = None


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
    global _driver
    with _lock:
        client_slot.fill(client)
        _driver = driver
