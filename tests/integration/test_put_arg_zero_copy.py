"""A task whose argument is a large ``put`` object reads it in place (issue 11, item 3).

The array a task receives must be a read-only view of the object's file in the node's
store, mapped into the worker: no copy when the task starts, and none when it reads every
page (the worker's anonymous memory does not grow by the object's size; only shared,
file-backed pages come in).
"""

from __future__ import annotations

import os
import sys

import cloudpickle
import numpy as np
import pytest

import nbcluster

pytestmark = pytest.mark.integration
cloudpickle.register_pickle_by_value(sys.modules[__name__])  # workers cannot import tests/

SIZE = 48 * 2**20  # large enough to stand out of a worker's own memory (~40-60 MiB)


def _rss_anon() -> int:
    """This process's anonymous resident memory, in bytes (Linux)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no RssAnon in /proc/self/status")


def _mapping_of(address: int) -> tuple[str, str]:
    """``(permissions, path)`` of the mapping holding ``address`` in this process."""
    with open("/proc/self/maps") as f:
        for line in f:
            fields = line.split(None, 5)
            lo, hi = (int(x, 16) for x in fields[0].split("-"))
            if lo <= address < hi:
                return fields[1], fields[5].strip() if len(fields) > 5 else ""
    return "", ""


@nbcluster.remote
def anon_memory() -> tuple[int, int]:
    return os.getpid(), _rss_anon()


@nbcluster.remote
def inspect_argument(a: np.ndarray) -> dict:
    at_start = _rss_anon()
    perms, path = _mapping_of(a.__array_interface__["data"][0])
    total = float(a[:: 4096 // a.itemsize].sum())  # touch every page
    return {
        "pid": os.getpid(),
        "writeable": bool(a.flags.writeable),
        "perms": perms,
        "path": path,
        "anon_at_start": at_start,
        "anon_after_read": _rss_anon(),
        "sum": total,
    }


def test_a_task_reads_a_large_put_argument_in_place(shared_cluster) -> None:
    big = np.ones(SIZE // 8)
    ref = nbcluster.put(big)
    seen = nbcluster.get([inspect_argument.remote(ref) for _ in range(3)], timeout=120)
    for info in seen:
        assert info["sum"] == float(SIZE // 4096)
        # A read-only view (as in Ray) ...
        assert info["writeable"] is False
        # ... of the object's own file in the store, mapped shared and read-only: not a
        # private copy in the worker's heap.
        assert info["perms"].startswith("r-") and info["perms"].endswith("s"), info
        assert ref.hex() in os.path.basename(info["path"].replace(" (deleted)", "")), info
        assert info["anon_after_read"] - info["anon_at_start"] < SIZE // 4, info

    # The worker's anonymous memory while it held the argument is about what it is
    # without it: nothing the size of the object was copied when the task started.
    pids = {info["pid"] for info in seen}
    baseline: dict[int, int] = {}
    for _ in range(40):
        if pids <= baseline.keys():
            break
        pid, anon = nbcluster.get(anon_memory.remote(), timeout=60)
        baseline[pid] = min(anon, baseline.get(pid, anon))
    checked = 0
    for info in seen:
        if info["pid"] in baseline:
            checked += 1
            assert info["anon_at_start"] - baseline[info["pid"]] < SIZE // 2, (info, baseline)
    assert checked, f"no small task ran on the workers {pids} (saw {sorted(baseline)})"
    del ref
