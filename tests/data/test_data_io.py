"""Reading and writing files: every format, paths as files, directories, globs, lists,
URIs and ``pyarrow.fs`` filesystems; pushdowns into ``read_parquet``."""

from __future__ import annotations

import sys
from pathlib import Path

import cloudpickle
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest

from nbcluster import data
from nbcluster.data._optimizer import optimize
from nbcluster.util.state import list_objects

pytestmark = pytest.mark.integration
cloudpickle.register_pickle_by_value(sys.modules[__name__])


def _frame(n: int = 400) -> pd.DataFrame:
    return pd.DataFrame(
        {"a": np.arange(n), "b": np.arange(n) * 0.5, "s": [f"r{i}" for i in range(n)]}
    )


@pytest.fixture
def parquet_dir(tmp_path: Path) -> Path:
    df = _frame()
    d = tmp_path / "pq"
    d.mkdir()
    for i in range(4):
        pq.write_table(
            pa.Table.from_pandas(df.iloc[i * 100 : (i + 1) * 100], preserve_index=False),
            d / f"part-{i}.parquet",
            row_group_size=25,
        )
    return d


def _sorted(df: pd.DataFrame, col: str = "a") -> pd.DataFrame:
    return df.sort_values(col).reset_index(drop=True)


def test_parquet_roundtrip_and_metadata_without_reading(
    shared_cluster: object, parquet_dir: Path, tmp_path: Path
) -> None:
    ds = data.read_parquet(str(parquet_dir))
    assert ds.count() == 400 and ds._last_execution is None  # footers only
    assert ds.schema().names == ["a", "b", "s"]
    assert len(ds.input_files()) == 4
    pd.testing.assert_frame_equal(_sorted(ds.to_pandas()), _frame())
    out = tmp_path / "out"
    ds.map_batches(lambda b: {"a": b["a"], "c": b["b"] * 2}).write_parquet(str(out))
    back = data.read_parquet(str(out))
    assert back.count() == 400 and back.columns() == ["a", "c"]
    assert _sorted(back.to_pandas()).c.tolist() == (np.arange(400) * 1.0).tolist()


def test_projection_and_filter_pushed_into_the_read(
    shared_cluster: object, parquet_dir: Path
) -> None:
    ds = data.read_parquet(str(parquet_dir)).filter(expr=pc.field("a") >= 350).select_columns(["s"])
    opt = optimize(ds._plan)
    assert opt.name == "ReadParquet[columns=s; filter=(a >= 350)]"
    row_groups = [rg for t in opt.tasks for _, rgs in t.read_fn.pieces for rg in rgs]
    assert len(row_groups) == 2  # 16 row groups of 25 rows; statistics keep 350-399 only
    got = ds.to_pandas()
    assert sorted(got.s) == sorted(f"r{i}" for i in range(350, 400)) and list(got.columns) == ["s"]
    assert ds.stats().count("Operator") == 1  # one fused read, nothing else
    direct = data.read_parquet(str(parquet_dir), columns=["b"], filter=pc.field("a") < 10)
    assert direct.to_pandas().b.tolist() == [i * 0.5 for i in range(10)]
    assert data.read_parquet(str(parquet_dir)).limit(30).count() == 30
    as_text = data.read_parquet(str(parquet_dir)).filter(expr="a >= 350 and s != 'r399'")
    assert optimize(as_text._plan).filter is not None and as_text.count() == 49


def test_blocks_are_stored_at_their_size(shared_cluster: object, tmp_path: Path) -> None:
    # One row group of 600k rows: a parquet scan cuts it into batches that are slices of
    # one buffer, as does map_batches(batch_format="pyarrow") here. Each slice used to be
    # pickled with the whole buffer: blocks took a multiple of their size in the store.
    n = 600_000
    path = tmp_path / "one_group.parquet"
    pq.write_table(pa.table({"a": np.arange(n), "b": np.arange(n) * 0.5}), path)
    read = data.read_parquet(str(path)).materialize()
    sliced = (
        data.read_parquet(str(path))
        .map_batches(lambda t: t, batch_format="pyarrow", batch_size=50_000)
        .materialize()
    )
    for ds in (read, sliced):
        refs = {r.hex() for r in ds.to_arrow_refs()}
        stored = sum(o.object_size for o in list_objects(limit=100_000) if o.object_id in refs)
        assert ds.count() == n and ds.size_bytes() >= n * 16
        assert stored < ds.size_bytes() * 1.1 + 64 * 1024, (stored, ds.size_bytes())


def test_paths_globs_lists_uris_and_filesystems(shared_cluster: object, parquet_dir: Path) -> None:
    files = sorted(str(p) for p in parquet_dir.iterdir())
    assert data.read_parquet(str(parquet_dir / "part-[01].parquet")).count() == 200
    assert data.read_parquet(files[:3]).count() == 300
    assert data.read_parquet(f"file://{parquet_dir}").count() == 400
    assert data.read_parquet(f"local://{parquet_dir}").count() == 400
    fs = pafs.SubTreeFileSystem(str(parquet_dir), pafs.LocalFileSystem())
    sub = data.read_parquet("part-3.parquet", filesystem=fs)
    assert sub.take(1) == [{"a": 300, "b": 150.0, "s": "r300"}]
    assert (
        data.read_parquet(str(parquet_dir), override_num_blocks=2).materialize().num_blocks() == 2
    )


def test_csv_json_text_numpy_binary(shared_cluster: object, tmp_path: Path) -> None:
    df = _frame(50)
    ds = data.from_pandas(df)
    ds.write_csv(str(tmp_path / "csv"))
    pd.testing.assert_frame_equal(_sorted(data.read_csv(str(tmp_path / "csv")).to_pandas()), df)
    ds.write_json(str(tmp_path / "json"))
    pd.testing.assert_frame_equal(_sorted(data.read_json(str(tmp_path / "json")).to_pandas()), df)
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "a.txt").write_text("one\n\ntwo\nthree\n")
    (tmp_path / "t" / "b.txt").write_text("four\n")
    text = data.read_text(str(tmp_path / "t"))
    assert sorted(r["text"] for r in text.take_all()) == ["four", "one", "three", "two"]
    data.range_tensor(6, shape=(2, 3)).write_numpy(str(tmp_path / "npy"), column="data")
    arr = data.read_numpy(str(tmp_path / "npy")).take_batch(6)["data"]
    assert arr.shape == (6, 2, 3) and sorted(arr[:, 0, 0].tolist()) == list(range(6))
    files = data.read_binary_files(str(tmp_path / "t"), include_paths=True).take_all()
    assert {Path(r["path"]).name: r["bytes"] for r in files} == {
        "a.txt": b"one\n\ntwo\nthree\n",
        "b.txt": b"four\n",
    }
    withpaths = data.read_csv(str(tmp_path / "csv"), include_paths=True).take(1)[0]
    assert withpaths["path"].endswith(".csv")


def test_write_into_a_file_path_is_refused(shared_cluster: object, tmp_path: Path) -> None:
    f = tmp_path / "f"
    f.write_text("x")
    with pytest.raises(FileExistsError, match="is a file; give a directory"):
        data.range(3).write_parquet(str(f))
