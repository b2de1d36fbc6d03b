"""The single slot holding this process's core client (driver or worker).

There is no other process-global runtime state: ``init()`` fills the slot and
``shutdown()`` empties it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from nbcluster._runtime.core.client import CoreClient

_lock = threading.Lock()
_client: CoreClient | None = None

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
        from nbcluster.exceptions import NbclusterError

        raise NbclusterError(
            "nbcluster is not initialized: call nbcluster.init() (or %cluster start) first"
        )
    return client


def set_client(client: CoreClient | None) -> None:
    """Fill or empty the slot."""
    global _client
    with _lock:
        _client = client
