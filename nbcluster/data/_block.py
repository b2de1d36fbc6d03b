"""Blocks: Arrow tables, their metadata, and conversions to and from batches and rows.

A block is a ``pyarrow.Table``. It lives in the object store; its :class:`BlockMetadata`
(rows, bytes, schema) travels beside its ref so that the driver can count, plan and budget
without fetching the block. Batches are what user functions see: a dict of numpy arrays
(``batch_format="default"`` or ``"numpy"``), a ``pandas.DataFrame`` or a ``pyarrow.Table``.

Tensors (numpy arrays of more than one dimension) are stored in Arrow's
``fixed_shape_tensor`` extension type and come back as numpy arrays without a copy. Lists of
equal length come back as two-dimensional arrays (what Ray gives for
``from_items([{"x": [1]}])``). Primitive columns without nulls convert to numpy without a
copy; those views are read-only when the block was read from the object store.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

__all__ = [
    "BATCH_FORMATS",
    "BlockMetadata",
    "batch_to_block",
    "block_to_batch",
    "column_to_numpy",
    "compact",
    "concat",
    "empty_block",
    "iter_rows",
    "metadata_of",
    "partition_order",
    "pickled_bytes",
    "RowView",
    "row_views",
    "rows_to_block",
    "schema_names",
    "slice_block",
    "unify_schemas_or_raise",
]

#: What ``batch_format`` accepts; ``"default"`` means ``"numpy"`` (as in Ray).
BATCH_FORMATS = ("default", "numpy", "pandas", "pyarrow")


@dataclasses.dataclass(frozen=True)
class BlockMetadata:
    """What the driver knows about a block without fetching it."""

    num_rows: int
    size_bytes: int
    schema: pa.Schema | None
    input_files: tuple[str, ...] = ()
    exec_time_s: float = 0.0


def metadata_of(
    table: pa.Table, input_files: Sequence[str] = (), exec_time_s: float = 0.0
) -> BlockMetadata:
    """Metadata of ``table``."""
    return BlockMetadata(
        num_rows=table.num_rows,
        size_bytes=table.nbytes,
        schema=table.schema,
        input_files=tuple(input_files),
        exec_time_s=exec_time_s,
    )


def empty_block(schema: pa.Schema | None = None) -> pa.Table:
    """A block with no rows (and no columns when ``schema`` is None)."""
    return (schema or pa.schema([])).empty_table()


def schema_names(schema: pa.Schema | None) -> list[str]:
    """Column names of ``schema`` (empty for None)."""
    return [] if schema is None else list(schema.names)


# ------------------------------------------------------------------------ building blocks


def _tensor_array(arr: np.ndarray) -> pa.Array:
    arr = np.ascontiguousarray(arr)
    return pa.FixedShapeTensorArray.from_numpy_ndarray(arr)


def column_from_values(values: Any, name: str) -> pa.Array | pa.ChunkedArray:
    """One Arrow column from what a user gave for column ``name``."""
    if isinstance(values, pa.Array | pa.ChunkedArray):
        return values
    if isinstance(values, np.ndarray):
        if values.ndim == 0:
            raise ValueError(f"column {name!r} is a 0-dimensional array; give one value per row")
        if values.ndim > 1:
            return _tensor_array(values)
        if values.dtype == object:
            return column_from_values(list(values), name)
        return pa.array(values)
    if hasattr(values, "__array__") and not isinstance(values, list | tuple):  # torch tensors
        return column_from_values(np.asarray(values), name)
    values = list(values)
    if values and all(isinstance(v, np.ndarray) for v in values):
        shapes = {v.shape for v in values}
        if len(shapes) == 1 and values[0].ndim >= 1:
            return _tensor_array(np.stack(values))
        return pa.array([v.tolist() for v in values])
    try:
        return pa.array(values)
    except (pa.ArrowInvalid, pa.ArrowTypeError) as err:
        raise TypeError(
            f"column {name!r} could not be converted to an Arrow array ({err}); use values "
            "of one type per column (numbers, strings, lists, dicts or numpy arrays)"
        ) from None


def batch_to_block(batch: Any, where: str = "map_batches") -> pa.Table:
    """A block from a batch a user function returned; a clear error for anything else."""
    if isinstance(batch, pa.Table):
        return batch
    if isinstance(batch, pa.RecordBatch):
        return pa.Table.from_batches([batch])
    if isinstance(batch, Mapping):
        if not batch:
            return empty_block()
        columns = {}
        lengths = set()
        for key, values in batch.items():
            if not isinstance(key, str):
                raise TypeError(
                    f"the {where} function returned a dict with a non-string key {key!r}; "
                    "column names must be strings"
                )
            col = column_from_values(values, key)
            columns[key] = col
            lengths.add(len(col))
        if len(lengths) > 1:
            sizes = {k: len(v) for k, v in columns.items()}
            raise ValueError(
                f"the {where} function returned columns of different lengths {sizes}; every "
                "column of a batch must have one value per row"
            )
        return pa.table(columns)
    try:
        import pandas as pd
    except ImportError:  # pragma: no cover - pandas is part of the data extra
        pd = None
    if pd is not None and isinstance(batch, pd.DataFrame):
        return _table_from_pandas(batch)
    raise TypeError(
        f"the {where} function returned a {type(batch).__module__}.{type(batch).__name__}; it "
        "must return a dict of column name -> numpy array (batch_format 'default'/'numpy'), a "
        "pandas.DataFrame or a pyarrow.Table (any of the three is accepted whatever the "
        "batch_format)"
    )


def _table_from_pandas(df: Any) -> pa.Table:
    columns = {}
    for name in df.columns:
        series = df[name]
        if series.dtype == object and len(series) and isinstance(series.iloc[0], np.ndarray):
            columns[str(name)] = column_from_values(list(series), str(name))
        else:
            columns[str(name)] = pa.Array.from_pandas(series)
    return pa.table(columns) if columns else pa.table({}).slice(0, 0)


def rows_to_block(rows: Iterable[Any], where: str = "map") -> pa.Table:
    """A block from rows: dicts become columns; anything else is the ``"item"`` column."""
    rows = list(rows)
    if not rows:
        return empty_block()
    if all(isinstance(r, Mapping) for r in rows):
        names: dict[str, None] = {}
        for r in rows:
            for k in r:
                names.setdefault(k, None)
        columns = {
            str(name): column_from_values([r.get(name) for r in rows], str(name)) for name in names
        }
        return pa.table(columns)
    if any(isinstance(r, Mapping) for r in rows):
        bad = next(r for r in rows if not isinstance(r, Mapping))
        raise TypeError(
            f"the {where} function returned a mix of dicts and {type(bad).__name__}; every row "
            "must be a dict of column name -> value"
        )
    return pa.table({"item": column_from_values(rows, "item")})


# ------------------------------------------------------------------------ reading blocks


def _is_tensor(t: pa.DataType) -> bool:
    return isinstance(t, pa.FixedShapeTensorType)


def column_to_numpy(col: pa.ChunkedArray | pa.Array, zero_copy: bool = True) -> np.ndarray:
    """A numpy array of a column: zero-copy where Arrow allows, 2-D for equal-length lists."""
    if isinstance(col, pa.ChunkedArray):
        if col.num_chunks == 1:
            col = col.chunk(0)
        elif col.num_chunks == 0:
            col = pa.array([], type=col.type)
        else:
            col = col.combine_chunks()
    t = col.type
    if _is_tensor(t):
        out = col.to_numpy_ndarray()
    elif pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        out = _list_to_numpy(col)
    elif pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t):
        out = col.to_numpy(zero_copy_only=False)
    else:
        try:
            out = col.to_numpy(zero_copy_only=col.null_count == 0 and zero_copy)
        except pa.ArrowInvalid:
            out = col.to_numpy(zero_copy_only=False)
    if not zero_copy and not out.flags.writeable:
        out = out.copy()
    return out


def _list_to_numpy(col: pa.Array) -> np.ndarray:
    n = len(col)
    if col.null_count == 0 and n:
        if pa.types.is_fixed_size_list(col.type):
            width = col.type.list_size
            flat = col.flatten()
        else:
            offsets = col.offsets.to_numpy()
            lengths = np.diff(offsets)
            width = int(lengths[0])
            flat = col.flatten() if (lengths == width).all() else None
        if flat is not None and flat.null_count == 0:
            inner = column_to_numpy(flat)
            if inner.dtype != object or inner.ndim == 1:
                return inner.reshape((n, width) + inner.shape[1:])
    out = np.empty(n, dtype=object)
    for i, v in enumerate(col.to_pylist()):
        out[i] = None if v is None else np.asarray(v)
    return out


def block_to_batch(table: pa.Table, batch_format: str | None, zero_copy: bool = True) -> Any:
    """``table`` in ``batch_format`` ("default"/"numpy" dict, "pandas", "pyarrow" or None)."""
    if batch_format in ("default", "numpy"):
        return {
            name: column_to_numpy(table.column(i), zero_copy)
            for i, name in enumerate(table.column_names)
        }
    if batch_format == "pandas":
        return _to_pandas(table)
    if batch_format in ("pyarrow", None):
        return table
    raise ValueError(
        f"batch_format must be one of {', '.join(repr(f) for f in BATCH_FORMATS)} or None, "
        f"got {batch_format!r}"
    )


def _to_pandas(table: pa.Table) -> Any:
    import pandas as pd

    tensors = [i for i, f in enumerate(table.schema) if _is_tensor(f.type)]
    # split_blocks: one pandas block per column, so numeric columns without nulls are
    # views of the Arrow buffers instead of copies.
    if not tensors:
        return table.to_pandas(split_blocks=True)
    plain = table.drop_columns([table.column_names[i] for i in tensors])
    df = (
        plain.to_pandas(split_blocks=True)
        if plain.num_columns
        else pd.DataFrame(index=range(table.num_rows))
    )
    for i in tensors:
        arr = column_to_numpy(table.column(i))
        df.insert(i, table.column_names[i], pd.Series(list(arr), dtype=object))
    return df


def iter_rows(table: pa.Table) -> Iterator[dict[str, Any]]:
    """The rows of ``table`` as dicts of Python values (numpy arrays for tensors)."""
    if table.num_columns == 0:
        for _ in range(table.num_rows):
            yield {}
        return
    if not any(_is_tensor(f.type) for f in table.schema):
        yield from table.to_pylist()  # built in C++: several times faster than zipping here
        return
    names = table.column_names
    columns: list[list[Any]] = []
    for i, f in enumerate(table.schema):
        if _is_tensor(f.type):
            columns.append(list(column_to_numpy(table.column(i))))
        else:
            columns.append(table.column(i).to_pylist())
    for values in zip(*columns, strict=True):
        yield dict(zip(names, values, strict=True))


class RowView(Mapping[str, Any]):
    """A read-only row of a block: values are looked up when asked for (for predicates,
    which usually read one or two columns of every row)."""

    __slots__ = ("_columns", "_index")

    def __init__(self, columns: dict[str, list[Any]], index: int) -> None:
        self._columns = columns
        self._index = index

    def __getitem__(self, key: str) -> Any:
        return self._columns[key][self._index]

    def __iter__(self) -> Iterator[str]:
        return iter(self._columns)

    def __len__(self) -> int:
        return len(self._columns)

    def __repr__(self) -> str:
        return repr(dict(self))


def row_views(table: pa.Table) -> Iterator[RowView]:
    """Read-only rows whose columns are converted to Python once, lazily per column."""
    columns = _LazyColumns(table)
    return map(RowView, itertools.repeat(columns), range(table.num_rows))  # type: ignore[arg-type]


class _LazyColumns(dict):  # type: ignore[type-arg]
    """Column name -> Python list, converted on first access (``__missing__``), so plain
    lookups afterwards run at dict speed."""

    def __init__(self, table: pa.Table) -> None:
        super().__init__()
        self._table = table
        self.names = table.column_names

    def __missing__(self, key: str) -> list[Any]:
        if key not in self.names:
            raise KeyError(key)
        col = self._table.column(key)
        value = list(column_to_numpy(col)) if _is_tensor(col.type) else col.to_pylist()
        self[key] = value
        return value

    def __iter__(self) -> Iterator[str]:
        return iter(self.names)

    def __len__(self) -> int:
        return len(self.names)


# ------------------------------------------------------------------------ combining blocks


def _without_null_types(schema: pa.Schema) -> dict[str, pa.DataType]:
    return {f.name: f.type for f in schema if not pa.types.is_null(f.type)}


def unify_schemas_or_raise(schemas: Sequence[pa.Schema | None], what: str) -> pa.Schema | None:
    """The common schema, or ``ValueError`` naming the columns that differ.

    Columns whose type is ``null`` (all values missing) match any type.
    """
    known = [s for s in schemas if s is not None and len(s.names)]
    if not known:
        return schemas[0] if schemas else None
    first = known[0]
    for other in known[1:]:
        if list(other.names) != list(first.names) and set(other.names) != set(first.names):
            missing = sorted(set(first.names) ^ set(other.names))
            raise ValueError(
                f"{what}: the inputs have different columns ({list(first.names)} vs "
                f"{list(other.names)}; differing: {missing}). Make the schemas equal first, "
                "e.g. with select_columns() or add_column()."
            )
        a, b = _without_null_types(first), _without_null_types(other)
        for name in set(a) & set(b):
            if a[name] != b[name]:
                raise ValueError(
                    f"{what}: column {name!r} is {a[name]} in one input and {b[name]} in "
                    "another. Cast it to one type first, e.g. with map_batches()."
                )
    try:
        return pa.unify_schemas(known, promote_options="default")
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        return first


def concat(tables: Sequence[pa.Table]) -> pa.Table:
    """One table from several (zero-copy: the result's columns are chunked)."""
    tables = [t for t in tables if t.num_columns or t.num_rows]
    if not tables:
        return empty_block()
    if len(tables) == 1:
        return tables[0]
    first = tables[0].schema
    if all(t.schema == first for t in tables[1:]):
        return pa.concat_tables(tables)
    return pa.concat_tables(tables, promote_options="default")


def partition_order(part_of_row: np.ndarray, n: int) -> np.ndarray:
    """Row indices grouped by partition (``part_of_row`` in ``[0, n)``), rows in their
    order within each partition.

    The ids are narrowed to 8 or 16 bits first: numpy's stable argsort is a radix sort for
    those (about ten times faster than for int64 ids), and gives the same order.
    """
    if n <= 1 << 8:
        part_of_row = part_of_row.astype(np.uint8, copy=False)
    elif n <= 1 << 16:
        part_of_row = part_of_row.astype(np.uint16, copy=False)
    return np.argsort(part_of_row, kind="stable")


def slice_block(table: pa.Table, start: int, end: int) -> pa.Table:
    """Rows ``[start, end)`` of ``table`` (zero-copy; clamped to the table)."""
    start = min(max(start, 0), table.num_rows)
    return table.slice(start, max(min(end, table.num_rows) - start, 0))


def pickled_bytes(col: pa.ChunkedArray) -> int:
    """Bytes of buffers that pickling ``col`` writes (at least its data; more when sliced).

    Arrow pickles every chunk with the whole buffers it references, so chunks that are
    slices of one buffer (what a parquet scan returns: batches cut from one decoded row
    group) each write all of it. ``ChunkedArray.get_total_buffer_size`` counts a shared
    buffer once, so it is summed per chunk here.
    """
    return sum(chunk.get_total_buffer_size() for chunk in col.chunks)


def compact(table: pa.Table) -> pa.Table:
    """``table`` without buffers it does not use (before it is written to the store).

    Arrow pickles a sliced array with its whole buffers, so a block that is a small slice
    of a large one, or whose chunks are slices of one buffer, would be stored at a
    multiple of its size (see :func:`pickled_bytes`). Columns whose pickled buffers are
    much larger than their data are copied into one fresh, exactly sized array.
    """
    columns = []
    changed = False
    for col in table.columns:
        if col.num_chunks and pickled_bytes(col) > col.nbytes * 1.25 + 4096:
            col = pa.chunked_array([pa.concat_arrays(col.chunks)], type=col.type)
            changed = True
        columns.append(col)
    if not changed:
        return table
    return pa.Table.from_arrays(columns, schema=table.schema)
