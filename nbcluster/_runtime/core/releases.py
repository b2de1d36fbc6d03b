"""Sending what a process let go of: frees to the nodes that store its objects, and
"no longer borrowed" to the owners of objects it borrowed.

The ownership table decides what to release (``ownership.Release``); this batches it and
sends it from the I/O loop, one ``FreeObjects`` per node and one ``UpdateBorrows`` per
owner for everything released since the last send.

**Order.** A release that the loop itself finds (a dropped ref drained on the loop, a
finished task's arguments) is sent at once, before the calls queued on the loop after it:
a ``put`` right after ``del ref`` of a large object then reaches the node after the free,
and can write into the file that free just returned (``objects.store``, "Kept mappings").
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Callable
from typing import Any

from nbcluster._runtime.core.ownership import Release
from nbcluster._runtime.protocol.errors import RpcFailure
from nbcluster._runtime.protocol.rpc import pb

__all__ = ["Releases"]

log = logging.getLogger(__name__)


class Releases:
    """Pending frees and unborrows of one process, sent in batches on its I/O loop."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        node: Callable[[str], Any],
        core: Callable[[str], Any],
        address: Callable[[], str],
        closed: Callable[[], bool],
    ) -> None:
        self._loop = loop
        self._node = node  # node manager address -> stub
        self._core = core  # owner address -> stub
        self._address = address  # this process's CoreWorker address
        self._closed = closed
        self._frees: list[tuple[str, bytes]] = []
        self._unborrows: list[tuple[str, bytes]] = []
        self._lock = threading.Lock()
        self._scheduled = False

    def queue(self, release: Release, on_loop: bool = False) -> None:
        """Send ``release`` soon (thread-safe). ``on_loop``: called on the I/O loop, so the
        send starts in the loop's next step, ahead of what was queued after this call."""
        with self._lock:
            self._frees.extend(release.free_in_store)
            self._unborrows.extend(release.unborrow)
            if self._scheduled or self._closed() and not self._loop.is_running():
                return
            self._scheduled = True
        if on_loop:
            self._start()
            return
        with contextlib.suppress(RuntimeError):  # loop closed at interpreter exit
            self._loop.call_soon_threadsafe(self._start)

    def _start(self) -> None:
        self._loop.create_task(self.flush())

    async def flush(self) -> None:
        """Send everything pending now."""
        with self._lock:
            frees, self._frees = self._frees, []
            unborrows, self._unborrows = self._unborrows, []
            self._scheduled = False
        by_node: dict[str, list[bytes]] = {}
        for addr, oid in frees:
            by_node.setdefault(addr, []).append(oid)
        by_owner: dict[str, list[bytes]] = {}
        for addr, oid in unborrows:
            by_owner.setdefault(addr, []).append(oid)
        calls = [
            self._node(a).FreeObjects(pb.ObjectIds(object_ids=ids), timeout=10)
            for a, ids in by_node.items()
        ]
        calls += [
            self._core(a).UpdateBorrows(
                pb.BorrowRequest(object_ids=ids, borrower_address=self._address(), add=False),
                timeout=10,
            )
            for a, ids in by_owner.items()
        ]
        if len(calls) == 1:  # awaited here, it is sent in this step (gather's task: later)
            results = [await _settle(calls[0])]
        else:
            results = await asyncio.gather(*calls, return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException) and not isinstance(result, RpcFailure):
                log.debug("release failed: %r", result)


async def _settle(call: Any) -> Any:
    try:
        return await call
    except Exception as err:  # as gather(return_exceptions=True) would
        return err
