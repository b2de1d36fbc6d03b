"""nbcluster microbenchmarks, side by side with Ray, Dask and ProcessPoolExecutor in one run.

    python benchmarks/microbench.py                      # every installed system, full sizes
    python benchmarks/microbench.py --quick              # small sizes: a smoke run (CI)
    python benchmarks/microbench.py --only nbcluster,ray --json results.json

Each system runs in its own fresh subprocess (so one cannot leave processes or memory behind
for the next), with 2 CPUs / workers. The table gives nbcluster's figure, each peer's figure
and the ratio "how many times better nbcluster is" (>1 means nbcluster wins: peer/nbcluster for
times, nbcluster/peer for rates and memory), with the DESIGN.md §8 target next to the Ray ratio.
Absolute numbers drift on shared machines; only ratios measured in the same run mean anything.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from _harness import (
    SystemAdapter,
    finish,
    format_table,
    log,
    machine_info,
    new_report,
    read_records,
    run_child,
    start_ray,
    tail,
    versions_line,
)

# Only the standard library (and _harness, which imports only the standard library) is imported
# at module level: the cold-start child re-runs this file, and its import time should be the
# system's, not ours. numpy and psutil are imported lazily.

NUM_CPUS = 2
SYSTEMS = ("nbcluster", "ray", "dask", "processpool")
ALIASES = {"ppe": "processpool", "pool": "processpool", "processpoolexecutor": "processpool"}
LABELS = {"nbcluster": "nbcluster", "ray": "Ray", "dask": "Dask", "processpool": "ProcPool"}


def now() -> float:
    """System-wide monotonic clock: comparable between processes on one Linux host."""
    return time.clock_gettime(time.CLOCK_MONOTONIC)


# --------------------------------------------------------------------------- sizes


@dataclass
class Sizes:
    cold_reps: int = 3
    rtt_n: int = 1000
    async_n: int = 10_000
    put_bytes: int = 100 * 2**20
    small_bytes: int = 1 * 2**20
    put_reps: int = 5
    small_n: int = 10_000
    chain_n: int = 1000
    actor_n: int = 1000
    actor_async_n: int = 10_000
    burst_reps: int = 3  # async bursts (tasks, actor calls): the median rate of this many
    nn_callers: int = 4  # n:n actor calls: this many caller tasks ...
    nn_actors: int = 4  # ... each spreading its calls over this many actors
    nn_calls: int = 10_000  # in total, over all callers
    settle_s: float = 3.0
    budget_s: float = 60.0  # a sequential loop stops early (rate over what ran) past this
    workload_timeout_s: int = 240
    system_timeout_s: int = 1800

    @classmethod
    def quick(cls) -> Sizes:
        return cls(
            cold_reps=1,
            rtt_n=100,
            async_n=1000,
            put_bytes=10 * 2**20,
            small_bytes=2**20,
            put_reps=3,
            small_n=500,
            chain_n=100,
            actor_n=100,
            actor_async_n=1000,
            nn_calls=1000,
            settle_s=1.0,
            budget_s=10.0,
            workload_timeout_s=60,
            system_timeout_s=300,
        )


# --------------------------------------------------------------------------- user code
# Defined at module level so that every system can ship them (by reference or by value).


def tiny(x=None):
    return x


def inc(x):
    return x + 1


def read_array(a):
    """Touch every page of an array argument (one element per 4 KiB)."""
    return float(a[:: max(1, 4096 // a.itemsize)].sum())


class Pinger:
    def ping(self, x=None):
        return x


# Callers of the n:n workload: one task each, spreading its calls over every actor.


def nn_caller_nbcluster(actors, m):
    import nbcluster

    refs = [actors[i % len(actors)].ping.remote(i) for i in range(m)]
    assert nbcluster.get(refs) == list(range(m))
    return m


def nn_caller_ray(actors, m):
    import ray

    refs = [actors[i % len(actors)].ping.remote(i) for i in range(m)]
    assert ray.get(refs) == list(range(m))
    return m


def nn_caller_dask(actors, m):
    futures = [actors[i % len(actors)].ping(i) for i in range(m)]
    assert [f.result() for f in futures] == list(range(m))
    return m


# --------------------------------------------------------------------------- adapters


class NotSupported(Exception):
    """The system has no equivalent of this operation: the table shows n/a."""


class Adapter(SystemAdapter):
    """One system behind the same small interface. Subclasses override what they support."""

    module: str | None = None  # what must be importable (None: only the standard library)

    def start(self, num_cpus: int) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def remote(self, fn: Callable) -> Any:
        raise NotImplementedError

    def submit(self, handle: Any, *args: Any) -> Any:
        raise NotImplementedError

    def get(self, ref: Any) -> Any:
        raise NotImplementedError

    def get_many(self, refs: list) -> list:
        return [self.get(r) for r in refs]

    def put(self, value: Any) -> Any:
        raise NotSupported

    def actor(self, cls: type) -> Any:
        raise NotSupported

    def call(self, actor: Any, method: str, *args: Any) -> Any:
        raise NotSupported

    def get_calls(self, refs: list) -> list:
        return self.get_many(refs)

    def run_callers(self, actors: list, n_callers: int, m: int) -> int:
        """Run ``n_callers`` tasks at once, each making ``m`` calls spread over ``actors``
        (without waiting between calls); return the number of calls made."""
        raise NotSupported

    def extra_pids(self) -> set[int]:
        """Processes of the cluster that are not descendants of the driver (if any)."""
        return set()


class NbclusterAdapter(Adapter):
    name = "nbcluster"
    module = "nbcluster"

    def start(self, num_cpus):
        import nbcluster

        self.nb = nbcluster
        nbcluster.init(num_cpus=num_cpus)

    def stop(self):
        self.nb.shutdown()

    def remote(self, fn):
        return self.nb.remote(fn)

    def submit(self, handle, *args):
        return handle.remote(*args)

    def get(self, ref):
        return self.nb.get(ref)

    def get_many(self, refs):
        return self.nb.get(refs)

    def put(self, value):
        return self.nb.put(value)

    def actor(self, cls):
        try:
            actor_cls = self.nb.remote(cls)
        except (NotImplementedError, TypeError) as e:
            raise NotSupported(f"actors: {e}") from e
        return actor_cls.remote()

    def call(self, actor, method, *args):
        return getattr(actor, method).remote(*args)

    def run_callers(self, actors, n_callers, m):
        # Half a CPU each, so that all callers run at once on the 2 CPUs (as for Ray).
        caller = self.nb.remote(num_cpus=NUM_CPUS / n_callers)(nn_caller_nbcluster)
        return sum(self.nb.get([caller.remote(actors, m) for _ in range(n_callers)]))

    def extra_pids(self):
        pids: set[int] = set()
        with contextlib.suppress(Exception):
            for node in self.nb.nodes():
                items = node.items() if isinstance(node, dict) else vars(node).items()
                for key, value in items:
                    if "pid" in key.lower() and isinstance(value, int) and value > 0:
                        pids.add(value)
        return pids


class RayAdapter(Adapter):
    name = "ray"
    module = "ray"

    def start(self, num_cpus):
        self.ray = start_ray(num_cpus)

    def stop(self):
        self.ray.shutdown()

    def remote(self, fn):
        return self.ray.remote(fn)

    def submit(self, handle, *args):
        return handle.remote(*args)

    def get(self, ref):
        return self.ray.get(ref)

    def get_many(self, refs):
        return self.ray.get(refs)

    def put(self, value):
        return self.ray.put(value)

    def actor(self, cls):
        return self.ray.remote(cls).remote()

    def call(self, actor, method, *args):
        return getattr(actor, method).remote(*args)

    def run_callers(self, actors, n_callers, m):
        caller = self.ray.remote(num_cpus=NUM_CPUS / n_callers)(nn_caller_ray)
        return sum(self.ray.get([caller.remote(actors, m) for _ in range(n_callers)]))


class DaskAdapter(Adapter):
    name = "dask"
    module = "distributed"
    notes = {
        "put": "Dask: put = client.scatter, get = future.result() (TCP, copies)",
        "idle_pss": "Dask: its scheduler runs inside the driver, so it is not counted",
        "actor_nn": "Dask: n:n callers are tasks on 2 single-thread workers, so 2 run at a time",
    }

    def start(self, num_cpus):
        from dask.distributed import Client, LocalCluster

        self.cluster = LocalCluster(
            n_workers=num_cpus,
            threads_per_worker=1,
            processes=True,
            host="127.0.0.1",
            dashboard_address=None,
        )
        self.client = Client(self.cluster)

    def stop(self):
        self.client.close()
        self.cluster.close()

    def remote(self, fn):
        return fn

    def submit(self, handle, *args):
        return self.client.submit(handle, *args, pure=False)

    def get(self, ref):
        return ref.result()

    def get_many(self, refs):
        return self.client.gather(refs)

    def put(self, value):
        # A list so that a tuple is one object, not a collection; hash=False so equal values
        # still make new objects (as put does elsewhere).
        return self.client.scatter([value], hash=False)[0]

    def actor(self, cls):
        return self.client.submit(cls, actor=True).result()

    def call(self, actor, method, *args):
        return getattr(actor, method)(*args)

    def get_calls(self, refs):
        return [r.result() for r in refs]

    def run_callers(self, actors, n_callers, m):
        futures = [
            self.client.submit(nn_caller_dask, actors, m, pure=False) for _ in range(n_callers)
        ]
        return sum(self.client.gather(futures))


class ProcessPoolAdapter(Adapter):
    name = "processpool"
    notes = {"chain": "ProcPool: futures cannot be arguments, so each step waits for the last"}

    def start(self, num_cpus):
        from concurrent.futures import ProcessPoolExecutor

        self.ex = ProcessPoolExecutor(num_cpus)

    def stop(self):
        self.ex.shutdown(wait=True)

    def remote(self, fn):
        return fn

    def submit(self, handle, *args):
        from concurrent.futures import Future

        args = tuple(a.result() if isinstance(a, Future) else a for a in args)
        return self.ex.submit(handle, *args)

    def get(self, ref):
        return ref.result()


ADAPTERS: dict[str, type[Adapter]] = {
    "nbcluster": NbclusterAdapter,
    "ray": RayAdapter,
    "dask": DaskAdapter,
    "processpool": ProcessPoolAdapter,
}


# --------------------------------------------------------------------------- workloads


class WorkloadTimeout(Exception):
    pass


@contextlib.contextmanager
def deadline(seconds: int):
    def _raise(signum, frame):
        raise WorkloadTimeout(f"did not finish within {seconds} s")

    old = signal.signal(signal.SIGALRM, _raise)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def _median_seq(op: Callable[[], Any], n: int, budget_s: float) -> float:
    """Median seconds of ``op`` over ``n`` sequential runs (fewer if the budget runs out)."""
    times = []
    start = time.perf_counter()
    for _ in range(n):
        t = time.perf_counter()
        op()
        times.append(time.perf_counter() - t)
        if time.perf_counter() - start > budget_s:
            break
    return statistics.median(times)


def w_rtt(a: Adapter, s: Sizes) -> float:
    h = a.remote(tiny)
    for _ in range(50):
        a.get(a.submit(h))
    return 1e3 * _median_seq(lambda: a.get(a.submit(h)), s.rtt_n, s.budget_s)


def _median_burst(
    submit_all: Callable[[], Any], get_all: Callable[[Any], Any], n: int, reps: int
) -> float:
    """Calls/s of ``n`` calls submitted without waiting, then all results waited for: the
    median of ``reps`` bursts (one burst swings by a fifth from run to run on 2 CPUs)."""
    rates = []
    for _ in range(reps):
        t = time.perf_counter()
        refs = submit_all()
        out = get_all(refs)
        dt = time.perf_counter() - t
        assert list(out) == list(range(n))
        del refs, out
        rates.append(n / dt)
    return statistics.median(rates)


def w_async(a: Adapter, s: Sizes) -> float:
    h = a.remote(tiny)
    a.get_many([a.submit(h, i) for i in range(200)])
    return _median_burst(
        lambda: [a.submit(h, i) for i in range(s.async_n)], a.get_many, s.async_n, s.burst_reps
    )


def w_put_get(a: Adapter, s: Sizes) -> dict[str, float]:
    import numpy as np

    big = np.ones(s.put_bytes // 8)
    small = np.ones(s.small_bytes // 8)
    ref = a.put(big)  # warm-up: first touch of the store's memory
    assert a.get(ref).nbytes == big.nbytes
    del ref
    put_times = []
    for _ in range(s.put_reps):
        t = time.perf_counter()
        ref = a.put(big)
        put_times.append(time.perf_counter() - t)
        del ref
    out = {"put_GBps": big.nbytes / statistics.median(put_times) / 1e9}
    for key, arr in (("get_big_ms", big), ("get_small_ms", small)):
        ref = a.put(arr)
        a.get(ref)
        times = []
        for _ in range(s.put_reps):
            t = time.perf_counter()
            value = a.get(ref)
            times.append(time.perf_counter() - t)
            assert value.nbytes == arr.nbytes
            del value
        out[key] = 1e3 * statistics.median(times)
        del ref
    return out


def w_put_tasks(a: Adapter, s: Sizes) -> float:
    """put once, then 10 tasks that read the whole array; median ms of ``put_reps`` rounds."""
    import numpy as np

    big = np.ones(s.put_bytes // 8)
    h = a.remote(read_array)
    expect = read_array(big)
    for _ in range(2):  # warm-up: two rounds as measured (each worker maps the store's
        ref = a.put(big)  # memory it reads in: a cost paid once per process, not per round)
        a.get_many([a.submit(h, ref) for _ in range(10)])
        del ref
    times = []
    for _ in range(s.put_reps):
        t = time.perf_counter()
        ref = a.put(big)
        out = a.get_many([a.submit(h, ref) for _ in range(10)])
        times.append(time.perf_counter() - t)
        assert list(out) == [expect] * 10
        del ref, out
    return 1e3 * statistics.median(times)


def w_small_objects(a: Adapter, s: Sizes) -> float:
    for i in range(20):
        a.get(a.put(("obj", i)))
    done = 0
    t = time.perf_counter()
    for i in range(s.small_n):
        assert a.get(a.put(("obj", i)))[1] == i
        done += 1
        if time.perf_counter() - t > s.budget_s:
            break
    return done / (time.perf_counter() - t)


def w_chain(a: Adapter, s: Sizes) -> float:
    h = a.remote(inc)
    a.get(a.submit(h, 0))
    t = time.perf_counter()
    x = a.submit(h, 0)
    for _ in range(s.chain_n - 1):
        x = a.submit(h, x)
    result = a.get(x)
    dt = time.perf_counter() - t
    assert result == s.chain_n, result
    return dt


def w_actor(a: Adapter, s: Sizes) -> dict[str, float]:
    actor = a.actor(Pinger)
    for _ in range(50):
        a.get_calls([a.call(actor, "ping")])
    rtt = _median_seq(lambda: a.get_calls([a.call(actor, "ping")]), s.actor_n, s.budget_s)
    rate = _median_burst(
        lambda: [a.call(actor, "ping", i) for i in range(s.actor_async_n)],
        a.get_calls,
        s.actor_async_n,
        s.burst_reps,
    )
    return {"actor_rtt_ms": 1e3 * rtt, "actor_async": rate}


def w_actor_nn(a: Adapter, s: Sizes) -> float:
    """n:n actor calls: ``nn_callers`` tasks, each calling all ``nn_actors`` actors without
    waiting between calls; total calls/s over all callers (caller start-up included, after
    a warm-up round that starts the callers' workers and connections)."""
    actors = [a.actor(Pinger) for _ in range(s.nn_actors)]
    a.get_calls([a.call(actor, "ping", 0) for actor in actors])
    per_caller = s.nn_calls // s.nn_callers
    a.run_callers(actors, s.nn_callers, max(per_caller // 10, s.nn_actors))  # warm-up
    t = time.perf_counter()
    done = a.run_callers(actors, s.nn_callers, per_caller)
    dt = time.perf_counter() - t
    assert done == per_caller * s.nn_callers, done
    return done / dt


def cluster_memory(a: Adapter) -> dict[str, float]:
    """PSS summed over the driver's descendants (plus any pids the system names): MiB, count."""
    import psutil

    me = psutil.Process()
    procs = {p.pid: p for p in me.children(recursive=True)}
    for pid in a.extra_pids() - {me.pid} - set(procs):
        with contextlib.suppress(psutil.Error):
            procs[pid] = psutil.Process(pid)
    pss = 0
    count = 0
    for p in procs.values():
        try:
            pss += p.memory_full_info().pss
            count += 1
        except psutil.Error:
            pass
    return {"idle_pss_mib": pss / 2**20, "idle_procs": count}


# --------------------------------------------------------------------------- child processes


def _emit(path: str, record: dict) -> None:
    with open(path, "a") as f:
        f.write(json.dumps(record) + "\n")


WORKLOADS_ENV = "NBCLUSTER_BENCH_WORKLOADS"


def _selected(key: str) -> bool:
    """True when ``--workloads`` is unset or names ``key``."""
    chosen = os.environ.get(WORKLOADS_ENV, "")
    return not chosen or key in {w.strip() for w in chosen.split(",")}


def child_cold(system: str, out: str) -> None:
    a = ADAPTERS[system]()
    a.start(NUM_CPUS)
    h = a.remote(tiny)
    assert a.get(a.submit(h, 1)) == 1
    _emit(out, {"first_result_at": now()})
    a.stop()


def child_suite(system: str, out: str, s: Sizes) -> None:
    a = ADAPTERS[system]()

    def run(key: str, fn: Callable[[], Any]) -> None:
        if not _selected(key):
            return
        log(f"[{system}] {key} ...")
        try:
            with deadline(s.workload_timeout_s):
                value = fn()
        except NotSupported as e:
            _emit(out, {"key": key, "na": str(e) or "not supported"})
            return
        except Exception as e:  # a broken workload must not hide the others
            _emit(out, {"key": key, "error": f"{type(e).__name__}: {e}"[:300]})
            log(f"[{system}] {key} failed: {type(e).__name__}: {e}")
            return
        values = value if isinstance(value, dict) else {key: value}
        for k, v in values.items():
            _emit(out, {"key": k, "value": v})
        log(f"[{system}] {key}: {values}")

    with deadline(s.workload_timeout_s):
        a.start(NUM_CPUS)
        h = a.remote(tiny)
        a.get(a.submit(h, 1))
    time.sleep(s.settle_s)
    run("idle", lambda: cluster_memory(a))
    run("rtt_ms", lambda: w_rtt(a, s))
    run("async_tasks", lambda: w_async(a, s))
    run("putget", lambda: w_put_get(a, s))
    run("put_tasks_ms", lambda: w_put_tasks(a, s))
    run("small_objects", lambda: w_small_objects(a, s))
    run("chain_s", lambda: w_chain(a, s))
    run("actor", lambda: w_actor(a, s))
    run("actor_nn", lambda: w_actor_nn(a, s))
    with deadline(s.workload_timeout_s):
        t = time.perf_counter()
        a.stop()  # (returns once the system's processes it waits for have ended)
        if _selected("stop_s"):
            _emit(out, {"key": "stop_s", "value": time.perf_counter() - t})


# --------------------------------------------------------------------------- parent


def measure_memcpy(nbytes: int, reps: int = 10) -> float:
    import numpy as np

    src = np.ones(nbytes // 8)
    dst = np.empty_like(src)
    np.copyto(dst, src)
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        np.copyto(dst, src)
        times.append(time.perf_counter() - t)
    return src.nbytes / statistics.median(times) / 1e9


def measure_system(system: str, s: Sizes, workdir: Path, quick: bool) -> dict:
    entry: dict[str, Any] = {"results": {}, "errors": {}, "na": {}}
    try:
        entry["version"] = ADAPTERS[system]().version()
    except Exception as e:  # ImportError, or a half-written package
        entry["status"] = "not installed"
        log(f"[{system}] not installed ({type(e).__name__}: {e})")
        return entry
    entry["status"] = "ok"
    logfile = workdir / f"{system}.log"
    entry["log"] = str(logfile)
    flag = ["--quick"] if quick else []

    colds = []
    for i in range(s.cold_reps if _selected("cold_start_s") else 0):
        out = workdir / f"{system}-cold-{i}.jsonl"
        log(f"[{system}] cold start {i + 1}/{s.cold_reps} ...")
        run = run_child(
            __file__, ["--_cold", system, "--_out", str(out), *flag], timeout_s=180, logfile=logfile
        )
        recs = read_records(out)
        if recs:
            colds.append(recs[0]["first_result_at"] - run.started)
            log(f"[{system}] cold start: {colds[-1]:.3f} s")
        else:
            rc = run.returncode
            entry["errors"]["cold_start_s"] = f"child exited {rc}; log: {logfile}"
            log(f"[{system}] cold start failed (exit {rc}):\n{tail(logfile)}")
            break
    if colds:
        entry["results"]["cold_start_s"] = statistics.median(colds)

    out = workdir / f"{system}-suite.jsonl"
    run = run_child(
        __file__,
        ["--_suite", system, "--_out", str(out), *flag],
        timeout_s=s.system_timeout_s,
        logfile=logfile,
    )
    for rec in read_records(out):
        if "value" in rec:
            entry["results"][rec["key"]] = rec["value"]
        elif "na" in rec:
            entry["na"][rec["key"]] = rec["na"]
        else:
            entry["errors"][rec["key"]] = rec["error"]
    if run.returncode != 0:
        entry["errors"]["suite"] = f"child {run.why}; log: {logfile}"
        log(f"[{system}] suite {run.why}:\n{tail(logfile)}")
    return entry


# --------------------------------------------------------------------------- report

HIGHER, LOWER = "higher", "lower"


@dataclass
class Row:
    key: str
    label: str
    unit: str
    better: str
    target: float | None = None  # the §8 factor against Ray (>1 = nbcluster better)
    target_text: str = ""
    group: str = ""  # keys of a workload whose failure shows on this row


def rows_for(s: Sizes) -> list[Row]:
    mb = s.put_bytes // 2**20
    smb = s.small_bytes // 2**20
    return [
        Row("cold_start_s", "start to first result", "s", LOWER, 7, "≥7× (≤0.5 s)", "cold_start_s"),
        Row("rtt_ms", "tiny-task round trip", "ms", LOWER, 3, "≥3×", "rtt_ms"),
        Row("async_tasks", f"async tiny tasks ({s.async_n:,})", "/s", HIGHER, 4, "≥4×"),
        Row("actor_rtt_ms", "actor call round trip", "ms", LOWER, 2, "≥2×", "actor"),
        Row(
            "actor_async",
            f"async actor calls ({s.actor_async_n:,})",
            "/s",
            HIGHER,
            3,
            "≥3×",
            "actor",
        ),
        Row(
            "actor_nn",
            f"n:n actor calls ({s.nn_callers}×{s.nn_actors}, {s.nn_calls:,})",
            "/s",
            HIGHER,
        ),
        Row("put_GBps", f"put of {mb} MB", "GB/s", HIGHER, None, "≥60% memcpy", "putget"),
        Row("get_big_ms", f"get of {mb} MB", "ms", LOWER, None, "zero-copy", "putget"),
        Row("get_small_ms", f"get of {smb} MB", "ms", LOWER, None, "", "putget"),
        Row("put_tasks_ms", f"put {mb} MB + 10 tasks read it", "ms", LOWER, 2, "≥2×"),
        Row("small_objects", f"small put+get ({s.small_n:,})", "/s", HIGHER, 4, "≥4×"),
        Row("chain_s", f"chain of {s.chain_n:,} tasks", "s", LOWER, 3, "≥3×"),
        Row("idle_pss_mib", "idle memory (PSS)", "MiB", LOWER, 3, "≤⅓", "idle"),
        Row("idle_procs", "idle processes", "", LOWER, None, "", "idle"),
        Row("stop_s", "shutdown after the suite", "s", LOWER),
    ]


def fmt(v: float | None) -> str:
    if v is None:
        return ""
    if isinstance(v, int):
        return f"{v:,}"
    if v >= 1000:
        return f"{v:,.0f}"
    if v >= 100:
        return f"{v:.0f}"
    if v >= 10:
        return f"{v:.1f}"
    if v >= 1:
        return f"{v:.2f}"
    return f"{v:.3f}"


def advantage(row: Row, nb: float | None, peer: float | None) -> float | None:
    """How many times better nbcluster is than the peer (>1: nbcluster wins)."""
    if nb is None or peer is None or nb <= 0 or peer <= 0:
        return None
    return peer / nb if row.better == LOWER else nb / peer


def cell(entry: dict, row: Row) -> tuple[float | None, str]:
    """(value, text) of one system for one row: a figure, n/a, err, or not installed."""
    if entry.get("status") != "ok":
        return None, "-"
    value = entry["results"].get(row.key)
    if value is not None:
        return value, fmt(value)
    keys = {row.key, row.group} - {""}
    if any(k in entry["na"] for k in keys):
        return None, "n/a"
    if any(k in entry["errors"] for k in keys) or "suite" in entry["errors"]:
        return None, "err"
    return None, "n/a"


def target_status(row: Row, report: dict) -> str:
    nb = report["systems"].get("nbcluster", {})
    ray = report["systems"].get("ray", {})
    nbv = nb.get("results", {}).get(row.key) if nb.get("status") == "ok" else None
    if not row.target_text:
        return ""
    if nbv is None:
        return "no data"
    if row.key == "put_GBps":
        return "met" if nbv >= 0.6 * report["memcpy_GBps"] else "not met"
    if row.key == "get_big_ms":
        small = nb["results"].get("get_small_ms")
        if small is None:
            return "no data"
        # a copy grows with size; a mapping does not (allow noise: within 3× of the small get)
        return "met" if nbv <= 3 * max(small, 0.05) else "not met"
    rayv = ray.get("results", {}).get(row.key) if ray.get("status") == "ok" else None
    adv = advantage(row, nbv, rayv)
    if row.key == "cold_start_s":  # the ratio and the absolute figure (Ray's start-up varies)
        if adv is None:
            return "met (abs)" if nbv <= 0.5 else "not met (abs)"
        return "met" if adv >= row.target and nbv <= 0.5 else "not met"
    if adv is None:
        return "no Ray"
    return "met" if adv >= row.target else "not met"


def render(report: dict, s: Sizes) -> str:
    systems = report["systems"]
    peers = [p for p in ("ray", "dask", "processpool") if p in systems]
    head = ["workload", "unit", "nbcluster"]
    for p in peers:
        head += [LABELS[p], f"×{LABELS[p]}"]
        if p == "ray":
            head += ["target", "§8"]
    table = [head]
    nbe = systems.get("nbcluster", {"status": "skipped"})
    for row in rows_for(s):
        nbv, nbt = cell(nbe, row)
        line = [row.label, row.unit, nbt]
        for p in peers:
            pv, pt = cell(systems[p], row)
            adv = advantage(row, nbv, pv)
            line += [pt, f"{fmt(adv)}×" if adv is not None else ""]
            if p == "ray":
                line += [row.target_text, target_status(row, report)]
        table.append(line)
    memcpy = [f"memcpy of {s.put_bytes // 2**20} MB", "GB/s", fmt(report["memcpy_GBps"])]
    table.append(memcpy + [""] * (len(head) - len(memcpy)))

    out = format_table(table)

    out.append("")
    out.append(
        "×Peer = how many times better nbcluster is (>1: nbcluster wins); "
        "target = DESIGN.md §8, against Ray in this run."
    )
    out.append(versions_line(systems, LABELS))
    m = report["machine"]
    out.append(
        f"machine: {m['cpus']} CPUs, {m['cpu']}, Python {m['python']}, "
        f"{NUM_CPUS} workers each" + (", --quick sizes" if report["quick"] else "")
    )
    notes = []
    for k, v in systems.items():
        if v.get("status") != "ok":
            continue
        notes += ADAPTERS[k].notes.values()
        for key, msg in v["errors"].items():
            notes.append(f"{LABELS[k]} {key} failed: {msg}")
        for key, msg in v["na"].items():
            if msg != "not supported":
                notes.append(f"{LABELS[k]} {key}: {msg}")
    for note in notes:
        out.append(f"  - {note}")
    return "\n".join(out)


def machine_facts() -> dict:
    """``_harness.machine_info`` with the platform, and the time as YYYY-MM-DD HH:MM:SS."""
    info = machine_info()
    del info["time"]  # the keys in the order they always had
    info["platform"] = platform.platform()
    info["time"] = time.strftime("%Y-%m-%d %H:%M:%S")
    return info


def parse_only(text: str | None) -> list[str]:
    if not text:
        return list(SYSTEMS)
    names = []
    for raw in text.split(","):
        name = ALIASES.get(raw.strip().lower(), raw.strip().lower())
        if name not in SYSTEMS:
            raise SystemExit(f"unknown system {raw!r}; choose from {', '.join(SYSTEMS)}")
        names.append(name)
    return names


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, for a smoke run")
    parser.add_argument("--only", help="comma-separated: nbcluster,ray,dask,processpool")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    parser.add_argument(
        "--workloads",
        help="comma-separated subset, e.g. rtt_ms,actor (cold_start_s, idle, rtt_ms, async_tasks, "
        "putget, put_tasks_ms, small_objects, chain_s, actor, actor_nn, stop_s); default: all",
    )
    parser.add_argument("--_cold", help=argparse.SUPPRESS)
    parser.add_argument("--_suite", help=argparse.SUPPRESS)
    parser.add_argument("--_out", help=argparse.SUPPRESS)
    ns = parser.parse_args(argv)
    sizes = Sizes.quick() if ns.quick else Sizes()
    if ns.workloads:
        os.environ[WORKLOADS_ENV] = ns.workloads  # children inherit it

    if ns._cold:
        child_cold(ns._cold, ns._out)
        return 0
    if ns._suite:
        child_suite(ns._suite, ns._out, sizes)
        return 0

    systems = parse_only(ns.only)
    report = new_report(ns.quick, sizes, machine_facts())
    report["memcpy_GBps"] = measure_memcpy(sizes.put_bytes)
    log(f"memcpy of {sizes.put_bytes // 2**20} MB: {report['memcpy_GBps']:.2f} GB/s")
    workdir = Path(tempfile.mkdtemp(prefix="nbcluster-bench-"))
    for system in systems:
        report["systems"][system] = measure_system(system, sizes, workdir, ns.quick)
    finish(render(report, sizes), workdir, report, ns.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
