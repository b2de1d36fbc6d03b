"""Streaming under a budget, on a cluster with a 64 MiB object store.

A pipeline over ten times the store completes; the bytes in flight stay within the
budget (``stats()`` says so); nothing spills; the driver's memory does not grow with the
data. An interrupted pipeline (KeyboardInterrupt in the consuming thread) cancels its
tasks and stops its actor pool, and the cluster stays usable.
"""

from __future__ import annotations

import signal
import sys
import threading
import time
from collections.abc import Iterator

import cloudpickle
import numpy as np
import pytest

import nbcluster
from nbcluster import data, state
from nbcluster.testing import assert_cluster_healthy, assert_no_processes

pytestmark = pytest.mark.integration
cloudpickle.register_pickle_by_value(sys.modules[__name__])

MB = 1 << 20
STORE = 64 * MB


@pytest.fixture(scope="module")
def small_store() -> Iterator[None]:
    if nbcluster.is_initialized():
        nbcluster.shutdown()
    info = nbcluster.init(num_cpus=2, object_store_memory=STORE)
    yield
    nbcluster.shutdown()
    assert_no_processes(info.session_dir, timeout=15)


def _payload(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    n = len(batch["id"])
    # 4 MiB of float64 per 512-row block: 1024 values per row.
    return {"id": batch["id"], "x": np.ones((n, 1024)) * batch["id"][:, None]}


def test_ten_times_the_store_streams_within_budget(small_store: None) -> None:
    blocks = 160  # 160 x 4 MiB = 640 MiB through a 64 MiB store
    ds = data.range(blocks * 512, override_num_blocks=blocks).map_batches(_payload)
    rows = 0
    checksum = 0.0
    for batch in ds.iter_batches(batch_size=None):
        rows += len(batch["id"])
        checksum += float(batch["x"][:, 0].sum())
    assert rows == blocks * 512
    assert checksum == float(sum(range(blocks * 512)))
    stats = ds._last_execution.stats
    budget = STORE // 2  # DataContext.object_store_memory_fraction = 0.5
    assert stats.budget_bytes == budget
    # Estimates can be off by one block before the first outputs are seen.
    assert stats.peak_bytes_in_flight <= budget + 8 * MB, stats.to_string()
    assert stats.spilled_bytes < 16 * MB, stats.to_string()
    assert stats.driver_rss_peak - stats.driver_rss_start < 150 * MB, stats.to_string()
    text = ds.stats()
    assert (
        "Object store budget: 32.0 MiB" in text and "Spilled to disk during the execution" in text
    )
    assert sum(n.store_used for n in state.node_stats()) < STORE


def test_count_of_a_large_plan_fetches_no_blocks(small_store: None) -> None:
    ds = data.range(40 * 512, override_num_blocks=40).map_batches(_payload)
    assert ds.count() == 40 * 512  # metadata only: the driver never maps a block
    assert (
        ds._last_execution.stats.driver_rss_peak - ds._last_execution.stats.driver_rss_start
        < 64 * MB
    )


class _Slow:
    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        time.sleep(0.3)
        return batch


class _Interrupter(threading.Thread):
    """Interrupts the main thread as Ctrl-C does after ``seconds``, then again every 3 s
    until ``done`` is set, as a user presses again when the first one seems lost (Python
    drops a KeyboardInterrupt raised inside a finalizer; ObjectRef's re-delivers it)."""

    def __init__(self, seconds: float) -> None:
        super().__init__(daemon=True)
        self.seconds = seconds
        self.done = threading.Event()
        self.sent = 0
        self.start()

    def run(self) -> None:
        main = threading.main_thread().ident
        assert main is not None
        delay = self.seconds
        while not self.done.wait(delay):
            signal.pthread_kill(main, signal.SIGINT)
            self.sent += 1
            delay = 3.0


@pytest.mark.parametrize("pool", [False, True], ids=["tasks", "actor-pool"])
def test_interrupt_cancels_tasks_and_stops_pools(
    small_store: None, ctrl_c_raises: None, pool: bool
) -> None:
    assert threading.current_thread() is threading.main_thread()
    ds = data.range(200, override_num_blocks=100)
    if pool:
        ds = ds.map_batches(_Slow, concurrency=(1, 2))
    else:
        ds = ds.map_batches(lambda b: (time.sleep(0.3), b)[1])
    timer = None
    seen = 0
    try:
        with pytest.raises(KeyboardInterrupt):
            for _ in ds.iter_batches(batch_size=None, prefetch_batches=0):
                seen += 1
                if timer is None:  # the pipeline is running: interrupt it from "the kernel"
                    timer = _Interrupter(0.3)
                    started = time.monotonic()
    finally:
        if timer is not None:
            timer.done.set()
            timer.join()
    assert timer is not None and timer.sent >= 1
    assert time.monotonic() - started < 10
    assert 0 < seen < 100
    ex = ds._last_execution
    assert ex.stats is not None and ex.stats.status == "stopped"
    assert not ex._pending and not ex._actors
    # Every CPU comes back (tasks cancelled, pool actors killed); the cluster still works.
    assert_cluster_healthy(timeout=15)
    assert data.range(10).map(lambda r: {"id": r["id"] + 1}).count() == 10


def test_consumer_that_stops_early_stops_the_pipeline(small_store: None) -> None:
    ds = data.range(100, override_num_blocks=50).map_batches(lambda b: (time.sleep(0.1), b)[1])
    it = iter(ds.iter_batches(batch_size=None))
    next(it)
    it.close()  # what breaking out of a for loop does
    assert ds._last_execution.stats.status == "stopped"
    assert_cluster_healthy(timeout=15)
