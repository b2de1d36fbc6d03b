"""``GET /nbcluster/api/updates``: the long poll the lab extension listens to.

The server holds one event subscription per cluster; a waiting request wakes when the
list changes (a cluster started from the panel) or a head pushes a load change (tasks
running), and not while the cluster is idle. Bad queries are 400s; the watcher closes
its subscriptions when nobody has asked for a while.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pytest

import nbcluster
from nbcluster import state
from nbcluster.jupyter.server.manager import ClusterManager
from nbcluster.jupyter.server.watch import ClusterWatcher
from nbcluster.testing import assert_no_processes, poll_for

pytestmark = pytest.mark.integration

DEADLINE_S = 60.0


async def _updates(jp_fetch: Any, after: int, timeout: float = 10.0) -> dict[str, Any]:
    r = await jp_fetch(
        "nbcluster",
        "api",
        "updates",
        params={"after": str(after), "timeout": str(timeout)},
        request_timeout=timeout + 60,
    )
    assert r.code == 200
    return json.loads(r.body)


async def _until(jp_fetch: Any, predicate: Any, what: str, after: int = 0) -> dict[str, Any]:
    """Long-poll until ``predicate(model)`` holds; return that model."""
    deadline = time.monotonic() + DEADLINE_S
    while True:
        model = await _updates(jp_fetch, after, timeout=5)
        if predicate(model):
            return model
        if time.monotonic() > deadline:
            raise AssertionError(f"no update showed {what}; last: {model}")
        after = model["version"]


@nbcluster.remote
def hold(seconds: float) -> float:
    time.sleep(seconds)
    return seconds


async def test_updates_wake_on_changes_and_wait_while_idle(
    jp_fetch: Any, jp_serverapp: Any, manager: ClusterManager, monkeypatch: Any
) -> None:
    watcher: ClusterWatcher = jp_serverapp.web_app.settings["nbcluster_watcher"]
    first = await _updates(jp_fetch, 0)
    assert first["clusters"] == [] and first["loads"] == []

    # A long poll that is waiting when the panel starts a cluster wakes with it.
    waiting = asyncio.ensure_future(_updates(jp_fetch, first["version"], timeout=30))
    await asyncio.sleep(0.2)
    code = (
        await jp_fetch(
            "nbcluster",
            "api",
            "clusters",
            method="POST",
            body=json.dumps({"num_cpus": 2, "nodes": 1}),
            request_timeout=120,
        )
    ).code
    assert code == 201
    woke = await asyncio.wait_for(waiting, 30)
    assert woke["version"] > first["version"]
    (cluster,) = [c for c in woke["clusters"] if c["origin"] == "panel"]
    cid = cluster["id"]
    model = await _until(
        jp_fetch,
        lambda m: any(x["cluster_id"] == cid and x["cpu_total"] == 2.0 for x in m["loads"]),
        "the new cluster's load",
    )
    assert watcher.subscriptions == 1

    # Tasks on it: the load pushed by its head shows them.
    monkeypatch.setenv("NBCLUSTER_TOKEN_FILE", str(Path(cluster["session_dir"]) / "token"))
    nbcluster.init(address=cluster["address"])
    try:
        refs = [hold.remote(2) for _ in range(2)]
        busy = await _until(
            jp_fetch,
            lambda m: any(
                x["cluster_id"] == cid and (x["tasks_running"] or 0) >= 1 and x["cpu_used"] >= 1
                for x in m["loads"]
            ),
            "running tasks",
            after=model["version"],
        )
        assert nbcluster.get(refs, timeout=DEADLINE_S) == [2, 2]
        idle = await _until(
            jp_fetch,
            lambda m: any(
                x["cluster_id"] == cid and x["tasks_running"] == 0 and x["tasks_queued"] == 0
                for x in m["loads"]
            ),
            "the cluster idle again",
            after=busy["version"],
        )
    finally:
        nbcluster.shutdown()
    # The driver left (its job ends); after that nothing changes: the poll times out as is.
    settled = await _updates(jp_fetch, idle["version"], timeout=2)
    quiet = await _updates(jp_fetch, settled["version"], timeout=2)
    assert quiet["version"] == settled["version"], "an idle cluster pushed a change"

    code = (await jp_fetch("nbcluster", "api", "clusters", cid, method="DELETE")).code
    assert code == 204
    assert_no_processes(cluster["session_dir"], timeout=15)
    gone = await _until(jp_fetch, lambda m: m["clusters"] == [], "the cluster gone")
    assert gone["loads"] == []
    poll_for(lambda: watcher.subscriptions == 0, 10, 0.05, "the subscription to end")


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ({"after": "-1"}, "'after' must be a version number"),
        ({"after": "1e3"}, "'after' must be a version number"),
        ({"timeout": "61"}, "'timeout' must be seconds from 0 to 60"),
        ({"timeout": "abc"}, "'timeout' must be seconds from 0 to 60"),
    ],
)
async def test_bad_queries_are_400(jp_fetch: Any, query: dict[str, str], message: str) -> None:
    r = await jp_fetch("nbcluster", "api", "updates", params=query, raise_error=False)
    assert r.code == 400
    assert message in json.loads(r.body)["message"]


class FakeSubscription:
    def __init__(self) -> None:
        self.closed = False

    def close(self) -> None:
        self.closed = True


def test_the_watcher_lets_go_when_nobody_listens(tmp_path: Path) -> None:
    """Subscriptions exist only while requests come; fake sessions, fake subscriptions."""
    subs: list[FakeSubscription] = []

    class Manager:
        executor = None

        def list(self, kernel_pids: Any) -> list[dict[str, Any]]:
            return [
                {
                    "id": "aaaaaaaaaaaa",
                    "address": "127.0.0.1:1",
                    "origin": "host",
                    "session_dir": str(tmp_path),
                }
            ]

    def subscribe(callback: Any, **kw: Any) -> FakeSubscription:
        assert kw["address"] == "127.0.0.1:1" and kw["token_file"] == f"{tmp_path}/token"
        callback(
            state.EventBatch(
                (
                    state.ClusterEvent(
                        1,
                        0.0,
                        "node",
                        state.NodeChange(
                            "updated",
                            state.NodeStats(
                                "n1", "node0", "a:1", True, {"CPU": 4.0}, {"CPU": 1.0}, 10, 5, 0, 2
                            ),
                            pending_leases=2,
                            running_tasks=3,
                            death_reason="",
                        ),
                    ),
                ),
                snapshot=True,
            )
        )
        subs.append(FakeSubscription())
        return subs[-1]

    watcher = ClusterWatcher(Manager(), scan_interval=0.05, idle_after=0.5, subscribe=subscribe)  # type: ignore[arg-type]
    try:

        async def ask() -> Any:
            return await watcher.wait(0, 1)

        model = asyncio.run(ask())
        (load,) = model["loads"]
        assert load["cpu_used"] == 3.0 and load["cpu_total"] == 4.0
        assert load["tasks_running"] == 3 and load["tasks_queued"] == 2
        assert load["store_used"] == 5 and load["store_capacity"] == 10
        assert watcher.subscriptions == 1
        poll_for(lambda: subs[0].closed, 10, 0.05, "the idle watcher to unsubscribe")
        assert watcher.subscriptions == 0
    finally:
        watcher.close()
