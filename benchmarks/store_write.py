"""Object-store write bandwidth against memcpy, and the inline serialization round trip.

    .venv/bin/python benchmarks/store_write.py [--mib 100] [--repeat 9] [--dir /dev/shm]

Prints, for one numpy array of ``--mib`` MiB (median of ``--repeat`` runs):

* memcpy: ``np.copyto`` into an already-touched array of the same size (the reference);
* put, new file: ``serialize`` + ``write_object`` into a fresh file (tmpfs allocates pages);
* put, recycled file: the same after ``delete_object(..., recycle_limit=...)`` left a freed
  file to overwrite, three ways: ``os.pwritev``, a ``MAP_POPULATE`` mapping copied by one
  thread, and the same copied by two threads (the default);
* get: ``read_object`` + ``deserialize`` (zero-copy, so independent of size);

and the inline hot path ``deserialize(serialize(5).to_bytes())`` next to plain pickle.
Not a test: absolute figures drift on shared machines, compare the ratios.
"""

from __future__ import annotations

import argparse
import os
import pickle
import shutil
import statistics
import tempfile
import time
import timeit

import numpy as np

from nbcluster._runtime.objects import filling, store
from nbcluster._runtime.serialization import deserialize, serialize


def _median_seconds(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=9)
    parser.add_argument("--dir", default="/dev/shm")
    args = parser.parse_args()

    nbytes = args.mib << 20
    src = np.random.default_rng(0).integers(0, 255, nbytes, dtype=np.uint8)
    dst = np.ones_like(src)
    work = tempfile.mkdtemp(prefix="nbc-bench-", dir=args.dir)
    try:
        memcpy = nbytes / _median_seconds(lambda: np.copyto(dst, src), args.repeat)

        ids = iter(os.urandom(20) for _ in range(10**6))

        def put_fresh() -> None:
            oid = next(ids)
            store.write_object(work, oid, serialize(src))
            fresh_ids.append(oid)

        fresh_ids: list[bytes] = []
        fresh_times = []
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            put_fresh()
            fresh_times.append(time.perf_counter() - t0)
            store.delete_object(work, fresh_ids.pop())  # unlink: the next write is fresh
        fresh = nbytes / statistics.median(fresh_times)

        limit = 4 * nbytes
        oid = next(ids)
        store.write_object(work, oid, serialize(src))

        def recycled_rate(mapped_min: int, threads: int) -> float:
            nonlocal oid
            store.MAPPED_WRITE_MIN, filling.copy_threads = mapped_min, threads
            times = []
            for _ in range(args.repeat):
                store.delete_object(work, oid, recycle_limit=limit)
                oid = next(ids)
                t0 = time.perf_counter()
                store.write_object(work, oid, serialize(src))
                times.append(time.perf_counter() - t0)
            return nbytes / statistics.median(times)

        defaults = store.MAPPED_WRITE_MIN, filling.copy_threads
        try:
            # Interleaved rounds, so load from other processes hits every variant alike.
            runs: dict[str, list[float]] = {"pwritev": [], "mapped1": [], "mapped2": []}
            for _ in range(3):
                runs["pwritev"].append(recycled_rate(1 << 62, 1))
                runs["mapped1"].append(recycled_rate(0, 1))
                runs["mapped2"].append(recycled_rate(0, 2))
        finally:
            store.MAPPED_WRITE_MIN, filling.copy_threads = defaults
        recycled = {k: statistics.median(v) for k, v in runs.items()}

        def get() -> None:
            arr = deserialize(store.read_object(work, oid))
            assert arr.nbytes == nbytes

        get_s = _median_seconds(get, args.repeat)
        store.delete_object(work, oid)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    print(f"{args.mib} MiB numpy array in {args.dir} (median of {args.repeat})")
    rows = [
        ("memcpy (np.copyto, warm)", memcpy, ""),
        ("put, new file", fresh, f"  ({fresh / memcpy:4.0%} of memcpy)"),
    ]
    for key, label in (
        ("pwritev", "put, recycled, pwritev"),
        ("mapped1", "put, recycled, mapped"),
        ("mapped2", "put, recycled, mapped x2"),
    ):
        rate = recycled[key]
        rows.append((label, rate, f"  ({rate / memcpy:4.0%} of memcpy)"))
    for label, rate, note in rows:
        print(f"  {label:28s} {rate / 1e9:6.2f} GB/s{note}")
    print(f"  get (map + deserialize)    {get_s * 1e6:6.1f} us")

    n = 200_000
    ours = min(timeit.repeat(lambda: deserialize(serialize(5).to_bytes()), number=n, repeat=5)) / n
    plain = (
        min(timeit.repeat(lambda: pickle.loads(pickle.dumps(5, protocol=5)), number=n, repeat=5))
        / n
    )
    print(
        f"inline round trip of 5: {ours * 1e9:.0f} ns, plain pickle {plain * 1e9:.0f} ns "
        f"({ours / plain:.1f}x)"
    )


if __name__ == "__main__":
    main()
