"""Tune overhead and early stopping: nbcluster.tune beside Ray Tune (and Optuna alone), one run.

    python benchmarks/tune_bench.py                  # every installed system, full sizes
    python benchmarks/tune_bench.py --quick          # small sizes: a smoke run
    python benchmarks/tune_bench.py --only nbcluster,optuna --json tune.json

Each system runs in its own fresh subprocess; nbcluster and Ray get one node with 2 CPUs
(started before the clock starts; every trial takes 1 CPU). Workloads:

- **N trivial trials**: a function that reports 10 times and does nothing else, sampled
  N times from ``{"x": uniform(0, 1)}`` (N = 100, the median of 3 runs, and 1,000): wall
  time of ``fit()``, and trials/s. Targets (issue 16): 100 trials in <= 0.5 s; 1,000 trials >= 5x Ray's rate.
- **results/s**: 2 trials reporting 1,000 times each (target >= 2,000 results/s).
- **ASHA vs FIFO**: 81 trials of a synthetic learning curve ``acc = q * (1 - 1/(i+1))``
  over 27 iterations of 10 ms each, q from a shuffled grid (the best is q = 1); FIFO runs
  them all, ``ASHAScheduler(max_t=27, grace_period=1, reduction_factor=3)`` stops the weak
  ones. Reported: the time until ``fit()`` returns the best config (the search is only
  done when every trial is), when the best config's trial finished, the best config each
  found, and how many trials ASHA stopped early. Target: the same best config as FIFO in
  <= 1/3 of the time.

Optuna (no cluster: one process, in-memory study, ``RandomSampler``) is the reference for
per-trial overhead: the same trivial objective with 10 ``trial.report`` calls, and 2 trials
of 1,000 reports. Ray runs with ``reuse_actors=True`` (its fastest setting; Ray's default is False),
``verbose=0`` and a local ``storage_path``, as nbcluster does. Absolute times drift on
shared machines: read the ratios measured in the same run.
"""

from __future__ import annotations

import logging
import os
import random
import sys
import tempfile
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
    log,
    measure_all,
    new_report,
    note_lines,
    record_workload,
    select_systems,
    versions_line,
)

NUM_CPUS = 2
SYSTEMS = ("nbcluster", "ray", "optuna")
LABELS = {"nbcluster": "nbcluster", "ray": "Ray", "optuna": "Optuna"}
REPORTS_PER_TRIAL = 10


@dataclass
class Sizes:
    small: int = 100
    large: int = 1000
    long_reports: int = 1000
    asha_trials: int = 81
    asha_iters: int = 27
    asha_sleep_s: float = 0.01
    system_timeout_s: int = 1500

    @classmethod
    def quick(cls) -> Sizes:
        return cls(
            small=100,
            large=200,
            long_reports=300,
            asha_trials=9,
            asha_iters=9,
            system_timeout_s=400,
        )


# --------------------------------------------------------------------------- trainables
# The children run this file as __main__, so the cluster workers get these by value.


def trivial(config: dict[str, Any]) -> None:
    report = _REPORT[0] or _nbcluster_report()
    for _ in range(REPORTS_PER_TRIAL):
        report({"loss": config["x"]})


def long_reporter(config: dict[str, Any]) -> None:
    report = _REPORT[0] or _nbcluster_report()
    for i in range(config["n"]):
        report({"i": i})


def curve(config: dict[str, Any]) -> None:
    report = _REPORT[0] or _nbcluster_report()
    for i in range(1, config["iters"] + 1):
        time.sleep(config["sleep"])
        report({"acc": config["q"] * (1 - 1 / (i + 1)), "t": time.time()})


#: The report function of the system under test (set by the Ray and Optuna adapters).
_REPORT: list[Any] = [None]


def _nbcluster_report() -> Any:
    from nbcluster import tune

    return tune.report


# --------------------------------------------------------------------------- adapters


class Adapter(SystemAdapter):
    def start(self) -> None:
        """Bring up the cluster (outside the timed region)."""

    def stop(self) -> None:
        """Tear it down."""

    def fit(
        self, fn: Callable[..., Any], space: dict[str, Any], num_samples: int, **kw: Any
    ) -> Any:
        raise NotImplementedError

    def trivial(self, n: int) -> float:
        t = time.perf_counter()
        self.fit(trivial, {"x": self.uniform(0, 1)}, n)
        return time.perf_counter() - t

    def results(self, n: int) -> float:
        t = time.perf_counter()
        self.fit(long_reporter, {"n": n}, 2)
        return 2 * n / (time.perf_counter() - t)

    def asha(self, s: Sizes, use_asha: bool) -> dict[str, Any]:
        qs = [round((i + 1) / s.asha_trials, 4) for i in range(s.asha_trials)]
        # A fixed shuffle: in ascending order every newcomer beats all before it, and an
        # asynchronous scheduler would have nothing to stop.
        random.Random(0).shuffle(qs)
        space = {"q": self.grid(qs), "iters": s.asha_iters, "sleep": s.asha_sleep_s}
        t, wall = time.perf_counter(), time.time()
        best, iters, best_t = self.fit(curve, space, 1, asha=use_asha, max_t=s.asha_iters)
        return {
            "time": time.perf_counter() - t,
            "to_best": best_t - wall,
            "best_q": best,
            "iters": iters,
        }

    def uniform(self, lo: float, hi: float) -> Any:
        raise NotImplementedError

    def grid(self, values: list[Any]) -> Any:
        raise NotImplementedError


class _TuneLike(Adapter):
    """nbcluster.tune and ray.tune share the API: one adapter body for both."""

    tune: Any = None
    storage = ""

    def uniform(self, lo: float, hi: float) -> Any:
        return self.tune.uniform(lo, hi)

    def grid(self, values: list[Any]) -> Any:
        return self.tune.grid_search(values)

    def _run_config(self) -> Any:
        return self.tune.RunConfig(storage_path=self.storage, verbose=0)

    def _tune_config(self, num_samples: int, asha: bool, max_t: int | None) -> Any:
        kw: dict[str, Any] = {"num_samples": num_samples, "reuse_actors": True}
        if max_t is not None:
            kw.update(metric="acc", mode="max")
            if asha:
                kw["scheduler"] = self._asha(max_t)
        return self.tune.TuneConfig(**kw)

    def fit(self, fn, space, num_samples, asha=False, max_t=None):
        tuner = self.tune.Tuner(
            fn,
            param_space=space,
            tune_config=self._tune_config(num_samples, asha, max_t),
            run_config=self._run_config(),
        )
        grid = tuner.fit()
        if max_t is None:
            return grid
        best = grid.get_best_result(metric="acc", mode="max")
        iters = [r.metrics["training_iteration"] for r in grid]
        return best.config["q"], iters, best.metrics["t"]


class NbclusterAdapter(_TuneLike):
    name = "nbcluster"
    module = "nbcluster"

    def start(self) -> None:
        import nbcluster
        from nbcluster import tune

        self.nb, self.tune = nbcluster, tune
        self.storage = tempfile.mkdtemp(prefix="tb-nbc-")
        nbcluster.init(num_cpus=NUM_CPUS)

    def stop(self) -> None:
        self.nb.shutdown()

    def _asha(self, max_t: int) -> Any:
        from nbcluster.tune.schedulers import ASHAScheduler

        return ASHAScheduler(max_t=max_t, grace_period=1, reduction_factor=3)


class RayAdapter(_TuneLike):
    name = "ray"
    module = "ray"
    notes = {"reuse": "Ray runs with reuse_actors=True (its default, False, is slower)"}

    def start(self) -> None:
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
        import ray
        from ray import tune

        self.ray, self.tune = ray, tune
        _REPORT[0] = tune.report
        self.storage = tempfile.mkdtemp(prefix="tb-ray-")
        kwargs = dict(num_cpus=NUM_CPUS, include_dashboard=False, logging_level=logging.WARNING)
        for attempt in range(3):  # Ray gives its raylet 30 s to start: a loaded machine misses it
            try:
                ray.init(_node_ip_address="127.0.0.1", **kwargs)
                return
            except Exception as e:  # noqa: BLE001 - Ray raises a bare Exception here
                if "timed out during startup" not in str(e) or attempt == 2:
                    raise
                log(f"[ray] start timed out (attempt {attempt + 1}); retrying")
                ray.shutdown()

    def stop(self) -> None:
        self.ray.shutdown()

    def _asha(self, max_t: int) -> Any:
        from ray.tune.schedulers import ASHAScheduler

        return ASHAScheduler(max_t=max_t, grace_period=1, reduction_factor=3)


class _OptunaTrialReport:
    def __init__(self, trial: Any) -> None:
        self.trial = trial
        self.step = 0

    def __call__(self, metrics: dict[str, Any]) -> None:
        self.step += 1
        value = next(iter(metrics.values()))
        self.trial.report(float(value), self.step)


class OptunaAdapter(Adapter):
    name = "optuna"
    module = "optuna"
    notes = {"optuna": "Optuna: one process, in-memory study, no cluster (the reference)"}

    def start(self) -> None:
        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        self.ot = optuna

    def uniform(self, lo: float, hi: float) -> Any:
        return ("uniform", lo, hi)

    def grid(self, values: list[Any]) -> Any:
        return ("grid", values)

    def fit(self, fn, space, num_samples, asha=False, max_t=None):
        if max_t is not None:
            raise NotImplementedError("n/a")

        def objective(trial: Any) -> float:
            config = {}
            for k, v in space.items():
                if isinstance(v, tuple) and v[0] == "uniform":
                    config[k] = trial.suggest_float(k, v[1], v[2])
                else:
                    config[k] = v
            _REPORT[0] = _OptunaTrialReport(trial)
            fn(config)
            return 0.0

        study = self.ot.create_study(sampler=self.ot.samplers.RandomSampler(seed=0))
        study.optimize(objective, n_trials=num_samples)
        return study


ADAPTERS: dict[str, type[Adapter]] = {
    "nbcluster": NbclusterAdapter,
    "ray": RayAdapter,
    "optuna": OptunaAdapter,
}


# --------------------------------------------------------------------------- child


def child(system: str, out: str, s: Sizes) -> None:
    a = ADAPTERS[system]()
    a.start()

    def run(key: str, fn: Callable[[], Any]) -> None:
        record_workload(system, out, key, fn, skip=(NotImplementedError,))

    run("warmup", lambda: a.trivial(4))
    run("t_small", lambda: sorted(a.trivial(s.small) for _ in range(3))[1])  # median of 3
    run("t_large", lambda: a.trivial(s.large))
    run("results", lambda: a.results(s.long_reports))
    run("fifo", lambda: a.asha(s, use_asha=False))
    run("asha", lambda: a.asha(s, use_asha=True))
    a.stop()


# --------------------------------------------------------------------------- parent


def _rows(
    report: dict[str, Any], s: Sizes
) -> list[tuple[str, str, dict[str, float | None], bool, str]]:
    """(label, unit, value per system, higher is better, target)."""

    def val(system: str, key: str, fn: Callable[[Any], float] = float) -> float | None:
        e = report["systems"].get(system, {})
        v = e.get("results", {}).get(key) if e.get("status") == "ok" else None
        return None if v is None else fn(v)

    out = []
    for key, n, target in (("t_small", s.small, "<= 0.5 s"), ("t_large", s.large, ">= 5×Ray")):
        times = {x: val(x, key) for x in SYSTEMS}
        out.append(
            (
                f"{n} trivial trials (10 reports each)",
                "s",
                times,
                False,
                target if key == "t_small" else "",
            )
        )
        rates = {x: (n / v if v else None) for x, v in times.items()}
        out.append(
            ("  the same, as a rate", "trials/s", rates, True, target if key == "t_large" else "")
        )
    out.append(
        (
            f"2 trials × {s.long_reports} reports",
            "results/s",
            {x: val(x, "results") for x in SYSTEMS},
            True,
            ">= 2,000/s",
        )
    )
    for key, label in (("fifo", "FIFO"), ("asha", "ASHA")):
        out.append(
            (
                f"{label}: fit() returns the best of {s.asha_trials}",
                "s",
                {x: val(x, key, lambda v: v["time"]) for x in SYSTEMS},
                False,
                "ASHA <= FIFO/3" if key == "asha" else "",
            )
        )
        out.append(
            (
                f"  {label}: the best trial finished at",
                "s",
                {x: val(x, key, lambda v: v["to_best"]) for x in SYSTEMS},
                False,
                "",
            )
        )
    return out


def render(report: dict[str, Any], s: Sizes) -> str:
    head = ["workload", "unit", "nbcluster", "Ray", "Optuna", "×Ray", "target"]
    table = [head]
    for label, unit, values, higher, target in _rows(report, s):
        cells = []
        for name in SYSTEMS:
            e = report["systems"].get(name, {"status": "skipped"})
            v = values.get(name)
            if e.get("status") != "ok":
                cells.append("-")
            elif v is None:
                cells.append("n/a")
            else:
                cells.append(fmt(v, 0.1))
        ratio = better(values.get("nbcluster"), values.get("ray"), higher)
        table.append([label, unit, *cells, f"{fmt(ratio, 0.1)}×" if ratio else "", target])
    lines = format_table(table, right=slice(2, 6))
    lines.append("")
    lines.append(
        "×Ray = how many times better nbcluster is than Ray in this run (>1: nbcluster wins)."
    )
    for name in ("nbcluster", "ray"):
        e = report["systems"].get(name, {})
        res = e.get("results", {})
        if "fifo" in res and "asha" in res:
            f, a = res["fifo"], res["asha"]
            stopped = sum(1 for i in a["iters"] if i < max(a["iters"]))
            lines.append(
                f"{LABELS[name]}: best q FIFO {f['best_q']} / ASHA {a['best_q']} "
                f"({'same' if f['best_q'] == a['best_q'] else 'DIFFERENT'}); ASHA stopped "
                f"{stopped} of {len(a['iters'])} trials early; fit() returned the best config in "
                f"{a['time'] / f['time']:.2f} × FIFO's time (its trial finished at "
                f"{a['to_best'] / f['to_best']:.2f} × FIFO's)"
            )
    lines.append(versions_line(report["systems"], LABELS))
    m = report["machine"]
    lines.append(
        f"machine: {m['cpus']} CPUs, {m['cpu']}, Python {m['python']}; nbcluster and Ray: one "
        f"node with {NUM_CPUS} CPUs" + (", --quick sizes" if report["quick"] else "")
    )
    lines += note_lines(report["systems"], LABELS, lambda k: ADAPTERS[k].notes.values())
    return "\n".join(lines)


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
        prefix="nbcluster-tunebench-",
        timeout_s=sizes.system_timeout_s,
        flags=["--quick"] if ns.quick else [],
    )
    finish(render(report, sizes), workdir, report, ns.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
