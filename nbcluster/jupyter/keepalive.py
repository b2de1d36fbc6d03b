"""Keep-alive: a kernel whose tasks are running is not idle, whatever its cells do.

While tasks this kernel submitted run and no cell executes, :class:`KeepAlive` reports
kernel activity every ``NBCLUSTER_KEEPALIVE_S`` seconds (default 60; 0 turns it off), so an
idle culler (jupyter_server's ``MappingKernelManager.cull_idle_timeout``, and through the
server's last activity JupyterHub's and Binder's) does not shut down a kernel whose cluster
is working. When the culler does shut the kernel down, its cluster ends with it (the
parent-death watch).
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from typing import Any

__all__ = ["DEFAULT_KEEPALIVE_S", "KEEPALIVE_ENV", "KeepAlive", "keepalive_interval"]

log = logging.getLogger(__name__)

#: Seconds between two activity reports while tasks run (environment variable; 0: off).
KEEPALIVE_ENV = "NBCLUSTER_KEEPALIVE_S"
DEFAULT_KEEPALIVE_S = 60.0


def keepalive_interval() -> float:
    """``$NBCLUSTER_KEEPALIVE_S`` (default 60 s; 0 or less turns the keep-alive off)."""
    raw = os.environ.get(KEEPALIVE_ENV, "")
    try:
        return float(raw) if raw else DEFAULT_KEEPALIVE_S
    except ValueError:
        log.warning("%s=%r is not a number of seconds; using %s", KEEPALIVE_ENV, raw, 60)
        return DEFAULT_KEEPALIVE_S


class KeepAlive:
    """Reports kernel activity while ``working()`` says tasks run and no cell executes.

    The report is an iopub ``status: idle`` message with no parent: true (no cell runs),
    ignored by front ends, and counted as activity by jupyter_server (which is what its
    culler and JupyterHub's, through the server's last activity, look at). A thread
    ``nbcluster-keepalive`` checks every ``interval`` seconds; :meth:`close` stops it.
    """

    def __init__(self, kernel: Any, working: Callable[[], bool], interval: float) -> None:
        self._kernel = kernel
        self._working = working
        self.interval = interval
        self.sent = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="nbcluster-keepalive", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                if self._working():
                    self.beat()
            except Exception:  # noqa: BLE001 - a keep-alive must never disturb the kernel
                log.debug("nbcluster keep-alive failed", exc_info=True)

    def beat(self) -> None:
        """Publish one activity report now."""
        kernel = self._kernel
        topic = kernel._topic("status") if hasattr(kernel, "_topic") else b"kernel.status"
        kernel.session.send(
            kernel.iopub_socket, "status", {"execution_state": "idle"}, parent={}, ident=topic
        )
        self.sent += 1

    def close(self) -> None:
        """Stop reporting."""
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join(5)
