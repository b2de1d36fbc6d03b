"""How nbcluster's costs grow with load (issue 11, item 5): a table and a plotly chart.

    python benchmarks/scale.py                 # full sizes (several minutes)
    python benchmarks/scale.py --quick         # small sizes: about a minute
    python benchmarks/scale.py --html scale.html --json scale.json

Series, each point in a fresh cluster in its own subprocess (its process group is ended
if it overstays):

- queued tasks: N tasks that wait on one unfinished task (so all N are queued in the
  driver at once): submit rate, and the driver's memory growth per queued task (USS);
  then the gate opens and all N run (completion rate).
- small objects: ``put`` of N small values, then one ``get`` of all N refs: rates, and
  the driver's memory per live object.
- node managers: 10,000 tiny tasks (2,000 with --quick) on K node managers on this host
  (one CPU each): tasks per second.
- actors: N zero-CPU actors created and each called once: seconds until all answered.

For each series the table gives every point and the growth exponent between the first
and the last point (cost ~ size^k: k = 1 is linear; a cost that grows faster than
linearly shows k > 1, a rate that falls as size grows shows a negative exponent).
Absolute figures drift on a shared machine; the shape is what this measures.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from _harness import format_table, run_child


@dataclass
class Sizes:
    queued: list[int] = field(default_factory=lambda: [1_000, 10_000, 100_000])
    objects: list[int] = field(default_factory=lambda: [1_000, 10_000, 100_000, 1_000_000])
    nodes: list[int] = field(default_factory=lambda: [1, 2, 4, 8, 16])
    node_tasks: int = 10_000
    actors: list[int] = field(default_factory=lambda: [10, 100, 300, 1_000])
    point_timeout_s: int = 900

    @classmethod
    def quick(cls) -> Sizes:
        return cls(
            queued=[1_000, 4_000, 16_000],
            objects=[1_000, 10_000, 50_000],
            nodes=[1, 2, 4],
            node_tasks=2_000,
            actors=[10, 30, 100],
            point_timeout_s=120,
        )


# --------------------------------------------------------------------------- user code


def tiny(x: Any = None) -> Any:
    return x


def gate(path: str) -> int:
    """Finish once ``path`` exists (the parent opens the gate)."""
    while not os.path.exists(path):
        time.sleep(0.01)
    return 0


def after(_gate: int, i: int) -> int:
    return i


class Idle:
    def ping(self) -> int:
        return os.getpid()


def uss_mib() -> float:
    import psutil

    return psutil.Process().memory_full_info().uss / 2**20


# --------------------------------------------------------------------------- points (child)


def point_queued(n: int) -> dict[str, float]:
    import gc

    import nbcluster

    nbcluster.init(num_cpus=2)
    try:
        g, a = nbcluster.remote(gate), nbcluster.remote(after)
        nbcluster.get(a.remote(0, 0))  # warm
        path = os.path.join(tempfile.mkdtemp(prefix="nbc-scale-"), "open")
        gc.collect()
        mem0 = uss_mib()
        t0 = time.perf_counter()
        gate_ref = g.remote(path)
        refs = [a.remote(gate_ref, i) for i in range(n)]
        t1 = time.perf_counter()
        gc.collect()
        mem1 = uss_mib()
        Path(path).touch()
        out = nbcluster.get(refs, timeout=3600)
        t2 = time.perf_counter()
        assert out[-1] == n - 1
        return {
            "submit_per_s": n / (t1 - t0),
            "kib_per_queued_task": (mem1 - mem0) * 1024 / n,
            "run_per_s": n / (t2 - t1),
        }
    finally:
        nbcluster.shutdown()


def point_objects(n: int) -> dict[str, float]:
    import gc

    import nbcluster

    nbcluster.init(num_cpus=2)
    try:
        nbcluster.get(nbcluster.put(("warm", 0)))
        gc.collect()
        mem0 = uss_mib()
        t0 = time.perf_counter()
        refs = [nbcluster.put(("obj", i)) for i in range(n)]
        t1 = time.perf_counter()
        values = nbcluster.get(refs)
        t2 = time.perf_counter()
        assert values[-1] == ("obj", n - 1)
        del values
        gc.collect()
        mem1 = uss_mib()
        return {
            "put_per_s": n / (t1 - t0),
            "get_per_s": n / (t2 - t1),
            "bytes_per_object": (mem1 - mem0) * 2**20 / n,
        }
    finally:
        nbcluster.shutdown()


def point_nodes(k: int, tasks: int) -> dict[str, float]:
    import nbcluster

    nbcluster.init(num_cpus=1, _nodes=k)
    try:
        h = nbcluster.remote(tiny)
        nbcluster.get([h.remote(i) for i in range(200)])  # warm: leases on every node
        t0 = time.perf_counter()
        out = nbcluster.get([h.remote(i) for i in range(tasks)], timeout=3600)
        dt = time.perf_counter() - t0
        assert out[-1] == tasks - 1
        return {"tasks_per_s": tasks / dt}
    finally:
        nbcluster.shutdown()


def point_actors(n: int) -> dict[str, float]:
    import nbcluster

    nbcluster.init(num_cpus=2)
    try:
        cls = nbcluster.remote(num_cpus=0)(Idle)
        t0 = time.perf_counter()
        actors = [cls.remote() for _ in range(n)]
        pids = nbcluster.get([x.ping.remote() for x in actors], timeout=3600)
        dt = time.perf_counter() - t0
        assert len(set(pids)) == n
        return {"seconds": dt, "ms_per_actor": 1e3 * dt / n}
    finally:
        nbcluster.shutdown()


def run_point(series: str, size: int, extra: int) -> dict[str, float]:
    if series == "queued":
        return point_queued(size)
    if series == "objects":
        return point_objects(size)
    if series == "nodes":
        return point_nodes(size, extra)
    if series == "actors":
        return point_actors(size)
    raise ValueError(series)


# --------------------------------------------------------------------------- parent


@dataclass
class Series:
    key: str
    title: str
    size_label: str
    metrics: dict[str, tuple[str, str]]  # metric -> (label, "cost" | "rate")


SERIES = [
    Series(
        "queued",
        "queued tasks in the driver",
        "tasks",
        {
            "submit_per_s": ("submit rate (tasks/s)", "rate"),
            "kib_per_queued_task": ("driver memory per queued task (KiB)", "per-item"),
            "run_per_s": ("run rate once released (tasks/s)", "rate"),
        },
    ),
    Series(
        "objects",
        "small objects put, then got",
        "objects",
        {
            "put_per_s": ("put rate (/s)", "rate"),
            "get_per_s": ("get rate (/s)", "rate"),
            "bytes_per_object": ("driver memory per object (B)", "per-item"),
        },
    ),
    Series(
        "nodes",
        "node managers on this host (1 CPU each)",
        "nodes",
        {"tasks_per_s": ("tiny tasks per second", "rate")},
    ),
    Series(
        "actors",
        "zero-CPU actors created and called once",
        "actors",
        {
            "seconds": ("seconds until all answered", "cost"),
            "ms_per_actor": ("ms per actor", "per-item"),
        },
    ),
]


def measure(series: str, size: int, extra: int, timeout: int, log: Path) -> dict[str, Any]:
    out = Path(tempfile.mkstemp(prefix="nbc-scale-", suffix=".json")[1])
    args = ["--_point", series, str(size), str(extra), str(out)]
    run = run_child(__file__, args, timeout_s=timeout, logfile=log)
    try:
        text = out.read_text()
    finally:
        out.unlink(missing_ok=True)
    if run.returncode != 0 or not text:
        return {"error": f"{run.why}; log: {log}"}
    return json.loads(text)


def exponent(sizes: list[int], values: list[float], kind: str) -> float | None:
    """k in value ~ size^k between the first and last point (per item: of the total)."""
    pts = [(s, v) for s, v in zip(sizes, values, strict=True) if v and v > 0]
    if len(pts) < 2 or pts[0][0] == pts[-1][0]:
        return None
    (s0, v0), (s1, v1) = pts[0], pts[-1]
    if kind == "per-item":  # total cost = per-item cost x size
        v0, v1 = v0 * s0, v1 * s1
    return math.log(v1 / v0) / math.log(s1 / s0)


def verdict(k: float | None, kind: str) -> str:
    if k is None:
        return ""
    if kind == "rate":
        return "flat" if k > -0.15 else "falls"
    return "linear" if k <= 1.15 else "SUPERLINEAR"


def fmt(v: float | None) -> str:
    if v is None:
        return "-"
    if v >= 1000:
        return f"{v:,.0f}"
    if v >= 10:
        return f"{v:.1f}"
    return f"{v:.3g}"


def render(results: dict[str, dict[int, dict[str, Any]]], s: Sizes) -> str:
    lines = []
    for ser in SERIES:
        points = results.get(ser.key, {})
        sizes = sorted(points)
        if not sizes:
            continue
        lines.append(f"{ser.title} ({ser.size_label})")
        head = ["metric", *[f"{n:,}" for n in sizes], "growth k", ""]
        rows = [head]
        for metric, (label, kind) in ser.metrics.items():
            vals = [points[n].get(metric) for n in sizes]
            k = exponent(sizes, [v or 0 for v in vals], kind)
            rows.append(
                [label, *[fmt(v) for v in vals], "" if k is None else f"{k:+.2f}", verdict(k, kind)]
            )
        errors = [f"{n:,}: {points[n]['error']}" for n in sizes if "error" in points[n]]
        lines += format_table(rows, right=slice(1, None), indent="  ", full_rule=True)
        lines += [f"  ! {e}" for e in errors]
        lines.append("")
    lines.append(
        "growth k: cost ~ size^k from the first to the last point (for rates: rate ~ size^k;"
        " per-item figures are compared as totals). linear: k <= 1.15; a rate is flat while"
        " k > -0.15."
    )
    return "\n".join(lines)


def write_chart(results: dict[str, dict[int, dict[str, Any]]], path: Path) -> None:
    """One panel per series (log-log), every metric a line; an HTML file with plotly."""
    from plotly.subplots import make_subplots

    shown = [ser for ser in SERIES if results.get(ser.key)]
    fig = make_subplots(rows=len(shown), cols=1, subplot_titles=[s.title for s in shown])
    for row, ser in enumerate(shown, start=1):
        points = results[ser.key]
        sizes = sorted(n for n in points if "error" not in points[n])
        for metric, (label, _kind) in ser.metrics.items():
            fig.add_scatter(
                x=sizes,
                y=[points[n].get(metric) for n in sizes],
                mode="lines+markers",
                name=label,
                row=row,
                col=1,
            )
        fig.update_xaxes(type="log", title_text=ser.size_label, row=row, col=1)
        fig.update_yaxes(type="log", row=row, col=1)
    fig.update_layout(height=330 * len(shown), title="nbcluster: how cost grows with load")
    fig.write_html(str(path), include_plotlyjs="cdn")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes: about a minute")
    parser.add_argument("--only", help="comma-separated series: queued,objects,nodes,actors")
    parser.add_argument("--html", default="scale.html", help="chart file (default scale.html)")
    parser.add_argument("--json", metavar="PATH", help="also write the figures as JSON")
    parser.add_argument("--_point", nargs=4, help=argparse.SUPPRESS)
    ns = parser.parse_args(argv)
    if ns._point:
        series, size, extra, out = ns._point
        Path(out).write_text(json.dumps(run_point(series, int(size), int(extra))))
        return 0
    s = Sizes.quick() if ns.quick else Sizes()
    wanted = ns.only.split(",") if ns.only else [ser.key for ser in SERIES]
    unknown = set(wanted) - {ser.key for ser in SERIES}
    if unknown:
        raise SystemExit(
            f"unknown series {sorted(unknown)}; choose from queued,objects,nodes,actors"
        )
    plan = {
        "queued": (s.queued, 0),
        "objects": (s.objects, 0),
        "nodes": (s.nodes, s.node_tasks),
        "actors": (s.actors, 0),
    }
    workdir = Path(tempfile.mkdtemp(prefix="nbcluster-scale-"))
    results: dict[str, dict[int, dict[str, Any]]] = {}
    for key in wanted:
        sizes, extra = plan[key]
        for n in sizes:
            print(f"[{key}] {n:,} ...", file=sys.stderr, flush=True)
            t = time.perf_counter()
            res = measure(key, n, extra, s.point_timeout_s, workdir / f"{key}.log")
            print(f"[{key}] {n:,}: {res} ({time.perf_counter() - t:.1f} s)", file=sys.stderr)
            results.setdefault(key, {})[n] = res
    print(render(results, s))
    write_chart(results, Path(ns.html))
    print(f"chart: {ns.html}   logs: {workdir}")
    if ns.json:
        Path(ns.json).write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
