"""Splitting datasets: ``split``/``split_at_indices`` (materialized) and ``streaming_split``.

``streaming_split(n)`` runs the dataset once, inside a coordinator actor, and hands its
blocks to ``n`` consumers. Each consumer is a :class:`StreamSplitDataIterator`: a small
picklable object (the coordinator's handle and a split index) that can be sent to
another process — Train gives one to each worker actor. A consumer asks the coordinator
for its next block; the answer is a block ref and a row range, and the consumer maps
the block from the object store and slices it, so no data goes through the coordinator.

With ``equal=False`` a block goes to whichever consumer asks first. With ``equal=True``
every block is cut into ``n`` equal row ranges, one per consumer, and the rows left over
(fewer than ``n`` per block) are dealt out evenly at the end of the epoch (dropping fewer
than ``n`` rows in total), so every consumer sees exactly the same number of rows.

Epochs: each pass a consumer starts (``iter_batches``...) is an epoch. The coordinator
starts epoch ``e`` when every consumer has asked for it, as Ray does: consumers must
iterate concurrently.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Iterator
from typing import Any

import nbcluster
from nbcluster.data._executor import Execution
from nbcluster.data._logical import InputData, LogicalOp, RefBundle, known_schema
from nbcluster.data._schema import Schema
from nbcluster.data._tasks import slice_task
from nbcluster.data.context import DataContext
from nbcluster.data.iterator import DataIterator, Piece

__all__ = [
    "SplitCoordinator",
    "StreamSplitDataIterator",
    "make_streaming_split",
    "split_at",
    "split_materialized",
]

#: How long one ``next`` call waits for a block before telling the consumer to ask again.
_WAIT_S = 1.0
#: Blocks queued per consumer before the coordinator stops pulling from the execution.
_QUEUE_PER_SPLIT = 2


# --------------------------------------------------------------------------- materialized


def _piece_bundles(bundles: list[RefBundle], start: int, end: int) -> list[RefBundle]:
    out: list[RefBundle] = []
    pending = []
    offset = 0
    for b in bundles:
        n = b.meta.num_rows
        lo, hi = max(start, offset), min(end, offset + n)
        if lo < hi:
            if lo == offset and hi == offset + n:
                out.append(b)
            else:
                block, meta = slice_task.remote(b.block, lo - offset, hi - offset)
                pending.append((len(out), block, meta))
                out.append(b)  # placeholder
        offset += n
    if pending:
        metas = nbcluster.get([m for _, _, m in pending])
        for (i, block, _), meta in zip(pending, metas, strict=True):
            out[i] = RefBundle(block, meta)
    return out


def split_at(ds: Any, indices: list[int]) -> list[Any]:
    """Cut a materialized dataset at row ``indices``."""
    bundles = list(ds._plan.bundles)
    total = sum(b.meta.num_rows for b in bundles)
    cuts = [0] + [min(i, total) for i in indices] + [total]
    return [
        ds._materializer(_piece_bundles(bundles, lo, hi), ds._context, "Split")
        for lo, hi in zip(cuts[:-1], cuts[1:], strict=True)
    ]


def split_materialized(ds: Any, n: int, equal: bool) -> list[Any]:
    """``n`` pieces of near-equal rows (exactly equal with ``equal``)."""
    total = ds.count()
    if equal:
        per = total // n
        parts = split_at(ds, [per * i for i in range(1, n + 1)])
        return parts[:n]
    return split_at(ds, [(total * i) // n for i in range(1, n)])


# --------------------------------------------------------------------------- streaming


@nbcluster.remote(num_cpus=0, max_concurrency=256)
class SplitCoordinator:
    """Runs the dataset once per epoch and deals its blocks to ``n`` consumers."""

    def __init__(self, plan: LogicalOp, ctx: DataContext, n: int, equal: bool) -> None:
        self._plan = plan
        self._ctx = ctx
        self._n = n
        self._equal = equal
        self._cond = threading.Condition()
        self._epoch = -1
        self._asked = [-1] * n
        self._queues: list[deque[tuple[Any, int, int | None]]] = [deque() for _ in range(n)]
        self._shared: deque[tuple[Any, int, int | None]] = deque()
        self._finished = False
        self._error: BaseException | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._execution: Execution | None = None

    def _start_epoch(self, epoch: int) -> None:
        self._stop.set()
        if self._execution is not None:
            self._execution.stop()
        if self._thread is not None:
            self._cond.release()
            try:
                self._thread.join(30)
            finally:
                self._cond.acquire()
        self._stop = threading.Event()
        self._epoch = epoch
        self._finished = False
        self._error = None
        for q in self._queues:
            q.clear()
        self._shared.clear()
        self._execution = Execution(self._plan, self._ctx, progress=False)
        self._thread = threading.Thread(
            target=self._pump, args=(self._execution, self._stop), daemon=True
        )
        self._thread.start()

    def _room(self) -> bool:
        if self._equal:
            return all(len(q) < _QUEUE_PER_SPLIT for q in self._queues)
        return len(self._shared) < _QUEUE_PER_SPLIT * self._n

    def _pump(self, execution: Execution, stop: threading.Event) -> None:
        leftovers: list[tuple[Any, int, int]] = []
        try:
            for bundle in execution.iter_bundles():
                rows = bundle.meta.num_rows
                with self._cond:
                    while not self._room() and not stop.is_set():
                        self._cond.wait(0.5)
                    if stop.is_set():
                        return
                    if not self._equal:
                        if rows:
                            self._shared.append((bundle.block, 0, None))
                    else:
                        per = rows // self._n
                        for i in range(self._n):
                            if per:
                                self._queues[i].append((bundle.block, i * per, (i + 1) * per))
                        if rows - per * self._n:
                            leftovers.append((bundle.block, per * self._n, rows))
                    self._cond.notify_all()
            if self._equal and leftovers and not stop.is_set():
                self._deal(leftovers)
        except BaseException as err:  # noqa: BLE001 - handed to the consumers
            with self._cond:
                self._error = err
        finally:
            with self._cond:
                self._finished = True
                self._cond.notify_all()

    def _deal(self, leftovers: list[tuple[Any, int, int]]) -> None:
        total = sum(e - s for _, s, e in leftovers)
        per = total // self._n
        pieces = deque(leftovers)
        with self._cond:
            for i in range(self._n):
                need = per
                while need > 0:
                    block, s, e = pieces.popleft()
                    take = min(need, e - s)
                    self._queues[i].append((block, s, s + take))
                    need -= take
                    if s + take < e:
                        pieces.appendleft((block, s + take, e))
            self._cond.notify_all()

    def next(self, split: int, epoch: int) -> tuple[Any, ...]:
        """``("item", ref, start, end)``, ``("end",)`` or ``("wait",)`` (ask again)."""
        deadline = time.monotonic() + _WAIT_S
        with self._cond:
            if epoch > self._epoch:
                self._asked[split] = max(self._asked[split], epoch)
                if all(a >= epoch for a in self._asked):
                    self._start_epoch(epoch)
                    self._cond.notify_all()
                else:
                    while epoch > self._epoch:
                        left = deadline - time.monotonic()
                        if left <= 0:
                            return ("wait",)
                        self._cond.wait(left)
            if epoch < self._epoch:
                return ("end",)
            queue = self._queues[split] if self._equal else self._shared
            while True:
                if queue:
                    block, start, end = queue.popleft()
                    self._cond.notify_all()
                    return ("item", block, start, end)
                if self._error is not None:
                    raise self._error
                if self._finished:
                    return ("end",)
                left = deadline - time.monotonic()
                if left <= 0:
                    return ("wait",)
                self._cond.wait(left)

    def schema(self) -> Any:
        """The dataset's Arrow schema if the plan knows it (None otherwise)."""
        return known_schema(self._plan)

    def shutdown(self) -> None:
        """Stop the running epoch."""
        self._stop.set()
        if self._execution is not None:
            self._execution.stop()


class StreamSplitDataIterator(DataIterator):
    """One consumer's share of a ``streaming_split`` (picklable: send it to a worker)."""

    def __init__(self, coordinator: Any, index: int, n: int) -> None:
        self._coordinator = coordinator
        self._index = index
        self._n = n
        self._epoch = 0

    def _pieces(self) -> Iterator[Piece]:
        epoch = self._epoch
        self._epoch += 1
        while True:
            reply = nbcluster.get(self._coordinator.next.remote(self._index, epoch))
            if reply[0] == "wait":
                continue
            if reply[0] == "end":
                return
            _, block, start, end = reply
            yield Piece(block, start, end)

    def _describe(self) -> str:
        return f"StreamSplitDataIterator(split {self._index} of {self._n})"

    def world_size(self) -> int:
        """How many consumers share the dataset."""
        return self._n

    def schema(self) -> Schema | None:
        """The dataset's schema, when the plan knows it without running."""
        base = nbcluster.get(self._coordinator.schema.remote())
        return None if base is None else Schema(base)


def make_streaming_split(ds: Any, n: int, equal: bool) -> list[DataIterator]:
    """Start the coordinator; one iterator per consumer."""
    if not nbcluster.is_initialized():
        nbcluster.init()
    plan = ds._plan
    if isinstance(plan, InputData):
        plan = InputData((), bundles=list(plan.bundles), label=plan.label)
    coordinator = SplitCoordinator.remote(plan, ds._context, n, equal)
    return [StreamSplitDataIterator(coordinator, i, n) for i in range(n)]
