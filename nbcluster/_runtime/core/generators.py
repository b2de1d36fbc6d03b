"""Generator tasks, owner side: the items a generator task yields, as they arrive.

A generator task (``num_returns="streaming"`` or ``"dynamic"``) reports each yielded
item to its owner with ``ReportGeneratorItem`` (``generators.proto``) before it runs the
generator further; the task's final reply (on the PushTasks stream, as for any task)
then only says how the stream ended. Item ``i`` is the object ``task_id + (i + 2)``;
``task_id + 1`` is the task's own return (``None``, or its error), which
``ObjectRefGenerator.completed()`` hands out.

:class:`GeneratorState` is the pure bookkeeping (positions reported, consumed, where the
stream ends, backpressure), unit-tested without processes. :class:`OwnerGenerator` ties
one state to the ownership table; :class:`GeneratorService` receives the reports.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from nbcluster._runtime import exceptions as exc
from nbcluster._runtime.core.ownership import PENDING, Release
from nbcluster._runtime.protocol.protos import generators_pb2 as gpb
from nbcluster._runtime.protocol.protos import generators_pb2_grpc as gpb_grpc
from nbcluster._runtime.protocol.rpc import AuthedStub

if TYPE_CHECKING:
    from nbcluster._runtime.core.ports import GeneratorHost

log = logging.getLogger(__name__)

__all__ = [
    "DYNAMIC",
    "STREAMING",
    "GeneratorService",
    "GeneratorState",
    "OwnerGenerator",
    "add_to_server",
    "item_id",
    "registry",
    "reporter",
    "wire_num_returns",
]

#: ``TaskSpec.num_returns`` on the wire for ``num_returns="streaming"`` / ``"dynamic"``.
STREAMING = -1
DYNAMIC = -2
_WIRE = {"streaming": STREAMING, "dynamic": DYNAMIC}


def wire_num_returns(num_returns: int | str) -> int:
    """The spec's ``num_returns`` for an option value (an int, "streaming" or "dynamic")."""
    return num_returns if isinstance(num_returns, int) else _WIRE[num_returns]


def item_id(task_id: bytes, index: int) -> bytes:
    """Object id of item ``index`` (0-based) of the generator task ``task_id``."""
    return task_id + (index + 2).to_bytes(4, "big")


class GeneratorState:
    """Positions of one generator stream (thread-safe; no I/O).

    ``reported`` items have arrived (in order: the executor waits for each report's
    reply), ``consumed`` were handed out by ``next()``; ``total`` is set once the task
    ended (an error takes the position after the last item). ``threshold`` > 0 pauses
    the executor while ``threshold`` items are unconsumed.
    """

    def __init__(self, threshold: int = -1) -> None:
        self.threshold = threshold
        self.reported = 0
        self.consumed = 0
        self.total: int | None = None
        self.closed = False
        self._cond = threading.Condition()
        self._watchers: list[Callable[[], None]] = []

    # -- producer side (the owner's I/O loop) ------------------------------------------------
    def is_new(self, index: int) -> bool:
        """True for the next position of a live stream (a retried attempt repeats earlier
        positions, which are ignored)."""
        with self._cond:
            return not self.closed and self.total is None and index == self.reported

    def on_item(self, index: int) -> None:
        """Item ``index`` is in the ownership table now."""
        with self._cond:
            if index != self.reported or self.total is not None:
                return
            self.reported += 1
            self._cond.notify_all()
        self._notify()

    def on_finish(self, errored: bool) -> int | None:
        """The task ended; returns the position its error takes (None without error)."""
        with self._cond:
            if self.total is not None:
                return None
            at = self.reported if errored else None
            self.total = self.reported + (1 if errored else 0)
            self._cond.notify_all()
        self._notify()
        return at

    def should_pause(self, index: int) -> bool:
        """After reporting ``index``: must the executor wait before producing more?"""
        with self._cond:
            if self.threshold <= 0 or self.closed or self.total is not None:
                return False
            return index + 1 - self.consumed >= self.threshold

    # -- consumer side (user threads) ------------------------------------------------------
    def ready(self) -> bool:
        """True when ``take`` would not block (an item is there, or the stream ended)."""
        with self._cond:
            return self.consumed < self.reported or (
                self.total is not None and self.consumed >= self.reported
            )

    def take(self, timeout: float | None = None) -> int | None:
        """The next position, once it is there; None on timeout.

        Raises ``StopIteration`` at the end of the stream. The end-of-stream error (if
        any) is a position like the others.
        """
        with self._cond:
            while True:
                if self.consumed < self.reported:
                    index = self.consumed
                    self.consumed += 1
                    break
                if self.total is not None and self.consumed >= self.total:
                    raise StopIteration
                if self.total is not None:  # the error position, not yet reported
                    index = self.consumed
                    self.consumed += 1
                    break
                if not self._cond.wait(timeout) and timeout is not None:
                    return None  # timed out
        self._notify()
        return index

    def close(self) -> list[int]:
        """The consumer is gone; returns the reported positions nobody took."""
        with self._cond:
            self.closed = True
            left = list(range(self.consumed, self.reported))
            self._cond.notify_all()
        self._notify()
        return left

    def add_watcher(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` once, at the next change (any thread; keep it short)."""
        with self._cond:
            self._watchers.append(callback)

    def remove_watcher(self, callback: Callable[[], None]) -> None:
        """Forget a watcher that was not called."""
        with self._cond:
            if callback in self._watchers:
                self._watchers.remove(callback)

    def _notify(self) -> None:
        with self._cond:
            watchers, self._watchers = self._watchers, []
        for cb in watchers:
            try:
                cb()
            except Exception:  # noqa: BLE001 - a waiter's failure must not stop the stream
                log.debug("generator watcher failed", exc_info=True)


class OwnerGenerator:
    """One generator task's stream in its owner: its state and its items' entries."""

    def __init__(self, client: GeneratorHost, rec: Any, mode: int, threshold: int) -> None:
        self.client = client
        self.task_id: bytes = rec.task_id
        self.rec = rec
        self.mode = mode
        self.state = GeneratorState(threshold)
        self._resume: asyncio.Event | None = None  # loop-side, while a report is held back
        self._early: dict[int, gpb.GeneratorItem] = {}  # reports that overtook earlier ones

    # -- loop thread -------------------------------------------------------------------------
    async def on_report(self, item: gpb.GeneratorItem) -> None:
        """Record an item; return when the executor may go on (backpressure)."""
        st = self.state
        if item.index > st.reported and st.total is None and not st.closed:
            self._early[item.index] = item  # pipelined reports may arrive out of order
            return
        self._record(item)
        while st.reported in self._early:
            self._record(self._early.pop(st.reported))
        while self.state.should_pause(item.index):
            if self._resume is None:
                self._resume = asyncio.Event()
            self._resume.clear()
            self.state.add_watcher(self._wake_threadsafe)
            if not self.state.should_pause(item.index):
                self.state.remove_watcher(self._wake_threadsafe)
                break
            await self._resume.wait()

    def _record(self, item: gpb.GeneratorItem) -> None:
        client = self.client
        table = client.table
        if self.state.is_new(item.index):
            entry = table.create_owned(item.object_id, task=self.rec)  # lineage
            with table.lock:
                entry.set_ready(
                    data=None if item.in_store else item.data,
                    in_store=item.in_store,
                    size=item.size,
                    node_id=item.node_id,
                    node_address=item.node_address,
                )
                # dynamic: the items are reachable only through the task's return value
                entry.escaped = self.mode == DYNAMIC
            table.wake(entry)
            client.submitter.object_ready(entry)
            self.state.on_item(item.index)
        else:  # a repeat: from a retried attempt, or a re-run rebuilding lost items
            entry = table.get(item.object_id)
            if entry is not None and entry.state == PENDING:  # lost with its node: rebuilt
                with table.lock:
                    entry.set_ready(
                        data=None if item.in_store else item.data,
                        in_store=item.in_store,
                        size=item.size,
                        node_id=item.node_id,
                        node_address=item.node_address,
                    )
                table.wake(entry)
                client.submitter.object_ready(entry)
            elif item.in_store and (entry is None or entry.node_address != item.node_address):
                free_orphan(client, item.node_address, item.object_id)

    def _wake_threadsafe(self) -> None:
        resume = self._resume
        if resume is not None:
            self.client.loop.call_soon_threadsafe(resume.set)

    def task_finished(self) -> None:
        """The task ended (called by the submitter on the loop): place its error, if any."""
        client = self.client
        table = client.table
        registry(client).pop(self.task_id, None)
        lost = self._drop_early()  # after a crash: items past one that never arrived
        if lost:
            client._queue_release(lost)
        done = table.get(self.rec.return_ids[0])
        errored = done is not None and (done.exc is not None or done.is_error)
        if self.state.total is not None:  # a re-run for lost items ended
            self._fail_unrebuilt(done)
            return
        if errored and done is not None and not self.state.closed:
            # the error takes the next position; its entry exists before next() can see it
            entry = table.create_owned(item_id(self.task_id, self.state.reported))
            with table.lock:
                entry.set_ready(
                    data=done.data,
                    in_store=done.in_store,
                    size=done.size,
                    node_id=done.node_id,
                    node_address=done.node_address,
                    is_error=done.is_error,
                    exc=done.exc,
                )
                entry.escaped = self.mode == DYNAMIC
            table.wake(entry)
            client.submitter.object_ready(entry)
        self.state.on_finish(errored)

    def reopen(self) -> None:
        """The task runs again to rebuild items lost with a node (lineage): take its
        reports (loop thread)."""
        registry(self.client)[self.task_id] = self

    def _fail_unrebuilt(self, done: Any) -> None:
        """Items the re-run did not produce again fail instead of waiting forever."""
        table = self.client.table
        for index in range(self.state.total or 0):
            oid = item_id(self.task_id, index)
            entry = table.get(oid)
            if entry is not None and entry.state == PENDING:
                error = (done.exc if done is not None else None) or (
                    exc.ObjectReconstructionFailedError(
                        oid.hex(), "the generator task that made it did not yield it again"
                    )
                )
                with table.lock:
                    entry.set_ready(exc=error)
                table.wake(entry)
                self.client.submitter.object_ready(entry)

    def _drop_early(self) -> Release:
        """Forget reports that wait for a gap that will never be filled."""
        rel = Release()
        for item in self._early.values():
            if item.in_store:
                rel.free_in_store.append((item.node_address, item.object_id))
        self._early.clear()
        return rel

    def close(self) -> None:
        """The consumer dropped the generator: free the items it never took (loop)."""
        registry(self.client).pop(self.task_id, None)
        table = self.client.table
        rel = self._drop_early()
        left = self.state.close()
        st = self.state
        if st.total is not None and st.total > st.reported and st.consumed <= st.reported:
            left.append(st.reported)  # the error position, not taken
        for index in left:
            oid = item_id(self.task_id, index)
            if table.get(oid) is None:
                continue
            table.add_local_ref(oid, self.client.address, False)
            more = table.remove_local_ref(oid)
            rel.free_in_store.extend(more.free_in_store)
        if rel:
            self.client._queue_release(rel)


def free_orphan(client: GeneratorHost, node_address: str, object_id: bytes) -> None:
    """Free a stored item nobody will ever read."""
    rel = Release()
    rel.free_in_store.append((node_address, object_id))
    client._queue_release(rel)


def registry(client: GeneratorHost) -> dict[bytes, OwnerGenerator]:
    """The live generator streams this process owns, by task id."""
    reg = client.__dict__.get("_generators")
    if reg is None:
        reg = client.__dict__.setdefault("_generators", {})
    return reg  # type: ignore[no-any-return]


class GeneratorService(gpb_grpc.GeneratorsServicer):
    """Receives the items of the generator tasks this process owns."""

    def __init__(self, client: GeneratorHost) -> None:
        self.client = client

    async def ReportGeneratorItem(self, request: gpb.GeneratorItem, context: Any) -> Any:
        gen = registry(self.client).get(request.task_id)
        if gen is None:  # the stream was dropped (or ended): nobody will read the item
            if request.in_store:
                free_orphan(self.client, request.node_address, request.object_id)
            return gpb.GeneratorItemAck()
        await gen.on_report(request)
        return gpb.GeneratorItemAck(backpressure=gen.state.threshold)


def add_to_server(client: GeneratorHost, server: Any) -> None:
    """Serve ``Generators`` beside the CoreWorker service of ``client``."""
    gpb_grpc.add_GeneratorsServicer_to_server(GeneratorService(client), server)


def reporter(client: GeneratorHost, owner_address: str) -> Any:
    """The ``Generators`` stub of ``owner_address`` (create on the loop thread)."""
    return AuthedStub(gpb_grpc.GeneratorsStub(client.channels.channel(owner_address)), client.token)
