"""All-to-all operators as map and reduce tasks: shuffle, sort, groupby, repartition, zip.

:func:`run_all_to_all` runs on the executor's thread once every input block of the
operator is known. It submits the operator's tasks and returns its outputs in order:
each a ``(block ref, metadata ref)`` pair of a reduce task, or a :class:`RefBundle` that
is already there (``randomize_block_order`` only reorders refs).

- ``random_shuffle``: each map task permutes its rows and cuts them into P parts; reduce
  task j concatenates the j-th parts and permutes again.
- ``sort``: samples of the key give P-1 boundaries; map tasks cut each block by them;
  reduce task j sorts its part. Outputs come in key order.
- ``aggregate`` (groupby): each block is reduced to partial states first, then those are
  range-partitioned by key like a sort and combined; the result is sorted by key.
- ``map_groups``: range-partitioned like a sort; each reducer calls the function once
  per group.
- ``repartition``: without shuffle, output i gathers rows ``[i*N/k, (i+1)*N/k)``.
- ``zip``: output i is left block i with the same rows of the right side beside it.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

import nbcluster
from nbcluster._refs import ObjectRef
from nbcluster.data._block import (
    BlockMetadata,
    batch_to_block,
    block_to_batch,
    column_to_numpy,
    compact,
    concat,
    metadata_of,
    partition_order,
)
from nbcluster.data._datasource import group_units
from nbcluster.data._logical import AllToAll, RefBundle
from nbcluster.data._transform import SHUFFLE_KEY, SHUFFLE_OFFSETS, _note
from nbcluster.data.aggregate import aggregate_block, combine
from nbcluster.data.context import DataContext

__all__ = ["Output", "run_all_to_all"]

Output = RefBundle | tuple[ObjectRef, ObjectRef]

#: Reduce outputs aim at about this many bytes (fewer, larger blocks for small data).
PARTITION_BYTES = 64 * 1024 * 1024
SAMPLES_PER_BLOCK = 32


def _sort_keys(keys: Sequence[str], descending: Sequence[bool]) -> list[tuple[str, str]]:
    return [
        (k, "descending" if d else "ascending", "at_end")
        for k, d in zip(keys, descending, strict=True)
    ]


def _parts(table: pa.Table, part_of_row: np.ndarray, n: int) -> tuple[pa.Table, ...]:
    """``table`` cut into ``n`` tables by ``part_of_row`` (one copy of the rows in all)."""
    if not table.num_rows:
        return tuple(table for _ in range(n))
    order = partition_order(part_of_row, n)
    counts = np.bincount(part_of_row, minlength=n)
    bounds = np.cumsum(counts)[:-1]
    # One take per part: each copies only its own rows (a slice of one big take would be
    # pickled with the whole buffers, or need a second copy to compact it).
    return tuple(table.take(pa.array(idx)) for idx in np.split(order, bounds))


def _one_or_many(result: Any, n: int) -> list[ObjectRef]:
    return [result] if n == 1 else list(result)


# ----------------------------------------------------------------------- remote tasks


@nbcluster.remote
def _shuffle_map(seed: int | None, n: int, *blocks: pa.Table) -> Any:
    table = concat(blocks)
    rng = np.random.default_rng(seed)
    parts = _parts(table, rng.integers(0, n, size=table.num_rows), n)
    return parts[0] if n == 1 else parts


@nbcluster.remote(num_returns=2)
def _shuffle_reduce(seed: int | None, *parts: pa.Table) -> tuple[pa.Table, BlockMetadata]:
    table = concat(parts)
    rng = np.random.default_rng(seed)
    out = (
        compact(table.take(pa.array(rng.permutation(table.num_rows)))) if table.num_rows else table
    )
    return out, metadata_of(out)


@nbcluster.remote(num_returns=2)
def _premapped_reduce(
    seed: int | None, j: int, *blocks: pa.Table
) -> tuple[pa.Table, BlockMetadata]:
    """Part ``j`` of every shuffle-mapped block (in a repeatable order), permuted."""
    keyed = []
    for b in blocks:
        meta = b.schema.metadata or {}
        if SHUFFLE_OFFSETS not in meta:
            continue  # an empty block without columns
        offsets = json.loads(meta[SHUFFLE_OFFSETS])
        part = b.slice(offsets[j], offsets[j + 1] - offsets[j]).replace_schema_metadata(None)
        keyed.append((int(meta[SHUFFLE_KEY]), b.num_rows, part))
    keyed.sort(key=lambda k: (k[0], k[1]))
    table = concat([k[2] for k in keyed])
    if table.num_rows:
        rng = np.random.default_rng(seed)
        table = table.take(pa.array(rng.permutation(table.num_rows)))
    out = compact(table)
    return out, metadata_of(out)


@nbcluster.remote
def _sample(block: pa.Table, keys: list[str], k: int) -> pa.Table:
    missing = [c for c in keys if c not in block.column_names]
    if missing and (block.num_rows or block.num_columns):
        raise KeyError(
            f"sort: column(s) {missing} not found; the dataset has columns {block.column_names}"
        )
    if not block.num_rows:
        return pa.table({})
    idx = np.linspace(0, block.num_rows - 1, num=min(k, block.num_rows)).astype(np.int64)
    return compact(block.select(keys).take(pa.array(idx)))


def _partition_index(table: pa.Table, key: str, bounds: list[Any], descending: bool) -> np.ndarray:
    n = len(bounds) + 1
    col = table.column(key)
    if not bounds:
        return np.zeros(table.num_rows, dtype=np.int64)
    nulls = pc.is_null(col).to_numpy(zero_copy_only=False)
    values = col.to_numpy(zero_copy_only=False)
    if nulls.any():
        values = values.copy()
        values[nulls] = bounds[0]
    idx = np.searchsorted(
        np.asarray(bounds, dtype=values.dtype if values.dtype != object else object),
        values,
        side="right",
    )
    if descending:
        idx = (n - 1) - idx
    idx[nulls] = n - 1
    return idx.astype(np.int64)


@nbcluster.remote
def _range_map(n: int, key: str, bounds: list[Any], descending: bool, block: pa.Table) -> Any:
    if not block.num_rows:
        parts = tuple(block for _ in range(n))
    else:
        parts = _parts(block, _partition_index(block, key, bounds, descending), n)
    return parts[0] if n == 1 else parts


def _distinct_float_order(table: pa.Table, key: str, descending: bool) -> np.ndarray | None:
    """The sorted order of a float key whose values are all distinct, without nulls or
    NaN; ``None`` for any other key.

    Then every sort gives the same order, so numpy's unstable sort (several times faster
    than Arrow's stable one) gives exactly ``Table.sort_by``'s result; ties, nulls and NaN
    (whose places Arrow defines) go to ``sort_by``.
    """
    col = table.column(key)
    if not pa.types.is_floating(col.type) or col.null_count:
        return None
    values = column_to_numpy(col)
    if np.isnan(values).any():
        return None
    order = np.argsort(values)
    ranked = values[order]
    if (ranked[1:] == ranked[:-1]).any():
        return None
    return order[::-1] if descending else order


def _sort_table(table: pa.Table, keys: list[str], descending: list[bool]) -> pa.Table:
    """``table`` sorted by ``keys``: exactly ``Table.sort_by``'s order (stable, nulls last)."""
    if not table.num_rows:
        return table
    order = _distinct_float_order(table, keys[0], descending[0]) if len(keys) == 1 else None
    if order is None:
        return table.sort_by(_sort_keys(keys, descending))
    return table.take(order)


@nbcluster.remote(num_returns=2)
def _sort_reduce(
    keys: list[str], descending: list[bool], *parts: pa.Table
) -> tuple[pa.Table, BlockMetadata]:
    table = compact(_sort_table(concat(parts), keys, descending))
    return table, metadata_of(table)


@nbcluster.remote(num_returns=2)
def _partial_agg(
    keys: list[str], aggs: list[Any], block: pa.Table
) -> tuple[pa.Table, BlockMetadata]:
    out = aggregate_block(block, keys, aggs)
    return out, metadata_of(out)


@nbcluster.remote(num_returns=2)
def _combine_agg(
    keys: list[str], aggs: list[Any], *parts: pa.Table
) -> tuple[pa.Table, BlockMetadata]:
    out = combine(concat([p for p in parts if p.num_columns]), keys, aggs)
    return out, metadata_of(out)


@nbcluster.remote(num_returns=2)
def _map_groups_reduce(
    keys: list[str], stage: Any, *parts: pa.Table
) -> tuple[pa.Table, BlockMetadata]:
    table = concat(parts)
    outs = []
    if table.num_rows:
        table = table.sort_by([(k, "ascending", "at_end") for k in keys])
        bounds = _group_bounds(table, keys)
        stage.open()
        fn = stage._callable
        for start, end in zip(bounds[:-1], bounds[1:], strict=True):
            batch = block_to_batch(table.slice(start, end - start), stage.batch_format)
            try:
                result = fn(batch, *stage.fn_args, **stage.fn_kwargs)
            except Exception as err:
                raise _note(err, stage.name) from None
            outs.append(
                batch_to_block(
                    result, f"map_groups ({stage.name}, batch_format={stage.batch_format!r})"
                )
            )
    out = compact(concat(outs)) if outs else pa.table({})
    return out, metadata_of(out)


def _group_bounds(table: pa.Table, keys: list[str]) -> list[int]:
    change = np.zeros(table.num_rows, dtype=bool)
    change[0] = True
    for k in keys:
        col = table.column(k)
        values = col.to_numpy(zero_copy_only=False)
        nulls = pc.is_null(col).to_numpy(zero_copy_only=False)
        if table.num_rows > 1:
            diff = values[1:] != values[:-1]
            both_null = nulls[1:] & nulls[:-1]
            change[1:] |= diff & ~both_null
            change[1:] |= nulls[1:] != nulls[:-1]
    starts = list(np.nonzero(change)[0])
    return [int(s) for s in starts] + [table.num_rows]


@nbcluster.remote(num_returns=2)
def _gather(spec: list[tuple[int, int]], *blocks: pa.Table) -> tuple[pa.Table, BlockMetadata]:
    out = compact(concat([b.slice(s, e - s) for b, (s, e) in zip(blocks, spec, strict=True)]))
    return out, metadata_of(out)


@nbcluster.remote(num_returns=2)
def _zip(
    left: pa.Table, spec: list[tuple[int, int]], *right: pa.Table
) -> tuple[pa.Table, BlockMetadata]:
    other = concat([b.slice(s, e - s) for b, (s, e) in zip(right, spec, strict=True)])
    out = left
    for name, col in zip(other.column_names, other.columns, strict=True):
        new = name
        k = 1
        while new in out.column_names:
            new = f"{name}_{k}"
            k += 1
        out = out.append_column(new, col)
    out = compact(out)
    return out, metadata_of(out)


# ----------------------------------------------------------------------- the driver side


def _partitions(bundles: Sequence[RefBundle], requested: int | None, cpu: float) -> int:
    if requested:
        return int(requested)
    total = sum(b.meta.size_bytes for b in bundles)
    n = max(len(bundles), 1)
    by_size = math.ceil(total / PARTITION_BYTES) if total else 1
    return max(1, min(n, max(by_size, min(n, int(cpu)))))


def _boundaries(bundles: Sequence[RefBundle], keys: list[str], n: int) -> list[Any]:
    samples = nbcluster.get([_sample.remote(b.block, keys, SAMPLES_PER_BLOCK) for b in bundles])
    samples = [s for s in samples if s.num_rows]
    if not samples or n <= 1:
        return []
    values = concat(samples).column(keys[0]).drop_null()
    if not len(values):
        return []
    values = values.take(pc.sort_indices(values)).to_pylist()
    cuts = [values[min(len(values) - 1, (i * len(values)) // n)] for i in range(1, n)]
    out: list[Any] = []
    for c in cuts:
        if not out or c != out[-1]:
            out.append(c)
    return out


def _range_partition(
    bundles: Sequence[RefBundle], key: str, bounds: list[Any], descending: bool
) -> list[list[ObjectRef]]:
    n = len(bounds) + 1
    return [
        _one_or_many(
            _range_map.options(num_returns=n).remote(n, key, bounds, descending, b.block), n
        )
        for b in bundles
    ]


def _check_keys(bundles: Sequence[RefBundle], keys: list[str], what: str) -> None:
    for b in bundles:
        schema = b.meta.schema
        if schema is not None and (len(schema.names) or b.meta.num_rows):
            missing = [k for k in keys if k not in schema.names]
            if missing:
                raise KeyError(
                    f"{what}: column(s) {missing} not found; the dataset has columns {list(schema.names)}"
                )
            return


def run_all_to_all(
    op: AllToAll, inputs: list[list[RefBundle]], ctx: DataContext, cpu: float
) -> list[Output]:
    """Submit the tasks of ``op`` over its input bundles; its outputs, in order."""
    kind, p = op.kind, op.params
    bundles = [b for group in inputs for b in group]
    if kind == "randomize_block_order":
        order = list(bundles)
        random.Random(p.get("seed")).shuffle(order)
        return list(order)
    if p.get("premapped"):  # the producing tasks ran ShuffleMapStage
        seed = p.get("seed")
        blocks = [b.block for b in bundles]
        return [
            tuple(_premapped_reduce.remote(None if seed is None else seed * 104729 + j, j, *blocks))
            for j in range(p["partitions"])
        ]
    if kind == "random_shuffle" or (kind == "repartition" and p.get("shuffle")):
        n = _partitions(bundles, p.get("num_blocks"), cpu)
        seed = p.get("seed")
        groups = group_units([b.meta.size_bytes for b in bundles], n) if bundles else []
        maps = [
            _one_or_many(
                _shuffle_map.options(num_returns=n).remote(
                    None if seed is None else seed * 7919 + i, n, *[bundles[j].block for j in g]
                ),
                n,
            )
            for i, g in enumerate(groups)
        ]
        return [
            tuple(
                _shuffle_reduce.remote(
                    None if seed is None else seed * 104729 + j, *[m[j] for m in maps]
                )
            )
            for j in range(n)
        ]
    if kind == "repartition":
        return _repartition(bundles, p)
    if kind == "sort":
        keys, desc = p["keys"], p["descending"]
        _check_keys(bundles, keys, "sort")
        n = _partitions(bundles, None, cpu)
        bounds = _boundaries(bundles, keys, n)
        parts = _range_partition(bundles, keys[0], bounds, desc[0])
        return [
            tuple(_sort_reduce.remote(keys, desc, *[m[j] for m in parts]))
            for j in range(len(bounds) + 1)
        ]
    if kind == "aggregate":
        keys, aggs = p["keys"], p["aggs"]
        _check_keys(bundles, keys, "groupby")
        if p.get("partials"):  # the upstream tasks already reduced their blocks
            pb = list(bundles)
        else:
            partial = [tuple(_partial_agg.remote(keys, aggs, b.block)) for b in bundles]
            metas = nbcluster.get([m for _, m in partial])
            pb = [RefBundle(r, m) for (r, _), m in zip(partial, metas, strict=True)]
        if not keys or not pb:
            return [tuple(_combine_agg.remote(keys, aggs, *[b.block for b in pb]))]
        n = _partitions(pb, None, 1)
        bounds = _boundaries(pb, keys, n)
        parts = _range_partition(pb, keys[0], bounds, False)
        return [
            tuple(_combine_agg.remote(keys, aggs, *[m[j] for m in parts]))
            for j in range(len(bounds) + 1)
        ]
    if kind == "map_groups":
        keys, stage = p["keys"], p["stage"]
        _check_keys(bundles, keys, "map_groups")
        n = _partitions(bundles, None, cpu)
        bounds = _boundaries(bundles, keys, n) if keys else []
        parts = (
            _range_partition(bundles, keys[0], bounds, False)
            if keys
            else [[b.block] for b in bundles]
        )
        opts = dict(p.get("remote_args") or {})
        opts.setdefault("num_cpus", 1)
        return [
            tuple(_map_groups_reduce.options(**opts).remote(keys, stage, *[m[j] for m in parts]))
            for j in range(len(bounds) + 1)
        ]
    if kind == "zip":
        return _zip_all(inputs)
    raise ValueError(f"unknown all-to-all operator {kind!r}")


def _ranges(
    bundles: Sequence[RefBundle], start: int, end: int
) -> tuple[list[ObjectRef], list[tuple[int, int]]]:
    refs, spec = [], []
    offset = 0
    for b in bundles:
        n = b.meta.num_rows
        lo, hi = max(start, offset), min(end, offset + n)
        if lo < hi:
            refs.append(b.block)
            spec.append((lo - offset, hi - offset))
        offset += n
    return refs, spec


def _repartition(bundles: Sequence[RefBundle], p: dict[str, Any]) -> list[Output]:
    total = sum(b.meta.num_rows for b in bundles)
    if p.get("target_num_rows_per_block"):
        k = max(1, math.ceil(total / p["target_num_rows_per_block"]))
    else:
        k = int(p["num_blocks"])
    out: list[Output] = []
    for i in range(k):
        lo, hi = (i * total) // k, ((i + 1) * total) // k
        refs, spec = _ranges(bundles, lo, hi)
        if not refs:
            schema = next((b.meta.schema for b in bundles if b.meta.schema is not None), None)
            empty = (schema or pa.schema([])).empty_table()
            out.append(RefBundle(nbcluster.put(empty), metadata_of(empty)))
            continue
        out.append(tuple(_gather.remote(spec, *refs)))
    return out


def _zip_all(inputs: list[list[RefBundle]]) -> list[Output]:
    left, right = inputs[0], inputs[1]
    nl = sum(b.meta.num_rows for b in left)
    nr = sum(b.meta.num_rows for b in right)
    if nl != nr:
        raise ValueError(
            f"zip: the datasets have different numbers of rows ({nl} and {nr}); zip needs "
            "equal row counts (use limit() on the longer one)"
        )
    out: list[Output] = []
    offset = 0
    for b in left:
        refs, spec = _ranges(right, offset, offset + b.meta.num_rows)
        out.append(tuple(_zip.remote(b.block, spec, *refs)))
        offset += b.meta.num_rows
    return out
