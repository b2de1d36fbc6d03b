"""Head CPU of an idle notebook with every widget open: polling (before) vs pushed events (now).

    python benchmarks/events_bench.py                # 30 s per phase
    python benchmarks/events_bench.py --seconds 8    # a quick run

One 2-CPU cluster, left idle after a few tasks. Three phases of equal length, each
measuring the CPU time the head process uses (user + system, from /proc via psutil):

- **baseline**: nothing watches the cluster (the head still takes the nodes' heartbeats);
- **polling**: the request pattern the widgets and the lab extension used before the event
  stream, replayed with the same public calls: the widgets' feed asked the head, twice a
  second, for the newest task events (``state.task_events(limit=64)``) and every node's
  stats (``state.node_stats()``); the lab extension asked every 2 s for each cluster's load
  (``state.cluster_status``: cluster info, actors, autoscaler status);
- **push**: what runs now: the dashboard's widgets (Timeline, Resources, ObjectStore) on
  the kernel's feed, which holds one event subscription, and the server extension's
  :class:`ClusterWatcher` (one subscription per cluster) answering a long poll in a loop,
  as the lab extension does.

It prints the head's CPU in each phase and what each approach adds to the baseline.
"Adds no measurable CPU" means the push phase is within the baseline's noise.
"""

from __future__ import annotations

import argparse
import asyncio
import threading
import time
from pathlib import Path
from typing import Any

import psutil

import nbcluster
from nbcluster import state


def head_cpu(pid: int) -> float:
    """CPU seconds the head has used so far."""
    t = psutil.Process(pid).cpu_times()
    return float(t.user + t.system)


def measure(pid: int, seconds: float) -> float:
    """The head's CPU use over ``seconds`` of wall time, in percent of one core."""
    start_cpu, start = head_cpu(pid), time.monotonic()
    time.sleep(seconds)
    return 100.0 * (head_cpu(pid) - start_cpu) / (time.monotonic() - start)


class Polling:
    """The request pattern of the widgets' feed (2 Hz) and the lab extension (every 2 s)."""

    def __init__(self, address: str, token_file: str) -> None:
        self.address, self.token_file = address, token_file
        self.stop = threading.Event()
        self.requests = 0
        self.threads = [
            threading.Thread(target=self._feed, daemon=True),
            threading.Thread(target=self._lab, daemon=True),
        ]

    def _feed(self) -> None:
        while not self.stop.wait(0.5):
            state.task_events(limit=64)
            state.node_stats()
            self.requests += 2

    def _lab(self) -> None:
        while not self.stop.wait(2.0):
            state.cluster_status(self.address, self.token_file)
            self.requests += 3

    def __enter__(self) -> Polling:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop.set()
        for t in self.threads:
            t.join()


class Push:
    """The dashboard's widgets on the kernel's feed, and the server's watcher long-polled."""

    def __init__(self, temp_dir: str) -> None:
        from nbcluster.jupyter.server.manager import ClusterManager
        from nbcluster.jupyter.server.watch import ClusterWatcher

        self.manager = ClusterManager(temp_dir)
        self.watcher = ClusterWatcher(self.manager)
        self.stop = threading.Event()
        self.answers = 0
        self.widgets: list[Any] = []
        self.thread = threading.Thread(target=self._browser, daemon=True)

    def _browser(self) -> None:
        async def listen() -> None:
            version = 0
            while not self.stop.is_set():
                model = await self.watcher.wait(version, 1.0)
                if model["version"] != version:
                    self.answers += 1
                version = model["version"]

        asyncio.run(listen())

    def __enter__(self) -> Push:
        from nbcluster.jupyter.widgets import ObjectStore, Resources, Timeline

        self.widgets = [Timeline(), Resources(), ObjectStore(user_ns={})]
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop.set()
        self.thread.join()
        for w in self.widgets:
            w.close()
        self.watcher.close()
        self.manager.shutdown()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=30.0, help="length of each phase")
    args = p.parse_args()

    info = nbcluster.init(num_cpus=2)
    session = Path(info.session_dir)
    pid = int((session / "head.pid").read_text())
    token_file = str(session / "token")

    @nbcluster.remote
    def tiny(i: int) -> int:
        return i

    nbcluster.get([tiny.remote(i) for i in range(50)])
    time.sleep(3.0)  # the task events and heartbeats of the warm-up settle

    rows: list[tuple[str, float, str]] = []
    try:
        base = measure(pid, args.seconds)
        rows.append(("baseline (nothing watches)", base, ""))
        with Polling(info.address, token_file) as polling:
            poll = measure(pid, args.seconds)
        rows.append(("polling (before)", poll, f"{polling.requests} requests to the head"))
        with Push(str(session.parent)) as push:
            time.sleep(2.0)  # subscriptions and first snapshots, then the idle window
            pushed = measure(pid, args.seconds)
            detail = (
                f"{push.watcher.subscriptions} server subscription(s), "
                f"{push.answers} long-poll answers, feed backfills {push.widgets[0]._feed.requests}"
            )
        rows.append(("push (now)", pushed, detail))
        base_after = measure(pid, args.seconds)
        rows.append(("baseline again", base_after, ""))
    finally:
        nbcluster.shutdown()

    noise = abs(base_after - base)
    print(f"\nHead CPU of an idle 2-CPU cluster, {args.seconds:g} s per phase (% of one core)")
    print(f"{'phase':<28} {'head CPU':>9}  notes")
    for name, cpu, note in rows:
        print(f"{name:<28} {cpu:8.2f}%  {note}")
    baseline = (base + base_after) / 2
    print(f"\npolling adds {poll - baseline:+.2f}% of a core to the head")
    print(
        f"push adds    {pushed - baseline:+.2f}% (baseline noise between its two runs: {noise:.2f}%)"
    )


if __name__ == "__main__":
    main()
