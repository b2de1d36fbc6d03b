"""Client mode (``init("nbcluster://...")``) through the Driver interface, call by call.

The API calls ``context.require_driver()``; in client mode that is the ``ProxyClient``,
which forwards each Driver call by name to the proxy driver's ``CoreDriver``. One client
session covers objects, cancel, named actors, placement groups (which client mode could
not make before the Driver interface) and the read-only head queries of
``nbcluster.state``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

import nbcluster
from nbcluster import LocalCluster, state
from nbcluster._runtime import context
from nbcluster._runtime.proxy.client import ProxyClient
from nbcluster.exceptions import ActorDiedError, TaskCancelledError
from nbcluster.testing import poll_for
from nbcluster.util.placement_group import (
    placement_group,
    placement_group_table,
    remove_placement_group,
)

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def client_mode() -> Iterator[LocalCluster]:
    if nbcluster.is_initialized():
        nbcluster.shutdown()
    cluster = LocalCluster(num_cpus=2).start()
    try:
        nbcluster.init(f"nbcluster://{cluster.address}")
        try:
            assert isinstance(context.require_driver(), ProxyClient)
            yield cluster
        finally:
            nbcluster.shutdown()
    finally:
        cluster.stop()


def _work() -> tuple[Any, Any]:
    """Defined here so they pickle by value (the proxy cannot import this module)."""

    @nbcluster.remote
    def nap(s: float) -> float:
        time.sleep(s)
        return s

    @nbcluster.remote
    class Counter:
        def __init__(self) -> None:
            self.n = 0

        def add(self, k: int) -> int:
            self.n += k
            return self.n

    return nap, Counter


def test_objects_and_cancel_through_the_proxy(client_mode: LocalCluster) -> None:
    nap, _ = _work()
    ref = nbcluster.put({"a": 1})
    assert nbcluster.get(ref, timeout=30) == {"a": 1}
    fast, slow = nap.remote(0), nap.remote(60)
    ready, rest = nbcluster.wait([fast, slow], num_returns=1, timeout=30)
    assert ready == [fast] and rest == [slow]
    nbcluster.cancel(slow)
    with pytest.raises(TaskCancelledError):
        nbcluster.get(slow, timeout=30)
    assert nbcluster.cluster_resources()["CPU"] == 2
    assert [n["Alive"] for n in nbcluster.nodes()] == [True]


def test_named_actors_through_the_proxy(client_mode: LocalCluster) -> None:
    _, Counter = _work()
    made = Counter.options(name="tally").remote()
    assert nbcluster.get(made.add.remote(2), timeout=60) == 2
    found = nbcluster.get_actor("tally")
    assert nbcluster.get(found.add.remote(3), timeout=30) == 5
    with pytest.raises(ValueError, match="already"):
        Counter.options(name="tally").remote()
    with pytest.raises(ValueError, match="Failed to look up actor"):
        nbcluster.get_actor("no-such-actor")
    nbcluster.kill(found)
    with pytest.raises(ActorDiedError):
        nbcluster.get(made.add.remote(1), timeout=30)


def test_placement_groups_and_state_queries_through_the_proxy(client_mode: LocalCluster) -> None:
    pg = placement_group([{"CPU": 1}, {"CPU": 1}], strategy="PACK", name="pair")
    assert pg.wait(30) is True
    row = placement_group_table(pg)
    assert row["state"] == "CREATED" and row["name"] == "pair"
    assert pg.id.hex() in placement_group_table()
    remove_placement_group(pg)
    poll_for(lambda: placement_group_table(pg)["state"] == "REMOVED", 30)

    def napped() -> bool:  # task events reach the head in batches: wait for this job's
        events, _dropped = state.task_events()  # a blocking channel straight to the head
        return any(e.name.endswith("nap") for e in events)

    poll_for(napped, 60, interval=0.2, message="the head has no event of the client's nap tasks")
