"""Many idle actors: creation time, memory per actor worker and idle CPU, beside Ray.

    python benchmarks/actors_bench.py                  # nbcluster 100 and 1,000; Ray 100
    python benchmarks/actors_bench.py --quick          # small sizes: a smoke run
    python benchmarks/actors_bench.py --n 1000 --ray-n 100 --idle-s 10 --json actors.json

Issue 11's targets: 1,000 actors created and answering in <= 30 s, <= 15 MiB PSS per idle
actor worker, and 0 % idle CPU (no polling wake-ups). Each point runs in a fresh
subprocess (its process group is ended afterwards) with ``init(num_cpus=2)`` on one node:

1. N zero-CPU actors are created and each is called once (the call returns the worker's
   pid); the time from the first ``.remote()`` to the last answer;
2. after ``--settle-s`` of quiet, the PSS of every actor's worker process
   (``/proc/<pid>/smaps_rollup``): the median per worker;
3. then ``--idle-s`` of quiet: the CPU time (utime + stime, every thread) those workers
   used, and their wake-ups (the growth of voluntary + involuntary context switches,
   summed over each worker's threads; a thread that sleeps until it is woken counts one
   per wake-up). The rest of the cluster (every other descendant of the driver: head,
   node manager, store, Ray's raylet/GCS/agents) is measured over the same window.

Ray's actor workers are each a full core worker (tens of MiB each), so Ray runs at the
smaller size (``--ray-n``) and nbcluster runs at that size too: the ratios compare the
same N in the same run. Absolute figures drift on a shared machine; only ratios measured
in the same run mean anything. Last, the floor: the same idle window on a bare Python
process that holds a started ``grpc.aio`` server and a connected channel (no nbcluster),
since gRPC's own threads (timer, thread-pool lifeguard) wake on their own.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _harness import format_table, run_child, start_ray

NUM_CPUS = 2
LABELS = {"nbcluster": "nbcluster", "ray": "Ray"}
TARGET_S, TARGET_PSS_MIB = 30.0, 15.0
CLK_TCK = os.sysconf("SC_CLK_TCK")


# --------------------------------------------------------------------------- /proc readers


def pss_mib(pid: int) -> float:
    """Proportional set size of ``pid`` in MiB (0 when it is gone)."""
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1]) / 1024
    return 0.0


def cpu_and_switches(pid: int) -> tuple[float, int]:
    """(CPU seconds used so far, context switches summed over every thread) of ``pid``."""
    cpu, switches = 0.0, 0
    with contextlib.suppress(OSError):
        stat = Path(f"/proc/{pid}/stat").read_text()
        fields = stat[stat.rindex(")") + 2 :].split()
        cpu = (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime, stime: all threads
        for tid in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError):
                for line in Path(f"/proc/{pid}/task/{tid}/status").read_text().splitlines():
                    if line.startswith(("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches")):
                        switches += int(line.split()[1])
    return cpu, switches


def descendants(root: int) -> list[int]:
    """Every live descendant of ``root`` (from /proc's parent links)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        with contextlib.suppress(OSError, ValueError, IndexError):
            stat = Path(f"/proc/{entry}/stat").read_text()
            ppid = int(stat[stat.rindex(")") + 2 :].split()[1])
            children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [root]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def sample(pids: list[int]) -> dict[int, tuple[float, int]]:
    return {p: cpu_and_switches(p) for p in pids}


# --------------------------------------------------------------------------- systems


class Idle:
    def ping(self) -> int:
        return os.getpid()


def start(system: str) -> Any:
    if system == "nbcluster":
        import nbcluster

        nbcluster.init(num_cpus=NUM_CPUS)
        return nbcluster
    return start_ray(NUM_CPUS)


def point(system: str, n: int, settle_s: float, idle_s: float) -> dict[str, Any]:
    """One size on one system, in this (fresh) process."""
    api = start(system)
    try:
        cls = api.remote(num_cpus=0)(Idle)
        t0 = time.perf_counter()
        actors = [cls.remote() for _ in range(n)]
        pids = api.get([a.ping.remote() for a in actors], timeout=3600)
        create_s = time.perf_counter() - t0
        assert len(set(pids)) == n, "two actors answered from one process"
        time.sleep(settle_s)
        pss = [pss_mib(p) for p in pids]
        others = [p for p in descendants(os.getpid()) if p not in set(pids)]
        before_w, before_o = sample(pids), sample(others)
        time.sleep(idle_s)
        after_w, after_o = sample(pids), sample(others)
        # every actor still answers after the quiet spell
        again = api.get([a.ping.remote() for a in actors], timeout=600)
        assert sorted(again) == sorted(pids)

        def delta(b: dict[int, tuple[float, int]], a: dict[int, tuple[float, int]]) -> Any:
            cpu = sum(max(0.0, a[p][0] - b[p][0]) for p in b)
            wakes = [max(0, a[p][1] - b[p][1]) for p in b]
            return cpu, wakes

        cpu_w, wakes_w = delta(before_w, after_w)
        cpu_o, wakes_o = delta(before_o, after_o)
        return {
            "n": n,
            "create_s": create_s,
            "actors_per_s": n / create_s,
            "pss_mib_median": statistics.median(pss),
            "pss_mib_mean": statistics.fmean(pss),
            "idle_s": idle_s,
            "idle_cpu_s_workers": cpu_w,
            "idle_cpu_pct_workers": 100 * cpu_w / idle_s,  # % of one core, all workers
            "wakeups_per_worker_s": sum(wakes_w) / n / idle_s,
            "workers_woken": sum(1 for w in wakes_w if w),
            "other_procs": len(others),
            "idle_cpu_pct_others": 100 * cpu_o / idle_s,
            "wakeups_others_s": sum(wakes_o) / idle_s,
        }
    finally:
        api.shutdown()


# --------------------------------------------------------------------------- parent


GRPC_IDLE = """
import asyncio, grpc
async def main():
    server = grpc.aio.server()
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    await channel.channel_ready()
    print("ready", flush=True)
    await asyncio.sleep(3600)
asyncio.run(main())
"""


def grpc_floor(settle_s: float, idle_s: float) -> dict[str, float]:
    """Wake-ups and CPU of a bare Python process that holds a started ``grpc.aio`` server
    and a connected channel and does nothing: the floor for any process that uses gRPC
    (gRPC's own threads wake on timers)."""
    proc = subprocess.Popen(
        [sys.executable, "-c", GRPC_IDLE], stdout=subprocess.PIPE, stdin=subprocess.DEVNULL
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == b"ready"
        time.sleep(settle_s)
        cpu0, sw0 = cpu_and_switches(proc.pid)
        time.sleep(idle_s)
        cpu1, sw1 = cpu_and_switches(proc.pid)
    finally:
        proc.kill()
        proc.wait()
    return {"wakeups_per_s": (sw1 - sw0) / idle_s, "cpu_pct": 100 * (cpu1 - cpu0) / idle_s}


def measure(
    system: str, n: int, settle_s: float, idle_s: float, timeout: int, log: Path
) -> dict[str, Any]:
    out = Path(tempfile.mkstemp(prefix="nbc-actors-", suffix=".json")[1])
    args = ["--_point", system, str(n), str(out), "--settle-s", str(settle_s)]
    args += ["--idle-s", str(idle_s)]
    print(f"[{system}] {n:,} actors ...", file=sys.stderr, flush=True)
    t = time.perf_counter()
    run = run_child(__file__, args, timeout_s=timeout, logfile=log, grace_s=15)
    try:
        text = out.read_text()
    finally:
        out.unlink(missing_ok=True)
    if run.returncode != 0 or not text:
        res: dict[str, Any] = {"error": run.why}
    else:
        res = json.loads(text)
    print(f"[{system}] {n:,}: {res} ({time.perf_counter() - t:.1f} s)", file=sys.stderr)
    return res


ROWS = [
    ("create_s", "created and answering", "s", "cost"),
    ("actors_per_s", "creation rate", "actors/s", "rate"),
    ("pss_mib_median", "PSS per idle actor worker (median)", "MiB", "cost"),
    ("idle_cpu_pct_workers", "idle CPU, all actor workers", "% core", "cost"),
    ("wakeups_per_worker_s", "wake-ups per idle actor worker", "/s", "cost"),
    ("workers_woken", "actor workers woken at all while idle", "", "cost"),
    ("idle_cpu_pct_others", "idle CPU, rest of the cluster", "% core", "cost"),
    ("other_procs", "rest of the cluster: processes", "", "cost"),
]


def fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, int):
        return f"{v:,}"
    if v >= 100:
        return f"{v:,.0f}"
    if v >= 10:
        return f"{v:.1f}"
    return f"{v:.3g}" if v else "0"


def targets(big: dict[str, Any]) -> list[str]:
    """The issue's three targets, judged on the large nbcluster point."""
    if "error" in big:
        return [f"nbcluster at {big.get('n', '?')}: {big['error']}"]
    n = big["n"]
    idle_ok = big["idle_cpu_s_workers"] == 0 and big["workers_woken"] == 0
    return [
        f"{n:,} actors answering in {big['create_s']:.1f} s (target <= {TARGET_S:.0f} s): "
        + ("met" if big["create_s"] <= TARGET_S else "NOT MET"),
        f"PSS per idle actor worker {big['pss_mib_median']:.1f} MiB (target <= "
        f"{TARGET_PSS_MIB:.0f}): "
        + ("met" if big["pss_mib_median"] <= TARGET_PSS_MIB else "NOT MET"),
        f"idle actor workers over {big['idle_s']:.0f} s: {big['idle_cpu_s_workers']:.2f} CPU-s, "
        f"{big['workers_woken']} of {n:,} woken (target 0 %, no wake-ups): "
        + ("met" if idle_ok else "NOT MET"),
    ]


def render(points: dict[str, dict[str, Any]], names: dict[str, str]) -> str:
    """The table: nbcluster and Ray at the same size, the ratio, then nbcluster's large size."""
    cols = [k for k in ("nbcluster@small", "ray@small") if k in points]
    both = len(cols) == 2
    head = ["metric", "unit", *(names[k] for k in cols)] + (["×Ray"] if both else [])
    if "nbcluster@big" in points:
        head.append(names["nbcluster@big"])
    rows = [head]
    for key, label, unit, kind in ROWS:
        row = [label, unit, *(fmt(points[k].get(key)) for k in cols)]
        if both:
            nb, ray = points["nbcluster@small"].get(key), points["ray@small"].get(key)
            ratio = ""
            if nb and ray:
                ratio = f"{fmt(nb / ray if kind == 'rate' else ray / nb)}×"
            elif ray and nb == 0:
                ratio = "∞"
            row.append(ratio)
        if "nbcluster@big" in points:
            row.append(fmt(points["nbcluster@big"].get(key)))
        rows.append(row)
    return "\n".join(format_table(rows))


def main(argv: list[str] | None = None) -> int:
    """Run the points, print the table and the issue's targets."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=1000, help="nbcluster's large size (default 1000)")
    p.add_argument("--ray-n", type=int, default=100, help="size run on both (default 100)")
    p.add_argument("--only", default="nbcluster,ray", help="comma-separated: nbcluster,ray")
    p.add_argument("--settle-s", type=float, default=3.0, help="quiet before measuring")
    p.add_argument("--idle-s", type=float, default=10.0, help="idle window (default 10 s)")
    p.add_argument("--quick", action="store_true", help="n=50, ray-n=20, idle 5 s")
    p.add_argument("--json", metavar="PATH", help="also write the figures as JSON")
    p.add_argument("--_point", nargs=3, help=argparse.SUPPRESS)
    ns = p.parse_args(argv)
    if ns._point:
        system, n, out = ns._point
        Path(out).write_text(json.dumps(point(system, int(n), ns.settle_s, ns.idle_s)))
        return 0
    if ns.quick:
        ns.n, ns.ray_n, ns.idle_s = 50, 20, 5.0
    systems = [s.strip() for s in ns.only.split(",") if s.strip()]
    for s in systems:
        if s not in LABELS:
            raise SystemExit(f"unknown system {s!r}; choose from nbcluster,ray")
    workdir = Path(tempfile.mkdtemp(prefix="nbcluster-actorsbench-"))
    timeout = 1800
    points: dict[str, dict[str, Any]] = {}
    names: dict[str, str] = {}
    for system in systems:
        key = f"{system}@small"
        names[key] = f"{LABELS[system]} ({ns.ray_n:,})"
        points[key] = measure(
            system, ns.ray_n, ns.settle_s, ns.idle_s, timeout, workdir / f"{system}.log"
        )
    if "nbcluster" in systems and ns.n != ns.ray_n:
        names["nbcluster@big"] = f"nbcluster ({ns.n:,})"
        points["nbcluster@big"] = measure(
            "nbcluster", ns.n, ns.settle_s, ns.idle_s, timeout, workdir / "nbcluster.log"
        )
    print(render(points, names))
    print()
    print("×Ray = how many times better nbcluster is at the same size in this run (>1: wins).")
    print(
        f"idle window {ns.idle_s:.0f} s after {ns.settle_s:.0f} s of quiet; "
        f"% core = CPU time / window (100 = one core busy); machine: {os.cpu_count()} CPUs, "
        f"Python {platform.python_version()}"
    )
    for key, res in points.items():
        if "error" in res:
            print(f"  ! {names[key]}: {res['error']} (log in {workdir})")
    floor = grpc_floor(ns.settle_s, ns.idle_s)
    print(
        f"floor: an idle Python process holding a grpc.aio server and channel (no nbcluster): "
        f"{floor['wakeups_per_s']:.1f} wake-ups/s, {floor['cpu_pct']:.2f} % core"
    )
    big = points.get("nbcluster@big") or points.get("nbcluster@small")
    if big is not None:
        print("targets (issue 11, nbcluster at its largest size):")
        for line in targets(big):
            print(f"  {line}")
    print(f"logs: {workdir}")
    if ns.json:
        Path(ns.json).write_text(
            json.dumps({"points": points, "names": names, "grpc_floor": floor}, indent=2) + "\n"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
