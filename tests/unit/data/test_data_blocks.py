"""Blocks, batches, stages, aggregations and path planning, in one process."""

from __future__ import annotations

import pickle

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from nbcluster.data._all_to_all import _sort_table
from nbcluster.data._block import (
    batch_to_block,
    block_to_batch,
    compact,
    concat,
    iter_rows,
    partition_order,
    pickled_bytes,
    rows_to_block,
    unify_schemas_or_raise,
)
from nbcluster.data._datasource import group_units, parquet_read_tasks, resolve_paths
from nbcluster.data._transform import MapBatchesStage, MapRowsStage, ProjectStage, run_stages
from nbcluster.data.aggregate import (
    AggregateFn,
    Count,
    Max,
    Mean,
    Min,
    Std,
    Sum,
    aggregate_block,
    combine,
)
from nbcluster.data.compute import ActorPoolStrategy, TaskPoolStrategy, resolve_compute
from nbcluster.data.context import DataContext
from nbcluster.data.iterator import rebatch


def test_rows_with_lists_become_two_dimensional_batches() -> None:
    block = rows_to_block([{"x": [i], "y": [2 * i, 3]} for i in range(4)])
    batch = block_to_batch(block, "default")
    assert batch["x"].shape == (4, 1) and batch["y"].shape == (4, 2)
    assert batch["y"][:, 0].tolist() == [0, 2, 4, 6]


def test_tensors_round_trip_without_copy() -> None:
    arr = np.arange(24, dtype=np.float32).reshape(4, 2, 3)
    block = batch_to_block({"t": arr, "k": np.arange(4)})
    assert isinstance(block.schema.field("t").type, pa.FixedShapeTensorType)
    back = block_to_batch(block, "numpy")["t"]
    assert back.shape == (4, 2, 3) and np.array_equal(back, arr)
    k = block_to_batch(block, "numpy")["k"]
    assert not k.flags.owndata  # a view of the Arrow buffer


def test_non_dict_rows_are_the_item_column() -> None:
    assert rows_to_block([1, 2, 3]).column_names == ["item"]
    with pytest.raises(TypeError, match="mix of dicts and int"):
        rows_to_block([{"a": 1}, 2])


def test_wrong_return_type_names_what_was_expected() -> None:
    with pytest.raises(
        TypeError, match=r"returned a builtins\.list; it must return a dict of column"
    ):
        batch_to_block([1, 2, 3], "map_batches")
    with pytest.raises(ValueError, match="columns of different lengths"):
        batch_to_block({"a": [1, 2], "b": [1]})


def test_pandas_and_pyarrow_batches() -> None:
    block = pa.table({"a": [1, 2, None], "s": ["x", "y", "z"]})
    df = block_to_batch(block, "pandas")
    assert isinstance(df, pd.DataFrame) and df["a"].isna().sum() == 1
    assert batch_to_block(df).column("a").null_count == 1
    assert block_to_batch(block, "pyarrow") is block
    with pytest.raises(ValueError, match="batch_format must be one of"):
        block_to_batch(block, "torch")


def test_iter_rows_gives_python_values_and_arrays_for_tensors() -> None:
    block = batch_to_block({"a": np.arange(2), "t": np.zeros((2, 2))})
    rows = list(iter_rows(block))
    assert rows[1]["a"] == 1 and rows[1]["t"].shape == (2,)


def test_compact_drops_unused_buffers() -> None:
    big = pa.table({"x": np.arange(1_000_000)})
    small = big.slice(10, 5)
    assert small.get_total_buffer_size() > 1_000_000
    out = compact(small)
    assert out.get_total_buffer_size() < 1000 and out.column("x").to_pylist() == [
        10,
        11,
        12,
        13,
        14,
    ]
    assert compact(big) is big


def _pickled_size(table: pa.Table) -> int:
    """Bytes the object store holds for ``table``: its pickle and out-of-band buffers."""
    buffers: list[pickle.PickleBuffer] = []
    meta = pickle.dumps(table, protocol=5, buffer_callback=buffers.append)
    return len(meta) + sum(memoryview(b).nbytes for b in buffers)


def test_compact_chunks_that_share_one_buffer() -> None:
    # What a parquet scan returns: batches cut from one decoded row group. Each chunk
    # pickles with the whole shared buffer, so the block would be stored at 8x its size.
    whole = pa.table({"x": np.arange(800_000), "y": np.arange(800_000) * 0.5})
    table = pa.Table.from_batches(whole.to_batches(max_chunksize=100_000))
    assert table.column("x").num_chunks == 8
    assert pickled_bytes(table.column("x")) > 7 * table.column("x").nbytes
    assert _pickled_size(table) > 7 * table.nbytes
    out = compact(table)
    assert _pickled_size(out) < table.nbytes * 1.01 + 4096
    assert out.equals(table)
    # Chunks that own their buffers are left as they are.
    separate = pa.concat_tables([compact(whole.slice(0, 400_000)), compact(whole.slice(400_000))])
    assert compact(separate) is separate


def test_parquet_blocks_are_stored_at_their_size(tmp_path: pytest.TempPathFactory) -> None:
    path = tmp_path / "one_group.parquet"  # type: ignore[operator]
    n = 600_000  # one row group, larger than the scanner's default batch (131,072 rows)
    pq.write_table(pa.table({"a": np.arange(n), "b": np.random.default_rng(0).random(n)}), path)
    tasks, _ = parquet_read_tasks(
        str(path),
        filesystem=None,
        columns=None,
        filter=None,
        override_num_blocks=1,
        min_blocks=1,
        min_block_size=1,
    )
    (block,) = list(tasks[0]())
    assert block.num_rows == n
    assert _pickled_size(block) < block.nbytes * 1.01 + 4096
    assert compact(block) is block  # nothing to copy


@pytest.mark.parametrize("descending", [False, True])
def test_sort_table_is_arrows_stable_sort(descending: bool) -> None:
    rng = np.random.default_rng(7)
    n = 2000
    distinct = rng.random(n)
    cases = {
        "distinct": distinct,
        "ties": np.round(distinct, 1),
        "signed zeros": np.where(distinct < 0.5, -0.0, 0.0),
        "nan": np.where(distinct < 0.1, np.nan, distinct),
        "nulls": pa.array(np.where(distinct < 0.1, None, distinct).tolist(), type=pa.float64()),
        "float32": distinct.astype(np.float32),
        "ints": rng.integers(0, 10, n),
    }
    for name, key in cases.items():
        chunks = [slice(0, 700), slice(700, 701), slice(701, n)]
        table = pa.concat_tables(
            [pa.table({"key": key[c], "row": np.arange(n)[c]}) for c in chunks]
        )
        want = table.sort_by([("key", "descending" if descending else "ascending", "at_end")])
        got = _sort_table(table, ["key"], [descending])
        # Rows are numbered: the same row order is the same table (NaN != NaN in equals).
        assert got.column("row").equals(want.column("row")), name
        assert got.schema == want.schema and got.num_rows == n
    two = pa.table({"a": np.round(distinct, 1), "b": distinct, "row": np.arange(n)})
    want = two.sort_by([("a", "descending" if descending else "ascending"), ("b", "ascending")])
    assert _sort_table(two, ["a", "b"], [descending, False]).equals(want)
    assert _sort_table(two.slice(0, 0), ["a"], [descending]).num_rows == 0


@pytest.mark.parametrize("n", [1, 7, 256, 257, 70_000])
def test_partition_order_is_a_stable_grouping(n: int) -> None:
    part = np.random.default_rng(n).integers(0, n, size=5000)
    assert np.array_equal(partition_order(part, n), np.argsort(part, kind="stable"))


def test_union_schema_check_names_the_column() -> None:
    a = pa.schema([("x", pa.int64())])
    b = pa.schema([("x", pa.string())])
    with pytest.raises(ValueError, match="column 'x' is int64 in one input and string"):
        unify_schemas_or_raise([a, b], "union")
    with pytest.raises(ValueError, match="different columns"):
        unify_schemas_or_raise([a, pa.schema([("y", pa.int64())])], "union")
    nulls = pa.schema([("x", pa.null())])
    assert unify_schemas_or_raise([a, nulls], "union").field("x").type == pa.int64()


def test_map_batches_stage_rebatches_and_checks_output() -> None:
    blocks = [pa.table({"v": np.arange(i * 10, i * 10 + 10)}) for i in range(3)]
    seen = []

    def fn(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        seen.append(len(batch["v"]))
        return {"v": batch["v"] + 1}

    out = run_stages([MapBatchesStage(fn, 7, "default")], blocks)
    assert seen == [7, 7, 7, 7, 2] and out.column("v").to_pylist() == list(range(1, 31))
    bad = MapBatchesStage(lambda b: 5, None, "numpy", name="MapBatches(bad)")
    with pytest.raises(TypeError, match=r"batch_format='numpy'.*returned a builtins\.int") as info:
        run_stages([bad], blocks)
    assert "MapBatches(bad) operator" in "\n".join(getattr(info.value, "__notes__", []))


def test_udf_errors_name_the_operator() -> None:
    def boom(row: dict) -> dict:
        raise ZeroDivisionError("no")

    with pytest.raises(ZeroDivisionError) as info:
        run_stages([MapRowsStage(boom, name="Map(boom)")], [pa.table({"a": [1]})])
    assert "Map(boom) operator" in info.value.__notes__[0]
    with pytest.raises(TypeError, match="must return a dict"):
        run_stages([MapRowsStage(lambda r: 1, name="Map(x)")], [pa.table({"a": [1]})])


def test_projection_of_a_missing_column() -> None:
    with pytest.raises(
        KeyError, match=r"column\(s\) \['z'\] not found; the dataset has columns \['a'\]"
    ):
        ProjectStage(select=("z",), name="Project(z)").project(pa.table({"a": [1]}))


def test_rebatch_sizes_drop_last_and_shuffle() -> None:
    tables = [pa.table({"i": np.arange(s, s + 10)}) for s in range(0, 100, 10)]
    assert [t.num_rows for t in rebatch(tables, 32)] == [32, 32, 32, 4]
    assert [t.num_rows for t in rebatch(tables, 32, drop_last=True)] == [32, 32, 32]
    shuffled = concat(list(rebatch(tables, 25, shuffle_buffer=40, seed=1))).column("i").to_pylist()
    assert sorted(shuffled) == list(range(100)) and shuffled != list(range(100))


def _frame(n: int = 1000) -> pd.DataFrame:
    rng = np.random.default_rng(0)
    df = pd.DataFrame({"k": rng.integers(0, 7, n), "v": rng.normal(size=n)})
    df.loc[::13, "v"] = np.nan
    return df


def test_aggregations_over_many_blocks_equal_pandas() -> None:
    df = _frame()
    table = pa.Table.from_pandas(df, preserve_index=False)
    aggs = [Count(), Sum("v"), Min("v"), Max("v"), Mean("v"), Std("v")]
    partials = [aggregate_block(table.slice(i, 100), ["k"], aggs) for i in range(0, 1000, 100)]
    out = combine(concat(partials), ["k"], aggs).to_pandas().set_index("k")
    g = df.groupby("k")["v"]
    assert out["count()"].tolist() == df.groupby("k").size().tolist()
    np.testing.assert_allclose(out["sum(v)"], g.sum())
    np.testing.assert_allclose(out["min(v)"], g.min())
    np.testing.assert_allclose(out["max(v)"], g.max())
    np.testing.assert_allclose(out["mean(v)"], g.mean())
    np.testing.assert_allclose(out["std(v)"], g.std(ddof=1))


def test_global_aggregate_and_custom_aggregate_fn() -> None:
    table = pa.table({"v": [1, 2, 3, 4]})
    total = AggregateFn(
        init=lambda k: 0,
        accumulate_block=lambda s, b: s + sum(b.column("v").to_pylist()),
        merge=lambda a, b: a + b,
        name="total",
    )
    parts = [
        aggregate_block(table.slice(0, 2), [], [total, Mean("v")]),
        aggregate_block(table.slice(2), [], [total, Mean("v")]),
    ]
    out = combine(concat(parts), [], [total, Mean("v")]).to_pylist()
    assert out == [{"total": 10, "mean(v)": 2.5}]


def test_group_units_balances_contiguously() -> None:
    assert group_units([1] * 10, 3) == [[0, 1, 2, 3], [4, 5, 6], [7, 8, 9]]
    assert group_units([5, 5], 4) == [[0], [1]]


def test_paths_directories_globs_and_missing(tmp_path: pytest.TempPathFactory) -> None:
    d = tmp_path / "t"  # type: ignore[operator]
    d.mkdir()
    for i in range(3):
        pq.write_table(pa.table({"a": [i]}), d / f"p{i}.parquet")
    (d / "_SUCCESS").write_text("")
    fs, files = resolve_paths(str(d), None, "read_parquet")
    assert [f.rsplit("/", 1)[1] for f, _ in files] == ["p0.parquet", "p1.parquet", "p2.parquet"]
    _, files = resolve_paths(str(d / "p[12].parquet"), None, "read_parquet")
    assert len(files) == 2
    with pytest.raises(FileNotFoundError, match="nope.parquet' does not exist"):
        resolve_paths([str(d), str(d / "nope.parquet")], None, "read_parquet")


def test_parquet_row_groups_pruned_by_statistics(tmp_path: pytest.TempPathFactory) -> None:
    import pyarrow.compute as pc

    path = tmp_path / "rg.parquet"  # type: ignore[operator]
    pq.write_table(
        pa.table({"a": np.arange(1000), "b": np.arange(1000) * 2}), path, row_group_size=100
    )
    tasks, schema = parquet_read_tasks(
        str(path),
        filesystem=None,
        columns=None,
        filter=None,
        override_num_blocks=10,
        min_blocks=200,
        min_block_size=1,
    )
    assert len(tasks) == 10 and sum(t.num_rows or 0 for t in tasks) == 1000
    tasks, schema = parquet_read_tasks(
        str(path),
        filesystem=None,
        columns=["b"],
        filter=pc.field("a") >= 850,
        override_num_blocks=10,
        min_blocks=200,
        min_block_size=1,
    )
    assert len(tasks) == 2 and schema.names == ["b"]  # row groups 800-899 and 900-999
    out = concat([t for task in tasks for t in task()])
    assert out.column_names == ["b"] and out.num_rows == 150


def test_compute_strategies_from_concurrency() -> None:
    class C:
        def __call__(self, b: object) -> object:
            return b

    assert resolve_compute(C, None, 3, "map_batches") == ActorPoolStrategy(size=3)
    assert resolve_compute(C, None, (1, 4), "map_batches") == ActorPoolStrategy(
        min_size=1, max_size=4
    )
    assert resolve_compute(len, None, 2, "map_batches") == TaskPoolStrategy(size=2)
    with pytest.raises(ValueError, match=r"concurrency=\(min, max\) autoscales an actor pool"):
        resolve_compute(len, None, (1, 2), "map_batches")
    with pytest.raises(ValueError, match="needs an actor pool"):
        resolve_compute(C, TaskPoolStrategy(), None, "map_batches")
    assert ActorPoolStrategy(min_size=2).bounds(cpu_limit=6, cpus_per_actor=1) == (2, 6)


def test_data_context_defaults_and_budget() -> None:
    ctx = DataContext()
    assert ctx.target_max_block_size == 128 * 1024 * 1024
    assert ctx.object_store_budget(1000) == 500
    ctx.execution_options.resource_limits.object_store_memory = 123
    assert ctx.object_store_budget(1000) == 123
    assert DataContext.get_current() is DataContext.get_current()
    with pytest.raises(ValueError, match="object_store_memory_fraction"):
        DataContext(object_store_memory_fraction=0)


def test_a_limit_stops_the_parquet_reader_early(tmp_path: pytest.TempPathFactory) -> None:
    path = tmp_path / "big.parquet"  # type: ignore[operator]
    pq.write_table(pa.table({"a": np.arange(100_000)}), path, row_group_size=100_000)
    tasks, _ = parquet_read_tasks(
        str(path),
        filesystem=None,
        columns=None,
        filter=None,
        override_num_blocks=None,
        min_blocks=200,
        min_block_size=1,
    )
    limited = tasks[0].with_limit(5)
    out = list(limited())
    assert sum(t.num_rows for t in out) == 5 and limited.num_rows == 5
    assert out[0].column("a").to_pylist() == [0, 1, 2, 3, 4]


def test_string_filter_expressions_become_arrow_expressions() -> None:
    from nbcluster.data._expr import parse_expression

    table = pa.table({"a": [1, 2, 3, None], "s": ["x", "y", "x", "z"], "v": [0.5, 1.5, 2.5, 3.5]})

    def keep(text: str) -> list[int | None]:
        return table.filter(parse_expression(text)).column("a").to_pylist()

    assert keep("a > 1") == [2, 3]
    assert keep("a >= 2 and s == 'x'") == [3]
    assert keep("not (s == 'x') or v * 2 > 6") == [2, None]
    assert keep("1 < a <= 3") == [2, 3]
    assert keep("a is None") == [None]
    assert keep("s in ['y', 'z'] and a is not None") == [2]
    assert keep("-a < -2") == [3]
    with pytest.raises(ValueError, match=r"__import__\('os'\)\" is not supported"):
        parse_expression("__import__('os')")
    with pytest.raises(ValueError, match="must refer to at least one column"):
        parse_expression("1 + 1")


def test_pandas_batches_are_views_where_arrow_allows() -> None:
    block = pa.table({"a": np.arange(1000), "b": np.random.default_rng(0).random(1000)})
    df = block_to_batch(block, "pandas")
    assert np.shares_memory(df["a"].to_numpy(), block.column("a").chunk(0).to_numpy())
