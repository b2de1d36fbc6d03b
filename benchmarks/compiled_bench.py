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

import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from _harness import (
    SystemAdapter,
    bench_parser,
    better,
    finish,
    fmt,
    format_table,
    measure_all,
    new_report,
    note_lines,
    record_workload,
    select_systems,
    start_ray,
    versions_line,
)

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


class Adapter(SystemAdapter):
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
        self.ray = start_ray(NUM_CPUS)

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


def child(system: str, out: str, s: Sizes) -> None:
    import numpy as np

    a = ADAPTERS[system]()
    a.start()
    dag = a.build()

    def run(key: str, fn: Callable[[], float]) -> None:
        record_workload(system, out, key, fn)

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


#: (key, label, unit, higher is better)
ROWS = [
    ("compiled", "compiled round trip, 2-actor chain", "µs", False),
    ("uncompiled", "same DAG uncompiled (dag.execute)", "µs", False),
    ("pipelined", "compiled, 10 in flight", "exec/s", True),
    ("big", "compiled round trip, 1 MB array", "µs", False),
]


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
        ratio = better(values[key]["nbcluster"], values[key]["ray"], higher)
        table.append([label, unit, *cells, f"{fmt(ratio)}×" if ratio else ""])
    out = format_table(table)
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
    out.append(versions_line(systems, LABELS))
    m = report["machine"]
    out.append(
        f"machine: {m['cpus']} CPUs, {m['cpu']}, Python {m['python']}; "
        f"each system: one node with {NUM_CPUS} CPUs"
        + (", --quick sizes" if report["quick"] else "")
    )
    out += note_lines(systems, LABELS)
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ns = bench_parser(__doc__, SYSTEMS).parse_args(argv)
    sizes = Sizes.quick() if ns.quick else Sizes()
    if ns._child:
        child(ns._child, ns._out, sizes)
        return 0
    systems = select_systems(ns.only, SYSTEMS)
    report = new_report(ns.quick, sizes)
    workdir = measure_all(
        __file__,
        report,
        systems,
        ADAPTERS,
        prefix="nbcluster-compiledbench-",
        timeout_s=sizes.system_timeout_s,
        flags=["--quick"] if ns.quick else [],
    )
    finish(render(report), workdir, report, ns.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
