"""The ``nbcluster`` command on real processes: start a head, status, join, stop, --block.

Every command runs as ``python -m nbcluster.cli`` with ``NBCLUSTER_TEMP_DIR`` pointing at
a directory of this test, so ``auto`` and ``stop`` only ever see this test's sessions.
Cleanup runs in ``finally`` blocks: ``nbcluster stop``, then SIGKILL of whatever process of
the test's sessions is still alive (by PID, found through the session directory).
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

import nbcluster
from nbcluster.testing import assert_no_processes, cluster_processes, pid_alive, poll_for

CLI = [sys.executable, "-m", "nbcluster.cli"]


class Cli:
    """Runs ``nbcluster`` commands against one temp dir and cleans up after them."""

    def __init__(self, temp_dir: Path) -> None:
        self.temp_dir = temp_dir
        self.env = {**os.environ, "NBCLUSTER_TEMP_DIR": str(temp_dir)}
        self.env.pop("NBCLUSTER_ADDRESS", None)
        self.popens: list[subprocess.Popen[str]] = []

    def run(self, *args: str, timeout: float = 90) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*CLI, *args],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
        )

    def popen(self, *args: str) -> subprocess.Popen[str]:
        p = subprocess.Popen(
            [*CLI, *args],
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            text=True,
        )
        self.popens.append(p)
        return p

    def sessions(self) -> list[Path]:
        if not self.temp_dir.exists():
            return []
        return [p for p in self.temp_dir.glob("session_*") if not p.is_symlink()]

    def processes(self) -> list[psutil.Process]:
        """Every process whose command line names this test's temp dir (any session in it,
        also through the 'session_latest' link)."""
        return cluster_processes(self.temp_dir)

    def cleanup(self) -> None:
        with contextlib.suppress(Exception):
            self.run("stop", timeout=30)
        for p in self.popens:
            if p.poll() is None:
                p.kill()
                p.wait(10)
        for proc in self.processes():
            with contextlib.suppress(psutil.NoSuchProcess, ProcessLookupError):
                os.kill(proc.pid, signal.SIGKILL)


@pytest.fixture
def cli(tmp_path) -> Iterator[Cli]:
    if nbcluster.is_initialized():
        nbcluster.shutdown()
    c = Cli(tmp_path / "sessions")
    try:
        yield c
    finally:
        if nbcluster.is_initialized():
            nbcluster.shutdown()
        c.cleanup()


def parse_start(out: str) -> tuple[str, Path, Path]:
    address = re.search(r"^nbcluster head started at (127\.0\.0\.1:\d+)$", out, re.M)
    token_file = re.search(r"^\s+token file:\s+(\S+)", out, re.M)
    session = re.search(r"^\s+session dir:\s+(\S+)", out, re.M)
    assert address and token_file and session, out
    return address.group(1), Path(token_file.group(1)), Path(session.group(1))


def cpu_of(status_out: str) -> list[str]:
    return re.findall(r"CPU ([\d.]+/[\d.]+)", status_out)


def test_start_status_join_and_stop(cli, monkeypatch):
    started = cli.run("start", "--head", "--num-cpus", "3")
    assert started.returncode == 0, started.stderr[-3000:]
    address, token_file, session = parse_start(started.stdout)
    # The command returned; the cluster keeps running in the background.
    assert token_file == session / "token" and token_file.is_file()
    assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
    token = token_file.read_text().strip()
    assert token not in started.stdout + started.stderr, "the token itself was printed"
    assert f"--address {address}" in started.stdout
    head_and_node = cluster_processes(session)
    assert len(head_and_node) >= 2

    status = cli.run("status")
    assert status.returncode == 0, status.stderr[-3000:]
    assert f"cluster at {address}" in status.stdout
    assert cpu_of(status.stdout) == ["3/3"], status.stdout
    assert "alive" in status.stdout
    assert len(re.findall(r"^\s+node [0-9a-f]{8} ", status.stdout, re.M)) == 1

    # A driver joins with address="auto".
    monkeypatch.setenv("NBCLUSTER_TEMP_DIR", str(cli.temp_dir))
    info = nbcluster.init(address="auto")
    try:
        assert info.address == address and info.started_here is False

        @nbcluster.remote
        def triple(x):
            return 3 * x

        assert nbcluster.get([triple.remote(i) for i in range(30)]) == [3 * i for i in range(30)]
        assert nbcluster.cluster_resources()["CPU"] == 3

        joined = cli.run("start", "--address", address, "--num-cpus", "1")
        assert joined.returncode == 0, joined.stderr[-3000:]
        m = re.search(rf"nbcluster node joined {re.escape(address)} \(pid (\d+)\)", joined.stdout)
        assert m, joined.stdout
        joined_pid = int(m.group(1))
        assert joined_pid in {p.pid for p in cluster_processes(session)}
        poll_for(lambda: nbcluster.cluster_resources().get("CPU") == 4, 30)
        alive = [n for n in nbcluster.nodes() if n["Alive"]]
        assert sorted(n["Resources"]["CPU"] for n in alive) == [1.0, 3.0]

        @nbcluster.remote(num_cpus=3)
        def big_task():
            return nbcluster.get_runtime_context().get_node_id()

        # Both nodes run tasks: a 3-CPU task can only run on the first node.
        node3 = next(n["NodeID"] for n in alive if n["Resources"]["CPU"] == 3.0)
        assert nbcluster.get(big_task.remote(), timeout=60) == node3
        poll_for(
            lambda: sorted(cpu_of(cli.run("status").stdout)) == ["1/1", "3/3"],
            30,
            message="status did not show both nodes with all CPUs free",
        )
    finally:
        nbcluster.shutdown()

    pids = {p.pid for s in cli.sessions() for p in cluster_processes(s)}
    assert len(pids) >= 4, "head, two node managers and their workers"
    stopped = cli.run("stop")
    assert stopped.returncode == 0, stopped.stderr
    assert re.search(r"signalled 3 process\(es\)", stopped.stdout), stopped.stdout
    for s in cli.sessions():
        assert_no_processes(s, timeout=10)
    assert [pid for pid in pids if pid_alive(pid)] == []
    assert not pid_alive(joined_pid)
    # (The head may be an unreaped zombie for a moment, which still looks alive by PID.)
    poll_for(
        lambda: (
            "no running cluster" in (after := cli.run("status")).stderr and after.returncode == 1
        ),
        20,
        message="status still finds a cluster after stop",
    )


def _catches(pid: int, sig: int) -> bool:
    """Whether the process has installed a handler for ``sig`` (SigCgt in /proc status)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigCgt:"):
            return bool(int(line.split()[1], 16) >> (sig - 1) & 1)
    return False


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_start_block_stays_in_the_foreground_until_signalled(cli, sig):
    p = cli.popen("start", "--head", "--block", "--num-cpus", "1")
    lines = []
    while not any("session dir:" in ln for ln in lines):
        line = p.stdout.readline()
        assert line, "".join(lines) + p.stderr.read()[-3000:]
        lines.append(line)
    _, _, session = parse_start("".join(lines))
    # Wait until the command is blocking with its handlers installed, not just printing.
    poll_for(lambda: _catches(p.pid, signal.SIGTERM), 30, message="no signal handler installed")
    assert p.poll() is None, "start --block returned"
    procs = cluster_processes(session)
    assert len(procs) >= 2
    status = cli.run("status")
    assert status.returncode == 0 and cpu_of(status.stdout) == ["1/1"], status.stdout
    assert p.poll() is None
    os.kill(p.pid, sig)
    out, err = p.communicate(timeout=30)
    assert p.returncode == 0, err[-3000:]
    assert "nbcluster: stopped" in out
    assert_no_processes(session, timeout=10)


def test_cli_argument_errors(cli):
    neither = cli.run("start")
    assert neither.returncode == 2 and "exactly one of --head or --address" in neither.stderr
    no_cluster = cli.run("status")
    assert no_cluster.returncode == 1 and "found no running cluster" in no_cluster.stderr
    nothing = cli.run("stop")
    assert nothing.returncode == 0 and "signalled 0 process(es)" in nothing.stdout
    assert cli.sessions() == []
