"""``nbcluster up / attach / status / down`` with the local provider, as a user runs them."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from nbcluster.testing import assert_no_processes, poll_for

pytestmark = pytest.mark.integration

CONFIG = """
cluster_name: clidemo
max_workers: 2
idle_timeout_minutes: 5
provider: {type: local}
head_node_type: head
available_node_types:
  head: {resources: {CPU: 1}, max_workers: 0}
  cpu1: {resources: {CPU: 1}, min_workers: 1, max_workers: 2}
update_interval_s: 0.3
"""


def _cli(tmp_path: Path, *args: str, timeout: float = 90) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "NBCLUSTER_TEMP_DIR": str(tmp_path / "sessions")}
    return subprocess.run(
        [sys.executable, "-m", "nbcluster.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        stdin=subprocess.DEVNULL,
    )


def _session(out: str) -> str:
    m = re.search(r"session dir: (\S+)", out)
    assert m, out
    return m.group(1)


def test_up_attach_status_down(tmp_path: Path) -> None:
    cfg = tmp_path / "cluster.yaml"
    cfg.write_text(CONFIG)
    up = _cli(tmp_path, "up", str(cfg))
    assert up.returncode == 0, up.stderr[-2000:]
    assert "cluster 'clidemo' (local provider) is up" in up.stdout
    assert "launching min_workers: 1 x cpu1" in up.stdout
    address = re.search(r"%cluster connect (127\.0\.0\.1:\d+)", up.stdout).group(1)  # type: ignore[union-attr]
    session = _session(up.stdout)
    try:
        again = _cli(tmp_path, "up", str(cfg))
        assert again.returncode == 0 and f"is already up at {address}" in again.stdout
        attach = _cli(tmp_path, "attach", "--name", "clidemo")
        assert attach.returncode == 0
        assert f"%cluster connect {address}" in attach.stdout
        assert f"%cluster connect nbcluster://{address}" in attach.stdout
        assert "NBCLUSTER_TOKEN_FILE=" in attach.stdout

        def status() -> str:
            out = _cli(tmp_path, "status", "--address", address)
            return out.stdout if "1 running, 0 launching" in out.stdout else ""

        text = poll_for(status, 60, 0.5, "the min_workers node did not start")
        assert "autoscaler: cluster 'clidemo', local provider" in text
        assert re.search(r"node [0-9a-f]{8} clidemo-cpu1-[0-9a-f]{6}", text), text
        assert "launch          launching 1 x cpu1 for min_workers" in text
    finally:
        down = _cli(tmp_path, "down", str(cfg))
    assert down.returncode == 0, down.stderr
    assert "stopped cluster 'clidemo'" in down.stdout
    assert_no_processes(session, timeout=20)
    gone = _cli(tmp_path, "attach", "--name", "clidemo")
    assert gone.returncode == 1 and "no cluster named 'clidemo' is running" in gone.stderr


def test_nbcluster_stop_also_stops_the_autoscaler_and_its_nodes(tmp_path: Path) -> None:
    cfg = tmp_path / "cluster.yaml"
    cfg.write_text(CONFIG)
    up = _cli(tmp_path, "up", str(cfg))
    assert up.returncode == 0, up.stderr[-2000:]
    session = _session(up.stdout)
    nodes = Path(session) / "autoscaler" / "local-nodes.json"
    poll_for(lambda: nodes.exists() and "clidemo-cpu1" in nodes.read_text(), 60, 0.2)
    stop = _cli(tmp_path, "stop")
    assert stop.returncode == 0, stop.stderr
    assert_no_processes(session, timeout=20)


def test_up_refuses_a_bad_config_with_the_fix(tmp_path: Path) -> None:
    cfg = tmp_path / "bad.yaml"
    cfg.write_text(CONFIG.replace("max_workers: 2", "max_worker: 2"))
    out = _cli(tmp_path, "up", str(cfg))
    assert out.returncode == 2
    assert "nbcluster up: unknown key 'max_worker'; did you mean 'max_workers'?" in out.stderr
    assert not (tmp_path / "sessions").exists() or not list(
        (tmp_path / "sessions").glob("session_*")
    )
