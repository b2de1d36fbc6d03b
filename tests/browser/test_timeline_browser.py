"""The Timeline widget in a real JupyterLab, in Debian's headless chromium (TOOLCHAIN §4).

The test starts ``jupyter lab`` itself (fresh settings and workspaces, a free port, a
token), writes a notebook that starts a 2-CPU cluster, runs 20 tasks and displays
``Timeline()``, runs it in the browser with Python playwright driving
``/usr/bin/chromium`` (no browser download), and checks in the page that the plotly plot
holds 20 bars. Screenshots go to ``test-artifacts/``. The server is stopped by its PID,
which ends the kernel and, through the parent-death watch, the kernel's cluster.

Needs ``apt-get install -y chromium`` (see ``tests/browser/README.md``); skipped only when
``/usr/bin/chromium`` is absent.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import nbformat
import pytest

import nbcluster
from nbcluster.testing import assert_no_processes, cluster_processes

CHROMIUM = Path("/usr/bin/chromium")
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
TOKEN = "nbcluster-browser-test"
N_TASKS = 20
DEADLINE_S = 90.0
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
]

pytestmark = [
    pytest.mark.browser,
    pytest.mark.slow,
    pytest.mark.skipif(
        not CHROMIUM.exists(),
        reason="/usr/bin/chromium is absent: install it with `apt-get install -y chromium` "
        "(tests/browser/README.md)",
    ),
]

# JavaScript: the total number of bars in every plotly plot on the page.
BAR_COUNT_JS = """() => Array.from(document.querySelectorAll('.js-plotly-plot'))
    .flatMap(el => el.data || [])
    .filter(t => t.type === 'bar')
    .reduce((n, t) => n + (t.x ? t.x.length : 0), 0)"""
KERNEL_IDLE_JS = """() => {
    const w = window.jupyterapp.shell.currentWidget;
    const k = w && w.sessionContext && w.sessionContext.session && w.sessionContext.session.kernel;
    return !!k && k.status === 'idle';
}"""
TRACE_NAMES_JS = """() => Array.from(document.querySelectorAll('.js-plotly-plot'))
    .flatMap(el => el.data || []).map(t => t.name)"""


def free_port() -> int:
    """A port nothing listens on right now (jupyter lab does not accept port 0)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def write_notebook(path: Path) -> None:
    if hasattr(nbcluster, "load_ipython_extension"):
        start = "%load_ext nbcluster\n%cluster start --num-cpus 2"
    else:  # the magics are not wired yet
        start = "import nbcluster\nnbcluster.init(num_cpus=2)"
    cells = [
        start,
        "import time\nimport nbcluster\n\n"
        "@nbcluster.remote\n"
        "def simulate(i):\n"
        "    time.sleep(0.05)\n"
        "    return i\n\n"
        f"print('SUM', sum(nbcluster.get([simulate.remote(i) for i in range({N_TASKS})])))",
        "from nbcluster.jupyter.widgets import Timeline\n\ntl = Timeline()\ntl",
        "deadline = time.monotonic() + 60\n"
        f"while tl.total < {N_TASKS} and time.monotonic() < deadline:\n"
        "    time.sleep(0.2)\n"
        "print('TIMELINE BARS', tl.total)",
    ]
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    nb.metadata["kernelspec"] = {
        "name": "python3",
        "display_name": "Python 3",
        "language": "python",
    }
    nbformat.write(nb, path)


def start_lab(tmp: Path, port: int, env: dict[str, str]) -> subprocess.Popen[bytes]:
    settings = tmp / "settings"
    notif = settings / "@jupyterlab" / "apputils-extension" / "notification.jupyterlab-settings"
    notif.parent.mkdir(parents=True)
    notif.write_text(json.dumps({"fetchNews": "false", "checkForUpdates": False}))
    (tmp / "workspaces").mkdir()
    cmd = [
        sys.executable,
        "-m",
        "jupyterlab",
        "--no-browser",
        f"--port={port}",
        "--ip=127.0.0.1",
        f"--IdentityProvider.token={TOKEN}",
        "--allow-root",
        f"--ServerApp.root_dir={tmp / 'root'}",
        "--LabApp.expose_app_in_browser=True",
        f"--LabApp.user_settings_dir={settings}",
        f"--LabApp.workspaces_dir={tmp / 'workspaces'}",
    ]
    log = open(tmp / "lab.log", "wb")  # noqa: SIM115 - closed with the process, in stop_lab
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)


def wait_for_server(proc: subprocess.Popen[bytes], port: int, log: Path) -> None:
    url = f"http://127.0.0.1:{port}/api/status?token={TOKEN}"
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"jupyter lab exited with {proc.returncode}:\n{log.read_text()}")
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.2)
    raise AssertionError(f"jupyter lab did not answer within {DEADLINE_S}s:\n{log.read_text()}")


def stop_lab(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the server's PID (it shuts its kernels down), SIGKILL if it hangs."""
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


@pytest.mark.timeout(600)
def test_timeline_renders_one_bar_per_task(tmp_path: Path) -> None:
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.fail(
            "playwright is not installed: `pip install playwright` (never `playwright install`)"
        )
    ARTIFACTS.mkdir(exist_ok=True)
    (tmp_path / "root").mkdir()
    write_notebook(tmp_path / "root" / "widgets.ipynb")
    sessions = tmp_path / "nbc"
    env = {**os.environ, "NBCLUSTER_TEMP_DIR": str(sessions)}
    port = free_port()
    proc = start_lab(tmp_path, port, env)
    page: Any = None
    try:
        wait_for_server(proc, port, tmp_path / "lab.log")
        with sync_playwright() as pw:
            browser = pw.chromium.launch(
                executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS
            )
            try:
                page = browser.new_page(viewport={"width": 1400, "height": 1000})
                console_errors: list[str] = []
                page.on(
                    "console",
                    lambda m: console_errors.append(m.text) if m.type == "error" else None,
                )
                page.goto(f"http://127.0.0.1:{port}/lab?token={TOKEN}", timeout=DEADLINE_S * 1000)
                page.wait_for_function("() => window.jupyterapp && window.jupyterapp.shell")
                page.wait_for_selector(".jp-Launcher", timeout=DEADLINE_S * 1000)
                # Open with an explicit kernel, so JupyterLab asks nothing.
                page.evaluate(
                    """() => window.jupyterapp.commands
                        .execute('docmanager:open', {
                            path: 'widgets.ipynb', factory: 'Notebook', kernel: {name: 'python3'}})
                        .then(() => true)"""
                )
                page.wait_for_function(KERNEL_IDLE_JS, timeout=DEADLINE_S * 1000)
                # Do not await the command's promise: it settles only when every cell ran.
                page.evaluate(
                    "() => { window.jupyterapp.commands.execute('notebook:run-all-cells'); }"
                )
                page.get_by_text(f"TIMELINE BARS {N_TASKS}").wait_for(timeout=DEADLINE_S * 1000)
                page.wait_for_function(
                    f"() => ({BAR_COUNT_JS})() >= {N_TASKS}", timeout=DEADLINE_S * 1000
                )
                plot = page.locator(".js-plotly-plot").first
                plot.scroll_into_view_if_needed()
                plot.screenshot(path=str(ARTIFACTS / "timeline-plot.png"))
                page.screenshot(path=str(ARTIFACTS / "timeline-page.png"))

                assert page.evaluate(BAR_COUNT_JS) == N_TASKS
                assert page.evaluate(TRACE_NAMES_JS) == ["simulate"]
                assert page.get_by_text(f"SUM {sum(range(N_TASKS))}").count() == 1
                assert page.locator("text=Traceback").count() == 0
                assert page.locator("text=Loading widget").count() == 0
                assert page.locator(".js-plotly-plot .bars path").count() == N_TASKS
                title = page.locator(".js-plotly-plot .gtitle").first.text_content() or ""
                assert f"{N_TASKS} attempts" in title, title
                widget_errors = [e for e in console_errors if "widget" in e.lower()]
                assert not widget_errors, widget_errors
            except BaseException:
                if page is not None:
                    page.screenshot(path=str(ARTIFACTS / "timeline-failure.png"))
                (ARTIFACTS / "timeline-lab.log").write_bytes((tmp_path / "lab.log").read_bytes())
                raise
            finally:
                browser.close()
    finally:
        stop_lab(proc)
    assert_no_processes(sessions, timeout=30)
    assert not cluster_processes(sessions)
