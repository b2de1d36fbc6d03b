"""The nbcluster sidebar and status bar in a real JupyterLab, in Debian's headless chromium.

The test starts ``jupyter lab`` (extension enabled by the installed config, update
interval set to 500 ms through the settings schema), then, in the browser: opens the
panel, starts a 2-CPU cluster, sees its card with CPU total 2, creates a notebook,
inserts and runs the connect code, runs tasks and sees the status bar show them (pushed:
the page long-polls ``updates``, and makes no request while the cluster is idle), scales
the cluster to 2 nodes and stops it; no cluster process is left. Screenshots go to
``test-artifacts/labextension-*.png``.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from nbcluster.testing import assert_no_processes

CHROMIUM = Path("/usr/bin/chromium")
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
TIMEOUT_MS = 120_000

pytestmark = [
    pytest.mark.browser,
    pytest.mark.slow,
    pytest.mark.skipif(
        not CHROMIUM.exists(),
        reason="/usr/bin/chromium is absent: `make chromium` (apt-get install -y chromium) "
        "installs it; see tests/browser/README.md",
    ),
]

KERNEL_IDLE_JS = """() => {
    const w = window.jupyterapp.shell.currentWidget;
    const k = w && w.sessionContext && w.sessionContext.session && w.sessionContext.session.kernel;
    return !!k && k.status === 'idle';
}"""

# Insert a code cell below the active one in the current notebook, and run it (without
# waiting for it: the test waits for the cell's output instead).
RUN_CELL_JS = """async (code) => {
    const app = window.jupyterapp;
    await app.commands.execute('notebook:insert-cell-below');
    app.shell.currentWidget.content.activeCell.model.sharedModel.setSource(code);
    app.commands.execute('notebook:run-cell');
    return true;
}"""

TASKS_CELL = """import time

@nbcluster.remote
def busy(i):
    time.sleep(10)
    return i

refs = [busy.remote(i) for i in range(2)]
print("SUBMITTED", len(refs))"""


def shot(target: Any, name: str) -> None:
    target.screenshot(path=str(ARTIFACTS / f"labextension-{name}.png"))


@pytest.mark.timeout(900)
def test_panel_start_connect_run_scale_stop(
    jupyter_lab: Callable[..., Any], chromium_page: Any
) -> None:
    from playwright.sync_api import expect

    lab = jupyter_lab(settings={"nbcluster:plugin": {"pollInterval": 500}})
    page = chromium_page
    console: list[str] = []
    page.on("console", lambda m: console.append(f"{m.type}: {m.text}"))
    requests: list[str] = []
    page.on("request", lambda r: requests.append(r.url) if "/nbcluster/api/" in r.url else None)
    try:
        page.goto(lab.url, timeout=TIMEOUT_MS)
        page.wait_for_function("() => window.jupyterapp && window.jupyterapp.shell")
        page.wait_for_selector(".jp-Launcher", timeout=TIMEOUT_MS)

        # The panel: a sidebar tab, and the start form.
        page.locator('.jp-SideBar.jp-mod-left li[data-id="nbcluster-panel"]').click()
        panel = page.locator("#nbcluster-panel")
        expect(panel.locator(".nbcluster-title")).to_have_text("nbcluster")
        expect(panel.locator(".nbcluster-card")).to_have_count(0)
        status = page.locator("#nbcluster-statusbar")
        expect(status).to_have_text("nbcluster: no cluster", timeout=TIMEOUT_MS)

        # Start a cluster with 2 CPUs: its card shows CPU total 2.
        panel.locator(".nbcluster-start-cpus").fill("2")
        panel.locator(".nbcluster-start-nodes").fill("1")
        panel.locator(".nbcluster-start-button").click()
        card = panel.locator(".nbcluster-card")
        expect(card).to_have_count(1, timeout=TIMEOUT_MS)
        expect(card.locator(".nbcluster-cpu")).to_have_text("0/2", timeout=TIMEOUT_MS)
        expect(card.locator(".nbcluster-nodes")).to_have_text("1")
        expect(card.locator(".nbcluster-origin")).to_have_text("started here")
        code, listing = lab.api("GET", "nbcluster/api/clusters")
        assert code == 200
        (cluster,) = listing["clusters"]
        expect(card.locator(".nbcluster-address")).to_have_text(cluster["address"])
        session_dir = Path(cluster["session_dir"])
        assert session_dir.parent == lab.sessions_dir
        shot(panel, "1-started")

        # A new notebook; insert the connect code from the card, which also runs it.
        page.evaluate(
            "() => window.jupyterapp.commands"
            ".execute('notebook:create-new', {kernelName: 'python3'}).then(() => true)"
        )
        page.wait_for_function(KERNEL_IDLE_JS, timeout=TIMEOUT_MS)
        card.locator(".nbcluster-connect").click()
        connect_cell = page.locator(".jp-Notebook .jp-Cell").filter(
            has_text=f"%cluster connect {cluster['address']}"
        )
        expect(connect_cell).to_have_count(1, timeout=TIMEOUT_MS)
        expect(connect_cell.locator(".jp-OutputArea-output").first).to_be_visible(
            timeout=TIMEOUT_MS
        )
        page.wait_for_function(KERNEL_IDLE_JS, timeout=TIMEOUT_MS)
        page.evaluate(
            RUN_CELL_JS,
            "import nbcluster\n"
            "print('CONNECTED', nbcluster.is_initialized(), nbcluster.cluster_resources()['CPU'])",
        )
        page.get_by_text("CONNECTED True 2.0").wait_for(timeout=TIMEOUT_MS)

        # Tasks that hold both CPUs for a while: the status bar shows the load.
        page.evaluate(RUN_CELL_JS, TASKS_CELL)
        page.get_by_text("SUBMITTED 2").wait_for(timeout=TIMEOUT_MS)
        expect(status).to_have_text(
            re.compile(r"^nbcluster: CPU [12](\.\d+)?/2 · store \d+%$"), timeout=TIMEOUT_MS
        )
        shot(page.locator(".jp-StatusBar-Widget"), "2-statusbar-busy")
        shot(page, "3-notebook")
        page.wait_for_function(KERNEL_IDLE_JS, timeout=TIMEOUT_MS)
        page.evaluate(RUN_CELL_JS, "print('SUM', sum(nbcluster.get(refs)))")
        page.get_by_text("SUM 1").wait_for(timeout=TIMEOUT_MS)
        expect(status).to_have_text("nbcluster: CPU 0/2 · store 0%", timeout=TIMEOUT_MS)
        # The load reached the status bar through the pushed updates (the long poll), and
        # nothing polls the loads: an idle cluster leaves the page quiet (but for the Jobs
        # section's list, read every 10 s to show jobs submitted elsewhere).
        assert any("/nbcluster/api/updates?after=" in u for u in requests), requests
        page.wait_for_timeout(1500)
        quiet_from = len(requests)
        page.wait_for_timeout(3000)
        idle_requests = [u for u in requests[quiet_from:] if not u.endswith("/jobs")]
        assert not [u for u in idle_requests if u.endswith("/load")], idle_requests
        assert len(idle_requests) <= 1, idle_requests  # at most one long poll answered

        # Scale to 2 nodes from the card.
        card.locator(".nbcluster-scale-input").fill("2")
        card.locator(".nbcluster-scale-button").click()
        expect(card.locator(".nbcluster-nodes")).to_have_text("2", timeout=TIMEOUT_MS)
        expect(card.locator(".nbcluster-cpu")).to_have_text("0/4", timeout=TIMEOUT_MS)
        expect(status).to_have_text(re.compile(r"CPU 0/4"), timeout=TIMEOUT_MS)
        shot(panel, "4-scaled")

        # Stop it: the card goes, and so does every process of the cluster.
        card.locator(".nbcluster-stop").click()
        expect(panel.locator(".nbcluster-card")).to_have_count(0, timeout=TIMEOUT_MS)
        expect(status).to_have_text("nbcluster: no cluster", timeout=TIMEOUT_MS)
        assert_no_processes(session_dir, timeout=30)
        expect(panel.locator(".nbcluster-error")).to_have_text("")
        shot(page, "5-stopped")

        assert page.locator("text=Traceback").count() == 0
        errors = [m for m in console if m.startswith("error") and "nbcluster" in m.lower()]
        assert not errors, errors
    except BaseException:
        page.screenshot(path=str(ARTIFACTS / "labextension-failure.png"))
        (ARTIFACTS / "labextension-lab.log").write_bytes(lab.log.read_bytes())
        (ARTIFACTS / "labextension-console.log").write_text("\n".join(console))
        raise
    finally:
        lab.stop()
    assert_no_processes(lab.sessions_dir, timeout=30)
