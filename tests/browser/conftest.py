"""Shared fixtures of the browser tests (TOOLCHAIN.md §4).

- ``jupyter_lab``: a factory; ``jupyter_lab(settings={...})`` starts ``jupyter lab`` as a
  child process (free port, a token, ``--allow-root``, fresh settings and workspaces,
  ``window.jupyterapp`` exposed, cluster sessions in a temp dir of the test) and returns a
  :class:`LabServer`. Teardown stops it by its PID (SIGTERM, then SIGKILL).
- ``chromium_page``: a page in Debian's ``/usr/bin/chromium`` driven by Python playwright
  (no browser download), 1400×1000.

When this tree has a built lab extension (``nbcluster/labextension/``), the server loads
that one: ``JUPYTER_PATH`` starts with a folder whose ``labextensions/nbcluster`` links
to it (JupyterLab takes the first extension of a name it finds).

Test modules skip themselves when ``/usr/bin/chromium`` is absent (``make test`` installs
it); these fixtures assume it is there.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

CHROMIUM = Path("/usr/bin/chromium")
REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO / "test-artifacts"
#: The lab extension built from this tree (``make labext``), served instead of any copy
#: installed in the environment, so the tests check the code they sit beside.
BUILT_LABEXTENSION = REPO / "nbcluster" / "labextension"
LAB_TOKEN = "nbcluster-browser-test"
LAB_START_TIMEOUT_S = 120.0
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
]


def free_port() -> int:
    """A port nothing listens on right now (``jupyter lab`` does not accept port 0)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class LabServer:
    """A running ``jupyter lab`` started by a test."""

    proc: subprocess.Popen[bytes]
    port: int
    token: str
    root_dir: Path
    sessions_dir: Path
    log: Path

    @property
    def url(self) -> str:
        """The lab page, logged in with the token."""
        return f"http://127.0.0.1:{self.port}/lab?token={self.token}"

    def api(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        """Call the server's REST API with the token; return (status, parsed JSON or None)."""
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(
            f"http://127.0.0.1:{self.port}/{path.lstrip('/')}",
            data=data,
            method=method,
            headers={"Authorization": f"token {self.token}"},
        )
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                raw = r.read()
                return r.status, json.loads(raw) if raw else None
        except urllib.error.HTTPError as err:
            raw = err.read()
            return err.code, json.loads(raw) if raw else None

    def wait_ready(self) -> None:
        """Wait until ``/api/status`` answers (fails early if the process exits)."""
        deadline = time.monotonic() + LAB_START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(
                    f"jupyter lab exited with {self.proc.returncode}:\n{self.log.read_text()}"
                )
            try:
                if self.api("GET", "api/status")[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.25)
        raise AssertionError(
            f"jupyter lab did not answer within {LAB_START_TIMEOUT_S}s:\n{self.log.read_text()}"
        )

    def stop(self) -> None:
        """SIGTERM to the server's PID (it shuts its kernels down), SIGKILL if it hangs."""
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)


@pytest.fixture
def jupyter_lab(tmp_path: Path) -> Iterator[Callable[..., LabServer]]:
    """Factory: start ``jupyter lab`` with optional user settings ``{plugin_id: {...}}``."""
    servers: list[LabServer] = []

    def start(settings: dict[str, dict[str, Any]] | None = None) -> LabServer:
        base = tmp_path / f"lab{len(servers)}"
        settings_dir = base / "settings"
        all_settings: dict[str, dict[str, Any]] = {
            "@jupyterlab/apputils-extension:notification": {
                "fetchNews": "false",
                "checkForUpdates": False,
            },
            **(settings or {}),
        }
        for plugin_id, values in all_settings.items():
            package, _, plugin = plugin_id.partition(":")
            path = settings_dir / package / f"{plugin}.jupyterlab-settings"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(values))
        for sub in ("workspaces", "root", "clusters"):
            (base / sub).mkdir(parents=True)
        port = free_port()
        log = base / "lab.log"
        cmd = [
            sys.executable,
            "-m",
            "jupyterlab",
            "--no-browser",
            f"--port={port}",
            "--ip=127.0.0.1",
            f"--IdentityProvider.token={LAB_TOKEN}",
            "--allow-root",
            f"--ServerApp.root_dir={base / 'root'}",
            "--LabApp.expose_app_in_browser=True",
            f"--LabApp.user_settings_dir={settings_dir}",
            f"--LabApp.workspaces_dir={base / 'workspaces'}",
        ]
        env = {**os.environ, "NBCLUSTER_TEMP_DIR": str(base / "clusters")}
        if (BUILT_LABEXTENSION / "package.json").exists():
            share = base / "share"
            (share / "labextensions").mkdir(parents=True)
            (share / "labextensions" / "nbcluster").symlink_to(BUILT_LABEXTENSION)
            env["JUPYTER_PATH"] = os.pathsep.join(
                p for p in (str(share), os.environ.get("JUPYTER_PATH", "")) if p
            )
        with open(log, "wb") as out:
            proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
        server = LabServer(proc, port, LAB_TOKEN, base / "root", base / "clusters", log)
        servers.append(server)
        server.wait_ready()
        return server

    try:
        yield start
    finally:
        for server in servers:
            server.stop()


@pytest.fixture
def chromium_page() -> Iterator[Any]:
    """A playwright page in Debian's chromium (never a downloaded browser)."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.fail(
            "playwright is not installed: `pip install playwright` (never `playwright install`)"
        )
    ARTIFACTS.mkdir(exist_ok=True)
    with sync_playwright() as pw:
        browser = pw.chromium.launch(
            executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS
        )
        try:
            yield browser.new_page(viewport={"width": 1400, "height": 1000})
        finally:
            browser.close()
