"""Batched frees and unborrows (core.releases): grouping, and their order on the loop."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from nbcluster._runtime.core.ownership import Release
from nbcluster._runtime.core.releases import Releases


class _Stub:
    """A node or owner stub whose calls log when they start (``RetryingStub`` calls are
    coroutines: the request goes out when the coroutine first runs)."""

    def __init__(self, log: list[Any], address: str) -> None:
        self.log, self.address = log, address

    async def FreeObjects(self, request: Any, timeout: float) -> None:  # noqa: N802
        self.log.append(("free", self.address, list(request.object_ids)))

    async def UpdateBorrows(self, request: Any, timeout: float) -> None:  # noqa: N802
        self.log.append(("unborrow", self.address, list(request.object_ids), request.add))

    async def CreateObject(self) -> None:  # noqa: N802
        self.log.append(("create", self.address))


class _Loop:
    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


def _release(
    frees: list[tuple[str, bytes]], unborrows: tuple[tuple[str, bytes], ...] = ()
) -> Release:
    r = Release()
    r.free_in_store.extend(frees)
    r.unborrow.extend(unborrows)
    return r


def _releases(loop: asyncio.AbstractEventLoop, log: list[Any]) -> Releases:
    return Releases(
        loop, lambda a: _Stub(log, a), lambda a: _Stub(log, a), lambda: "me:1", lambda: False
    )


def test_releases_are_batched_per_node_and_per_owner() -> None:
    log: list[Any] = []
    lp = _Loop()
    try:
        rel = _releases(lp.loop, log)
        rel.queue(_release([("n1", b"a"), ("n2", b"b")], [("o1", b"c")]))
        rel.queue(_release([("n1", b"d")]))  # before the send: joins the same batch
        asyncio.run_coroutine_threadsafe(rel.flush(), lp.loop).result(10)
        asyncio.run_coroutine_threadsafe(asyncio.sleep(0.01), lp.loop).result(10)
    finally:
        lp.close()
    assert sorted(log) == [
        ("free", "n1", [b"a", b"d"]),
        ("free", "n2", [b"b"]),
        ("unborrow", "o1", [b"c"], False),
    ]


def test_a_free_found_on_the_loop_goes_out_before_calls_queued_after_it() -> None:
    # ``del ref`` of a large object, then ``put``: the dropped ref is drained on the loop
    # and the put's reservation is queued right behind it. The free must reach the node
    # first, so the put can write into the file the free returns.
    log: list[Any] = []
    lp = _Loop()
    try:
        rel = _releases(lp.loop, log)
        ready = threading.Event()
        lp.loop.call_soon_threadsafe(ready.wait)  # hold the loop while both are queued
        lp.loop.call_soon_threadsafe(rel.queue, _release([("n1", b"a")]), True)
        create = asyncio.run_coroutine_threadsafe(_Stub(log, "n1").CreateObject(), lp.loop)
        ready.set()
        create.result(10)
        asyncio.run_coroutine_threadsafe(asyncio.sleep(0.05), lp.loop).result(10)
    finally:
        lp.close()
    assert [entry[0] for entry in log] == ["free", "create"]
