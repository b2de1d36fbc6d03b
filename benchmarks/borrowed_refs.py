"""An actor call while the actor holds many borrowed refs: the cost must not grow with them.

A worker tells the owners of the refs it gained during a call, after the call (so the
objects outlive the caller's own refs). Until the sixteenth session it found them by
walking its whole object table after every task and call, so an actor holding 50,000
borrowed refs paid about 40 ms per call; now it looks only at the refs it gained.

For each size, one actor receives that many refs to small objects the driver put (in
lists of 10,000), keeps them, and then answers ``--calls`` sequential calls of a method
that does nothing; the table gives the median call and its ratio to the same actor's call
holding no ref, measured in the same run (1.0 = flat).

Run: ``python benchmarks/borrowed_refs.py [--sizes 0,1000,10000,50000] [--calls 300]``.
"""

from __future__ import annotations

import argparse
import statistics
import time

import nbcluster as nb


@nb.remote
class Holder:
    """Keeps the refs it is given; ``ping`` does nothing."""

    def __init__(self) -> None:
        self.refs: list[nb.ObjectRef] = []

    def hold(self, refs: list[nb.ObjectRef]) -> int:
        self.refs.extend(refs)
        return len(self.refs)

    def ping(self) -> int:
        return 1


def call_ms(holder: object, calls: int) -> float:
    """Median ms of ``calls`` sequential calls (after 20 warm-up calls)."""
    for _ in range(20):
        nb.get(holder.ping.remote())  # type: ignore[attr-defined]
    times = []
    for _ in range(calls):
        t = time.perf_counter()
        nb.get(holder.ping.remote())  # type: ignore[attr-defined]
        times.append(time.perf_counter() - t)
    return 1e3 * statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="0,1000,10000,50000")
    parser.add_argument("--calls", type=int, default=300)
    ns = parser.parse_args(argv)
    sizes = [int(s) for s in ns.sizes.split(",")]
    nb.init(num_cpus=2)
    try:
        refs = [nb.put(i) for i in range(max(sizes))]
        rows = []
        for size in sizes:
            holder = Holder.remote()
            for i in range(0, size, 10_000):
                nb.get(holder.hold.remote(refs[i : min(size, i + 10_000)]))
            rows.append((size, call_ms(holder, ns.calls)))
            nb.kill(holder)
    finally:
        nb.shutdown()
    base = rows[0][1]
    print(f"{'borrowed refs held':>20}  {'actor call (ms)':>16}  {'× holding none':>15}")
    for size, ms in rows:
        print(f"{size:>20,}  {ms:>16.3f}  {ms / base:>15.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
