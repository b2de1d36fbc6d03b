"""Cluster life cycle on real processes (issue acceptance 8; RELIABILITY J01).

Start and stop, a killed driver taking its cluster down, re-``init``, a second driver
joining a running cluster, resources given to ``init``, and node ids seen from tasks.
Processes are only ever signalled by PIDs this test started or found in its own session.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

import nbcluster
from nbcluster._runtime import proc
from nbcluster.cluster import find_session
from nbcluster.testing import assert_no_processes, cluster_processes, poll_for, worker_pids

MiB = 2**20


def session_worker_pids(session_dir: str | os.PathLike[str]) -> set[int]:
    """Workers: children of the fork server, itself a child of a node manager.

    All three run ``nbcluster._runtime.node.main`` (workers are forked, not exec'd).
    """
    parent = {}
    for p in cluster_processes(session_dir):
        with contextlib.suppress(psutil.NoSuchProcess):
            if "nbcluster._runtime.node.main" in " ".join(p.cmdline()):
                parent[p.pid] = p.ppid()
    managers = {pid for pid, pp in parent.items() if pp not in parent}
    zygotes = {pid for pid, pp in parent.items() if pp in managers}
    return {pid for pid, pp in parent.items() if pp in zygotes}


def kill_leftovers(session_dir: str | os.PathLike[str]) -> None:
    """Last-resort cleanup: SIGKILL the processes of this session only (by PID)."""
    for p in cluster_processes(session_dir):
        with contextlib.suppress(psutil.NoSuchProcess, ProcessLookupError):
            os.kill(p.pid, signal.SIGKILL)


@nbcluster.remote
def square(x):
    return x * x


@nbcluster.remote
def where():
    ctx = nbcluster.get_runtime_context()
    return ctx.get_node_id(), ctx.get_job_id(), os.getpid()


# ------------------------------------------------------------------------------- shutdown


def test_shutdown_leaves_no_process(cluster):
    info = cluster(num_cpus=2)
    assert nbcluster.get([square.remote(i) for i in range(10)]) == [i * i for i in range(10)]
    big = nbcluster.put(b"x" * MiB)
    assert nbcluster.get(big) == b"x" * MiB
    procs = cluster_processes(info.session_dir)
    assert len(procs) >= 4, "head, node manager, fork server and workers"
    assert session_worker_pids(info.session_dir)
    nbcluster.shutdown()
    assert not nbcluster.is_initialized()
    assert_no_processes(info.session_dir, timeout=10)
    assert not any(psutil.pid_exists(p.pid) and p.status() != psutil.STATUS_ZOMBIE for p in procs)
    # Calling it again is harmless.
    nbcluster.shutdown()


def test_shutdown_of_a_multi_node_cluster_leaves_no_process(cluster):
    info = cluster(num_cpus=1, _nodes=2)
    assert len([n for n in nbcluster.nodes() if n["Alive"]]) == 2
    assert nbcluster.get([square.remote(i) for i in range(4)]) == [0, 1, 4, 9]
    nbcluster.shutdown()
    assert_no_processes(info.session_dir, timeout=10)


def test_shutdown_leaves_nothing_in_shared_memory(cluster):
    info = cluster(num_cpus=1)
    assert nbcluster.get(nbcluster.put(b"y" * MiB)) == b"y" * MiB
    store_dir = Path(nbcluster._api.context.require_client().store_dir)
    assert store_dir.is_dir()
    nbcluster.shutdown()
    assert_no_processes(info.session_dir)
    assert not store_dir.exists()
    assert not store_dir.parent.exists(), f"{store_dir.parent} left behind"


_DRIVER = textwrap.dedent(
    """
    import sys, time, nbcluster

    @nbcluster.remote
    def sleeper(path):
        open(path, "w").write("running")
        time.sleep(600)

    @nbcluster.remote
    def one():
        return 1

    info = nbcluster.init(num_cpus=2)
    assert nbcluster.get(one.remote()) == 1
    ref = sleeper.remote(sys.argv[1])  # a task still running when the driver is killed
    print("SESSION", info.session_dir, flush=True)
    time.sleep(600)
    """
)


def test_sigkilled_driver_takes_its_cluster_down(tmp_path):
    running = tmp_path / "running"
    driver = subprocess.Popen(
        [sys.executable, "-c", _DRIVER, str(running)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    session = None
    try:
        line = driver.stdout.readline()
        assert line.startswith("SESSION "), line + driver.stderr.read()[-2000:]
        session = line.split(" ", 1)[1].strip()
        poll_for(running.exists, 30, message="the long task never started")
        procs = cluster_processes(session)
        workers = session_worker_pids(session)
        assert len(procs) >= 4 and workers
        os.kill(driver.pid, signal.SIGKILL)
        driver.wait(10)
        assert_no_processes(session, timeout=10)
        assert not any(psutil.pid_exists(pid) for pid in workers)
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait(10)
        if session:
            kill_leftovers(session)


# ------------------------------------------------------------------------------- init twice


def test_second_init_raises_unless_ignore_reinit_error(cluster):
    info = cluster(num_cpus=1)
    with pytest.raises(RuntimeError, match="ignore_reinit_error=True") as err:
        nbcluster.init()
    assert "already called" in str(err.value)
    with pytest.raises(RuntimeError, match="ignore_reinit_error"):
        nbcluster.init(num_cpus=4)
    with pytest.raises(RuntimeError, match="ignore_reinit_error"):
        nbcluster.init(address="auto")
    again = nbcluster.init(ignore_reinit_error=True)
    assert again == info
    assert again.session_dir == info.session_dir and again.address == info.address
    # Nothing new was started and the first cluster still works.
    assert len([n for n in nbcluster.nodes() if n["Alive"]]) == 1
    assert nbcluster.get(square.remote(5)) == 25


def test_init_after_shutdown_starts_a_new_cluster(cluster):
    first = cluster(num_cpus=1)
    nbcluster.shutdown()
    assert_no_processes(first.session_dir)
    second = cluster(num_cpus=1)
    assert second.session_dir != first.session_dir and second.address != first.address
    assert nbcluster.get(square.remote(3)) == 9


# ------------------------------------------------------------------------------- joining


_JOINER = textwrap.dedent(
    """
    import os, sys, time, nbcluster

    @nbcluster.remote
    def cube(x):
        return x ** 3

    info = nbcluster.init(address=sys.argv[1])
    print("JOINED", info.session_dir, info.started_here, info.job_id, flush=True)
    assert nbcluster.get([cube.remote(i) for i in range(20)]) == [i ** 3 for i in range(20)]
    assert nbcluster.get(nbcluster.put(b"z" * 300_000)) == b"z" * 300_000
    print("READY", flush=True)
    gate = sys.argv[2]
    deadline = time.monotonic() + 60
    while not os.path.exists(gate) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert nbcluster.get(cube.remote(7)) == 343
    print("DONE", flush=True)
    nbcluster.shutdown()
    """
)


@pytest.fixture
def own_temp_dir(tmp_path, monkeypatch) -> Iterator[Path]:
    """A temp dir of our own, so address='auto' cannot find another test's cluster."""
    base = tmp_path / "sessions"
    monkeypatch.setenv("NBCLUSTER_TEMP_DIR", str(base))
    yield base


@pytest.mark.parametrize("how", ["auto", "host:port"])
def test_second_driver_joins_a_running_cluster(cluster, own_temp_dir, tmp_path, how):
    info = cluster(num_cpus=2)
    assert nbcluster.get(square.remote(2)) == 4
    gate = tmp_path / "gate"
    address = "auto" if how == "auto" else info.address
    joiner = subprocess.Popen(
        [sys.executable, "-c", _JOINER, address, str(gate)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        joined = joiner.stdout.readline().split()
        assert joined[:1] == ["JOINED"], joined + [joiner.stderr.read()[-2000:]]
        assert Path(joined[1]).resolve() == Path(info.session_dir) and joined[2] == "False"
        assert joined[3] != info.job_id
        assert joiner.stdout.readline().strip() == "READY"
        # Both drivers use the cluster at the same time.
        assert nbcluster.get([square.remote(i) for i in range(50)]) == [i * i for i in range(50)]
        gate.touch()
        out, err = joiner.communicate(timeout=60)
        assert joiner.returncode == 0, err[-2000:]
        assert out.strip() == "DONE"
    finally:
        if joiner.poll() is None:
            joiner.kill()
            joiner.wait(10)
    # The joined driver's shutdown left the cluster running for the first driver.
    assert nbcluster.get(square.remote(9)) == 81
    assert len([n for n in nbcluster.nodes() if n["Alive"]]) == 1
    assert cluster_processes(info.session_dir)


def test_find_session_returns_the_session_directory_not_the_latest_symlink(tmp_path):
    results = []
    for i in range(16):  # directory order differs per directory: try several
        base = tmp_path / f"t{i}"
        session = proc.new_session_dir(str(base))
        (session / proc.HEAD_ADDRESS_FILE).write_text(f"127.0.0.1:{40000 + i}\n")
        (session / "head.pid").write_text(str(os.getpid()))  # a live "head"
        assert (base / proc.LATEST_LINK).is_symlink()
        for address in ("auto", f"127.0.0.1:{40000 + i}"):
            found = find_session(address, str(base))
            assert found is not None and found.resolve() == session
            results.append(found)
    assert [p for p in results if p.is_symlink()] == []


def test_joining_with_resource_arguments_is_refused(cluster, own_temp_dir):
    info = cluster(num_cpus=1)
    script = (
        "import sys, nbcluster\n"
        "try:\n"
        "    nbcluster.init(address=sys.argv[1], num_cpus=2)\n"
        "except ValueError as e:\n"
        "    print('REFUSED', e)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script, info.address], capture_output=True, text=True, timeout=60
    )
    assert "REFUSED" in out.stdout and "cannot be given when joining" in out.stdout, out.stderr


# ------------------------------------------------------------------------------- resources


def test_init_arguments_set_the_cluster_resources(cluster):
    store = 256 * MiB
    cluster(
        num_cpus=3,
        num_gpus=2,
        resources={"custom": 4, "disk": 1.5},
        object_store_memory=store,
    )
    total = nbcluster.cluster_resources()
    assert total["CPU"] == 3 and total["GPU"] == 2
    assert total["custom"] == 4 and total["disk"] == 1.5
    (node,) = nbcluster.nodes()
    assert node["Alive"] is True
    assert {k: node["Resources"][k] for k in ("CPU", "GPU", "custom", "disk")} == {
        "CPU": 3.0,
        "GPU": 2.0,
        "custom": 4.0,
        "disk": 1.5,
    }
    assert node["ObjectStoreCapacity"] == store
    assert node["NodeManagerAddress"] == "127.0.0.1" and node["NodeManagerPort"] > 0
    assert node["DeathReason"] == ""
    poll_for(
        lambda: nbcluster.available_resources().get("CPU") == 3.0,
        10,
        message=f"available: {nbcluster.available_resources()}",
    )

    @nbcluster.remote(num_gpus=1)
    def gpus():
        return nbcluster.get_gpu_ids(), os.environ.get("CUDA_VISIBLE_DEVICES")

    @nbcluster.remote(resources={"custom": 4})
    def needs_custom():
        return "ran"

    ids, visible = nbcluster.get(gpus.remote(), timeout=30)
    assert len(ids) == 1 and ids[0] in (0, 1) and visible == str(ids[0])
    assert nbcluster.get(needs_custom.remote(), timeout=30) == "ran"


def test_default_init_uses_the_machines_cpus(cluster):
    cluster()
    assert nbcluster.cluster_resources()["CPU"] == len(os.sched_getaffinity(0))


def test_node_id_inside_a_task_is_the_nodes_id(cluster):
    info = cluster(num_cpus=2)
    (node,) = nbcluster.nodes()
    node_id, job_id, _pid = nbcluster.get(where.remote())
    assert node_id == node["NodeID"] == info.node_id
    assert job_id == info.job_id == nbcluster.get_runtime_context().get_job_id()
    assert nbcluster.get_runtime_context().get_node_id() == node["NodeID"]


@nbcluster.remote(num_cpus=1)
def where_gated(gate, started):
    Path(started, str(os.getpid())).touch()
    deadline = time.monotonic() + 60
    while not os.path.exists(gate) and time.monotonic() < deadline:
        time.sleep(0.01)
    return nbcluster.get_runtime_context().get_node_id(), os.getpid()


def test_node_id_inside_a_task_matches_the_node_that_runs_it(cluster, tmp_path):
    info = cluster(num_cpus=1, _nodes=2)
    session = Path(info.session_dir)
    nodes = {n["NodeID"] for n in nbcluster.nodes() if n["Alive"]}
    assert len(nodes) == 2
    manager_pid = {
        json.loads(p.read_text())["pid"]: json.loads(p.read_text())["node_id"]
        for p in (session / "nodes").glob("*.json")
    }
    gate, started = tmp_path / "gate", tmp_path / "started"
    started.mkdir()
    # 1 CPU per node and both tasks must run at once: one lands on each node.
    refs = [where_gated.remote(str(gate), str(started)) for _ in range(2)]
    poll_for(lambda: len(list(started.iterdir())) == 2, 30, message="tasks did not both start")
    gate.touch()
    seen = nbcluster.get(refs, timeout=60)
    assert {node_id for node_id, _ in seen} == nodes
    for node_id, pid in seen:
        zygote = psutil.Process(pid).ppid()
        manager = psutil.Process(zygote).ppid()
        assert manager_pid[manager] == node_id, "the task reported another node's id"


# ------------------------------------------------------------------------------- testing helpers


def test_testing_worker_pids_finds_the_workers(cluster):
    info = cluster(num_cpus=2)
    assert nbcluster.get(square.remote(3)) == 9
    expected = session_worker_pids(info.session_dir)
    assert expected
    assert set(worker_pids(info.session_dir)) == expected
