"""The event loops nbcluster's own threads run: uvloop's when it is installed.

On the task and actor-call paths (core client I/O threads, task channels, async actors)
uvloop takes about a quarter off a tiny task's round trip. ``NBCLUSTER_UVLOOP=0`` falls
back to asyncio's loop (for debugging, or to rule uvloop out).
"""

from __future__ import annotations

import asyncio
import os

__all__ = ["new_event_loop"]


def new_event_loop() -> asyncio.AbstractEventLoop:
    """A new event loop: uvloop's when installed and not turned off, else asyncio's."""
    if os.environ.get("NBCLUSTER_UVLOOP", "1").strip().lower() not in ("0", "false", "no", "off"):
        try:
            import uvloop
        except ImportError:
            pass
        else:
            return uvloop.new_event_loop()
    return asyncio.new_event_loop()
