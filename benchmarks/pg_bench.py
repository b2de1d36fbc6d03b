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

import argparse
import contextlib
import importlib.metadata
import importlib.util
import json
import logging
import os
import platform
import signal
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


class Adapter:
    name = ""
    module = ""
    notes: dict[str, str] = {}

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
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        import importlib

        import ray

        # ray.util.placement_group is also the name of a function: import the module by path
        pgmod = importlib.import_module("ray.util.placement_group")

        self.ray, self.pgmod = ray, pgmod
        kwargs = dict(num_cpus=NUM_CPUS, include_dashboard=False, logging_level=logging.WARNING)
        try:  # keep Ray's traffic on loopback, as ours is
            ray.init(_node_ip_address="127.0.0.1", **kwargs)
        except TypeError:
            ray.init(**kwargs)

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


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def child(system: str, out: str, s: Sizes) -> None:
    a = ADAPTERS[system]()
    a.start()

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

    cpu: dict[str, float] = {}
    run("seq1", lambda: w_sequential(a, 1, "PACK", s.seq_n, s, cpu))
    run("cpu1", lambda: cpu["ms"])
    run("seq4", lambda: w_sequential(a, 4, "SPREAD", s.seq4_n, s))
    run("batch", lambda: w_batch(a, s))
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


def rows(s: Sizes) -> list[tuple[str, str, str]]:
    """(key, label, unit): rates in groups/s (higher is better), CPU in ms (lower is)."""
    return [
        ("seq1", "create+ready+remove, 1 bundle (sequential)", "groups/s"),
        ("seq4", "create+ready+remove, 4 bundles SPREAD (sequential)", "groups/s"),
        ("batch", f"{s.batch_n} groups created, then all removed", "groups/s"),
        ("cpu1", "CPU per 1-bundle cycle, all processes", "ms"),
    ]


def fmt(v: float | None) -> str:
    if v is None:
        return ""
    if v >= 100:
        return f"{v:,.0f}"
    if v >= 10:
        return f"{v:.1f}"
    return f"{v:.2f}"


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
        nb, ray = values["nbcluster"], values["ray"]
        better = (nb / ray if unit == "groups/s" else ray / nb) if nb and ray else None
        ratio = f"{fmt(better)}×" if better else ""
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
        "×Ray = nbcluster's rate / Ray's rate (for CPU: Ray's / nbcluster's), measured in "
        "this run (>1: nbcluster wins)."
    )
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
        if v.get("status") != "ok":
            continue
        for note in ADAPTERS[k].notes.values():
            out.append(f"  - {note}")
        for key, msg in v["errors"].items():
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
    workdir = Path(tempfile.mkdtemp(prefix="nbcluster-pgbench-"))
    for name in systems:
        report["systems"][name] = run_system(name, sizes, workdir, ns.quick)
    print(render(report, sizes))
    print(f"logs: {workdir}")
    if ns.json:
        Path(ns.json).write_text(json.dumps(report, indent=2) + "\n")
        print(f"results written to {ns.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
