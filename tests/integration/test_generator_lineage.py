"""Items of a generator task lost with their node are rebuilt by re-running the task
(Ray: "Ray generators work with built-in fault tolerance features such as retry or
lineage reconstruction")."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import numpy as np
import pytest

import nbcluster
from nbcluster.state import local_cluster
from nbcluster.util import NodeAffinitySchedulingStrategy as NA


@pytest.fixture
def fast_failure_detection(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NBCLUSTER_HEARTBEAT_INTERVAL_S", "0.2")
    monkeypatch.setenv("NBCLUSTER_NODE_DEATH_TIMEOUT_S", "2")


def _node_pid(node_id: str) -> int:
    for f in (Path(local_cluster().session_dir) / "nodes").glob("*.json"):
        d = json.loads(f.read_text())
        if d["node_id"] == node_id:
            return int(d["pid"])
    raise AssertionError(f"no node file for {node_id}")


def test_items_lost_with_their_node_are_rebuilt(cluster, fast_failure_detection) -> None:
    cluster(num_cpus=1, _nodes=2)
    me = nbcluster.get_runtime_context().get_node_id()
    other = next(n["NodeID"] for n in nbcluster.nodes() if n["Alive"] and n["NodeID"] != me)
    runs = Path(local_cluster().session_dir) / "runs.txt"

    @nbcluster.remote(max_retries=1)
    def make(path: str, n: int):
        with open(path, "a") as f:
            f.write("x\n")
        for i in range(n):
            yield np.full(500_000, i)  # 4 MB: in the store of the node that ran it

    gen = make.options(scheduling_strategy=NA(other, soft=True)).remote(str(runs), 3)
    refs = list(gen)  # all made there; no copy here yet
    nbcluster.get(gen.completed(), timeout=60)
    del refs[1]  # a freed item is not needed again
    os.kill(_node_pid(other), signal.SIGKILL)
    values = nbcluster.get(refs, timeout=60)  # rebuilt by re-running the task elsewhere
    assert [int(v[0]) for v in values] == [0, 2]
    assert all(v.shape == (500_000,) for v in values)
    assert runs.read_text().count("x") == 2
