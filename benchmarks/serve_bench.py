"""Serve: nbcluster.serve beside Ray Serve, in one run (issue 18, item 5).

    python benchmarks/serve_bench.py                 # every installed system, full sizes
    python benchmarks/serve_bench.py --quick         # small sizes: a smoke run
    python benchmarks/serve_bench.py --load          # also the big load test (20,000 requests)
    python benchmarks/serve_bench.py --only nbcluster --json serve.json

Each system runs in its own fresh subprocess on a 2-CPU single-node cluster, with the same
application: one no-op deployment (``async def __call__(self, request): return "ok"``),
one replica with ``num_cpus=0.5`` and ``max_ongoing_requests=100``, served on a free port
of 127.0.0.1. Workloads, in order:

- **first answer**: from calling ``serve.run`` (the cluster is up, Serve is not) to the
  first HTTP request answered 200; seconds.
- **HTTP, 1 client**: sequential GETs on one keep-alive connection; p50/p99 latency and
  requests/s.
- **HTTP, 32 clients**: 32 keep-alive connections from 2 client processes (raw asyncio
  sockets: ``nbcluster/serve/_loadgen.py``); requests/s and p50/p99.
- **handle, sequential**: ``handle.remote().result()`` in a loop; p50 latency.
- **handle, concurrent**: 1,000 calls submitted, then all results; calls/s.
- **rolling redeploy**: ``serve.run`` of a changed class while 8 connections send
  requests; seconds until it returns, and how many requests failed (must be 0).
- **load** (``--load``): 20,000 requests from 32 connections; every answer counted, and
  the RSS of the proxy and replica processes before and after (flat memory), and of every
  process of the run (nbcluster's head keeps a bounded ring of 100,000 task events, one
  per request, so its memory grows until the ring is full).

The table gives the figures and the ratio "how many times better nbcluster is" (Ray's
time ÷ nbcluster's, nbcluster's rate ÷ Ray's; >1: nbcluster wins), with the issue's
targets: ≥ 3× Ray's requests/s, ≤ ⅓ of its p50, first answer ≤ 1 s and ≥ 5× faster,
handle p50 ≤ 1 ms, HTTP p50 ≤ 2 ms, redeploy ≤ 1 s with no failed request.
"""

from __future__ import annotations

import contextlib
import statistics
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from _harness import (
    SystemAdapter,
    bench_parser,
    finish,
    fmt,
    format_table,
    free_port,
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
OPTIONS = {"ray_actor_options": {"num_cpus": 0.5}, "max_ongoing_requests": 100}


@dataclass
class Sizes:
    http_seq: int = 2000
    http_conc: int = 20000
    handle_seq: int = 2000
    handle_conc: int = 1000
    load: int = 20000
    system_timeout_s: int = 900

    @classmethod
    def quick(cls) -> Sizes:
        return cls(
            http_seq=300,
            http_conc=3000,
            handle_seq=300,
            handle_conc=300,
            load=4000,
            system_timeout_s=300,
        )


# --------------------------------------------------------------------------- adapters


class Adapter(SystemAdapter):
    def init(self) -> None:
        raise NotImplementedError

    def serve_module(self) -> Any:
        raise NotImplementedError

    def start_serve(self, port: int) -> None:
        raise NotImplementedError

    def shutdown(self) -> None:
        raise NotImplementedError


class NbclusterAdapter(Adapter):
    name = "nbcluster"
    module = "nbcluster"

    def init(self) -> None:
        import nbcluster

        self.nb = nbcluster
        nbcluster.init(num_cpus=NUM_CPUS)

    def serve_module(self) -> Any:
        from nbcluster import serve

        return serve

    def start_serve(self, port: int) -> None:
        self.serve_module().start(http_options={"host": "127.0.0.1", "port": port})

    def run_kwargs(self) -> dict[str, Any]:
        return {"_display": False}

    def serving_pids(self) -> list[int]:
        st = self.serve_module().status()
        replicas = st.applications["default"].deployments["NoOp"].replicas
        return [*st.proxy_pids.values(), *(r.pid for r in replicas if r.pid)]

    def shutdown(self) -> None:
        self.serve_module().shutdown()
        self.nb.shutdown()


class RayAdapter(Adapter):
    name = "ray"
    module = "ray"

    def init(self) -> None:
        self.ray = start_ray(NUM_CPUS)

    def serve_module(self) -> Any:
        from ray import serve

        return serve

    def start_serve(self, port: int) -> None:
        self.serve_module().start(http_options={"host": "127.0.0.1", "port": port})

    def run_kwargs(self) -> dict[str, Any]:
        return {}

    def serving_pids(self) -> list[int]:
        from ray.util.state import list_actors

        actors = list_actors(filters=[("state", "=", "ALIVE")], limit=1000)
        return [
            a.pid
            for a in actors
            if a.pid and a.class_name and ("Proxy" in a.class_name or "NoOp" in a.class_name)
        ]

    def shutdown(self) -> None:
        self.serve_module().shutdown()
        self.ray.shutdown()


ADAPTERS: dict[str, type[Adapter]] = {"nbcluster": NbclusterAdapter, "ray": RayAdapter}


# --------------------------------------------------------------------------- workloads


def make_app(serve: Any, version: str) -> Any:
    @serve.deployment(name="NoOp", **OPTIONS)
    class NoOp:
        async def __call__(self, request: Any = None) -> str:
            return version

    return NoOp.bind()


def http_get_until_ok(client: Any, url: str, timeout: float = 120.0) -> None:
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError):
            if client.get(url, timeout=5).status_code == 200:
                return
        time.sleep(0.002)
    raise TimeoutError(f"{url} never answered 200")


def pct(values: list[float], q: float) -> float:
    v = sorted(values)
    return v[min(len(v) - 1, int(q * (len(v) - 1) + 0.5))] * 1e3


def serving_rss(system: str) -> int:
    """RSS of every process of the run except this driver (the serving processes)."""
    import psutil

    me = psutil.Process()
    total = 0
    for p in me.children(recursive=True):
        with contextlib.suppress(psutil.Error):
            total += p.memory_info().rss
    return total


def child(system: str, out: str, s: Sizes, load: bool) -> None:
    import httpx  # imported before any timing

    from nbcluster.serve._loadgen import run_load

    a = ADAPTERS[system]()
    a.init()
    serve = a.serve_module()
    port = free_port()
    url = f"http://127.0.0.1:{port}/"
    handle_box: dict[str, Any] = {}

    def record(key: str, fn: Callable[[], dict[str, float]]) -> None:
        record_workload(system, out, key, fn, value_field="values")

    def first_answer() -> dict[str, float]:
        app = make_app(serve, "v1")
        client = httpx.Client()
        time.sleep(2)  # the cluster's start-up is not part of this figure
        t = time.perf_counter()
        a.start_serve(port)
        started = time.perf_counter()
        handle_box["h"] = serve.run(app, **a.run_kwargs())
        ran = time.perf_counter()
        http_get_until_ok(client, url)
        done = time.perf_counter()
        client.close()
        return {"s": done - t, "start_s": started - t, "run_s": ran - started, "get_s": done - ran}

    def http_seq() -> dict[str, float]:
        run_load(url, 200, 1)  # warm-up
        r = run_load(url, s.http_seq, 1, timeout_s=120)
        assert r.statuses == {200: s.http_seq}, r.statuses
        return {
            "rps": r.requests_per_s,
            "p50_ms": r.percentile_ms(0.5),
            "p99_ms": r.percentile_ms(0.99),
        }

    def http_conc() -> dict[str, float]:
        run_load(url, 1000, 32, processes=2)  # warm-up
        r = run_load(url, s.http_conc, 32, processes=2, timeout_s=300)
        assert r.answered == s.http_conc and r.errors == 0, (r.statuses, r.errors)
        return {
            "rps": r.requests_per_s,
            "p50_ms": r.percentile_ms(0.5),
            "p99_ms": r.percentile_ms(0.99),
            "non200": r.answered - r.statuses.get(200, 0),
        }

    def handle_seq() -> dict[str, float]:
        h = handle_box["h"]
        for _ in range(100):
            h.remote().result()
        lat = []
        for _ in range(s.handle_seq):
            t = time.perf_counter()
            h.remote().result()
            lat.append(time.perf_counter() - t)
        return {"p50_ms": pct(lat, 0.5), "p99_ms": pct(lat, 0.99), "rps": len(lat) / sum(lat)}

    def handle_conc() -> dict[str, float]:
        h = handle_box["h"]
        rates = []
        for _ in range(3):
            t = time.perf_counter()
            responses = [h.remote() for _ in range(s.handle_conc)]
            for r in responses:
                r.result()
            rates.append(s.handle_conc / (time.perf_counter() - t))
        return {"rps": statistics.median(rates)}

    def redeploy() -> dict[str, float]:
        results: list[Any] = []
        stop = threading.Event()

        def background() -> None:
            while not stop.is_set():
                results.append(run_load(url, 50, 8, timeout_s=60))

        thread = threading.Thread(target=background, daemon=True)
        thread.start()
        time.sleep(0.5)
        t = time.perf_counter()
        serve.run(make_app(serve, "v2"), **a.run_kwargs())
        seconds = time.perf_counter() - t
        time.sleep(0.5)
        stop.set()
        thread.join(120)
        final = httpx.get(url, timeout=10).text
        failed = sum(r.errors + (r.answered - r.statuses.get(200, 0)) for r in results)
        answered = sum(r.answered for r in results)
        return {
            "s": seconds,
            "failed": failed,
            "answered": answered,
            "new_version": float(final == "v2"),
        }

    def big_load() -> dict[str, float]:
        import psutil

        run_load(url, 2000, 32, processes=2)
        pids = a.serving_pids()

        def serving() -> int:
            return sum(psutil.Process(p).memory_info().rss for p in pids)

        before, before_all = serving(), serving_rss(system)
        r = run_load(url, s.load, 32, processes=2, timeout_s=600)
        after, after_all = serving(), serving_rss(system)
        return {
            "answered": r.answered,
            "ok": r.statuses.get(200, 0),
            "errors": r.errors,
            "rps": r.requests_per_s,
            "rss_growth_mib": (after - before) / 2**20,
            "all_rss_growth_mib": (after_all - before_all) / 2**20,
        }

    record("first", first_answer)
    record("http1", http_seq)
    record("http32", http_conc)
    record("hseq", handle_seq)
    record("hconc", handle_conc)
    record("redeploy", redeploy)
    if load:
        record("load", big_load)
    a.shutdown()


# --------------------------------------------------------------------------- parent


#: (label, workload key, value key, unit, higher is better, target text, target check)
ROWS: list[tuple[str, str, str, str, bool, str, Callable[[float, float | None], bool] | None]] = [
    (
        "serve.run to first answer",
        "first",
        "s",
        "s",
        False,
        "≤1 s, ≥5×",
        lambda v, r: v <= 1 and (r is None or r >= 5),
    ),
    (
        "HTTP no-op, 1 client",
        "http1",
        "rps",
        "req/s",
        True,
        "≥3×",
        lambda v, r: r is not None and r >= 3,
    ),
    (
        "HTTP no-op, 1 client p50",
        "http1",
        "p50_ms",
        "ms",
        False,
        "≤2 ms, ≤⅓",
        lambda v, r: v <= 2 and (r is None or r >= 3),
    ),
    ("HTTP no-op, 1 client p99", "http1", "p99_ms", "ms", False, "", None),
    (
        "HTTP no-op, 32 clients",
        "http32",
        "rps",
        "req/s",
        True,
        "≥3×",
        lambda v, r: r is not None and r >= 3,
    ),
    (
        "HTTP no-op, 32 clients p50",
        "http32",
        "p50_ms",
        "ms",
        False,
        "≤⅓",
        lambda v, r: r is not None and r >= 3,
    ),
    ("HTTP no-op, 32 clients p99", "http32", "p99_ms", "ms", False, "", None),
    ("handle call p50", "hseq", "p50_ms", "ms", False, "≤1 ms", lambda v, r: v <= 1),
    ("handle calls, 1,000 at once", "hconc", "rps", "calls/s", True, "", None),
    ("rolling redeploy under load", "redeploy", "s", "s", False, "≤1 s", lambda v, r: v <= 1),
    ("  requests failed during it", "redeploy", "failed", "", False, "0", lambda v, r: v == 0),
    ("load: requests answered", "load", "answered", "", True, "all", None),
    ("load: requests/s", "load", "rps", "req/s", True, "", None),
    ("load: proxy+replica RSS growth", "load", "rss_growth_mib", "MiB", False, "flat", None),
    ("load: every process's RSS growth", "load", "all_rss_growth_mib", "MiB", False, "", None),
]


def render(report: dict[str, Any]) -> str:
    systems = report["systems"]
    head = ["workload", "unit", "nbcluster", "Ray", "×Ray", "target", "met"]
    table = [head]
    for label, key, field, unit, higher, target, check in ROWS:
        values: dict[str, float | None] = {}
        cells = []
        for name in SYSTEMS:
            e = systems.get(name, {"status": "skipped"})
            v = e.get("results", {}).get(key, {}).get(field) if e.get("status") == "ok" else None
            values[name] = v
            if e.get("status") != "ok":
                cells.append("-")
            elif v is None:
                cells.append("err" if key in e.get("errors", {}) else "")
            else:
                cells.append(fmt(v))
        nb, ray = values["nbcluster"], values["ray"]
        ratio = None
        if nb is not None and ray is not None and nb > 0 and ray > 0 and unit:
            ratio = nb / ray if higher else ray / nb
        met = ""
        if check is not None and nb is not None:
            met = "met" if check(nb, ratio) else "not met"
        table.append([label, unit, *cells, f"{fmt(ratio)}×" if ratio else "", target, met])
    out = format_table(table, right=slice(2, 5))
    out.append("")
    out.append("×Ray = how many times better nbcluster is in this run (>1: nbcluster wins).")
    out.append(versions_line(systems, LABELS))
    m = report["machine"]
    out.append(
        f"machine: {m['cpus']} CPUs, {m['cpu']}, Python {m['python']}; each system: one node with "
        f"{NUM_CPUS} CPUs, one replica (num_cpus=0.5, max_ongoing_requests=100)"
        + (", --quick sizes" if report["quick"] else "")
    )
    out += note_lines(systems, LABELS)
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = bench_parser(__doc__, SYSTEMS)
    parser.add_argument("--load", action="store_true", help="also the 20,000-request load test")
    ns = parser.parse_args(argv)
    sizes = Sizes.quick() if ns.quick else Sizes()
    if ns._child:
        child(ns._child, ns._out, sizes, ns.load)
        return 0
    systems = select_systems(ns.only, SYSTEMS)
    report = new_report(ns.quick, sizes)
    workdir = measure_all(
        __file__,
        report,
        systems,
        ADAPTERS,
        prefix="nbcluster-servebench-",
        timeout_s=sizes.system_timeout_s,
        flags=(["--quick"] if ns.quick else []) + (["--load"] if ns.load else []),
        value_field="values",
    )
    finish(render(report), workdir, report, ns.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
