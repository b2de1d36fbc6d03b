"""A cluster whose token is longer than a raw-socket hello carries (``protocol/hello.py``:
255 bytes). ``NBCLUSTER_TOKEN`` lets a user choose it; tasks, actor calls and placement
groups then stay on gRPC instead of waiting forever on task channels that cannot open."""

from __future__ import annotations

from typing import Any

import pytest

import nbcluster
from nbcluster._runtime.protocol import hello
from nbcluster.util import NodeAffinitySchedulingStrategy as NA
from nbcluster.util.placement_group import placement_group, remove_placement_group


@nbcluster.remote
def _add_one(x: int) -> int:
    return x + 1


@nbcluster.remote
class _Counter:
    def __init__(self) -> None:
        self.n = 0

    def incr(self) -> int:
        self.n += 1
        return self.n


def test_a_token_too_long_for_the_hello_runs_everything_over_grpc(
    cluster: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    token = "t" * (hello.MAX_TOKEN + 45)
    assert not hello.token_fits(token)
    monkeypatch.setenv("NBCLUSTER_TOKEN", token)
    cluster(num_cpus=1)
    assert nbcluster.get([_add_one.remote(i) for i in range(5)], timeout=60) == [1, 2, 3, 4, 5]
    counter = _Counter.remote()
    assert nbcluster.get([counter.incr.remote() for _ in range(3)], timeout=60) == [1, 2, 3]
    pg = placement_group([{"CPU": 0.5}])
    assert pg.wait(timeout_seconds=60)
    remove_placement_group(pg)


@nbcluster.remote(num_cpus=1)
def _make(n: int) -> bytes:
    return b"z" * n


def test_a_token_too_long_for_the_hello_pulls_between_nodes_over_grpc(
    cluster: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The data plane's hello (objects/transfer.py) has the same one-byte length: a node
    pulls another's object over gRPC instead of failing the read."""
    monkeypatch.setenv("NBCLUSTER_TOKEN", "u" * (hello.MAX_TOKEN + 100))
    cluster(num_cpus=1, _nodes=2)
    me = nbcluster.get_runtime_context().get_node_id()
    other = next(n["NodeID"] for n in nbcluster.nodes() if n["NodeID"] != me)
    ref = _make.options(scheduling_strategy=NA(other)).remote(3_000_000)
    assert len(nbcluster.get(ref, timeout=60)) == 3_000_000
