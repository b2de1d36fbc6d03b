"""``nbcluster start --address ... --block`` stopped (SIGTERM) while its node is still joining
stops the node too: the node runs in its own session, so nothing else would end it (a pod
deleted while starting left an orphaned node manager behind)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil

from nbcluster._runtime import proc
from nbcluster.testing import pid_alive, poll_for


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_sigterm_while_the_node_is_joining_stops_the_node(tmp_path: Path) -> None:
    proc.create_token_file(tmp_path)
    # No head listens there: the node keeps trying to register, and the CLI keeps waiting.
    address = f"127.0.0.1:{_free_port()}"
    env = {**os.environ, "NBCLUSTER_TEMP_DIR": str(tmp_path / "sessions")}
    cli = subprocess.Popen(
        [sys.executable, "-m", "nbcluster.cli", "start", "--address", address, "--block"]
        + ["--token-file", str(tmp_path / proc.TOKEN_FILE), "--host", "127.0.0.1"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        env=env,
    )
    node: psutil.Process | None = None
    try:
        children = poll_for(lambda: psutil.Process(cli.pid).children(), 30, 0.02)
        node = children[0]
        assert "nbcluster._runtime.node.main" in " ".join(node.cmdline())
        time.sleep(0.5)  # the node is up and retrying; the CLI is still in its join wait
        os.kill(cli.pid, signal.SIGTERM)
        out, _ = cli.communicate(timeout=30)
        assert b"stopped before the node joined" in out, out.decode(errors="replace")
        poll_for(lambda: not pid_alive(node.pid), 10)  # (it may end between two questions)
    finally:
        if cli.poll() is None:
            os.killpg(cli.pid, signal.SIGKILL)
            cli.wait(10)
        if node is not None and node.is_running():
            os.killpg(node.pid, signal.SIGKILL)  # the node leads its own session
