"""The head sees deaths it missed while it was down (issue 12, item 2; RELIABILITY F11a).

Node records persist in the head's database; after a restart a node that does not come back
within the death timeout is declared dead (owners rebuild what was lost there), the nodes'
reports of worker deaths are retried until the head takes them, and actors recorded ALIVE
are verified rather than trusted.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import numpy as np
import pytest

import nbcluster
from nbcluster.state import local_cluster
from nbcluster.testing import pid_alive, poll_for
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


def _named(name: str) -> object:
    try:
        return nbcluster.get_actor(name)
    except ValueError:
        return None


def test_deaths_during_a_head_outage_are_acted_on_after_the_restart(
    cluster, fast_failure_detection, tmp_path: Path
) -> None:
    cluster(num_cpus=1, _nodes=2)
    lc = local_cluster()
    me = nbcluster.get_runtime_context().get_node_id()
    other = next(n["NodeID"] for n in nbcluster.nodes() if n["Alive"] and n["NodeID"] != me)
    runs = tmp_path / "runs.txt"

    @nbcluster.remote(max_retries=1)
    def make(path: str) -> np.ndarray:
        with open(path, "a") as f:
            f.write("x\n")
        return np.full(500_000, 7)

    @nbcluster.remote(max_restarts=1, num_cpus=0)
    class Counter:
        def __init__(self) -> None:
            self.n = 0

        def inc(self) -> int:
            self.n += 1
            return self.n

        def pid(self) -> int:
            return os.getpid()

    @nbcluster.remote(num_cpus=0)
    class Child:
        def __init__(self, owner_pid: int) -> None:
            self.owner_pid = owner_pid

        def owner(self) -> int:
            return self.owner_pid

    @nbcluster.remote(max_retries=0)
    def spawn() -> None:
        child = Child.options(name="owned-by-a-worker").remote(os.getpid())
        nbcluster.get(child.owner.remote())
        time.sleep(300)  # holds the handle: this worker owns the actor until it dies

    out = make.options(scheduling_strategy=NA(other, soft=True)).remote(str(runs))
    nbcluster.wait([out])  # made on the other node; no copy here
    counter = Counter.options(scheduling_strategy=NA(me)).remote()
    assert nbcluster.get(counter.inc.remote()) == 1
    actor_pid = nbcluster.get(counter.pid.remote())
    spawn.options(scheduling_strategy=NA(me)).remote()
    child = poll_for(lambda: _named("owned-by-a-worker"), timeout=30)
    owner_pid = nbcluster.get(child.owner.remote())

    lc.kill_head()
    node_pid = _node_pid(other)
    for pid in (node_pid, actor_pid, owner_pid):
        os.kill(pid, signal.SIGKILL)
    poll_for(lambda: not any(pid_alive(p) for p in (node_pid, actor_pid, owner_pid)), timeout=10)
    node_log = Path(lc.session_dir) / "logs" / f"node-{me[:8]}.log"
    poll_for(  # the surviving node tried to report the deaths and failed
        lambda: node_log.exists() and "did not take" in node_log.read_text(),
        timeout=20,
        message="the node never tried to report the worker deaths",
    )
    lc.restart_head()

    # The node that did not come back is declared dead: its lost output is rebuilt.
    rebuilt = nbcluster.get(out, timeout=60)
    assert rebuilt.shape == (500_000,) and int(rebuilt[0]) == 7
    assert runs.read_text().count("x") == 2
    dead = poll_for(
        lambda: [n for n in nbcluster.nodes() if n["NodeID"] == other and not n["Alive"]],
        timeout=20,
    )
    assert "after the head restarted" in dead[0]["DeathReason"]
    # The actor whose worker died during the outage restarted (a fresh instance).
    assert nbcluster.get(counter.inc.remote(), timeout=60) == 1
    assert nbcluster.get(counter.pid.remote()) != actor_pid
    # The actor whose owner died during the outage was ended once the report got through.
    poll_for(
        lambda: _named("owned-by-a-worker") is None,
        timeout=30,
        message="an actor outlived its dead owner",
    )
    nbcluster.kill(counter)


def test_f11b_without_the_head_calls_that_need_it_fail_within_the_grace_period(
    cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """F11(b)/J03 for an ordinary driver: the head is gone and not restarted. What needs it
    raises ``HeadUnavailableError`` after the grace period (no hang, and this process, the
    "kernel", lives on); what does not (tasks on leased workers) keeps working; once the
    head is back the same driver carries on."""
    monkeypatch.setenv("NBCLUSTER_HEAD_GRACE_PERIOD_S", "3")
    cluster(num_cpus=1)

    @nbcluster.remote
    def one() -> int:
        return 1

    @nbcluster.remote
    class Probe:
        def ping(self) -> str:
            return "pong"

    assert nbcluster.get(one.remote()) == 1
    local_cluster().kill_head()
    for needs_head in (
        lambda: nbcluster.get_actor("anything"),
        lambda: nbcluster.get(Probe.remote().ping.remote(), timeout=60),
    ):
        start = time.monotonic()
        with pytest.raises(nbcluster.exceptions.HeadUnavailableError, match="head"):
            needs_head()
        assert time.monotonic() - start < 30  # the grace period (3 s), not a hang
    assert nbcluster.get(one.remote(), timeout=60) == 1  # tasks do not need the head
    local_cluster().restart_head()

    def head_answers() -> bool:
        try:
            nbcluster.get_actor("anything")
        except nbcluster.exceptions.HeadUnavailableError:
            return False
        except ValueError:  # "no such actor": the head answered
            return True
        return False

    poll_for(head_answers, timeout=30, message="the driver did not reconnect to the head")
    assert nbcluster.get(Probe.remote().ping.remote(), timeout=60) == "pong"
