"""Jobs and runtime_env: nbcluster beside Ray, in one run (issue 17, item 6).

    python benchmarks/jobs_bench.py                  # every installed system, full sizes
    python benchmarks/jobs_bench.py --quick          # small sizes: a smoke run
    python benchmarks/jobs_bench.py --only nbcluster --json jobs.json

Each system runs in its own fresh subprocess (its own process group, ended afterwards),
with a 2-CPU cluster on this host: nbcluster's ``LocalCluster``; Ray's ``ray start --head
--block`` with the dashboard (job submission needs it) on free loopback ports, ended by
signalling that process (never ``ray stop``, which would end every Ray on the machine).

Workloads (medians of several runs after a warm-up):

- submit → RUNNING, submit → SUCCEEDED: ``submit_job(entrypoint="echo hello")``, polling the
  status every 5 ms (targets: RUNNING ≤ 0.5 s; SUCCEEDED ≥ 5× faster than Ray).
- task round trip, plain and with a cached ``working_dir`` (target: ≤ 10 % more).
- a new worker's start, plain and in a cached ``pip`` environment: a task whose env_vars
  are new each time needs a new worker (target: the pip env adds ≤ 100 ms).
- a cold ``pip`` environment (``termcolor`` from the machine's local package index when pip
  has one, so both systems install offline): first task, fresh caches.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shutil
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

from _harness import SystemAdapter, format_table, free_port, record_workload, run_system

NUM_CPUS = 2
SYSTEMS = ("nbcluster", "ray")
LABELS = {"nbcluster": "nbcluster", "ray": "Ray"}
ENTRYPOINT = "echo hello"
PIP_PACKAGE = "termcolor"


@dataclass
class Sizes:
    jobs: int = 10
    tasks: int = 300
    workers: int = 6
    system_timeout_s: int = 1200

    @classmethod
    def quick(cls) -> Sizes:
        return cls(jobs=3, tasks=50, workers=2, system_timeout_s=600)


def local_index() -> str | None:
    """The first file:// index of pip's configuration (so installs stay offline)."""
    try:
        out = subprocess.run(
            [sys.executable, "-m", "pip", "config", "list"],
            capture_output=True,
            text=True,
            timeout=60,
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    for line in out.splitlines():
        if "index-url" in line:
            for url in line.split("=", 1)[1].strip("'\" ").split():
                if url.startswith("file://"):
                    return url
    return None


def pip_spec() -> dict[str, Any]:
    idx = local_index()
    if idx is None:
        return {"pip": [PIP_PACKAGE]}
    return {"pip": {"packages": [PIP_PACKAGE], "pip_install_options": ["--index-url", idx]}}


# --------------------------------------------------------------------------- adapters


class Adapter(SystemAdapter):
    # jobs
    def submit(self, entrypoint: str) -> str: ...
    def status(self, sid: str) -> str: ...
    # tasks
    def remote(self, fn: Callable[..., Any], runtime_env: dict[str, Any] | None) -> Any: ...
    def get(self, ref: Any) -> Any: ...


class NbclusterAdapter(Adapter):
    name = module = "nbcluster"

    def start(self, cache: str) -> None:
        os.environ["NBCLUSTER_RUNTIME_ENV_DIR"] = cache
        import nbcluster
        from nbcluster.job_submission import JobSubmissionClient

        self.nb = nbcluster
        self.cluster = nbcluster.LocalCluster(num_cpus=NUM_CPUS).start()
        self.jobs = JobSubmissionClient(self.cluster.address)
        nbcluster.init(address=self.cluster.address)

    def stop(self) -> None:
        self.nb.shutdown()
        self.jobs.close()
        self.cluster.stop()

    def submit(self, entrypoint: str) -> str:
        return self.jobs.submit_job(entrypoint=entrypoint)

    def status(self, sid: str) -> str:
        return self.jobs.get_job_status(sid).value

    def remote(self, fn, runtime_env):
        rf = self.nb.remote(fn)
        return rf.options(runtime_env=runtime_env) if runtime_env else rf

    def get(self, ref):
        return self.nb.get(ref)


class RayAdapter(Adapter):
    name = module = "ray"

    def start(self, cache: str) -> None:
        os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
        os.environ["RAY_AUTH_MODE"] = "disabled"
        os.environ.setdefault("RAY_raylet_start_wait_time_s", "300")  # slow, busy machines
        self.tmp = tempfile.mkdtemp(prefix="rayjobs-", dir="/tmp")
        dash = free_port()
        ray_bin = shutil.which("ray") or str(Path(sys.executable).parent / "ray")
        ports = {
            "--port": free_port(),
            "--dashboard-port": dash,
            "--dashboard-agent-listen-port": free_port(),
            "--dashboard-agent-grpc-port": free_port(),
            "--runtime-env-agent-port": free_port(),
            "--metrics-export-port": free_port(),
            "--node-manager-port": free_port(),
            "--object-manager-port": free_port(),
        }
        cmd = [ray_bin, "start", "--head", "--block", f"--num-cpus={NUM_CPUS}"]
        cmd += ["--include-dashboard=true", "--dashboard-host=127.0.0.1"]
        cmd += ["--node-ip-address=127.0.0.1", f"--temp-dir={self.tmp}"]
        cmd += [f"{k}={v}" for k, v in ports.items()]
        self.head = subprocess.Popen(
            cmd, stdin=subprocess.DEVNULL, stdout=sys.stderr, stderr=sys.stderr
        )
        import ray
        from ray.job_submission import JobSubmissionClient

        self.ray = ray
        deadline = time.monotonic() + 600
        while True:  # the head, then its dashboard, then the job agent come up
            try:
                self.jobs = JobSubmissionClient(f"http://127.0.0.1:{dash}")
                sid = self.jobs.submit_job(entrypoint="true")
                break
            except Exception as e:  # noqa: BLE001 - not up yet
                if time.monotonic() > deadline or self.head.poll() is not None:
                    raise RuntimeError(f"Ray's job server did not come up: {e}") from None
                time.sleep(1.0)
        while not self.jobs.get_job_status(sid).is_terminal():
            time.sleep(0.1)
        ray.init(address=f"127.0.0.1:{ports['--port']}")

    def stop(self) -> None:
        with contextlib.suppress(Exception):
            self.ray.shutdown()
        self.head.send_signal(signal.SIGTERM)  # `ray start --block` ends its own processes
        try:
            self.head.wait(120)
        except subprocess.TimeoutExpired:
            self.head.kill()
            self.head.wait(10)

    def submit(self, entrypoint: str) -> str:
        return self.jobs.submit_job(entrypoint=entrypoint)

    def status(self, sid: str) -> str:
        return str(self.jobs.get_job_status(sid).value)

    def remote(self, fn, runtime_env):
        rf = self.ray.remote(fn)
        return rf.options(runtime_env=runtime_env) if runtime_env else rf

    def get(self, ref):
        return self.ray.get(ref)


ADAPTERS: dict[str, type[Adapter]] = {"nbcluster": NbclusterAdapter, "ray": RayAdapter}


# --------------------------------------------------------------------------- workloads


def tiny() -> int:
    return 1


def pid_of() -> int:
    return os.getpid()


def w_jobs(a: Any, s: Sizes) -> dict[str, float]:
    running, done = [], []
    for i in range(s.jobs + 1):  # the first one is a warm-up
        t = time.perf_counter()
        sid = a.submit(ENTRYPOINT)
        t_run = None
        while True:
            st = a.status(sid)
            if t_run is None and st != "PENDING":
                t_run = time.perf_counter() - t
            if st in ("SUCCEEDED", "FAILED", "STOPPED"):
                break
            time.sleep(0.005)
        if st != "SUCCEEDED":
            raise RuntimeError(f"the trivial job ended {st}")
        if i:
            running.append(t_run)
            done.append(time.perf_counter() - t)
    return {"job_running": statistics.median(running), "job_succeeded": statistics.median(done)}


def w_round_trips(a: Any, s: Sizes, runtime_env: dict[str, Any]) -> dict[str, float]:
    """Plain and in-env round trips, interleaved (a busy machine drifts; pairs do not)."""
    plain, env = a.remote(tiny, None), a.remote(tiny, runtime_env)
    for _ in range(20):
        a.get(plain.remote())
        a.get(env.remote())
    times: dict[str, list[float]] = {"rt_plain": [], "rt_wd": []}
    for _ in range(s.tasks):
        for key, f in (("rt_plain", plain), ("rt_wd", env)):
            t = time.perf_counter()
            a.get(f.remote())
            times[key].append(time.perf_counter() - t)
    return {k: statistics.median(v) for k, v in times.items()}


def w_worker_start(a: Any, s: Sizes, base: dict[str, Any], tag: str) -> float:
    times = []
    for i in range(s.workers):
        env = {**base, "env_vars": {"BENCH_NEW_WORKER": f"{tag}{i}-{time.time_ns()}"}}
        f = a.remote(pid_of, env)
        time.sleep(1.0)  # idle leases go back: the new worker waits for nothing else
        t = time.perf_counter()
        a.get(f.remote())
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def child(system: str, out: str, s: Sizes) -> None:
    a = ADAPTERS[system]()
    cache = tempfile.mkdtemp(prefix=f"{system}-envcache-")
    a.start(cache)
    wd = Path(tempfile.mkdtemp(prefix="bench-wd-"))
    (wd / "helper.py").write_text("X = 1\n")
    pip = pip_spec()

    def run(key: str, fn: Callable[[], Any]) -> None:
        record_workload(system, out, key, fn, expand=True)

    run("jobs", lambda: w_jobs(a, s))
    run("round_trips", lambda: w_round_trips(a, s, {"working_dir": str(wd)}))

    def cold() -> float:
        f = a.remote(pid_of, pip)
        t = time.perf_counter()
        a.get(f.remote())
        return time.perf_counter() - t

    run("pip_cold", cold)
    run("start_plain", lambda: w_worker_start(a, s, {}, "p"))
    run("start_pip", lambda: w_worker_start(a, s, pip, "q"))
    a.stop()
    shutil.rmtree(cache, ignore_errors=True)


# --------------------------------------------------------------------------- parent


def measure(system: str, s: Sizes, workdir: Path, quick: bool) -> dict[str, Any]:
    """One system's entry of the report, from a fresh child (see ``_harness.run_system``)."""
    return run_system(
        __file__,
        system,
        ADAPTERS[system]().version,
        workdir=workdir,
        timeout_s=s.system_timeout_s,
        flags=["--quick"] if quick else [],
        grace_s=15,
    )


ROWS = [
    ("job_running", "submit → RUNNING (echo hello)", "s", "≤ 0.5 s"),
    ("job_succeeded", "submit → SUCCEEDED (echo hello)", "s", "≥ 5× Ray"),
    ("rt_plain", "task round trip", "ms", ""),
    ("rt_wd", "task round trip, cached working_dir", "ms", "≤ 1.10× plain"),
    ("start_plain", "new worker's first task", "ms", ""),
    ("start_pip", "new worker's first task, cached pip env", "ms", "≤ plain + 100 ms"),
    ("pip_cold", f"cold pip env ({PIP_PACKAGE}): first task", "s", "beside Ray"),
]


def render(report: dict[str, Any]) -> str:
    systems = report["systems"]
    res = {k: v.get("results", {}) for k, v in systems.items()}
    head = ["workload", "unit", "nbcluster", "Ray", "×Ray", "target", "met"]
    table = [head]
    nb = res.get("nbcluster", {})
    for key, label, unit, target in ROWS:
        scale = 1000.0 if unit == "ms" else 1.0
        cells, vals = [], {}
        for name in SYSTEMS:
            v = res.get(name, {}).get(key)
            vals[name] = v
            status = systems.get(name, {}).get("status")
            cells.append("-" if status != "ok" else ("err" if v is None else f"{v * scale:.3g}"))
        ratio = (
            f"{vals['ray'] / vals['nbcluster']:.2g}×" if vals["nbcluster"] and vals["ray"] else ""
        )
        met = ""
        v = nb.get(key)
        if v is not None:
            if key == "job_running":
                met = "yes" if v <= 0.5 else "no"
            elif key == "job_succeeded" and vals["ray"]:
                met = "yes" if vals["ray"] / v >= 5 else "no"
            elif key == "rt_wd" and nb.get("rt_plain"):
                met = "yes" if v <= 1.10 * nb["rt_plain"] else "no"
            elif key == "start_pip" and nb.get("start_plain") is not None:
                met = "yes" if v - nb["start_plain"] <= 0.100 else "no"
        table.append([label, unit, *cells, ratio, target, met])
    lines = format_table(table, right=slice(2, 5))
    lines.append("")
    lines.append(
        "×Ray = Ray's time / nbcluster's time, measured in this run (>1: nbcluster is faster)."
    )
    for name, v in systems.items():
        lines.append(f"{LABELS[name]}: {v.get('version', '')} ({v['status']})")
        for key, msg in v.get("errors", {}).items():
            lines.append(f"  - {key} failed: {msg}")
    m = report["machine"]
    lines.append(
        f"machine: {m['cpus']} CPUs, Python {m['python']}"
        + (", --quick" if report["quick"] else "")
    )
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="small sizes: a smoke run")
    p.add_argument("--only", default=",".join(SYSTEMS), help="comma-separated systems")
    p.add_argument("--json", default="", help="also write the figures here")
    p.add_argument("--_child", default="", help=argparse.SUPPRESS)
    p.add_argument("--_out", default="", help=argparse.SUPPRESS)
    args = p.parse_args()
    s = Sizes.quick() if args.quick else Sizes()
    if args._child:
        child(args._child, args._out, s)
        return
    workdir = Path(tempfile.mkdtemp(prefix="jobs-bench-"))
    report: dict[str, Any] = {
        "quick": args.quick,
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "systems": {},
    }
    for system in [x for x in args.only.split(",") if x]:
        if system not in ADAPTERS:
            raise SystemExit(f"unknown system {system!r}; choose from {', '.join(SYSTEMS)}")
        report["systems"][system] = measure(system, s, workdir, args.quick)
    print(render(report))
    print(f"\nlogs: {workdir}")
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
