"""A driver script that exits with work in flight exits cleanly (issue 20, item 7).

Ray prints nothing of its own when a script ends while lease requests are pending, and
what running tasks printed before the exit still reaches the terminal. Each run is a real
``python script.py`` that starts its own cluster and leaves no process behind.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from nbcluster.testing import assert_no_processes

SCRIPT = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    import nbcluster

    info = nbcluster.init(num_cpus=2)
    print("SESSION", info.session_dir, flush=True)
    marker = Path(sys.argv[2])

    @nbcluster.remote
    def chatty(i):
        print(f"task {i} started", flush=True)
        time.sleep(0.02)  # the worker sends the next line after its 0.1 s flush interval
        print(f"task {i} still running", flush=True)
        marker.write_text("started")
        time.sleep(60)

    refs = [chatty.remote(i) for i in range(8)]  # more than 2 CPUs: leases are pending
    if sys.argv[1] == "after_output":
        deadline = time.monotonic() + 60
        while not marker.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
    """
)

NOISE = ("Task exception was never retrieved", "Channel is closed", "Traceback", "Error")


def _run(tmp_path: Path, mode: str) -> tuple[str, str]:
    script = tmp_path / "driver.py"
    script.write_text(SCRIPT)
    env = dict(os.environ, NBCLUSTER_TEMP_DIR=str(tmp_path / "sessions"))
    proc = subprocess.run(
        [sys.executable, str(script), mode, str(tmp_path / "marker")],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    session = next(
        line.split(" ", 1)[1] for line in proc.stdout.splitlines() if line.startswith("SESSION")
    )
    assert_no_processes(session, timeout=15)
    return proc.stdout, proc.stderr


@pytest.mark.parametrize("attempt", range(3))
def test_a_driver_exiting_with_lease_requests_in_flight_prints_nothing(
    tmp_path: Path, attempt: int
):
    _, stderr = _run(tmp_path, "immediately")
    for noise in NOISE:
        assert noise not in stderr, stderr


def test_output_of_running_tasks_is_printed_before_the_driver_exits(tmp_path: Path):
    stdout, stderr = _run(tmp_path, "after_output")
    assert "chatty pid=" in stdout and "started" in stdout, (stdout, stderr)
    assert "still running" in stdout, (stdout, stderr)
    for noise in NOISE:
        assert noise not in stderr, stderr
