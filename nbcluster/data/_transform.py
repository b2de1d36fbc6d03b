"""Stages: the per-block transforms that map tasks and pool actors run, fused in a chain.

A :class:`Stage` turns an iterator of blocks into an iterator of blocks. The optimizer
fuses consecutive map-like operators (``map``, ``map_batches``, ``flat_map``, ``filter``,
``add_column``, projections) into one list of stages that a single task (or actor call)
runs on its input, so blocks are read from and written to the object store once per fused
operator, not once per step. Stages are pickled to workers; a callable class is
instantiated once by :meth:`Stage.open` (once per actor, when the stage runs in a pool).

Errors raised by user functions get a note naming the operator, so the remote traceback
says where in the pipeline it happened; a function returning the wrong type gets a
``TypeError`` that says what was expected.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import zlib
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from nbcluster.data._block import (
    batch_to_block,
    block_to_batch,
    column_from_values,
    concat,
    iter_rows,
    partition_order,
    row_views,
    rows_to_block,
)
from nbcluster.data.aggregate import aggregate_block

__all__ = [
    "AddColumnStage",
    "FilterStage",
    "FlatMapStage",
    "MapBatchesStage",
    "MapRowsStage",
    "PartialAggregateStage",
    "ProjectStage",
    "SHUFFLE_KEY",
    "SHUFFLE_OFFSETS",
    "ShuffleMapStage",
    "Stage",
    "run_stages",
]


def _note(err: BaseException, op: str) -> BaseException:
    if hasattr(err, "add_note"):
        err.add_note(f"(raised by the function of the {op} operator of an nbcluster.data pipeline)")
    return err


def _make_callable(
    fn: Any, ctor_args: Sequence[Any] | None, ctor_kwargs: Mapping[str, Any] | None, op: str
) -> Callable[..., Any]:
    if inspect.isclass(fn):
        try:
            return fn(*(ctor_args or ()), **(ctor_kwargs or {}))  # type: ignore[no-any-return]
        except Exception as err:
            raise _note(err, op) from None
    return fn  # type: ignore[no-any-return]


class Stage:
    """A transform of a stream of blocks (subclasses implement :meth:`apply`)."""

    name: str = "Stage"

    def open(self) -> None:
        """Build per-process state (instantiate a callable class). Idempotent."""

    def apply(self, blocks: Iterator[pa.Table]) -> Iterator[pa.Table]:
        """The transformed blocks."""
        raise NotImplementedError

    @property
    def is_actor_stage(self) -> bool:
        """True when the stage's function is a callable class (it runs in an actor pool)."""
        return False


def _batches(blocks: Iterable[pa.Table], batch_size: int | None) -> Iterator[pa.Table]:
    """Re-chunk ``blocks`` into tables of ``batch_size`` rows (the last may be shorter)."""
    if batch_size is None:
        for b in blocks:
            if b.num_rows:
                yield b
        return
    pending: list[pa.Table] = []
    rows = 0
    for b in blocks:
        if b.num_rows == 0:
            continue  # as Ray: the function never sees an empty batch
        offset = 0
        while offset < b.num_rows:
            take = min(batch_size - rows, b.num_rows - offset)
            pending.append(b.slice(offset, take))
            rows += take
            offset += take
            if rows == batch_size:
                yield concat(pending)
                pending, rows = [], 0
    if pending:
        yield concat(pending)


@dataclasses.dataclass
class MapBatchesStage(Stage):
    """``map_batches``: ``fn(batch, *fn_args, **fn_kwargs)`` on batches of ``batch_size``."""

    fn: Any
    batch_size: int | None
    batch_format: str | None
    zero_copy_batch: bool = True
    fn_args: Sequence[Any] = ()
    fn_kwargs: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    fn_constructor_args: Sequence[Any] = ()
    fn_constructor_kwargs: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    name: str = "MapBatches"
    where: str = "map_batches"

    def __post_init__(self) -> None:
        self._callable: Callable[..., Any] | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_callable"] = None
        return state

    @property
    def is_actor_stage(self) -> bool:
        """True for a callable class."""
        return inspect.isclass(self.fn)

    def open(self) -> None:
        """Instantiate the callable class once."""
        if self._callable is None:
            self._callable = _make_callable(
                self.fn, self.fn_constructor_args, self.fn_constructor_kwargs, self.name
            )

    def apply(self, blocks: Iterator[pa.Table]) -> Iterator[pa.Table]:
        """Run the function on each batch; validate and convert what it returns."""
        self.open()
        fn = self._callable
        assert fn is not None
        for table in _batches(blocks, self.batch_size):
            batch = block_to_batch(table, self.batch_format, zero_copy=self.zero_copy_batch)
            try:
                result = fn(batch, *self.fn_args, **self.fn_kwargs)
            except Exception as err:
                raise _note(err, self.name) from None
            if inspect.isgenerator(result):
                try:
                    for item in result:
                        yield self._to_block(item)
                except TypeError:
                    raise
                except Exception as err:
                    raise _note(err, self.name) from None
            else:
                yield self._to_block(result)

    def _to_block(self, result: Any) -> pa.Table:
        try:
            return batch_to_block(
                result, f"{self.where} ({self.name}, batch_format={self.batch_format!r})"
            )
        except TypeError as err:
            raise _note(err, self.name) from None


@dataclasses.dataclass
class AddColumnStage(Stage):
    """``add_column(col, fn)``: a new (or replaced) column computed from each batch."""

    col: str
    fn: Callable[[Any], Any]
    batch_format: str | None = "pandas"
    name: str = "AddColumn"

    def apply(self, blocks: Iterator[pa.Table]) -> Iterator[pa.Table]:
        """Append ``fn(batch)`` as column ``col`` of every block."""
        for table in blocks:
            batch = block_to_batch(table, self.batch_format)
            try:
                values = self.fn(batch)
            except Exception as err:
                raise _note(err, self.name) from None
            if hasattr(values, "to_numpy") and not isinstance(values, pa.Array | pa.ChunkedArray):
                values = values.to_numpy()
            col = column_from_values(values, self.col)
            if len(col) != table.num_rows:
                raise ValueError(
                    f"add_column({self.col!r}): the function returned {len(col)} values for a "
                    f"batch of {table.num_rows} rows; return one value per row"
                )
            if self.col in table.column_names:
                table = table.set_column(table.column_names.index(self.col), self.col, col)
            else:
                table = table.append_column(self.col, col)
            yield table


@dataclasses.dataclass
class MapRowsStage(Stage):
    """``map``: ``fn(row) -> row`` on every row (rows are dicts)."""

    fn: Any
    fn_args: Sequence[Any] = ()
    fn_kwargs: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    fn_constructor_args: Sequence[Any] = ()
    fn_constructor_kwargs: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    name: str = "Map"

    def __post_init__(self) -> None:
        self._callable: Callable[..., Any] | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_callable"] = None
        return state

    @property
    def is_actor_stage(self) -> bool:
        """True for a callable class."""
        return inspect.isclass(self.fn)

    def open(self) -> None:
        """Instantiate the callable class once."""
        if self._callable is None:
            self._callable = _make_callable(
                self.fn, self.fn_constructor_args, self.fn_constructor_kwargs, self.name
            )

    def apply(self, blocks: Iterator[pa.Table]) -> Iterator[pa.Table]:
        """One output row per input row."""
        self.open()
        fn = self._callable
        assert fn is not None
        for table in blocks:
            out = []
            for row in iter_rows(table):
                try:
                    new = fn(row, *self.fn_args, **self.fn_kwargs)
                except Exception as err:
                    raise _note(err, self.name) from None
                if not isinstance(new, Mapping):
                    raise _note(
                        TypeError(
                            f"the map function ({self.name}) returned a {type(new).__name__}; "
                            "it must return a dict of column name -> value for each row (use "
                            "flat_map to return several rows, filter to drop rows)"
                        ),
                        self.name,
                    )
                out.append(new)
            yield rows_to_block(out, "map") if out else table.schema.empty_table()


@dataclasses.dataclass
class FlatMapStage(Stage):
    """``flat_map``: ``fn(row) -> list of rows``."""

    fn: Any
    fn_args: Sequence[Any] = ()
    fn_kwargs: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    fn_constructor_args: Sequence[Any] = ()
    fn_constructor_kwargs: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    name: str = "FlatMap"

    def __post_init__(self) -> None:
        self._callable: Callable[..., Any] | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_callable"] = None
        return state

    @property
    def is_actor_stage(self) -> bool:
        """True for a callable class."""
        return inspect.isclass(self.fn)

    def open(self) -> None:
        """Instantiate the callable class once."""
        if self._callable is None:
            self._callable = _make_callable(
                self.fn, self.fn_constructor_args, self.fn_constructor_kwargs, self.name
            )

    def apply(self, blocks: Iterator[pa.Table]) -> Iterator[pa.Table]:
        """Zero or more output rows per input row."""
        self.open()
        fn = self._callable
        assert fn is not None
        for table in blocks:
            out: list[Any] = []
            for row in iter_rows(table):
                try:
                    new = fn(row, *self.fn_args, **self.fn_kwargs)
                    if isinstance(new, Mapping) or not isinstance(new, Iterable):
                        raise TypeError(
                            f"the flat_map function ({self.name}) returned a "
                            f"{type(new).__name__}; it must return a list of rows (dicts)"
                        )
                    out.extend(new)
                except Exception as err:
                    raise _note(err, self.name) from None
            yield rows_to_block(out, "flat_map") if out else table.schema.empty_table()


@dataclasses.dataclass
class FilterStage(Stage):
    """``filter``: keep rows where ``fn(row)`` is true, or where ``expr`` holds."""

    fn: Any = None
    expr: Any = None  # a pyarrow.compute.Expression
    name: str = "Filter"
    fn_constructor_args: Sequence[Any] = ()
    fn_constructor_kwargs: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        self._callable: Callable[..., Any] | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_callable"] = None
        return state

    @property
    def is_actor_stage(self) -> bool:
        """True for a callable class."""
        return inspect.isclass(self.fn)

    def open(self) -> None:
        """Instantiate the callable class once."""
        if self.fn is not None and self._callable is None:
            self._callable = _make_callable(
                self.fn, self.fn_constructor_args, self.fn_constructor_kwargs, self.name
            )

    def apply(self, blocks: Iterator[pa.Table]) -> Iterator[pa.Table]:
        """The rows that pass."""
        self.open()
        for table in blocks:
            if self.expr is not None:
                yield table.filter(self.expr)
                continue
            fn = self._callable
            assert fn is not None
            keep = []
            try:
                for row in row_views(table):
                    keep.append(bool(fn(row)))
            except Exception as err:
                raise _note(err, self.name) from None
            yield table.filter(pa.array(keep, type=pa.bool_())) if keep else table


@dataclasses.dataclass
class ProjectStage(Stage):
    """``select_columns`` / ``drop_columns`` / ``rename_columns``."""

    select: tuple[str, ...] | None = None
    drop: tuple[str, ...] | None = None
    rename: Mapping[str, str] | None = None
    name: str = "Project"

    def apply(self, blocks: Iterator[pa.Table]) -> Iterator[pa.Table]:
        """The projected blocks (zero-copy)."""
        for table in blocks:
            yield self.project(table)

    def project(self, table: pa.Table) -> pa.Table:
        """Apply the projection to one table."""
        have = table.column_names
        wanted = self.select if self.select is not None else self.drop or ()
        if self.rename:
            wanted = tuple(self.rename)
        missing = [c for c in wanted if c not in have]
        if missing and (table.num_columns or table.num_rows):
            raise KeyError(
                f"{self.name}: column(s) {missing} not found; the dataset has columns {have}"
            )
        if self.select is not None:
            return table.select(list(self.select))
        if self.drop is not None:
            return table.drop_columns([c for c in self.drop if c in have])
        if self.rename:
            return table.rename_columns([self.rename.get(c, c) for c in have])
        return table


@dataclasses.dataclass
class PartialAggregateStage(Stage):
    """The map side of a groupby: each block reduced to partial aggregation states.

    Fused into the task that makes the blocks (a read, a map), so only the small partial
    states go to the object store; the all-to-all step merges them.
    """

    keys: Sequence[str]
    aggs: Sequence[Any]
    name: str = "PartialAggregate"

    def apply(self, blocks: Iterator[pa.Table]) -> Iterator[pa.Table]:
        """The partial states of each block's groups."""
        for table in blocks:
            yield aggregate_block(table, self.keys, self.aggs)


#: Schema metadata of a shuffle-mapped block: its partition offsets and ordering key.
SHUFFLE_OFFSETS = b"nbcluster.shuffle.offsets"
SHUFFLE_KEY = b"nbcluster.shuffle.key"


def _content_key(table: pa.Table) -> int:
    """A number that depends on the block's content (for repeatable seeded shuffles)."""
    key = zlib.crc32(str(table.num_rows).encode())
    if table.num_columns and table.num_rows:
        head = table.column(0).slice(0, 64).to_pylist()
        key = zlib.crc32(repr(head).encode(), key)
    return key


@dataclasses.dataclass
class ShuffleMapStage(Stage):
    """The map side of a random shuffle: rows get a random partition (of ``partitions``)
    and the block comes out sorted by partition, with the offsets in its schema metadata.

    Fused into the task that makes the blocks, so the shuffle costs one pass through the
    object store before the reducers, not two; reducer j slices part j of every block.
    """

    partitions: int
    seed: int | None = None
    name: str = "ShuffleMap"

    def apply(self, blocks: Iterator[pa.Table]) -> Iterator[pa.Table]:
        """The task's rows (all its blocks: one output) permuted into partition order."""
        table = concat(list(blocks))
        key = _content_key(table)
        rng = np.random.default_rng(None if self.seed is None else [self.seed, key])
        part = rng.integers(0, self.partitions, size=table.num_rows)
        order = partition_order(part, self.partitions)
        counts = np.bincount(part, minlength=self.partitions)
        offsets = [0, *np.cumsum(counts).tolist()]
        out = table.take(pa.array(order)) if table.num_rows else table
        meta = {SHUFFLE_OFFSETS: json.dumps(offsets).encode(), SHUFFLE_KEY: str(key).encode()}
        yield out.replace_schema_metadata(meta)


def run_stages(stages: Sequence[Stage], blocks: Iterable[pa.Table]) -> pa.Table:
    """Run ``stages`` over ``blocks``; one output block (the outputs concatenated)."""
    it: Iterator[pa.Table] = iter(blocks)
    for stage in stages:
        it = stage.apply(it)
    outputs = list(it)
    if not outputs:
        return pa.table({})
    nonempty = [t for t in outputs if t.num_rows]
    if not nonempty:
        return outputs[-1]
    return concat(nonempty)
