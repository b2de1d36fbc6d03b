"""``DataIterator``: batches, rows and torch tensors out of a stream of blocks.

A :class:`DataIterator` reads blocks from a source — an execution of a dataset, or one
share of a ``streaming_split`` — fetches each block from the object store (a zero-copy
mapping on the block's node), re-chunks the rows into batches of ``batch_size`` (optionally
through a local shuffle buffer), and converts them to the requested format. With
``prefetch_batches > 0`` a background thread prepares the next batches while the caller
works on the current one. Train's ``get_dataset_shard`` returns one of these.
"""

from __future__ import annotations

import dataclasses
import queue
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import numpy as np
import pyarrow as pa

import nbcluster
from nbcluster._refs import ObjectRef
from nbcluster.data._block import BATCH_FORMATS, block_to_batch, concat, iter_rows, metadata_of
from nbcluster.data._dataset_like import DatasetLike
from nbcluster.data._logical import RefBundle
from nbcluster.data._schema import Schema
from nbcluster.data._torch import to_torch_batch, torch_device
from nbcluster.data.context import DataContext

#: Builds a ``MaterializedDataset`` from blocks (``dataset.py`` installs it).
Materializer = Callable[[list[RefBundle], DataContext, str], DatasetLike]

__all__ = ["DataIterator", "Piece"]


@dataclasses.dataclass(frozen=True)
class Piece:
    """Rows ``[start, end)`` of the block behind ``block`` (``end`` None: to the end)."""

    block: ObjectRef
    start: int = 0
    end: int | None = None


def _check_batch_args(batch_size: Any, batch_format: Any, where: str) -> None:
    if batch_size is not None and (
        not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1
    ):
        raise ValueError(f"{where}: batch_size must be a positive int or None, got {batch_size!r}")
    if batch_format is not None and batch_format not in BATCH_FORMATS:
        raise ValueError(
            f"{where}: batch_format must be one of {', '.join(repr(f) for f in BATCH_FORMATS)} "
            f"or None, got {batch_format!r}"
        )


def _tables(pieces: Iterable[Piece]) -> Iterator[pa.Table]:
    for p in pieces:
        table = nbcluster.get(p.block)
        if p.start or p.end is not None:
            end = table.num_rows if p.end is None else p.end
            table = table.slice(p.start, end - p.start)
        yield table


def rebatch(
    tables: Iterable[pa.Table],
    batch_size: int | None,
    drop_last: bool = False,
    shuffle_buffer: int | None = None,
    seed: int | None = None,
) -> Iterator[pa.Table]:
    """Tables of exactly ``batch_size`` rows (the last may be short unless ``drop_last``).

    With ``shuffle_buffer``, rows are drawn at random from a buffer holding at least that
    many rows (refilled from the stream), as Ray's local shuffle does.
    """
    if batch_size is None and not shuffle_buffer:
        for t in tables:
            if t.num_rows:
                yield t
        return
    rng = np.random.default_rng(seed)
    size = batch_size or 256
    pending: list[pa.Table] = []
    rows = 0
    want = size + (shuffle_buffer or 0)

    def cut(buffer: pa.Table, n: int) -> tuple[pa.Table, pa.Table]:
        return buffer.slice(0, n), buffer.slice(n)

    buffer = None
    for t in tables:
        if not t.num_rows:
            continue
        pending.append(t)
        rows += t.num_rows
        if rows < want:
            continue
        buffer = concat(pending)
        if shuffle_buffer:
            buffer = buffer.take(pa.array(rng.permutation(buffer.num_rows)))
        while buffer.num_rows >= (want if shuffle_buffer else size):
            batch, buffer = cut(buffer, size)
            yield batch
        pending, rows = ([buffer], buffer.num_rows) if buffer.num_rows else ([], 0)
    if rows:
        buffer = concat(pending)
        if shuffle_buffer:
            buffer = buffer.take(pa.array(rng.permutation(buffer.num_rows)))
        while buffer.num_rows >= size:
            batch, buffer = cut(buffer, size)
            yield batch
        if buffer.num_rows and not drop_last:
            yield buffer


_STOP = object()


class _Failure:
    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


def prefetch(make: Callable[[], Iterator[Any]], depth: int) -> Iterator[Any]:
    """Run the generator from ``make()`` on a thread, ``depth`` items ahead."""
    if depth <= 0:
        yield from make()
        return
    q: queue.Queue[Any] = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def produce() -> None:
        gen = make()
        try:
            for item in gen:
                while not stop.is_set():
                    try:
                        q.put(item, timeout=0.1)
                        break
                    except queue.Full:
                        continue
                if stop.is_set():
                    break
            else:
                q.put(_STOP)
        except BaseException as err:  # noqa: BLE001 - handed to the consumer
            q.put(_Failure(err))
        finally:
            gen.close()  # type: ignore[attr-defined]

    thread = threading.Thread(target=produce, name="nbcluster-data-prefetch", daemon=True)
    thread.start()
    try:
        while True:
            try:
                item = q.get(timeout=0.1)
            except queue.Empty:
                continue
            if item is _STOP:
                return
            if isinstance(item, _Failure):
                raise item.exc
            yield item
    finally:
        stop.set()
        thread.join(30)


class DataIterator:
    """An iterator over a dataset's batches or rows (Ray's ``ray.data.DataIterator``).

    Subclasses provide :meth:`_pieces` (the blocks of one pass). Every call of
    :meth:`iter_batches`, :meth:`iter_rows` or :meth:`iter_torch_batches` starts a new
    pass (an epoch).
    """

    #: Builds a ``MaterializedDataset`` from blocks (set by ``dataset.py``).
    _materializer: Materializer

    def _pieces(self) -> Iterator[Piece]:
        raise NotImplementedError

    def _describe(self) -> str:
        return "DataIterator"

    def __repr__(self) -> str:
        return self._describe()

    def iter_batches(
        self,
        *,
        prefetch_batches: int = 1,
        batch_size: int | None = 256,
        batch_format: str | None = "default",
        drop_last: bool = False,
        local_shuffle_buffer_size: int | None = None,
        local_shuffle_seed: int | None = None,
        _collate_fn: Callable[[Any], Any] | None = None,
    ) -> Iterator[Any]:
        """Batches of ``batch_size`` rows in ``batch_format`` ("default"/"numpy": a dict of
        numpy arrays; "pandas"; "pyarrow"). ``batch_size=None`` gives whole blocks.
        ``local_shuffle_buffer_size`` shuffles rows through a buffer of that many rows."""
        _check_batch_args(batch_size, batch_format, "iter_batches")
        if local_shuffle_buffer_size is not None and local_shuffle_buffer_size < 1:
            raise ValueError("local_shuffle_buffer_size must be a positive int or None")

        def batches() -> Iterator[Any]:
            for table in rebatch(
                _tables(self._pieces()),
                batch_size,
                drop_last,
                local_shuffle_buffer_size,
                local_shuffle_seed,
            ):
                batch = block_to_batch(table, batch_format)
                yield _collate_fn(batch) if _collate_fn is not None else batch

        return prefetch(batches, prefetch_batches)

    def iter_rows(self) -> Iterator[dict[str, Any]]:
        """Every row as a dict."""
        for table in _tables(self._pieces()):
            yield from iter_rows(table)

    def iter_torch_batches(
        self,
        *,
        prefetch_batches: int = 1,
        batch_size: int | None = 256,
        dtypes: Any = None,
        device: Any = "auto",
        collate_fn: Callable[[dict[str, np.ndarray]], Any] | None = None,
        drop_last: bool = False,
        local_shuffle_buffer_size: int | None = None,
        local_shuffle_seed: int | None = None,
        pin_memory: bool = False,
    ) -> Iterator[Any]:
        """Batches as dicts of ``torch.Tensor`` (or what ``collate_fn`` makes of the numpy
        batch). ``dtypes``: one ``torch.dtype`` or a dict per column. ``device``: "auto"
        (the GPU given to this worker, else CPU), or any torch device."""
        if collate_fn is not None and dtypes is not None:
            raise ValueError("iter_torch_batches: give either collate_fn or dtypes, not both")
        dev = torch_device(device)

        def convert(batch: dict[str, np.ndarray]) -> Any:
            return to_torch_batch(batch, dtypes, dev, collate_fn, pin_memory)

        return self.iter_batches(
            prefetch_batches=prefetch_batches,
            batch_size=batch_size,
            batch_format="numpy",
            drop_last=drop_last,
            local_shuffle_buffer_size=local_shuffle_buffer_size,
            local_shuffle_seed=local_shuffle_seed,
            _collate_fn=convert,
        )

    def materialize(self) -> DatasetLike:
        """One pass, kept in the object store as a dataset (a ``MaterializedDataset``)."""
        bundles = []
        for table in _tables(self._pieces()):
            ref = nbcluster.put(table)
            bundles.append(RefBundle(ref, metadata_of(table)))
        return self._materializer(bundles, DataContext.get_current(), "FromIterator")

    def to_dataset(self) -> DatasetLike:
        """Same as :meth:`materialize`."""
        return self.materialize()

    def stats(self) -> str:
        """Execution statistics, when known (empty otherwise)."""
        return ""

    def schema(self) -> Schema | None:
        """The schema of the rows, when it is known without running anything."""
        return None
