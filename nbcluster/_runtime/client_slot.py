"""The slot holding this process's core client (driver or worker).

The lowest piece of the process's runtime state: object refs (``refs.py``) read it, so it
names nothing above them. :mod:`nbcluster._runtime.context` fills it together with the
driver, and hands on its readers.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from nbcluster._runtime.exceptions import NbclusterError

if TYPE_CHECKING:
    from nbcluster._runtime.core.client import CoreClient

__all__ = ["CLIENT_OWNER", "current_client", "fill", "require_client"]

_client: CoreClient | None = None

#: Set by the client-mode proxy: turns a client's ref id back into the real ObjectRef.
client_ref_resolver: Callable[[bytes], Any] | None = None
#: The owner address of a ref made by a client-mode client (resolved by the proxy).
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


def fill(client: CoreClient | None) -> None:
    """Put ``client`` in the slot (None: empty it); ``context.set_client`` calls this."""
    global _client
    _client = client
