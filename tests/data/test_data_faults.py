"""Bad input gets a clear error at the earliest point, and a killed worker's blocks are
recomputed: the output equals the fault-free run. The shared cluster is checked for
health after every test (resources back, tasks run)."""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path

import cloudpickle
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from nbcluster import data
from nbcluster.exceptions import TaskError
from nbcluster.testing import kill_process, poll_for

pytestmark = pytest.mark.integration
cloudpickle.register_pickle_by_value(sys.modules[__name__])


# ------------------------------------------------------------------------ bad input


def test_udf_error_names_the_operator_with_remote_traceback(shared_cluster: object) -> None:
    def explode(batch: dict) -> dict:
        if batch["id"].max() > 50:
            raise ValueError("bad row")
        return batch

    ds = data.range(100, override_num_blocks=4).map_batches(explode)
    with pytest.raises(ValueError, match="bad row") as info:
        ds.take_all()
    err = info.value
    assert isinstance(err, TaskError)
    text = str(err)
    assert "in explode" in text  # the remote traceback
    assert "MapBatches(explode) operator" in text


def test_wrong_return_type_says_what_was_expected(shared_cluster: object) -> None:
    ds = data.range(10).map_batches(lambda b: [1, 2, 3], batch_format="numpy")
    with pytest.raises(
        TypeError,
        match=r"batch_format='numpy'.*returned a builtins\.list; it must return a dict of column name -> numpy array",
    ):
        ds.take_all()
    with pytest.raises(TypeError, match="must return a dict of column name -> value for each row"):
        data.range(3).map(lambda r: r["id"]).take_all()


def test_union_of_different_schemas(shared_cluster: object) -> None:
    a = data.from_items([{"x": 1}])
    with pytest.raises(
        ValueError, match=r"union: the inputs have different columns \(\['x'\] vs \['y'\]"
    ):
        a.union(data.from_items([{"y": 1}]))
    with pytest.raises(ValueError, match="union: column 'x' is int64 in one input and string"):
        a.union(data.from_items([{"x": "s"}]))
    lazy = data.from_items([{"x": 1}]).map(lambda r: {"y": r["x"]})
    with pytest.raises(ValueError, match="union: the inputs have different columns"):
        a.union(lazy).take_all()  # schemas known only when it runs


def test_missing_columns(shared_cluster: object) -> None:
    ds = data.range(5)
    with pytest.raises(
        KeyError,
        match=r"select_columns: column\(s\) \['nope'\] not found; the dataset has columns \['id'\]",
    ):
        ds.select_columns(["nope"])
    with pytest.raises(KeyError, match="sort: column"):
        ds.sort("nope")
    with pytest.raises(KeyError, match="groupby: column"):
        ds.groupby("nope")
    lazy = ds.map(lambda r: {"a": r["id"]})
    with pytest.raises(
        KeyError, match=r"column\(s\) \['id'\] not found; the dataset has columns \['a'\]"
    ):
        lazy.select_columns(["id"]).take_all()
    with pytest.raises(KeyError, match="sort: column"):
        lazy.sort("id").take_all()


def test_missing_and_unreadable_paths(shared_cluster: object, tmp_path: Path) -> None:
    missing = tmp_path / "nowhere.parquet"
    with pytest.raises(
        FileNotFoundError, match=f"read_parquet: the path '{missing}' does not exist"
    ):
        data.read_parquet(str(missing))
    with pytest.raises(FileNotFoundError, match="no file matches the pattern"):
        data.read_csv(str(tmp_path / "*.csv"))
    junk = tmp_path / "junk.parquet"
    junk.write_text("not parquet")
    with pytest.raises(Exception, match="junk.parquet"):
        data.read_parquet(str(junk))
    bad_csv = tmp_path / "bad.csv"
    bad_csv.write_text("a,b\n1,2\n3\n")
    with pytest.raises(Exception, match="bad.csv") as info:
        data.read_csv(str(bad_csv)).take_all()
    assert "read_csv could not read" in str(info.value)


@pytest.mark.parametrize(
    "call, error, match",
    [
        (
            lambda ds: ds.map_batches(lambda b: b, batch_size=0),
            ValueError,
            "batch_size must be a positive int",
        ),
        (
            lambda ds: ds.map_batches(lambda b: b, batch_format="torch"),
            ValueError,
            "batch_format must be one of",
        ),
        (
            lambda ds: ds.map_batches(lambda b: b, concurrency=(1, 2)),
            ValueError,
            r"concurrency=\(min, max\) autoscales an actor pool",
        ),
        (lambda ds: ds.map_batches(42), TypeError, "expects a function or a callable class"),
        (
            lambda ds: ds.map_batches(lambda b: b, num_cpus=-1),
            ValueError,
            "num_cpus must be a non-negative number",
        ),
        (
            lambda ds: ds.map_batches(lambda b: b, foo=1),
            ValueError,
            r"unknown keyword argument\(s\) \['foo'\]",
        ),
        (lambda ds: ds.limit(-1), ValueError, "limit must be a non-negative int"),
        (lambda ds: ds.filter(), ValueError, "exactly one of fn"),
        (lambda ds: ds.filter(expr=5), TypeError, "a string such as 'x > 5' or a pyarrow"),
        (lambda ds: ds.filter(expr="id.real > 3"), ValueError, r"'id\.real' is not supported"),
        (lambda ds: ds.filter(expr="id >"), ValueError, "is not a valid expression"),
        (lambda ds: ds.repartition(), ValueError, "exactly one of num_blocks"),
        (lambda ds: ds.zip(data.range(3)), ValueError, r"different numbers of rows \(10 and 3\)"),
        (
            lambda ds: ds.iter_batches(batch_size=-2),
            ValueError,
            "batch_size must be a positive int",
        ),
        (lambda ds: ds.streaming_split(0), ValueError, "n must be a positive int"),
        (lambda ds: ds.rename_columns({"id": "a", "x": "a"}), ValueError, "duplicates"),
        (lambda ds: list(ds), TypeError, "not iterable; use ds.iter_rows"),
        (lambda ds: data.from_items(5), TypeError, "from_items expects a list"),
    ],
)
def test_bad_arguments_fail_at_the_call(
    shared_cluster: object, call: object, error: type, match: str
) -> None:
    with pytest.raises(error, match=match):
        call(data.range(10))  # type: ignore[operator]


# ------------------------------------------------------------------------ faults


class _Killer(threading.Thread):
    """Kills the process whose pid appears in ``pid_file`` (the worker running block 40)."""

    def __init__(self, pid_file: Path) -> None:
        super().__init__(daemon=True)
        self.pid_file = pid_file
        self.killed: int | None = None
        self.start()

    def run(self) -> None:
        pid = int(
            poll_for(lambda: self.pid_file.exists() and self.pid_file.read_text(), timeout=30)
        )
        kill_process(pid)
        self.killed = pid


def _killer(pid_file: Path) -> _Killer:
    return _Killer(pid_file)


def _expected(n: int) -> list[int]:
    return sorted(i * 3 for i in range(n))


def test_killed_task_worker_blocks_are_recomputed(shared_cluster: object, tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"

    def slow_triple(batch: dict) -> dict:
        if 40 in batch["id"] and not pid_file.exists():
            pid_file.write_text(str(os.getpid()))
            time.sleep(30)  # killed here
        return {"id": batch["id"] * 3}

    killer = _killer(pid_file)
    started = time.monotonic()
    out = data.range(100, override_num_blocks=10).map_batches(slow_triple).take_all()
    killer.join(5)
    assert killer.killed is not None and time.monotonic() - started < 25
    assert [r["id"] for r in out] == _expected(100)  # equal to the fault-free run, in order


class _TripleOnce:
    def __init__(self, pid_file: str) -> None:
        self.pid_file = Path(pid_file)

    def __call__(self, batch: dict) -> dict:
        if 40 in batch["id"] and not self.pid_file.exists():
            self.pid_file.write_text(str(os.getpid()))
            time.sleep(30)  # killed here
        return {"id": batch["id"] * 3}


def test_killed_pool_actor_work_is_resubmitted(shared_cluster: object, tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    killer = _killer(pid_file)
    ds = data.range(100, override_num_blocks=10).map_batches(
        _TripleOnce, fn_constructor_args=(str(pid_file),), concurrency=1
    )
    started = time.monotonic()
    out = ds.take_all()
    killer.join(5)
    assert killer.killed is not None and time.monotonic() - started < 25
    assert [r["id"] for r in out] == _expected(100)  # equal to the fault-free run, in order


def test_constructor_error_fails_the_dataset(shared_cluster: object) -> None:
    class Broken:
        def __init__(self) -> None:
            raise RuntimeError("no model file")

        def __call__(self, batch: dict) -> dict:
            return batch

    with pytest.raises(Exception, match="no model file"):
        data.range(10).map_batches(Broken, concurrency=1).take_all()


def test_parquet_with_a_corrupt_file_among_good_ones(
    shared_cluster: object, tmp_path: Path
) -> None:
    pq.write_table(pa.table({"a": np.arange(10)}), tmp_path / "good.parquet")
    ds = data.read_parquet(str(tmp_path))
    (tmp_path / "good.parquet").write_bytes(b"PAR1 truncated")  # broken after planning
    with pytest.raises(Exception, match="good.parquet"):
        ds.take_all()


def test_a_stuck_execution_fails_with_its_state_instead_of_hanging(
    shared_cluster: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    from nbcluster.data import _executor
    from nbcluster.data._scheduler import StreamingState

    monkeypatch.setattr(_executor, "STALL_S", 0.5)
    monkeypatch.setattr(StreamingState, "decide", lambda self: [])  # a scheduler that never acts
    started = time.monotonic()
    with pytest.raises(
        RuntimeError,
        match=r"made no progress for 0s.*\n  0 ReadRange \[source\] queued=0 sources_left=1",
    ):
        data.range(10).take_all()
    assert time.monotonic() - started < 10
