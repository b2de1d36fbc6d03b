"""The consuming half of ``Dataset``: iterate, take, count, materialize, convert, write.

These methods run the plan (``_executor.Execution``). Row counts and schemas come from
metadata when the plan knows them (``count()`` of a parquet read reads no data). Methods
that return rows to the driver (``take``, ``take_all``, ``show``, ``to_pandas``) keep the
rows in their source order; streaming iteration follows
``DataContext.execution_options.preserve_order``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pyarrow as pa

import nbcluster
from nbcluster.data import _write
from nbcluster.data._block import (
    _to_pandas,
    block_to_batch,
    concat,
    iter_rows,
)
from nbcluster.data._display import dataset_html, dataset_text
from nbcluster.data._executor import Execution
from nbcluster.data._logical import (
    InputData,
    Limit,
    LogicalOp,
    Read,
    RefBundle,
    known_count,
    known_schema,
    walk,
)
from nbcluster.data._optimizer import explain
from nbcluster.data._plan_view import PlanView
from nbcluster.data._preview import preview as _preview
from nbcluster.data._schema import Schema
from nbcluster.data.context import DataContext
from nbcluster.data.iterator import DataIterator, Piece

__all__ = ["ConsumeAPI", "DatasetIterator"]


class DatasetIterator(DataIterator):
    """A :class:`DataIterator` over a whole dataset: each pass executes the plan."""

    def __init__(self, dataset: ConsumeAPI) -> None:
        self._dataset = dataset

    def _pieces(self) -> Iterator[Piece]:
        for bundle in self._dataset._execute().iter_bundles():
            yield Piece(bundle.block)

    def _describe(self) -> str:
        return f"DataIterator({self._dataset._label()})"

    def schema(self) -> Schema | None:
        """The dataset's schema."""
        return self._dataset.schema()

    def stats(self) -> str:
        """Statistics of the last pass."""
        return self._dataset.stats()


class ConsumeAPI:
    """Consumption methods shared by ``Dataset`` and ``MaterializedDataset``."""

    _plan: LogicalOp
    _context: DataContext
    _cache: dict[str, Any]
    _last_execution: Any
    _name: str | None
    #: Builds a ``MaterializedDataset`` from blocks (set by ``dataset.py``).
    _materializer: Callable[[list[RefBundle], DataContext, str], Any]

    # ------------------------------------------------------------------ execution
    def _label(self) -> str:
        names = [op.name for op in walk(self._plan)]
        text = "->".join(names)
        return self._name or (text if len(text) < 80 else "…" + text[-79:])

    def _execute(
        self,
        *,
        preserve_order: bool | None = None,
        progress: bool | None = None,
        plan: LogicalOp | None = None,
    ) -> Execution:
        ex = Execution(
            plan if plan is not None else self._plan,
            self._context,
            preserve_order=preserve_order,
            progress=progress,
            label=f"Dataset {self._name}" if self._name else "Dataset",
        )
        if plan is None:
            self._last_execution = ex
        return ex

    def _head_bundles(self, n: int) -> Iterator[RefBundle]:
        """The bundles of the first ``n`` rows, in source order."""
        return self._execute(preserve_order=True, plan=Limit((self._plan,), n=n)).iter_bundles()

    # ------------------------------------------------------------------ iteration
    def iterator(self) -> DataIterator:
        """A :class:`DataIterator` over this dataset (what Train hands to workers)."""
        return DatasetIterator(self)

    def iter_rows(self) -> Iterator[dict[str, Any]]:
        """Every row, as a dict of column -> value."""
        return self.iterator().iter_rows()

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
        """Batches of ``batch_size`` rows (see :meth:`DataIterator.iter_batches`)."""
        return self.iterator().iter_batches(
            prefetch_batches=prefetch_batches,
            batch_size=batch_size,
            batch_format=batch_format,
            drop_last=drop_last,
            local_shuffle_buffer_size=local_shuffle_buffer_size,
            local_shuffle_seed=local_shuffle_seed,
            _collate_fn=_collate_fn,
        )

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
        """Batches as dicts of ``torch.Tensor`` (see :meth:`DataIterator.iter_torch_batches`)."""
        return self.iterator().iter_torch_batches(
            prefetch_batches=prefetch_batches,
            batch_size=batch_size,
            dtypes=dtypes,
            device=device,
            collate_fn=collate_fn,
            drop_last=drop_last,
            local_shuffle_buffer_size=local_shuffle_buffer_size,
            local_shuffle_seed=local_shuffle_seed,
            pin_memory=pin_memory,
        )

    def __iter__(self) -> Any:
        raise TypeError(
            "a Dataset is not iterable; use ds.iter_rows(), ds.iter_batches() or ds.take_all()"
        )

    # ------------------------------------------------------------------ rows to the driver
    def take(self, limit: int = 20) -> list[dict[str, Any]]:
        """The first ``limit`` rows, as dicts."""
        if not isinstance(limit, int) or limit < 0:
            raise ValueError(f"take: limit must be a non-negative int, got {limit!r}")
        rows: list[dict[str, Any]] = []
        for bundle in self._head_bundles(limit):
            for row in iter_rows(nbcluster.get(bundle.block)):
                if len(rows) >= limit:
                    break
                rows.append(row)
        return rows

    def take_batch(self, batch_size: int = 20, *, batch_format: str | None = "default") -> Any:
        """The first ``batch_size`` rows as one batch; ``ValueError`` if the dataset is empty."""
        tables = [nbcluster.get(b.block) for b in self._head_bundles(batch_size)]
        nonempty = [t for t in tables if t.num_rows]
        if not nonempty:
            raise ValueError("The dataset is empty.")
        table = concat(nonempty)
        return block_to_batch(table.slice(0, min(batch_size, table.num_rows)), batch_format)

    def take_all(self, limit: int | None = None) -> list[dict[str, Any]]:
        """Every row; with ``limit``, ``ValueError`` if there are more than that."""
        rows: list[dict[str, Any]] = []
        for bundle in self._execute(preserve_order=True).iter_bundles():
            rows.extend(iter_rows(nbcluster.get(bundle.block)))
            if limit is not None and len(rows) > limit:
                raise ValueError(f"The dataset has more than the given limit of {limit} rows.")
        return rows

    def show(self, limit: int = 20) -> None:
        """Print the first ``limit`` rows, one per line."""
        for row in self.take(limit):
            print(row)

    # ------------------------------------------------------------------ metadata
    def count(self) -> int:
        """The number of rows (from metadata when the plan knows it; no data is fetched)."""
        n = known_count(self._plan)
        if n is not None:
            return n
        if "count" not in self._cache:
            self._cache["count"] = sum(b.meta.num_rows for b in self._execute().iter_bundles())
        return int(self._cache["count"])

    def schema(self, fetch_if_missing: bool = True) -> Schema | None:
        """Column names and types (runs the first block when the plan cannot tell)."""
        base = known_schema(self._plan) or self._cache.get("schema")
        if base is None and fetch_if_missing:
            empty = None
            for b in self._head_bundles(1):
                s = b.meta.schema
                if s is not None and len(s.names):
                    base = s
                    break
                empty = empty or s
            base = base or empty
            if base is not None:
                self._cache["schema"] = base
        return None if base is None else Schema(base)

    def columns(self, fetch_if_missing: bool = True) -> list[str] | None:
        """Column names."""
        schema = self.schema(fetch_if_missing)
        return None if schema is None else schema.names

    def num_blocks(self) -> int:
        """Blocks of a materialized dataset (``NotImplementedError`` for a lazy one, as Ray)."""
        raise NotImplementedError(
            "Number of blocks is only available for MaterializedDataset, because the number "
            "of blocks may change during execution. Call ds.materialize() first."
        )

    def size_bytes(self) -> int:
        """In-memory size of the blocks (runs the plan unless it is materialized)."""
        if isinstance(self._plan, InputData):
            return sum(b.meta.size_bytes for b in self._plan.bundles)
        return sum(b.meta.size_bytes for b in self._execute().iter_bundles())

    def input_files(self) -> list[str]:
        """Files the dataset reads (when it reads files)."""
        files: list[str] = []
        for op in walk(self._plan):
            if isinstance(op, Read):
                for t in op.tasks:
                    files.extend(t.input_files)
            elif isinstance(op, InputData):
                for b in op.bundles:
                    files.extend(b.meta.input_files)
        return list(dict.fromkeys(files))

    def materialize(self) -> Any:
        """Run the plan and keep every block in the object store (a ``MaterializedDataset``)."""
        if isinstance(self._plan, InputData):
            return self
        bundles = list(self._execute().iter_bundles())
        ds = self._materializer(bundles, self._context, "Materialized")
        ds._last_execution = self._last_execution
        return ds

    def stats(self) -> str:
        """Statistics of the last execution (empty when it has not run)."""
        ex = self._last_execution
        if ex is None or ex.stats is None:
            return ""
        return str(ex.stats.to_string())

    def explain(self) -> None:
        """Print the logical, optimized and physical plans."""
        print(explain(self._plan))

    # ------------------------------------------------------------------ conversions
    def to_pandas(self, limit: int | None = None) -> Any:
        """All rows as one ``pandas.DataFrame`` (``ValueError`` past ``limit`` rows)."""
        tables = []
        rows = 0
        for bundle in self._execute(preserve_order=True).iter_bundles():
            tables.append(nbcluster.get(bundle.block))
            rows += bundle.meta.num_rows
            if limit is not None and rows > limit:
                raise ValueError(f"The dataset has more than the given limit of {limit} rows.")
        table = concat([t for t in tables if t.num_columns])
        return _to_pandas(table)

    def to_arrow_refs(self) -> list[nbcluster.ObjectRef]:
        """Refs to the blocks (``pyarrow.Table`` each), materializing the dataset."""
        mat = self.materialize()
        return [b.block for b in mat._plan.bundles]

    def to_numpy_refs(self, *, column: str | None = None) -> list[nbcluster.ObjectRef]:
        """Refs to each block as numpy: a dict of arrays, or one array with ``column``."""
        return [_to_numpy.remote(ref, column) for ref in self.to_arrow_refs()]

    def to_pandas_refs(self) -> list[nbcluster.ObjectRef]:
        """Refs to each block as a ``pandas.DataFrame``."""
        return [_to_pandas_task.remote(ref) for ref in self.to_arrow_refs()]

    # ------------------------------------------------------------------ writes
    def write_parquet(
        self, path: str, *, filesystem: Any = None, **arrow_parquet_args: Any
    ) -> None:
        """Write one parquet file per block under directory ``path``."""
        _write.write(self, "parquet", path, filesystem, arrow_parquet_args)

    def write_csv(self, path: str, *, filesystem: Any = None, **arrow_csv_args: Any) -> None:
        """Write one CSV file per block under directory ``path``."""
        _write.write(self, "csv", path, filesystem, arrow_csv_args)

    def write_json(self, path: str, *, filesystem: Any = None, **pandas_json_args: Any) -> None:
        """Write one JSON-lines file per block under directory ``path``."""
        _write.write(self, "json", path, filesystem, pandas_json_args)

    def write_numpy(self, path: str, *, column: str, filesystem: Any = None) -> None:
        """Write column ``column`` of each block as a ``.npy`` file under ``path``."""
        if not isinstance(column, str):
            raise TypeError(f"write_numpy: column must be a column name, got {column!r}")
        _write.write(self, "numpy", path, filesystem, {"column": column})

    # ------------------------------------------------------------------ notebook
    def preview(self, n: int = 5) -> Any:
        """Push one block through every operator; show a sample and the schema after each."""
        return _preview(self._plan, n)

    def plan_view(self) -> Any:
        """A live graph of the plan: each operator's rows/s, bytes in flight, and what holds
        it back, updated while this dataset runs (a plotly widget in Jupyter)."""
        return PlanView(self._plan, self._context)

    def __repr__(self) -> str:
        return dataset_text(self)

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, Any]:
        return {"text/plain": dataset_text(self), "text/html": dataset_html(self)}


@nbcluster.remote
def _to_numpy(block: pa.Table, column: str | None) -> Any:
    batch = block_to_batch(block, "numpy", zero_copy=False)
    return batch[column] if column is not None else batch


@nbcluster.remote
def _to_pandas_task(block: pa.Table) -> Any:
    return _to_pandas(block)
