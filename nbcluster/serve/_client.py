"""Finding (or starting) this cluster's Serve controller from any process."""

from __future__ import annotations

import threading
from typing import Any

import nbcluster
from nbcluster.serve.exceptions import ServeException

__all__ = ["CONTROLLER_NAME", "SERVE_NAMESPACE", "controller_handle", "forget", "session_key"]

CONTROLLER_NAME = "SERVE_CONTROLLER"
SERVE_NAMESPACE = "serve"

_handles: dict[str, Any] = {}
_lock = threading.Lock()


def session_key() -> str:
    """Identifies the cluster this process is connected to (its session directory)."""
    if not nbcluster.is_initialized():
        raise ServeException(
            "nbcluster is not initialized: call nbcluster.init() (or %cluster start) first"
        )
    return str(nbcluster.get_runtime_context().session_dir)


def controller_handle(*, required: bool = True) -> Any:
    """The controller actor of this cluster (None when Serve is not running and not required)."""
    key = session_key()
    handle = _handles.get(key)
    if handle is not None:
        return handle
    with _lock:
        handle = _handles.get(key)
        if handle is None:
            try:
                handle = nbcluster.get_actor(CONTROLLER_NAME, namespace=SERVE_NAMESPACE)
            except ValueError:
                if required:
                    raise ServeException(
                        "Serve is not running on this cluster: deploy an application with "
                        "serve.run(app) (or start Serve with serve.start()) first"
                    ) from None
                return None
            _handles[key] = handle
    return handle


def remember(handle: Any) -> None:
    """Cache a controller this process just created."""
    _handles[session_key()] = handle


def forget() -> None:
    """Forget the cached controller (after ``serve.shutdown()``)."""
    with _lock:
        _handles.clear()
