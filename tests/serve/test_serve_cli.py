"""``nbcluster serve run|status|deploy|shutdown`` against a cluster started with
``nbcluster start --head`` (each command is a separate process, like a user's shell)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil
import pytest

import nbcluster
from nbcluster.testing import cluster_processes

pytestmark = pytest.mark.integration
CLI = [sys.executable, "-m", "nbcluster.cli"]

APP = textwrap.dedent(
    """
    from nbcluster import serve

    @serve.deployment(ray_actor_options={"num_cpus": 0})
    class Greeter:
        def __init__(self, greeting="hello"):
            self.greeting = greeting

        def __call__(self, request):
            return f"{self.greeting} from {serve.get_replica_context().app_name}"

    app = Greeter.bind()

    def builder(args):
        return Greeter.bind(args.get("greeting", "hi"))
    """
)


class Shell:
    """Runs ``nbcluster`` commands in one temp dir; kills what is left at the end."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.env = {
            **os.environ,
            "NBCLUSTER_TEMP_DIR": str(tmp / "sessions"),
            "PYTHONPATH": os.pathsep.join([str(tmp), os.environ.get("PYTHONPATH", "")]),
        }
        self.env.pop("NBCLUSTER_ADDRESS", None)

    def run(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*CLI, *args],
            env=self.env,
            cwd=self.tmp,
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
        )

    def cleanup(self) -> None:
        with contextlib.suppress(Exception):
            self.run("stop", timeout=30)
        for proc in cluster_processes(self.tmp / "sessions"):
            with contextlib.suppress(psutil.NoSuchProcess, ProcessLookupError):
                os.kill(proc.pid, signal.SIGKILL)


@pytest.fixture
def shell(tmp_path: Path) -> Iterator[Shell]:
    if nbcluster.is_initialized():
        nbcluster.shutdown()
    (tmp_path / "myapp.py").write_text(APP)
    s = Shell(tmp_path)
    try:
        yield s
    finally:
        s.cleanup()


def _ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    return result.stdout


def test_serve_cli_run_status_deploy_shutdown(shell: Shell) -> None:
    _ok(shell.run("start", "--head", "--num-cpus", "2"))
    out = _ok(
        shell.run("serve", "run", "myapp:app", "--non-blocking", "--port", "0", "--name", "one")
    )
    url = out.split("is ready at ", 1)[1].split()[0]
    assert httpx.get(url, timeout=30).text == "hello from one"

    status = json.loads(_ok(shell.run("serve", "status", "--json")))
    assert status["applications"]["one"]["status"] == "RUNNING"
    assert "Greeter: HEALTHY" in _ok(shell.run("serve", "status"))

    config = shell.tmp / "serve.yaml"
    config.write_text(
        textwrap.dedent(
            """
            applications:
              - name: two
                route_prefix: /two
                import_path: myapp:builder
                args: {greeting: hey}
                deployments:
                  - name: Greeter
                    num_replicas: 2
            """
        )
    )
    out = _ok(shell.run("serve", "deploy", str(config)))
    assert "Deployed 1 application(s): two" in out
    status = json.loads(_ok(shell.run("serve", "status", "--json")))
    assert list(status["applications"]) == ["two"]  # declarative: 'one' was removed
    two = status["applications"]["two"]["deployments"]["Greeter"]
    assert two["replica_states"] == {"RUNNING": 2}
    base = url.rstrip("/")
    assert httpx.get(f"{base}/two", timeout=30).text == "hey from two"

    _ok(shell.run("serve", "shutdown", "-y"))
    status = json.loads(_ok(shell.run("serve", "status", "--json")))
    assert status["applications"] == {}


def test_serve_cli_reports_bad_input(shell: Shell) -> None:
    bad = shell.tmp / "bad.yaml"
    bad.write_text(
        "applications:\n  - import_path: myapp:app\n    deployments:\n      - {name: Greeter, num_replicas: -1}\n"
    )
    r = shell.run("serve", "deploy", str(bad))
    assert r.returncode == 1 and "num_replicas must be >= 0" in r.stderr
    r = shell.run("serve", "run", "nosuchmodule:app", "--non-blocking")
    assert r.returncode == 1
    assert "no running cluster" in r.stderr or "cannot import 'nosuchmodule'" in r.stderr
    assert "Traceback" not in r.stderr
