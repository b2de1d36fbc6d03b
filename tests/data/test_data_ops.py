"""Every operation against pandas on the same data: normal, empty, one row, nulls, wide rows."""

from __future__ import annotations

import sys

import cloudpickle
import numpy as np
import pandas as pd
import pyarrow.compute as pc
import pytest

import nbcluster
from nbcluster import data
from nbcluster.data.aggregate import AggregateFn, Count, Mean, Sum

pytestmark = pytest.mark.integration
cloudpickle.register_pickle_by_value(sys.modules[__name__])


def _frame(n: int) -> pd.DataFrame:
    rng = np.random.default_rng(n)
    df = pd.DataFrame(
        {
            "i": np.arange(n, dtype=np.int64),
            "k": rng.integers(0, 5, n),
            "v": rng.normal(size=n),
            "g": pd.array(rng.choice(["a", "b", "c"], n), dtype=object),
        }
    )
    if n > 3:
        df.loc[::7, "v"] = np.nan
        df.loc[::11, "g"] = None
    return df


def _ds(df: pd.DataFrame, blocks: int = 4) -> data.Dataset:
    if len(df) < blocks:
        return data.from_pandas(df)
    cuts = [len(df) * j // blocks for j in range(blocks + 1)]
    return data.from_pandas(
        [df.iloc[a:b].reset_index(drop=True) for a, b in zip(cuts[:-1], cuts[1:], strict=True)]
    )


def _same(got: pd.DataFrame, want: pd.DataFrame, sort: list[str] | None = None) -> None:
    if len(want) == 0:
        # No rows ran through the user's function, so its output columns are unknown (as
        # in Ray); only the row count can be compared.
        assert len(got) == 0
        return
    got = got.reset_index(drop=True)
    want = want.reset_index(drop=True)
    if sort:
        got = got.sort_values(sort, kind="stable").reset_index(drop=True)
        want = want.sort_values(sort, kind="stable").reset_index(drop=True)
    pd.testing.assert_frame_equal(got, want, check_dtype=False)


@pytest.fixture(params=[1000, 1, 0], ids=["1000-rows", "one-row", "empty"])
def frame(request: pytest.FixtureRequest) -> pd.DataFrame:
    return _frame(request.param)


def test_row_maps_filters_and_projections(shared_cluster: object, frame: pd.DataFrame) -> None:
    ds = _ds(frame)
    assert ds.count() == len(frame)
    got = ds.map(lambda r: {"i": r["i"], "w": r["i"] * 2}).to_pandas()
    if len(frame):
        _same(got, pd.DataFrame({"i": frame.i, "w": frame.i * 2}))
    else:
        assert len(got) == 0
    got = ds.filter(lambda r: r["k"] > 2).select_columns(["i", "k"]).to_pandas()
    _same(got, frame[frame.k > 2][["i", "k"]])
    got = ds.filter(expr=pc.field("k") <= 2).to_pandas()
    _same(got, frame[frame.k <= 2])
    got = ds.drop_columns(["v"]).rename_columns({"g": "group"}).to_pandas()
    _same(got, frame.drop(columns=["v"]).rename(columns={"g": "group"}))
    got = ds.flat_map(lambda r: [{"i": r["i"]}] * 2).to_pandas()
    _same(got, pd.DataFrame({"i": np.repeat(frame.i.to_numpy(), 2)}), sort=["i"])
    got = ds.add_column("k2", lambda df: df["k"] * 10).to_pandas()
    _same(got, frame.assign(k2=frame.k * 10))


@pytest.mark.parametrize("fmt", ["default", "numpy", "pandas", "pyarrow"])
def test_map_batches_each_format(shared_cluster: object, fmt: str) -> None:
    frame = _frame(500)

    def fn(batch: object) -> object:
        if fmt == "pandas":
            return batch.assign(i=batch["i"] + 1)[["i", "v"]]
        if fmt == "pyarrow":
            return batch.select(["i", "v"]).set_column(0, "i", pc.add(batch.column("i"), 1))
        assert isinstance(batch["i"], np.ndarray)
        return {"i": batch["i"] + 1, "v": batch["v"]}

    got = _ds(frame).map_batches(fn, batch_format=fmt, batch_size=64).to_pandas()
    _same(got, pd.DataFrame({"i": frame.i + 1, "v": frame.v}))


def test_map_batches_args_generators_and_zero_copy(shared_cluster: object) -> None:
    def scale(batch: dict, k: int, *, plus: int) -> object:
        yield {"x": batch["id"] * k + plus}
        yield {"x": -batch["id"]}

    got = data.range(10).map_batches(scale, fn_args=(3,), fn_kwargs={"plus": 1}).to_pandas()
    assert sorted(got.x.tolist()) == sorted(
        [i * 3 + 1 for i in range(10)] + [-i for i in range(10)]
    )

    def writes(batch: dict) -> dict:
        batch["id"] += 1  # needs a writable copy
        return batch

    assert data.range(5).map_batches(writes, zero_copy_batch=False).take_all() == [
        {"id": i + 1} for i in range(5)
    ]


def test_limit_sort_and_shuffles(shared_cluster: object, frame: pd.DataFrame) -> None:
    ds = _ds(frame)
    _same(ds.limit(7).to_pandas(), frame.head(7))
    _same(ds.sort("v").to_pandas(), frame.sort_values("v", na_position="last", kind="stable"))
    got = ds.sort(["k", "i"], descending=[True, False]).to_pandas()
    _same(got, frame.sort_values(["k", "i"], ascending=[False, True]))
    # Float keys without NaN: all distinct (numpy's sort) and with ties (stable), both ways.
    plain = frame.dropna(subset=["v"]).assign(t=lambda d: d.k * 0.5)
    for key in ("v", "t"):
        for desc in (False, True):
            got = _ds(plain).sort(key, descending=desc).to_pandas()
            _same(got, plain.sort_values(key, ascending=not desc, kind="stable"))
    for shuffled in (
        ds.random_shuffle(seed=3),
        ds.randomize_block_order(seed=3),
        ds.repartition(3, shuffle=True),
    ):
        _same(shuffled.to_pandas(), frame, sort=["i"])
    a = ds.random_shuffle(seed=5).to_pandas()
    b = ds.random_shuffle(seed=5).to_pandas()
    _same(a, b)
    if len(frame) > 10:
        assert a.i.tolist() != frame.i.tolist()
    rep = ds.repartition(7).materialize()
    assert rep.num_blocks() == 7
    _same(rep.to_pandas(), frame)


def test_groupby_and_aggregates(shared_cluster: object, frame: pd.DataFrame) -> None:
    ds = _ds(frame)
    got = ds.groupby("k").count().to_pandas()
    want = frame.groupby("k").size().reset_index(name="count()")
    _same(got, want)
    for name in ("sum", "min", "max", "mean", "std"):
        got = getattr(ds.groupby("k"), name)("v").to_pandas()
        want = getattr(frame.groupby("k")["v"], name)().reset_index(name=f"{name}(v)")
        _same(got, want)
    got = ds.groupby("g").aggregate(Count(), Sum("i"), Mean("v")).to_pandas()
    want = (
        frame.groupby("g", dropna=False)
        .agg(**{"count()": ("i", "size"), "sum(i)": ("i", "sum"), "mean(v)": ("v", "mean")})
        .reset_index()
    )
    _same(got, want)
    if len(frame):
        assert ds.sum("i") == frame.i.sum()
        assert ds.max("k") == frame.k.max()
        assert ds.mean("v") == pytest.approx(frame.v.mean())
        assert ds.std("v") == pytest.approx(frame.v.std(), nan_ok=True)
        assert sorted(ds.unique("k")) == sorted(frame.k.unique().tolist())
        custom = AggregateFn(
            init=lambda k: 0,
            accumulate_row=lambda s, r: s + r["i"],
            merge=lambda a, b: a + b,
            name="s",
        )
        assert ds.aggregate(custom) == {"s": frame.i.sum()}

    def top(group: pd.DataFrame) -> pd.DataFrame:
        return group.nlargest(2, "i")[["k", "i"]]

    got = ds.groupby("k").map_groups(top, batch_format="pandas").to_pandas()
    want = frame.groupby("k", group_keys=False)[["k", "i"]].apply(lambda g: g.nlargest(2, "i"))
    _same(got, want, sort=["k", "i"])


def test_union_zip_and_splits(shared_cluster: object) -> None:
    frame = _frame(300)
    ds = _ds(frame, blocks=3)
    _same(ds.union(ds).to_pandas(), pd.concat([frame, frame]), sort=["i"])
    other = data.range(300).map(lambda r: {"i": r["id"], "z": r["id"] * 2})
    got = ds.select_columns(["i"]).zip(other).to_pandas()
    assert got.columns.tolist() == ["i", "i_1", "z"]
    assert (got.i == got.i_1).all() and (got.z == got.i * 2).all()
    parts = ds.split(3, equal=True)
    assert [p.count() for p in parts] == [100, 100, 100]
    _same(pd.concat([p.to_pandas() for p in parts]), frame, sort=["i"])
    parts = ds.split_at_indices([10, 250])
    assert [p.count() for p in parts] == [10, 240, 50]
    _same(parts[1].to_pandas(), frame.iloc[10:250])
    train, test = ds.train_test_split(test_size=0.2)
    assert (train.count(), test.count()) == (240, 60)
    _same(test.to_pandas(), frame.iloc[240:])
    train, test = ds.train_test_split(test_size=30, shuffle=True, seed=1)
    _same(pd.concat([train.to_pandas(), test.to_pandas()]), frame, sort=["i"])


def test_consumers_and_metadata(shared_cluster: object, capsys: pytest.CaptureFixture[str]) -> None:
    frame = _frame(100)
    ds = _ds(frame)
    assert ds.take(3) == [{**r, "v": r["v"]} for r in ds.take(3)]
    assert [r["i"] for r in ds.take(3)] == [0, 1, 2]
    batch = ds.take_batch(5)
    assert set(batch) == {"i", "k", "v", "g"} and len(batch["i"]) == 5
    assert len(ds.take_all()) == 100
    with pytest.raises(ValueError, match="more than the given limit of 10 rows"):
        ds.take_all(limit=10)
    ds.show(2)
    assert capsys.readouterr().out.count("\n") == 2
    assert ds.columns() == ["i", "k", "v", "g"]
    assert ds.schema().names == ["i", "k", "v", "g"]
    mapped = ds.map_batches(lambda b: {"s": b["i"].astype(str)})
    assert mapped.schema(fetch_if_missing=False) is None
    assert str(mapped.schema().types[0]) in ("string", "large_string")
    assert ds.num_blocks() == 4 and ds.size_bytes() > 0
    with pytest.raises(NotImplementedError, match="materialize"):
        mapped.num_blocks()
    mat = mapped.materialize()
    assert mat.count() == 100 and "Operator 0" in mat.stats()
    refs = ds.to_arrow_refs()
    assert sum(nbcluster.get(r).num_rows for r in refs) == 100
    arrays = nbcluster.get(ds.to_numpy_refs(column="i"))
    assert np.concatenate(arrays).tolist() == list(range(100))
    assert data.from_pandas_refs([nbcluster.put(frame)]).count() == 100
    assert data.from_numpy_refs([nbcluster.put(np.ones((4, 3)))]).take_batch(4)["data"].shape == (
        4,
        3,
    )
    assert data.from_numpy(np.arange(6).reshape(3, 2)).count() == 3
    assert data.from_arrow(ds.take_batch(10, batch_format="pyarrow")).count() == 10
    assert data.range_tensor(5, shape=(2, 2)).take(2)[1]["data"].tolist() == [[1, 1], [1, 1]]
    with pytest.raises(ValueError, match="The dataset is empty"):
        data.range(0).take_batch()


def test_wide_rows(shared_cluster: object) -> None:
    wide = pd.DataFrame({f"c{j}": np.arange(50) * j for j in range(300)})
    ds = _ds(wide, blocks=2).map_batches(lambda b: {k: v + 1 for k, v in b.items()})
    _same(ds.to_pandas(), wide + 1)
    assert ds.select_columns(["c299"]).sum("c299") == int((wide.c299 + 1).sum())
