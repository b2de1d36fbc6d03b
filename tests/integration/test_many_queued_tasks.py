"""L01: 100,000 no-op tasks queued behind blocked CPUs, then released (issue 12, item 6).

Every task completes with ``None``; the driver's memory grows by at most about 5 KB per
pending ref while they wait; afterwards the cluster's resources are back to the baseline.
The submission rate and the time to run them all are recorded as test properties (they
land in a JUnit report), never asserted. L05's driver half is here too:
``Config.max_pending_tasks`` refuses one task too many.

(Once this test seemed to make ``test_scheduling_strategies.py::test_default_uses_every_
node_when_the_work_needs_them_all`` fail after it. The cause was not this test: a node's
spill charges were undone by heartbeat views older than the spills, so a request could be
spilled onto a node already full of earlier spills and wait there. It failed on its own
under load too; ``unit/test_node_state.py::test_a_view_older_than_our_spills_does_not_
undo_their_charges`` guards the fix.)
"""

from __future__ import annotations

import gc
import os
import time
from pathlib import Path
from typing import Any

import pytest

import nbcluster
from nbcluster.testing import poll_for

N = 100_000
MAX_BYTES_PER_PENDING_REF = 5 * 1024


def _rss() -> int:
    with open(f"/proc/{os.getpid()}/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@nbcluster.remote
def hold(gate: str, started: str) -> None:
    Path(started, str(os.getpid())).touch()
    while not os.path.exists(gate):
        time.sleep(0.01)


@nbcluster.remote
def noop() -> None:
    return None


def test_l01_100k_queued_tasks_all_complete_with_bounded_driver_memory(
    cluster: Any, tmp_path: Path, record_property: pytest.RecordProperty
) -> None:
    cluster(num_cpus=2)
    total = nbcluster.cluster_resources()
    gate, started = tmp_path / "go", tmp_path / "started"
    started.mkdir()
    holders = [hold.remote(str(gate), str(started)) for _ in range(2)]
    poll_for(lambda: len(list(started.iterdir())) == 2, 60, message="the CPUs were not blocked")
    gc.collect()
    before = _rss()
    t0 = time.perf_counter()
    refs = [noop.remote() for _ in range(N)]
    submit_s = time.perf_counter() - t0
    gc.collect()
    grown = _rss() - before
    record_property("l01_submissions_per_second", round(N / submit_s))
    record_property("l01_driver_bytes_per_pending_ref", round(grown / N))
    assert grown <= MAX_BYTES_PER_PENDING_REF * N, (
        f"the driver grew {grown / N:.0f} bytes per pending ref (bound: "
        f"{MAX_BYTES_PER_PENDING_REF})"
    )
    ready, _ = nbcluster.wait(refs, num_returns=1, timeout=0)
    assert not ready  # queued behind the blocked CPUs, not run
    gate.touch()
    t0 = time.perf_counter()
    values = nbcluster.get(refs, timeout=600)
    record_property("l01_run_seconds", round(time.perf_counter() - t0, 1))
    assert len(values) == N and all(v is None for v in values)
    assert nbcluster.get(holders, timeout=60) == [None, None]
    del refs, values
    poll_for(
        lambda: nbcluster.available_resources().get("CPU") == total.get("CPU"),
        30,
        message="the CPUs did not come back",
    )


def test_l05_the_driver_cap_refuses_one_task_too_many_then_recovers(
    cluster: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NBCLUSTER_MAX_PENDING_TASKS", "10")
    cluster(num_cpus=2)
    gate, started = tmp_path / "go", tmp_path / "started"
    started.mkdir()
    refs = [hold.remote(str(gate), str(started)) for _ in range(2)]
    refs += [noop.remote() for _ in range(8)]  # 10 pending: the cap
    with pytest.raises(nbcluster.exceptions.PendingTasksLimitExceeded, match=r"\(10\)"):
        noop.remote()
    owned = len(nbcluster.state.owned_objects())
    with pytest.raises(nbcluster.exceptions.PendingTasksLimitExceeded):
        noop.remote()
    assert len(nbcluster.state.owned_objects()) == owned  # a refused task leaves nothing
    gate.touch()
    assert nbcluster.get(refs, timeout=60) == [None] * 10
    poll_for(lambda: _submitted_all([noop.remote() for _ in range(10)]), 30)


def _submitted_all(refs: list[Any]) -> bool:
    return nbcluster.get(refs, timeout=60) == [None] * len(refs)
