"""Long polling: how the controller pushes routing tables to routers and proxies.

The controller publishes snapshots under keys (``routes``, ``replicas:<app>#<deployment>``).
A listener calls :meth:`LongPollHost.listen` with the versions it knows; the call returns
at once with every newer snapshot, or waits until one changes (or ``timeout_s`` passes,
returning ``{}``). Versions are ``(epoch, n)``: a restarted controller has a new epoch,
so listeners take its snapshots even though ``n`` starts again. A key never published
answers ``None`` (the deployment does not exist).
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

__all__ = ["LongPollHost"]

_MISSING = object()


class LongPollHost:
    """Versioned snapshots and the listeners waiting for them (one event loop)."""

    def __init__(self) -> None:
        self.epoch = uuid.uuid4().hex[:8]
        self._values: dict[str, Any] = {}
        self._versions: dict[str, int] = {}
        self._changed = asyncio.Event()

    def publish(self, key: str, value: Any) -> bool:
        """Set ``key``'s snapshot; listeners wake when it differs from the last one."""
        if self._values.get(key, _MISSING) == value:
            return False
        self._values[key] = value
        self._versions[key] = self._versions.get(key, 0) + 1
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()
        return True

    def remove(self, key: str) -> None:
        """Forget ``key`` (listeners get ``None`` from now on)."""
        self.publish(key, None)

    def snapshot(self, key: str) -> Any:
        """The current value of ``key`` (None when unpublished)."""
        return self._values.get(key)

    def _collect(self, known: dict[str, Any]) -> dict[str, tuple[tuple[str, int], Any]]:
        out = {}
        for key, seen in known.items():
            version = (self.epoch, self._versions.get(key, 0))
            if seen is None or tuple(seen) != version:
                out[key] = (version, self._values.get(key))
        return out

    async def listen(
        self, known: dict[str, Any], timeout_s: float = 30.0
    ) -> dict[str, tuple[tuple[str, int], Any]]:
        """Newer snapshots of the keys in ``known`` (``{key: version or None}``)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while True:
            out = self._collect(known)
            if out:
                return out
            remaining = deadline - loop.time()
            if remaining <= 0:
                return {}
            try:
                await asyncio.wait_for(self._changed.wait(), remaining)
            except TimeoutError:
                return {}
