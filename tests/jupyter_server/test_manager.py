"""ClusterManager and session discovery against real clusters, without an HTTP server."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from nbcluster import LocalCluster
from nbcluster.jupyter.server import sessions
from nbcluster.jupyter.server.manager import (
    ClusterManager,
    ClusterNotFound,
    NotOwned,
    OperationFailed,
)
from nbcluster.testing import assert_no_processes


@pytest.fixture
def local_cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    """A 1-CPU cluster started by this process (so it is "another process" to a manager)."""
    cluster = LocalCluster(num_cpus=1, temp_dir=str(tmp_path)).start()
    yield cluster
    session = cluster.session_dir
    cluster.stop()
    assert session is not None
    assert_no_processes(session)


@pytest.fixture
def mgr(tmp_path: Path) -> Iterator[ClusterManager]:
    manager = ClusterManager(str(tmp_path))
    yield manager
    owned = [c.session_dir for c in manager.owned_clusters().values()]
    manager.shutdown()
    for s in owned:
        assert s is not None
        assert_no_processes(s)


def test_session_layout_matches_local_cluster(local_cluster: LocalCluster) -> None:
    """The file names sessions.py reads are the ones LocalCluster writes."""
    assert local_cluster.session_dir is not None and local_cluster.token_file is not None
    s = sessions.read_session(local_cluster.session_dir)
    assert s is not None, f"session not recognised: {sorted(os.listdir(local_cluster.session_dir))}"
    assert s.address == local_cluster.address
    assert s.token_file == local_cluster.token_file
    assert s.head_pid == local_cluster.pids()[0]
    assert s.owner_pid == os.getpid()
    assert s.nodes == 1
    assert sessions.live_sessions(local_cluster.session_dir.parent) == [s]


def test_ended_and_foreign_sessions_are_not_live(tmp_path: Path) -> None:
    cluster = LocalCluster(num_cpus=1, temp_dir=str(tmp_path)).start()
    session = cluster.session_dir
    assert session is not None
    cluster.stop()
    assert sessions.read_session(session) is None
    # A head.pid naming a live process of another program (PID reuse) is not a cluster.
    fake = tmp_path / "session_fake"
    fake.mkdir()
    (fake / sessions.HEAD_ADDRESS_FILE).write_text("127.0.0.1:1")
    (fake / sessions.HEAD_PID_FILE).write_text(str(os.getpid()))
    assert sessions.read_session(fake) is None
    (fake / sessions.HEAD_ADDRESS_FILE).write_text("127.0.0.1:1\n%system id")
    assert sessions.read_session(fake) is None
    assert sessions.live_sessions(tmp_path) == []
    assert sessions.live_sessions(tmp_path / "missing") == []


def test_cluster_started_by_a_kernel_is_marked(
    mgr: ClusterManager, local_cluster: LocalCluster
) -> None:
    """A cluster whose owner is one of the server's kernels gets origin "kernel"."""
    (entry,) = mgr.list({os.getpid(): "kernel-1"})
    assert entry["origin"] == "kernel" and entry["kernel_id"] == "kernel-1"
    (entry,) = mgr.list({os.getpid() + 1: "kernel-1"})
    assert entry["origin"] == "host" and entry["kernel_id"] is None
    with pytest.raises(NotOwned, match=r"started by another process \(PID \d+\)"):
        mgr.scale(entry["id"], 2)
    with pytest.raises(NotOwned):
        mgr.stop(entry["id"])
    assert local_cluster.head is not None and local_cluster.head.poll() is None


def test_owned_cluster_life_cycle(mgr: ClusterManager) -> None:
    model = mgr.start(num_cpus=1, nodes=2)
    assert model["origin"] == "panel" and model["nodes"] == 2
    assert mgr.get(model["id"]) == model
    assert mgr.load(model["id"])["cpu_total"] == 2.0
    assert mgr.scale(model["id"], 1)["nodes"] == 1
    session = model["session_dir"]
    assert session is not None
    mgr.stop(model["id"])
    assert_no_processes(session)
    with pytest.raises(ClusterNotFound):
        mgr.get(model["id"])
    with pytest.raises(ClusterNotFound):
        mgr.stop(model["id"])


def test_a_cluster_the_panel_starts_is_never_listed_as_another_hosts(mgr: ClusterManager) -> None:
    # Its session goes live before start() returns: a list taken meanwhile (the watcher's,
    # waking the panel's long poll) must already say "panel", not "host".
    seen: list[tuple[str, str | None]] = []
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            seen.extend((m["origin"], m["session_dir"]) for m in mgr.list())

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        model = mgr.start(num_cpus=1, nodes=1)
    finally:
        done.set()
        watcher.join(10)
    mine = [origin for origin, session in seen if session == model["session_dir"]]
    assert mine and set(mine) == {"panel"}, set(mine)


def test_shutdown_refuses_new_clusters(mgr: ClusterManager) -> None:
    mgr.shutdown()
    with pytest.raises(OperationFailed, match="shutting down"):
        mgr.start(num_cpus=1, nodes=1)


def test_added_address_that_is_a_local_cluster_keeps_one_entry(
    mgr: ClusterManager, local_cluster: LocalCluster
) -> None:
    model = mgr.add_address(local_cluster.address)
    assert model["origin"] == "host"  # the live session, with its load and node count
    assert [e["address"] for e in mgr.list()] == [local_cluster.address]
