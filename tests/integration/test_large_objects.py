"""L07 (RELIABILITY.md): a 1 GiB numpy array through the object store.

``put`` copies it into shared memory once; ``get`` maps it back without copying (a read-only
view of the store); a task that takes the ref reads the same shared memory. The transfer
times are recorded as test properties (``record_property``; they land in a JUnit report),
never asserted: the machine is shared.
"""

from __future__ import annotations

import time

import numpy as np
import psutil
import pytest

import nbcluster

GiB = 2**30


@pytest.mark.skipif(
    psutil.virtual_memory().available < 4 * GiB, reason="needs ~3 GiB of free memory"
)
def test_l07_a_1_gib_array_round_trips_zero_copy_and_reaches_a_task(
    cluster, record_property: pytest.RecordProperty
) -> None:
    cluster(num_cpus=1, object_store_memory=int(1.25 * GiB))
    a = np.full(GiB // 8, 3, dtype=np.int64)
    t0 = time.perf_counter()
    ref = nbcluster.put(a)
    put_s = time.perf_counter() - t0
    del a  # only the store's copy is left
    rss_before = psutil.Process().memory_info().rss
    t0 = time.perf_counter()
    b = nbcluster.get(ref)
    get_s = time.perf_counter() - t0
    assert b.nbytes == GiB and b.dtype == np.int64
    assert not b.flags.writeable  # a view of the store, not a private copy
    assert psutil.Process().memory_info().rss - rss_before < GiB // 4  # nothing was copied
    assert int(b[0]) == 3 and int(b[-1]) == 3 and int(b[len(b) // 2]) == 3

    @nbcluster.remote
    def total(x: np.ndarray) -> tuple[int, bool, int]:
        return int(x.sum()), bool(x.flags.writeable), x.nbytes

    t0 = time.perf_counter()
    s, writeable, nbytes = nbcluster.get(total.remote(ref), timeout=300)
    task_s = time.perf_counter() - t0
    assert (s, writeable, nbytes) == (3 * (GiB // 8), False, GiB)  # the task read it in place
    del b
    for name, seconds in (("put", put_s), ("get", get_s), ("task_sum", task_s)):
        record_property(f"l07_{name}_seconds", round(seconds, 4))
    record_property("l07_put_gib_per_s", round(1 / put_s, 2))
    print(
        f"L07: put {put_s:.2f}s ({1 / put_s:.2f} GiB/s), get {get_s * 1e3:.1f} ms, task {task_s:.2f}s"
    )
