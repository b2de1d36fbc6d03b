"""Shared fixtures of the browser tests (TOOLCHAIN.md §4).

- ``jupyter_lab``: a factory; ``jupyter_lab(settings={...})`` starts ``jupyter lab`` as a
  child process (free port, a token, ``--allow-root``, fresh settings and workspaces,
  ``window.jupyterapp`` exposed, cluster sessions in a temp dir of the test) and returns a
  :class:`LabServer`. Teardown stops it by its PID (SIGTERM, then SIGKILL).
- ``chromium_page``: a page in Debian's ``/usr/bin/chromium`` driven by Python playwright
  (no browser download), 1400×1000.
- ``nbcluster_panel``: both of the above with this tree's built extension, the nbcluster
  sidebar panel open (update interval 500 ms); a :class:`PanelSession` whose
  ``start_cluster()`` / ``stop_cluster()`` drive the panel's buttons. On a failure it
  writes the page, the lab log and the browser console to ``test-artifacts/<name>-*``;
  teardown stops the lab and checks no cluster process is left.

When this tree has a built lab extension (``nbcluster/labextension/``), the server loads
that one: ``JUPYTER_PATH`` starts with a folder whose ``labextensions/nbcluster`` links
to it (JupyterLab takes the first extension of a name it finds).

Test modules skip themselves when ``/usr/bin/chromium`` is absent (``make test`` installs
it); these fixtures assume it is there.
"""

from __future__ import annotations

import contextlib
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

from nbcluster.testing import assert_no_processes

CHROMIUM = Path("/usr/bin/chromium")
REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO / "test-artifacts"
#: The lab extension built from this tree (``make labext``), served instead of any copy
#: installed in the environment, so the tests check the code they sit beside.
BUILT_LABEXTENSION = REPO / "nbcluster" / "labextension"
LAB_TOKEN = "nbcluster-browser-test"
LAB_START_TIMEOUT_S = 120.0
#: Playwright waits of the panel helpers (a loaded CI machine is slow, never stuck).
PANEL_TIMEOUT_MS = 120_000
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


_FAILED = pytest.StashKey[bool]()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    """Remember on the item that a phase failed (``nbcluster_panel`` saves artifacts then)."""
    report = yield
    if report.failed:
        item.stash[_FAILED] = True
    return report


@dataclass
class PanelSession:
    """A lab in chromium with the nbcluster sidebar panel open (``nbcluster_panel``)."""

    lab: LabServer
    page: Any
    #: Every browser console message, as ``"<type>: <text>"``.
    console: list[str]
    #: Prefix of this test's files in ``test-artifacts/``.
    name: str

    @property
    def panel(self) -> Any:
        """The panel's locator (``#nbcluster-panel``)."""
        return self.page.locator("#nbcluster-panel")

    @property
    def jobs(self) -> Any:
        """The panel's Jobs section."""
        return self.panel.locator(".nbcluster-jobs")

    def shot(self, name: str) -> None:
        """Screenshot of the panel to ``test-artifacts/<prefix>-<name>.png``."""
        self.panel.screenshot(path=str(ARTIFACTS / f"{self.name}-{name}.png"))

    def start_cluster(self, cpus: int = 2) -> dict[str, Any]:
        """Start a cluster from the panel; wait for its card and empty job list; return it
        as the server lists it (``address``, ``session_dir``, ...)."""
        from playwright.sync_api import expect

        self.panel.locator(".nbcluster-start-cpus").fill(str(cpus))
        self.panel.locator(".nbcluster-start-button").click()
        expect(self.panel.locator(".nbcluster-card")).to_have_count(1, timeout=PANEL_TIMEOUT_MS)
        expect(self.jobs.locator(".nbcluster-jobs-empty")).to_contain_text(
            "No jobs yet", timeout=PANEL_TIMEOUT_MS
        )
        code, listing = self.lab.api("GET", "nbcluster/api/clusters")
        assert code == 200, listing
        (cluster,) = listing["clusters"]
        return dict(cluster)

    def stop_cluster(self, cluster: dict[str, Any]) -> None:
        """Stop the cluster with the panel's button; check none of its processes is left."""
        from playwright.sync_api import expect

        self.panel.locator(".nbcluster-stop").click()
        expect(self.panel.locator(".nbcluster-card")).to_have_count(0, timeout=PANEL_TIMEOUT_MS)
        assert_no_processes(Path(cluster["session_dir"]), timeout=30)

    def console_errors(self, word: str) -> list[str]:
        """Console errors whose text holds ``word`` (case-insensitive)."""
        return [m for m in self.console if m.startswith("error") and word.lower() in m.lower()]

    def save_artifacts(self) -> None:
        """The page, the lab's log and the console, to ``test-artifacts/<prefix>-*``."""
        ARTIFACTS.mkdir(exist_ok=True)
        with contextlib.suppress(Exception):  # a dead page must not hide the test's failure
            self.page.screenshot(path=str(ARTIFACTS / f"{self.name}-failure.png"))
        (ARTIFACTS / f"{self.name}-lab.log").write_bytes(self.lab.log.read_bytes())
        (ARTIFACTS / f"{self.name}-console.log").write_text("\n".join(self.console))


@pytest.fixture
def nbcluster_panel(
    request: pytest.FixtureRequest,
    jupyter_lab: Callable[..., LabServer],
    chromium_page: Any,
) -> Iterator[PanelSession]:
    """This tree's lab extension in a lab in chromium, its sidebar panel open."""
    assert (BUILT_LABEXTENSION / "package.json").exists(), (
        "the lab extension of this tree is not built: run `jlpm install && jlpm build` in "
        "labextension/ (or `make labext`)"
    )
    lab = jupyter_lab(settings={"nbcluster:plugin": {"pollInterval": 500}})
    name = request.path.stem.removeprefix("test_").removesuffix("_browser")
    session = PanelSession(lab, chromium_page, [], name)
    page = chromium_page
    page.on("console", lambda m: session.console.append(f"{m.type}: {m.text}"))
    try:
        page.goto(lab.url, timeout=PANEL_TIMEOUT_MS)
        page.wait_for_function("() => window.jupyterapp && window.jupyterapp.shell")
        page.wait_for_selector(".jp-Launcher", timeout=PANEL_TIMEOUT_MS)
        page.locator('.jp-SideBar.jp-mod-left li[data-id="nbcluster-panel"]').click()
        page.locator("#nbcluster-panel").wait_for(timeout=PANEL_TIMEOUT_MS)
    except BaseException:
        session.save_artifacts()
        lab.stop()
        raise
    try:
        yield session
    finally:
        if request.node.stash.get(_FAILED, False):
            session.save_artifacts()
        lab.stop()
    assert_no_processes(lab.sessions_dir, timeout=30)
