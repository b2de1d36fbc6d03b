"""Placement-group create+remove rate: nbcluster beside Ray, in one run (issue 5, item 6).

    python benchmarks/pg_bench.py                    # every installed system, full sizes
    python benchmarks/pg_bench.py --quick            # small sizes: a smoke run (CI)
    python benchmarks/pg_bench.py --only nbcluster --json pg.json

Each system runs in its own fresh subprocess with 2 CPUs on one node (the set-up of
``microbench.py``). Workloads, after a warm-up of the same loop:

- sequential, 1 bundle: ``pg = placement_group([{"CPU": 0.01}])``, wait until ready,
  ``remove_placement_group(pg)``, again and again; groups per second (the latency bound).
- sequential, 4 bundles SPREAD: the same with four bundles.
- batch of N: create N one-bundle groups, wait for all of them, remove them all; groups/s.
- CPU per cycle of the 1-bundle loop, summed over the driver and every process under it
  (the head, node manager and workers; Ray's GCS, raylet and workers): a figure that does
  not depend on how busy the machine is, where the rates do.

The table gives each figure and the ratio "how many times better nbcluster is" (nbcluster /
Ray for rates; >1 means nbcluster wins). Absolute numbers drift on shared machines; only
ratios measured in the same run mean anything. A system that is not installed shows "-".
"""

from __future__ import annotations

import contextlib
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
BUNDLE = {"CPU": 0.01}


@dataclass
class Sizes:
    warmup: int = 30
    seq_n: int = 300
    seq4_n: int = 200
    batch_n: int = 200
    batch_reps: int = 3
    budget_s: float = 30.0  # a sequential loop stops early (rate over what ran) past this
    system_timeout_s: int = 600

    @classmethod
    def quick(cls) -> Sizes:
        return cls(
            warmup=10,
            seq_n=50,
            seq4_n=30,
            batch_n=50,
            batch_reps=1,
            budget_s=10.0,
            system_timeout_s=180,
        )


# --------------------------------------------------------------------------- adapters


class Adapter(SystemAdapter):
    def start(self) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def create(self, bundles: list[dict[str, float]], strategy: str) -> Any:
        raise NotImplementedError

    def wait_ready(self, pgs: list[Any]) -> None:
        raise NotImplementedError

    def remove(self, pg: Any) -> None:
        raise NotImplementedError


class NbclusterAdapter(Adapter):
    name = "nbcluster"
    module = "nbcluster"

    def start(self) -> None:
        import nbcluster
        from nbcluster import util

        self.nb, self.util = nbcluster, util
        nbcluster.init(num_cpus=NUM_CPUS)

    def stop(self) -> None:
        self.nb.shutdown()

    def create(self, bundles, strategy):
        return self.util.placement_group(bundles, strategy=strategy)

    def wait_ready(self, pgs):
        assert self.nb.get([pg.ready() for pg in pgs], timeout=60) == [True] * len(pgs)

    def remove(self, pg):
        self.util.remove_placement_group(pg)


class RayAdapter(Adapter):
    name = "ray"
    module = "ray"
    notes = {
        "remove": "Ray: remove_placement_group returns once the GCS has the removal; the "
        "bundles are released in the background (nbcluster's returns after its nodes did)",
    }

    def start(self) -> None:
        import importlib

        self.ray = start_ray(NUM_CPUS)
        # ray.util.placement_group is also the name of a function: import the module by path
        self.pgmod = importlib.import_module("ray.util.placement_group")

    def stop(self) -> None:
        self.ray.shutdown()

    def create(self, bundles, strategy):
        return self.pgmod.placement_group(bundles, strategy=strategy)

    def wait_ready(self, pgs):
        self.ray.get([pg.ready() for pg in pgs], timeout=60)

    def remove(self, pg):
        self.pgmod.remove_placement_group(pg)


ADAPTERS: dict[str, type[Adapter]] = {"nbcluster": NbclusterAdapter, "ray": RayAdapter}


# --------------------------------------------------------------------------- workloads


def _cpu_by_pid() -> dict[int, float]:
    """CPU seconds used so far by this process and each live process under it, by pid."""
    import psutil

    me = psutil.Process()
    out = {}
    for p in [me, *me.children(recursive=True)]:
        with contextlib.suppress(psutil.Error):
            t = p.cpu_times()
            out[p.pid] = t.user + t.system
    return out


def _cpu_since(before: dict[int, float]) -> float:
    """CPU seconds used since ``before`` by the processes alive now (new ones in full; one
    that exited meanwhile is not counted: its CPU cannot be read any more)."""
    return sum(max(0.0, t - before.get(pid, 0.0)) for pid, t in _cpu_by_pid().items())


def w_sequential(
    a: Adapter,
    bundles: int,
    strategy: str,
    n: int,
    s: Sizes,
    cpu: dict[str, float] | None = None,
) -> float:
    """Groups per second; with ``cpu``, also its ``"ms"``: CPU ms per cycle, all processes."""

    def once() -> None:
        pg = a.create([dict(BUNDLE) for _ in range(bundles)], strategy)
        a.wait_ready([pg])
        a.remove(pg)

    for _ in range(s.warmup):
        once()
    done = 0
    cpu0 = _cpu_by_pid() if cpu is not None else {}
    t = time.perf_counter()
    for _ in range(n):
        once()
        done += 1
        if time.perf_counter() - t > s.budget_s:
            break
    elapsed = time.perf_counter() - t
    if cpu is not None:
        cpu["ms"] = _cpu_since(cpu0) / done * 1e3
    return done / elapsed


def w_batch(a: Adapter, s: Sizes) -> float:
    rates = []
    for rep in range(s.batch_reps + 1):  # the first round is a warm-up
        t = time.perf_counter()
        pgs = [a.create([dict(BUNDLE)], "PACK") for _ in range(s.batch_n)]
        a.wait_ready(pgs)
        for pg in pgs:
            a.remove(pg)
        if rep:
            rates.append(s.batch_n / (time.perf_counter() - t))
    return sorted(rates)[len(rates) // 2]


def child(system: str, out: str, s: Sizes) -> None:
    a = ADAPTERS[system]()
    a.start()

    def run(key: str, fn: Callable[[], float]) -> None:
        record_workload(system, out, key, fn)

    cpu: dict[str, float] = {}
    run("seq1", lambda: w_sequential(a, 1, "PACK", s.seq_n, s, cpu))
    run("cpu1", lambda: cpu["ms"])
    run("seq4", lambda: w_sequential(a, 4, "SPREAD", s.seq4_n, s))
    run("batch", lambda: w_batch(a, s))
    a.stop()


# --------------------------------------------------------------------------- parent


def rows(s: Sizes) -> list[tuple[str, str, str]]:
    """(key, label, unit): rates in groups/s (higher is better), CPU in ms (lower is)."""
    return [
        ("seq1", "create+ready+remove, 1 bundle (sequential)", "groups/s"),
        ("seq4", "create+ready+remove, 4 bundles SPREAD (sequential)", "groups/s"),
        ("batch", f"{s.batch_n} groups created, then all removed", "groups/s"),
        ("cpu1", "CPU per 1-bundle cycle, all processes", "ms"),
    ]


def render(report: dict[str, Any], s: Sizes) -> str:
    systems = report["systems"]
    head = ["workload", "unit", "nbcluster", "Ray", "×Ray"]
    table = [head]
    for key, label, unit in rows(s):
        cells = []
        values = {}
        for name in SYSTEMS:
            e = systems.get(name, {"status": "skipped"})
            v = e.get("results", {}).get(key) if e.get("status") == "ok" else None
            values[name] = v
            if e.get("status") != "ok":
                cells.append("-")
            elif v is None:
                cells.append("err")
            else:
                cells.append(fmt(v))
        ratio = better(values["nbcluster"], values["ray"], unit == "groups/s")
        table.append([label, unit, *cells, f"{fmt(ratio)}×" if ratio else ""])
    out = format_table(table)
    out.append("")
    out.append(
        "×Ray = nbcluster's rate / Ray's rate (for CPU: Ray's / nbcluster's), measured in "
        "this run (>1: nbcluster wins)."
    )
    out.append(versions_line(systems, LABELS))
    m = report["machine"]
    out.append(
        f"machine: {m['cpus']} CPUs, {m['cpu']}, Python {m['python']}; "
        f"each system: one node with {NUM_CPUS} CPUs"
        + (", --quick sizes" if report["quick"] else "")
    )
    out += note_lines(systems, LABELS, lambda k: ADAPTERS[k].notes.values())
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
        prefix="nbcluster-pgbench-",
        timeout_s=sizes.system_timeout_s,
        flags=["--quick"] if ns.quick else [],
    )
    finish(render(report, sizes), workdir, report, ns.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
