"""Compiled graphs: nbcluster beside Ray, in one run (issue 20, item 6).

    python benchmarks/compiled_bench.py                  # every installed system, full sizes
    python benchmarks/compiled_bench.py --quick          # small sizes: a smoke run
    python benchmarks/compiled_bench.py --only nbcluster --json compiled.json

Each system runs in its own fresh subprocess with 2 CPUs on one node (the set-up of
``microbench.py``). The graph is a chain of two actors, ``b.inc.bind(a.inc.bind(inp))``:

- compiled round trip: ``get(compiled.execute(i))``, median over N calls after a warm-up
  (``dag.experimental_compile()``; the target is at least 2x faster than Ray's);
- uncompiled round trip: ``get(dag.execute(i))`` on the same DAG (tasks submitted per call);
- compiled, pipelined: as many executions as may be in flight (10), then their results;
  executions per second;
- compiled, 1 MB array: the round trip of a 1 MB numpy array through both actors.

The table gives each figure and "how many times better nbcluster is" (Ray / nbcluster for
times, nbcluster / Ray for rates; >1 means nbcluster wins). Absolute numbers drift on
shared machines; only ratios measured in the same run mean anything.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import importlib.util
import json
import logging
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

NUM_CPUS = 2
SYSTEMS = ("nbcluster", "ray")
LABELS = {"nbcluster": "nbcluster", "ray": "Ray"}
TARGET = 2.0  # compiled round trip: at least this many times faster than Ray's


@dataclass
class Sizes:
    warmup: int = 300
    n: int = 5000
    uncompiled_n: int = 500
    pipelined_rounds: int = 300
    big_n: int = 200
    budget_s: float = 60.0  # a loop stops early (median over what ran) past this
    system_timeout_s: int = 600

    @classmethod
    def quick(cls) -> Sizes:
        return cls(
            warmup=30,
            n=300,
            uncompiled_n=50,
            pipelined_rounds=20,
            big_n=20,
            budget_s=15.0,
            system_timeout_s=180,
        )


# --------------------------------------------------------------------------- adapters


class Adapter:
    name = ""
    module = ""

    def version(self) -> str:
        """Raise ImportError when not installed. Imports nothing: the parent stays clean."""
        if importlib.util.find_spec(self.module) is None:
            raise ImportError(f"No module named {self.module!r}")
        try:
            return importlib.metadata.version(self.module)
        except importlib.metadata.PackageNotFoundError:
            return "(source tree)"

    def start(self) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def build(self) -> Any:
        """The chain DAG (two new actors)."""
        raise NotImplementedError

    def teardown(self, compiled: Any) -> None:
        """End a compiled graph (the shutdown that follows ends it too)."""
        compiled.teardown()

    def get(self, ref: Any) -> Any:
        raise NotImplementedError


class NbclusterAdapter(Adapter):
    name = "nbcluster"
    module = "nbcluster"

    def start(self) -> None:
        import nbcluster

        self.nb = nbcluster
        nbcluster.init(num_cpus=NUM_CPUS)

    def stop(self) -> None:
        self.nb.shutdown()

    def build(self) -> Any:
        from nbcluster.dag import InputNode

        @self.nb.remote
        class Stage:
            def inc(self, x: Any) -> Any:
                return x + 1

        a, b = Stage.remote(), Stage.remote()
        with InputNode() as inp:
            dag = b.inc.bind(a.inc.bind(inp))
        return dag

    def get(self, ref: Any) -> Any:
        return self.nb.get(ref)


class RayAdapter(Adapter):
    name = "ray"
    module = "ray"

    def start(self) -> None:
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        import ray

        self.ray = ray
        kwargs = dict(num_cpus=NUM_CPUS, include_dashboard=False, logging_level=logging.WARNING)
        try:  # keep Ray's traffic on loopback, as ours is
            ray.init(_node_ip_address="127.0.0.1", **kwargs)
        except TypeError:
            ray.init(**kwargs)

    def stop(self) -> None:
        self.ray.shutdown()

    def build(self) -> Any:
        import warnings

        from ray.dag import InputNode

        warnings.filterwarnings("ignore")  # DAGNode.execute() is deprecated in Ray

        @self.ray.remote
        class Stage:
            def inc(self, x: Any) -> Any:
                return x + 1

        a, b = Stage.remote(), Stage.remote()
        with InputNode() as inp:
            dag = b.inc.bind(a.inc.bind(inp))
        return dag

    def get(self, ref: Any) -> Any:
        return self.ray.get(ref)

    def teardown(self, compiled: Any) -> None:
        """Ray's teardown can wait 30 s for its loops here; ray.shutdown() ends them."""


ADAPTERS: dict[str, type[Adapter]] = {"nbcluster": NbclusterAdapter, "ray": RayAdapter}


# --------------------------------------------------------------------------- workloads


def median_us(fn: Callable[[int], None], warmup: int, n: int, budget_s: float) -> float:
    for i in range(warmup):
        fn(i)
    times = []
    start = time.perf_counter()
    for i in range(n):
        t = time.perf_counter()
        fn(i)
        times.append(time.perf_counter() - t)
        if time.perf_counter() - start > budget_s:
            break
    return statistics.median(times) * 1e6


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def child(system: str, out: str, s: Sizes) -> None:
    import numpy as np

    a = ADAPTERS[system]()
    a.start()
    dag = a.build()

    def run(key: str, fn: Callable[[], float]) -> None:
        log(f"[{system}] {key} ...")
        try:
            value = fn()
        except Exception as e:  # a broken workload must not hide the others
            record = {"key": key, "error": f"{type(e).__name__}: {e}"[:300]}
        else:
            record = {"key": key, "value": value}
        with open(out, "a") as f:
            f.write(json.dumps(record) + "\n")
        log(f"[{system}] {record}")

    def uncompiled(i: int) -> None:
        assert a.get(dag.execute(i)) == i + 2

    run("uncompiled", lambda: median_us(uncompiled, s.warmup // 10, s.uncompiled_n, s.budget_s))
    # The same graph on two fresh actors: Ray's compiled graph hangs on actors that ran
    # the uncompiled DAG just before.
    compiled = a.build().experimental_compile()

    def round_trip(i: int) -> None:
        assert a.get(compiled.execute(i)) == i + 2

    def pipelined() -> float:
        for _ in range(3):
            [a.get(r) for r in [compiled.execute(i) for i in range(10)]]
        t = time.perf_counter()
        done = 0
        for _ in range(s.pipelined_rounds):
            refs = [compiled.execute(i) for i in range(10)]
            for r in refs:
                a.get(r)
            done += 10
            if time.perf_counter() - t > s.budget_s:
                break
        return done / (time.perf_counter() - t)

    big = np.zeros(1 << 17)  # 1 MB of float64

    def big_round_trip(i: int) -> None:
        out = a.get(compiled.execute(big))
        assert out.nbytes == big.nbytes

    run("compiled", lambda: median_us(round_trip, s.warmup, s.n, s.budget_s))
    run("pipelined", pipelined)
    run("big", lambda: median_us(big_round_trip, s.warmup // 10, s.big_n, s.budget_s))
    a.teardown(compiled)
    a.stop()


# --------------------------------------------------------------------------- parent


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def run_system(system: str, s: Sizes, workdir: Path, quick: bool) -> dict[str, Any]:
    entry: dict[str, Any] = {"results": {}, "errors": {}}
    try:
        entry["version"] = ADAPTERS[system]().version()
    except Exception as e:  # ImportError, or a half-written package
        entry["status"] = "not installed"
        log(f"[{system}] not installed ({type(e).__name__}: {e})")
        return entry
    entry["status"] = "ok"
    out = workdir / f"{system}.jsonl"
    logfile = workdir / f"{system}.log"
    entry["log"] = str(logfile)
    cmd = [sys.executable, os.path.abspath(__file__), "--_child", system, "--_out", str(out)]
    if quick:
        cmd.append("--quick")
    with open(logfile, "ab") as logf:
        proc = subprocess.Popen(
            cmd, stdin=subprocess.DEVNULL, stdout=logf, stderr=logf, start_new_session=True
        )
        try:
            rc: int | None = proc.wait(timeout=s.system_timeout_s)
        except subprocess.TimeoutExpired:
            rc = None
    # The child leads its own process group: end whatever it left behind (by group id).
    deadline = time.monotonic() + (0 if rc is None else 10)
    while _group_alive(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    if _group_alive(proc.pid):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    if out.exists():
        for line in out.read_text().splitlines():
            rec = json.loads(line)
            if "value" in rec:
                entry["results"][rec["key"]] = rec["value"]
            else:
                entry["errors"][rec["key"]] = rec["error"]
    if rc != 0:
        entry["errors"]["run"] = (
            f"child {'timed out' if rc is None else f'exited {rc}'}; log: {logfile}"
        )
    return entry


#: (key, label, unit, higher is better)
ROWS = [
    ("compiled", "compiled round trip, 2-actor chain", "µs", False),
    ("uncompiled", "same DAG uncompiled (dag.execute)", "µs", False),
    ("pipelined", "compiled, 10 in flight", "exec/s", True),
    ("big", "compiled round trip, 1 MB array", "µs", False),
]


def fmt(v: float | None) -> str:
    if v is None:
        return ""
    if v >= 100:
        return f"{v:,.0f}"
    if v >= 10:
        return f"{v:.1f}"
    return f"{v:.2f}"


def render(report: dict[str, Any]) -> str:
    systems = report["systems"]
    head = ["workload", "unit", "nbcluster", "Ray", "×Ray"]
    table = [head]
    values: dict[str, dict[str, float | None]] = {}
    for key, label, unit, higher in ROWS:
        cells = []
        values[key] = {}
        for name in SYSTEMS:
            e = systems.get(name, {"status": "skipped"})
            v = e.get("results", {}).get(key) if e.get("status") == "ok" else None
            values[key][name] = v
            if e.get("status") != "ok":
                cells.append("-")
            elif v is None:
                cells.append("err")
            else:
                cells.append(fmt(v))
        nb, ray = values[key]["nbcluster"], values[key]["ray"]
        ratio = ""
        if nb and ray:
            ratio = f"{fmt(nb / ray if higher else ray / nb)}×"
        table.append([label, unit, *cells, ratio])
    widths = [max(len(r[i]) for r in table) for i in range(len(head))]
    out = []
    for n, r in enumerate(table):
        cells = [r[0].ljust(widths[0]), r[1].ljust(widths[1])]
        cells += [c.rjust(w) for c, w in zip(r[2:], widths[2:], strict=True)]
        out.append("  ".join(cells).rstrip())
        if n == 0:
            out.append("-" * len(out[0]))
    out.append("")
    out.append(
        "×Ray = how many times better nbcluster is, measured in this run (>1: nbcluster wins)."
    )
    nb_c, ray_c = values["compiled"]["nbcluster"], values["compiled"]["ray"]
    nb_u = values["uncompiled"]["nbcluster"]
    if nb_c and ray_c:
        met = "met" if ray_c / nb_c >= TARGET else "NOT met"
        out.append(f"target: compiled round trip >= {TARGET:g}× faster than Ray's: {met}")
    if nb_c and nb_u:
        out.append(f"nbcluster compiled vs uncompiled: {fmt(nb_u / nb_c)}× faster")
    vers = ", ".join(
        f"{LABELS[k]} {v.get('version', '')}".strip()
        + ("" if v["status"] == "ok" else f" ({v['status']})")
        for k, v in systems.items()
    )
    out.append(f"systems: {vers}")
    m = report["machine"]
    out.append(
        f"machine: {m['cpus']} CPUs, {m['cpu']}, Python {m['python']}; "
        f"each system: one node with {NUM_CPUS} CPUs"
        + (", --quick sizes" if report["quick"] else "")
    )
    for k, v in systems.items():
        for key, msg in v.get("errors", {}).items():
            out.append(f"  - {LABELS[k]} {key} failed: {msg}")
    return "\n".join(out)


def machine_info() -> dict[str, Any]:
    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    return {
        "cpus": os.cpu_count(),
        "cpu": cpu,
        "python": platform.python_version(),
        "time": time.ctime(),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, for a smoke run")
    parser.add_argument("--only", help="comma-separated: nbcluster,ray")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    parser.add_argument("--_child", help=argparse.SUPPRESS)
    parser.add_argument("--_out", help=argparse.SUPPRESS)
    ns = parser.parse_args(argv)
    sizes = Sizes.quick() if ns.quick else Sizes()
    if ns._child:
        child(ns._child, ns._out, sizes)
        return 0
    systems = [x.strip().lower() for x in ns.only.split(",")] if ns.only else list(SYSTEMS)
    for name in systems:
        if name not in SYSTEMS:
            raise SystemExit(f"unknown system {name!r}; choose from {', '.join(SYSTEMS)}")
    report: dict[str, Any] = {
        "quick": ns.quick,
        "machine": machine_info(),
        "sizes": vars(sizes),
        "systems": {},
    }
    workdir = Path(tempfile.mkdtemp(prefix="nbcluster-compiledbench-"))
    for name in systems:
        report["systems"][name] = run_system(name, sizes, workdir, ns.quick)
    print(render(report))
    print(f"logs: {workdir}")
    if ns.json:
        Path(ns.json).write_text(json.dumps(report, indent=2) + "\n")
        print(f"results written to {ns.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
