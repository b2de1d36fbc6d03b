"""F14: a chaos soak. Node managers are killed at intervals under a workload that counts.

Mirrors Ray's nightly ``chaos_test/test_chaos_basic.py`` (RELIABILITY.md F14):

- one head and ``--nodes`` node managers on this host; the driver's own node (which also
  holds the "DB" actor) is never killed; every ``--kill-interval`` seconds another node
  manager, picked at random, is SIGKILLed and a fresh one is started in its place;
- workload A: rounds of nested tasks (each outer task submits ``--fanout`` inner tasks and
  sums them), ``max_retries=-1``, every result checked;
- workload B: ``--actors`` actors with ``max_restarts=-1, max_task_retries=-1`` that report
  every sequence number they are given to the DB actor; at the end **every number is
  present** there (at least once: a retried call may report twice);
- before the chaos, a calm round measures the head's memory and the cluster's idle CPU;
  afterwards the cluster must come back: resources equal to the total, cluster CPU back
  near the idle baseline within ``--settle`` seconds, the head's peak memory during the
  chaos at most 1.5x (plus 32 MiB) its peak in the calm round.

    python benchmarks/chaos_soak.py --quick         # ~40 s (what `make test` runs)
    python benchmarks/chaos_soak.py                 # 30 minutes: 1 head + 4 nodes, a kill a minute
    python benchmarks/chaos_soak.py --json out.json

It prints one JSON summary and exits 1 when a check failed. ``run()`` is the same as a
function (the J04 test calls it from a Jupyter kernel).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psutil


@dataclasses.dataclass
class Settings:
    """One soak's sizes (defaults: the long run)."""

    duration_s: float = 1800.0
    nodes: int = 4
    cpus_per_node: int = 1
    kill_interval_s: float = 60.0
    tasks_per_round: int = 200
    fanout: int = 4
    actors: int = 16
    steps_per_round: int = 8
    settle_s: float = 60.0
    seed: int = 0


QUICK = Settings(
    duration_s=20.0,
    nodes=3,
    kill_interval_s=5.0,
    tasks_per_round=40,
    fanout=3,
    actors=4,
    steps_per_round=5,
    settle_s=30.0,
)


def _cluster_cpu_seconds(session_dir: str) -> float:
    from nbcluster.testing import cluster_processes

    total = 0.0
    for p in cluster_processes(session_dir):
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.Error:
            continue
    return total


def _cpu_fraction(session_dir: str, window_s: float = 2.0) -> float:
    """CPU used by the cluster's processes over a window, in cores."""
    before = _cluster_cpu_seconds(session_dir)
    time.sleep(window_s)
    # Processes that ended during the window drop out: clamp at zero.
    return max(0.0, _cluster_cpu_seconds(session_dir) - before) / window_s


def _held(node: dict[str, Any]) -> dict[str, Any]:
    """What a live node's last heartbeat says it still has leased out."""
    total, avail = node["Resources"], node.get("Available", {})
    return {
        "node": node["NodeID"][:8],
        "held": {k: v - avail.get(k, 0.0) for k, v in total.items() if avail.get(k, 0.0) != v},
    }


class _Killer(threading.Thread):
    """Kills a random node manager (never the driver's) every ``interval`` and replaces it."""

    def __init__(self, cluster: Any, spare_node_id: str, interval: float, seed: int) -> None:
        super().__init__(name="chaos-killer", daemon=True)
        self.cluster = cluster
        self.spare = spare_node_id
        self.interval = interval
        self.random = random.Random(seed)
        self.stop = threading.Event()
        self.kills = 0
        self.errors: list[str] = []

    def _victims(self) -> list[tuple[int, str]]:
        out = []
        for f in (Path(self.cluster.session_dir) / "nodes").glob("*.json"):
            try:
                d = json.loads(f.read_text())
            except (OSError, ValueError):
                continue
            pid = int(d["pid"])
            alive = psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
            if d["node_id"] != self.spare and alive:
                out.append((pid, d["node_id"]))
        return out

    def run(self) -> None:
        while not self.stop.wait(self.interval):
            victims = self._victims()
            if not victims:
                continue
            pid, _ = self.random.choice(victims)
            os.kill(pid, signal.SIGKILL)
            self.kills += 1
            for p in list(self.cluster.nodes):
                if p.pid == pid:
                    p.wait(10)
                    self.cluster.nodes.remove(p)
                    self.cluster.num_nodes -= 1
            try:
                self.cluster.add_node(timeout=60)
            except (RuntimeError, TimeoutError) as e:  # reported, and the soak fails
                self.errors.append(f"could not replace a node: {e}")


def run(settings: Settings, log: Any = None) -> dict[str, Any]:
    """Run one soak in this process (it starts and stops its own cluster)."""
    os.environ.setdefault("NBCLUSTER_HEARTBEAT_INTERVAL_S", "0.2")
    os.environ.setdefault("NBCLUSTER_NODE_DEATH_TIMEOUT_S", "2")
    import nbcluster
    from nbcluster.state import local_cluster
    from nbcluster.util import NodeAffinitySchedulingStrategy as NA

    def say(msg: str) -> None:
        if log is not None:
            print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=log, flush=True)

    s = settings
    nbcluster.init(num_cpus=s.cpus_per_node, _nodes=s.nodes)
    cluster = local_cluster()
    session = str(cluster.session_dir)
    head = psutil.Process(cluster.head.pid)
    home = nbcluster.get_runtime_context().get_node_id()

    @nbcluster.remote(max_retries=-1)
    def inner(i: int, j: int) -> int:
        return i * 1000 + j

    @nbcluster.remote(max_retries=-1)
    def outer(i: int, fanout: int) -> int:
        return sum(nbcluster.get([inner.remote(i, j) for j in range(fanout)]))

    @nbcluster.remote(num_cpus=0)
    class DB:
        def __init__(self) -> None:
            self.seen: dict[int, set[int]] = {}

        def record(self, who: int, seq: int) -> None:
            self.seen.setdefault(who, set()).add(seq)

        def missing(self, expected: dict[int, int]) -> dict[int, list[int]]:
            return {
                w: sorted(set(range(n)) - self.seen.get(w, set()))
                for w, n in expected.items()
                if set(range(n)) - self.seen.get(w, set())
            }

    @nbcluster.remote(max_restarts=-1, max_task_retries=-1, num_cpus=0)
    class Reporter:
        def __init__(self, who: int, db: Any) -> None:
            self.who, self.db = who, db

        def step(self, seq: int) -> int:
            nbcluster.get(self.db.record.remote(self.who, seq))
            return seq

    db = DB.options(scheduling_strategy=NA(home)).remote()
    # Spread over the nodes, so that kills hit actors too (they restart elsewhere).
    reporters = [
        Reporter.options(scheduling_strategy="SPREAD").remote(w, db) for w in range(s.actors)
    ]
    expected = {w: 0 for w in range(s.actors)}
    counts = {"rounds": 0, "tasks": 0, "steps": 0, "bad_results": 0}
    head_peak = {"calm": 0, "chaos": 0}

    def one_round(phase: str) -> None:
        base = counts["tasks"]
        refs = [outer.remote(base + i, s.fanout) for i in range(s.tasks_per_round)]
        calls = []
        for w, r in enumerate(reporters):
            for _ in range(s.steps_per_round):
                calls.append((expected[w], r.step.remote(expected[w])))
                expected[w] += 1
        got = nbcluster.get(refs, timeout=600)
        want = [
            sum((base + i) * 1000 + j for j in range(s.fanout)) for i in range(s.tasks_per_round)
        ]
        counts["bad_results"] += sum(g != w for g, w in zip(got, want, strict=True))
        steps = nbcluster.get([ref for _, ref in calls], timeout=600)
        counts["bad_results"] += sum(v != seq for (seq, _), v in zip(calls, steps, strict=True))
        counts["tasks"] += s.tasks_per_round
        counts["steps"] += len(calls)
        counts["rounds"] += 1
        head_peak[phase] = max(head_peak[phase], head.memory_info().rss)

    # Calm: the no-failure baseline (head memory, idle CPU).
    one_round("calm")
    nbcluster.get(db.missing.remote(expected))
    idle_cpu = _cpu_fraction(session)
    say(f"calm round done; idle cluster CPU {idle_cpu:.2f} cores")

    killer = _Killer(cluster, home, s.kill_interval_s, s.seed)
    killer.start()
    start = time.monotonic()
    try:
        while time.monotonic() - start < s.duration_s:
            one_round("chaos")
            say(f"round {counts['rounds']}: {killer.kills} node(s) killed so far")
    finally:
        killer.stop.set()
        killer.join(120)
    chaos_s = time.monotonic() - start

    missing = nbcluster.get(db.missing.remote(expected), timeout=120)
    restarts = sum((nbcluster.state.actor_info(r) or {}).get("restarts", 0) for r in reporters)
    settle_deadline = time.monotonic() + s.settle_s

    def settled() -> bool:
        # Both sides read now: the last node killed may be declared dead (leaving both
        # sums) after the loop started, so a total read once before it can never match.
        return nbcluster.available_resources() == nbcluster.cluster_resources()

    while time.monotonic() < settle_deadline and not settled():
        time.sleep(0.2)
    resources_back = settled()
    if not resources_back:
        say(f"resources not back: {[_held(n) for n in nbcluster.nodes() if n['Alive']]}")
    cpu_after = _cpu_fraction(session)
    while cpu_after > idle_cpu + 0.25 and time.monotonic() < settle_deadline:
        cpu_after = _cpu_fraction(session)
    mem_limit = 1.5 * head_peak["calm"] + 32 * 2**20
    checks = {
        "every_result_correct": counts["bad_results"] == 0,
        "every_sequence_number_present": not missing,
        "nodes_were_killed": killer.kills >= 1,
        "replacements_started": not killer.errors,
        "resources_back": resources_back,
        "cpu_back_to_baseline": cpu_after <= idle_cpu + 0.25,
        "head_memory_bounded": head_peak["chaos"] <= mem_limit,
    }
    summary = {
        "passed": all(checks.values()),
        "checks": checks,
        "settings": dataclasses.asdict(s),
        "chaos_seconds": round(chaos_s, 1),
        "kills": killer.kills,
        "actor_restarts": restarts,
        "killer_errors": killer.errors,
        **counts,
        "missing_sequence_numbers": missing,
        "idle_cpu_cores": round(idle_cpu, 3),
        "cpu_after_cores": round(cpu_after, 3),
        "head_rss_calm_mib": round(head_peak["calm"] / 2**20, 1),
        "head_rss_chaos_mib": round(head_peak["chaos"] / 2**20, 1),
    }
    for r in reporters:
        nbcluster.kill(r)
    nbcluster.kill(db)
    nbcluster.shutdown()
    return summary


def main(argv: list[str] | None = None) -> int:
    """Command line: run one soak, print (and optionally save) its summary."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="the short run of `make test` (~40 s)")
    for field in dataclasses.fields(Settings):
        flag = "--" + field.name.replace("_", "-")
        p.add_argument(flag, type=type(getattr(Settings(), field.name)), default=None)
    p.add_argument("--json", default="", help="also write the summary to this file")
    args = p.parse_args(argv)
    base = QUICK if args.quick else Settings()
    changes = {
        f.name: getattr(args, f.name)
        for f in dataclasses.fields(Settings)
        if getattr(args, f.name) is not None
    }
    summary = run(dataclasses.replace(base, **changes), log=sys.stderr)
    text = json.dumps(summary, indent=2)
    print(text)
    if args.json:
        Path(args.json).write_text(text)
    return 0 if summary["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
