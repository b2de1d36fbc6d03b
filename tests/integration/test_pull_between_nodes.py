"""Objects pulled from another node over the data plane (``objects/transfer.py``).

A two-node cluster on this host: values a task made on node B are read by the driver on
node A, whose node manager pulls them over a raw socket from B's. The bytes must arrive
intact at every size, and a pull whose source dies in the middle must end, either with
the value (rebuilt by lineage on a surviving node) or with a clear error: never a hang.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import nbcluster
from nbcluster.exceptions import ObjectLostError
from nbcluster.state import local_cluster
from nbcluster.util import NodeAffinitySchedulingStrategy

MiB = 1 << 20


def other_node() -> str:
    me = nbcluster.get_runtime_context().get_node_id()
    return next(n["NodeID"] for n in nbcluster.nodes() if n["Alive"] and n["NodeID"] != me)


def node_pid(node_id: str) -> int:
    for f in (Path(local_cluster().session_dir) / "nodes").glob("*.json"):
        d = json.loads(f.read_text())
        if d["node_id"] == node_id:
            return int(d["pid"])
    raise AssertionError(f"no node file for {node_id}")


@nbcluster.remote
def make(nbytes: int, seed: int) -> tuple[np.ndarray, str]:
    arr = np.random.default_rng(seed).integers(0, 255, nbytes, dtype=np.uint8)
    return arr, hashlib.sha256(arr).hexdigest()


@nbcluster.remote
def make_array(nbytes: int) -> np.ndarray:
    return np.arange(nbytes // 8, dtype=np.int64)


def test_values_made_on_another_node_arrive_intact(cluster) -> None:
    cluster(num_cpus=1, _nodes=2, object_store_memory=512 * MiB)
    there = NodeAffinitySchedulingStrategy(other_node())
    for i, nbytes in enumerate((300_000, 5 * MiB + 7, 40 * MiB + 12345)):
        arr, digest = nbcluster.get(make.options(scheduling_strategy=there).remote(nbytes, i))
        assert arr.nbytes == nbytes
        assert hashlib.sha256(arr).hexdigest() == digest
        assert not arr.flags.writeable  # mapped from this node's store, not copied


@pytest.fixture
def fast_failure_detection(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NBCLUSTER_HEARTBEAT_INTERVAL_S", "0.2")
    monkeypatch.setenv("NBCLUSTER_NODE_DEATH_TIMEOUT_S", "2")


def test_a_pull_whose_source_dies_midway_ends_with_the_value_or_an_error(
    cluster, fast_failure_detection
) -> None:
    cluster(num_cpus=1, _nodes=2, object_store_memory=2048 * MiB)
    other = other_node()
    nbytes = 400 * MiB
    ref = make_array.options(
        scheduling_strategy=NodeAffinitySchedulingStrategy(other, soft=True), max_retries=1
    ).remote(nbytes)
    nbcluster.wait([ref])  # made there; not here yet
    outcome: dict[str, object] = {}

    def read() -> None:
        try:
            arr = nbcluster.get(ref, timeout=90)
            outcome["ok"] = bool(arr.nbytes == nbytes and arr[-1] == nbytes // 8 - 1)
        except ObjectLostError as err:  # (or a subclass: reconstruction failed)
            outcome["error"] = err
        except BaseException as err:  # noqa: BLE001 - reported below
            outcome["unexpected"] = err

    reader = threading.Thread(target=read)
    reader.start()
    time.sleep(0.05)  # the pull has started (or is about to)
    os.kill(node_pid(other), signal.SIGKILL)
    reader.join(120)
    assert not reader.is_alive(), "the read hung after its source node died"
    assert "unexpected" not in outcome, outcome
    assert outcome.get("ok") is True or "error" in outcome, outcome
    # The cluster still works on the surviving node.
    assert nbcluster.get(make_array.remote(8 * MiB))[-1] == MiB - 1
