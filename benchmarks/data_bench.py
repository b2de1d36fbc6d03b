"""nbcluster.data beside Ray Data and a one-process pandas/pyarrow floor, in one run (issue 14).

    python benchmarks/data_bench.py                 # ~1 GB of parquet; every installed system
    python benchmarks/data_bench.py --quick         # ~64 MB: a smoke run (a minute or two)
    python benchmarks/data_bench.py --only nbcluster,floor --json data.json

The parent writes the parquet data once (8 files, columns ``id`` int64, ``k`` int64 in
0..999, ``v``/``w``/``x`` float64: 40 bytes a row), then runs each system in its own fresh
subprocess with 2 CPUs on one node. Rows (each after the cluster is up; start-up is not
timed):

- ``parquet -> map_batches -> iter_batches``: read every file, a numpy function
  (``y = v * 2 + w``) as tasks, iterate batches of 4,096 rows; rows/s.
- ``... with an actor pool``: the same function as a callable class on a pool of one
  actor (two one-CPU actors on two CPUs leave Ray Data no CPU to read with: it hangs).
- ``random_shuffle``, ``sort``: the whole data set, consumed block by block; rows/s.
- ``groupby(k).mean(v)``: the result to pandas; rows/s of input.
- ``small: 1M-row groupby``: ``from_pandas`` of 1M rows, ``groupby().mean()``, to pandas; s.
- ``small: first rows of show()``: ``read_parquet(all).take(5)`` (what ``show(5)`` prints);
  seconds to the rows.
- ``small: 100k-row pipeline``: ``from_pandas -> map_batches -> filter(expr="s > 1.0") ->
  to_pandas`` (the filter as an expression string, which both run vectorized); s.

The floor does the same work in this one process with pyarrow and pandas (no cluster).
Peak memory is the largest sum of RSS over the system's processes (the child and all its
descendants: workers, object store, Ray's raylet and GCS), sampled every 50 ms during the
row, so worker heaps count, not only store bytes. The table gives each figure, the ratio to
Ray (``xRay``: > 1 means nbcluster is faster / uses less) and to the floor. Absolute numbers
drift on a shared machine; only ratios from one run mean anything.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from _harness import init_ray, run_child

NUM_CPUS = 2
SYSTEMS = ("nbcluster", "ray", "floor")
LABELS = {"nbcluster": "nbcluster", "ray": "Ray Data", "floor": "pandas/pyarrow"}
FILES = 8
BATCH = 4096
#: Actors in the pool row. With 2 CPUs, a pool of 2 one-CPU actors leaves Ray Data no CPU
#: for its read tasks and it hangs ("Cluster resources are not enough"), so both use 1.
POOL = 1

ROWS = [
    ("pipeline", "parquet -> map_batches -> iter_batches", "rows/s"),
    ("actors", "... map_batches on an actor pool", "rows/s"),
    ("shuffle", "random_shuffle", "rows/s"),
    ("sort", "sort", "rows/s"),
    ("groupby", "groupby(k).mean(v)", "rows/s"),
    ("small_groupby", "small: 1M-row groupby", "s"),
    ("first_rows", "small: first rows of show()", "s"),
    ("small_pipeline", "small: 100k-row pipeline", "s"),
]


@dataclass
class Sizes:
    rows: int = 25_000_000  # 1 GB at 40 bytes a row
    small_rows: int = 1_000_000
    pipeline_rows: int = 100_000
    timeout_s: int = 3600

    @classmethod
    def quick(cls) -> Sizes:
        return cls(rows=1_600_000, timeout_s=1200)


# --------------------------------------------------------------------------- memory


class PeakRSS:
    """Largest RSS summed over this process and its descendants, sampled on a thread."""

    def __init__(self, interval: float = 0.05) -> None:
        import psutil

        self._psutil = psutil
        self._me = psutil.Process(os.getpid())
        self.interval = interval
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def total(self) -> int:
        total = 0
        procs = [self._me]
        with contextlib.suppress(Exception):
            procs += self._me.children(recursive=True)
        for p in procs:
            with contextlib.suppress(Exception):
                total += p.memory_info().rss
        return total

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self.total())
            self._stop.wait(self.interval)

    def reset(self) -> None:
        self.peak = self.total()

    def close(self) -> None:
        self._stop.set()


# --------------------------------------------------------------------------- data


def write_data(directory: Path, rows: int) -> None:
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    directory.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    per = rows // FILES
    for i in range(FILES):
        n = per if i < FILES - 1 else rows - per * (FILES - 1)
        start = i * per
        table = pa.table(
            {
                "id": np.arange(start, start + n, dtype=np.int64),
                "k": rng.integers(0, 1000, n),
                "v": rng.random(n),
                "w": rng.random(n),
                "x": rng.random(n),
            }
        )
        pq.write_table(table, directory / f"part-{i:02d}.parquet", row_group_size=min(n, 1 << 20))


def small_frame(n: int) -> Any:
    import numpy as np
    import pandas as pd

    rng = np.random.default_rng(1)
    return pd.DataFrame({"k": rng.integers(0, 1000, n), "v": rng.random(n), "w": rng.random(n)})


def udf(batch: dict[str, Any]) -> dict[str, Any]:
    return {"id": batch["id"], "y": batch["v"] * 2 + batch["w"]}


class Udf:
    """The same function as a callable class (its state is built once per actor)."""

    def __init__(self) -> None:
        self.scale = 2.0

    def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
        return {"id": batch["id"], "y": batch["v"] * self.scale + batch["w"]}


# --------------------------------------------------------------------------- systems

#: Where the child writes its figures, after every row (so a timeout keeps what ran).
RESULTS: Path | None = None


def _timed(
    system: str,
    out: dict[str, float],
    rss: PeakRSS,
    key: str,
    fn: Callable[[], int | None],
    rate: bool,
) -> None:
    rss.reset()
    t0 = time.perf_counter()
    n = fn()
    dt = time.perf_counter() - t0
    out[key] = (n / dt) if rate and n else dt
    out[key + ".mem"] = float(rss.peak)
    print(f"{system} {key}: {out[key]:.4g} ({dt:.2f}s) peak {rss.peak / 2**20:.0f} MiB", flush=True)
    if RESULTS is not None:
        RESULTS.write_text(json.dumps(out))


def _consume(batches: Any) -> int:
    n = 0
    for b in batches:
        n += len(next(iter(b.values()))) if isinstance(b, dict) else len(b)
    return n


def run_dataset_system(name: str, data_dir: Path, sizes: Sizes, rss: PeakRSS) -> dict[str, float]:
    if name == "ray":
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        # On a loaded machine the raylet gives up waiting for its agent after 30 s.
        os.environ.setdefault("RAY_agent_register_timeout_ms", "120000")
        import ray.data as rd

        temp = tempfile.mkdtemp(prefix="ray-")  # its own session dir: no clash with other Rays
        ray = init_ray(
            num_cpus=NUM_CPUS, include_dashboard=False, log_to_driver=False, _temp_dir=temp
        )
        rd.DataContext.get_current().enable_progress_bars = False
    else:
        import nbcluster
        import nbcluster.data as rd

        nbcluster.init(num_cpus=NUM_CPUS)
        rd.DataContext.get_current().enable_progress_bars = False
    path = str(data_dir)
    out: dict[str, float] = {}

    def timed(key: str, fn: Callable[[], int | None], rate: bool) -> None:
        _timed(name, out, rss, key, fn, rate)

    # warm up: workers started, functions exported
    warm = rd.read_parquet(path).limit(1000)
    _consume(warm.map_batches(udf).iter_batches(batch_size=BATCH))
    warm.groupby("k").mean("v").to_pandas()
    _consume(warm.sort("v").random_shuffle().iter_batches(batch_size=None))
    timed(
        "pipeline",
        lambda: _consume(rd.read_parquet(path).map_batches(udf).iter_batches(batch_size=BATCH)),
        True,
    )
    timed(
        "actors",
        lambda: _consume(
            rd.read_parquet(path).map_batches(Udf, concurrency=POOL).iter_batches(batch_size=BATCH)
        ),
        True,
    )
    timed(
        "shuffle",
        lambda: _consume(rd.read_parquet(path).random_shuffle().iter_batches(batch_size=None)),
        True,
    )
    timed(
        "sort",
        lambda: _consume(rd.read_parquet(path).sort("v").iter_batches(batch_size=None)),
        True,
    )
    timed(
        "groupby",
        lambda: (len(rd.read_parquet(path).groupby("k").mean("v").to_pandas()), sizes.rows)[1],
        True,
    )
    frame = small_frame(sizes.small_rows)
    timed(
        "small_groupby",
        lambda: len(rd.from_pandas(frame).groupby("k").mean("v").to_pandas()),
        False,
    )
    timed("first_rows", lambda: len(rd.read_parquet(path).take(5)), False)
    small = small_frame(sizes.pipeline_rows)

    def pipeline() -> int:
        ds = (
            rd.from_pandas(small)
            .map_batches(lambda b: {"k": b["k"], "s": b["v"] + b["w"]})
            .filter(expr="s > 1.0")
        )
        return len(ds.to_pandas())

    timed("small_pipeline", pipeline, False)
    if name == "ray":
        ray.shutdown()
        shutil.rmtree(temp, ignore_errors=True)
    return out


def run_floor(data_dir: Path, sizes: Sizes, rss: PeakRSS) -> dict[str, float]:
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    files = sorted(data_dir.glob("*.parquet"))
    out: dict[str, float] = {}

    def timed(key: str, fn: Callable[[], int | None], rate: bool) -> None:
        _timed("floor", out, rss, key, fn, rate)

    def batches(fn: Any) -> int:
        n = 0
        for f in files:
            pf = pq.ParquetFile(f)
            for i in range(pf.num_row_groups):
                t = pf.read_row_group(i)
                cols = {c: t.column(c).to_numpy() for c in t.column_names}
                res = fn(cols)
                for s in range(0, len(res["id"]), BATCH):
                    n += len(res["id"][s : s + BATCH])
        return n

    batches(udf)  # warm up, as the systems do (imports, file cache)
    timed("pipeline", lambda: batches(udf), True)
    timed("actors", lambda: batches(Udf()), True)

    def shuffle() -> int:
        t = pq.read_table(files)
        t = t.take(pa.array(np.random.default_rng().permutation(t.num_rows)))
        return t.num_rows

    timed("shuffle", shuffle, True)
    timed("sort", lambda: pq.read_table(files).sort_by("v").num_rows, True)
    timed(
        "groupby",
        lambda: (
            pq.read_table(files, columns=["k", "v"]).to_pandas().groupby("k")["v"].mean(),
            sizes.rows,
        )[1],
        True,
    )
    frame = small_frame(sizes.small_rows)
    timed("small_groupby", lambda: len(frame.groupby("k")["v"].mean().reset_index()), False)
    timed(
        "first_rows",
        lambda: len(pq.ParquetFile(files[0]).read_row_group(0).slice(0, 5).to_pylist()),
        False,
    )
    small = small_frame(sizes.pipeline_rows)

    def pipeline() -> int:
        df = small.assign(s=small.v + small.w)[["k", "s"]]
        return len(df[df.s > 1.0])

    timed("small_pipeline", pipeline, False)
    return out


def child(system: str, data_dir: Path, sizes: Sizes, out_file: Path) -> None:
    global RESULTS
    RESULTS = out_file
    rss = PeakRSS()
    try:
        if system == "floor":
            result = run_floor(data_dir, sizes, rss)
        else:
            result = run_dataset_system(system, data_dir, sizes, rss)
    finally:
        rss.close()
    out_file.write_text(json.dumps(result))


# --------------------------------------------------------------------------- parent


def installed(system: str) -> bool:
    if system == "floor":
        return True
    module = "ray.data" if system == "ray" else "nbcluster.data"
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


def run_system(
    system: str, data_dir: Path, sizes: Sizes, quick: bool, logs: Path
) -> dict[str, float] | str:
    out_file = logs / f"{system}.json"
    log = logs / f"{system}.log"
    args = ["--child", system, "--data", str(data_dir), "--out", str(out_file)]
    if quick:
        args.append("--quick")
    # grace 0: the group is killed as soon as the child is done (anything it left behind)
    run = run_child(__file__, args, timeout_s=sizes.timeout_s, logfile=log, grace_s=0)
    if run.returncode is None:
        partial = json.loads(out_file.read_text()) if out_file.exists() else {}
        partial["note"] = (
            f"timed out after {sizes.timeout_s}s; rows shown '-' did not finish (log: {log})"
        )
        return partial  # type: ignore[no-any-return]
    if run.returncode != 0:
        partial = json.loads(out_file.read_text()) if out_file.exists() else {}
        partial["note"] = f"exit {run.returncode}; rows shown '-' failed (log: {log})"
        return partial  # type: ignore[no-any-return]
    if not out_file.exists():
        return f"no results (log: {log})"
    return json.loads(out_file.read_text())  # type: ignore[no-any-return]


def _fmt(value: float | None, unit: str) -> str:
    if value is None:
        return "-"
    if unit == "rows/s":
        return f"{value / 1e6:.2f}M/s"
    return f"{value:.3f} s"


def _ratio(ours: float | None, theirs: float | None, unit: str) -> str:
    if not ours or not theirs:
        return "-"
    r = ours / theirs if unit == "rows/s" else theirs / ours
    return f"{r:.2f}"


def table(results: dict[str, dict[str, float] | str]) -> str:
    def get(system: str, key: str) -> float | None:
        r = results.get(system)
        return r.get(key) if isinstance(r, dict) else None

    lines = [
        "| row | nbcluster | Ray Data | floor | xRay (speed) | xfloor | peak RSS nbcluster | peak RSS Ray | xRay (memory) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for key, label, unit in ROWS:
        nb, ray, floor = get("nbcluster", key), get("ray", key), get("floor", key)
        mnb, mray = get("nbcluster", key + ".mem"), get("ray", key + ".mem")
        mem_ratio = f"{mray / mnb:.2f}" if mnb and mray else "-"
        lines.append(
            f"| {label} | {_fmt(nb, unit)} | {_fmt(ray, unit)} | {_fmt(floor, unit)} | "
            f"{_ratio(nb, ray, unit)} | {_ratio(nb, floor, unit)} | "
            f"{f'{mnb / 2**20:.0f} MiB' if mnb else '-'} | {f'{mray / 2**20:.0f} MiB' if mray else '-'} | {mem_ratio} |"
        )
    for system, r in results.items():
        if isinstance(r, str):
            lines.append(f"\n{LABELS[system]}: {r}")
        elif "note" in r:
            lines.append(f"\n{LABELS[system]}: {r['note']}")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="~64 MB instead of ~1 GB")
    ap.add_argument(
        "--only", default=",".join(SYSTEMS), help="comma-separated: nbcluster,ray,floor"
    )
    ap.add_argument("--json", help="also write the figures to this file")
    ap.add_argument(
        "--timeout", type=int, help="seconds allowed per system (default 3600, quick 1200)"
    )
    ap.add_argument("--data", help=argparse.SUPPRESS)
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    sizes = Sizes.quick() if args.quick else Sizes()
    if args.timeout:
        sizes.timeout_s = args.timeout
    if args.child:
        child(args.child, Path(args.data), sizes, Path(args.out))
        return
    work = Path(tempfile.mkdtemp(prefix="nbcluster-data-bench-"))
    try:
        data_dir = work / "data"
        t0 = time.perf_counter()
        write_data(data_dir, sizes.rows)
        mb = sum(f.stat().st_size for f in data_dir.iterdir()) / 2**20
        print(
            f"wrote {sizes.rows:,} rows ({mb:.0f} MiB of parquet, {sizes.rows * 40 / 2**20:.0f} MiB in memory) in {time.perf_counter() - t0:.1f}s"
        )
        results: dict[str, dict[str, float] | str] = {}
        for system in args.only.split(","):
            if system not in SYSTEMS:
                raise SystemExit(f"unknown system {system!r}; choose from {', '.join(SYSTEMS)}")
            if not installed(system):
                results[system] = "not installed"
                continue
            print(f"running {LABELS[system]}...", flush=True)
            results[system] = run_system(system, data_dir, sizes, args.quick, work)
        print()
        print(table(results))
        if args.json:
            Path(args.json).write_text(json.dumps(results, indent=2))
    finally:
        shutil.rmtree(work / "data", ignore_errors=True)
        print(f"\nlogs: {work}")


if __name__ == "__main__":
    main()
