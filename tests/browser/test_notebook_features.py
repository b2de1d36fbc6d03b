"""Issue 13 in a real JupyterLab (headless chromium): per-cell log areas and notebooks that
carry their cluster.

One lab server, one notebook, in order:

1. ``%cluster start --num-cpus 1 --nodes 2``: the lab extension writes the record into
   the notebook's metadata (read back from the notebook model, then from the saved file).
2. Late output: cell A submits a task that prints after A finished; cell B sleeps. While
   B still runs, the line shows in A's log area (the widget under A), not under B; the
   area's filters narrow what it shows, and its toggle folds it.
   A task's rich ``display()`` (HTML, a PNG) renders in its cell's log area, with the
   HTML's script and event handler removed.
3. ``%cluster stop``, restart the kernel, ``%cluster start`` with no arguments: the lab
   extension handed the notebook's record to the new kernel, which starts the same
   cluster and says so.

Screenshots go to ``test-artifacts/features-*.png``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import nbformat
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
        reason="/usr/bin/chromium is absent: `make chromium` installs it (tests/browser/README.md)",
    ),
]

OPEN_JS = """() => window.jupyterapp.commands
    .execute('docmanager:open', {path: 'carry.ipynb', factory: 'Notebook',
                                 kernel: {name: 'python3'}})
    .then(() => true)"""
KERNEL_IDLE_JS = """() => {
    const w = window.jupyterapp.shell.currentWidget;
    const k = w && w.sessionContext && w.sessionContext.session && w.sessionContext.session.kernel;
    return !!k && k.status === 'idle';
}"""
# Put `code` in the last cell (a new one below it) and run it, without waiting.
RUN_CELL_JS = """async (code) => {
    const app = window.jupyterapp;
    const nb = app.shell.currentWidget.content;
    nb.activeCellIndex = nb.widgets.length - 1;
    if (nb.activeCell.model.sharedModel.getSource().trim() !== '') {
        await app.commands.execute('notebook:insert-cell-below');
    }
    nb.activeCell.model.sharedModel.setSource(code);
    app.commands.execute('notebook:run-cell');
    return nb.activeCellIndex;
}"""
METADATA_JS = (
    """() => window.jupyterapp.shell.currentWidget.model.getMetadata('nbcluster') || null"""
)
SAVE_JS = """() => window.jupyterapp.shell.currentWidget.context.save().then(() => true)"""
RESTART_JS = """() => window.jupyterapp.shell.currentWidget.sessionContext.session.kernel
    .restart().then(() => true)"""
# What a cell's outputs hold, from the notebook model (rendered or scrolled away).
OUTPUTS_JS = """(i) => JSON.stringify(
    window.jupyterapp.shell.currentWidget.model.cells.get(i).toJSON().outputs || [])"""
CELL_RUNNING_JS = """(i) => {
    const cell = window.jupyterapp.shell.currentWidget.content.widgets[i];
    return cell.model.executionState === 'running' || cell.promptNode.textContent.includes('*');
}"""

LATE_TASK = """import time, nbcluster

@nbcluster.remote
def speak(delay, word):
    time.sleep(delay)
    print(word, flush=True)
    return word

@nbcluster.remote
def grumble():
    import logging
    logging.getLogger('grumble').warning('grumble-warning')

late_ref = speak.remote(3, 'LATE' + '-OUTPUT')
nbcluster.get(grumble.remote())"""


RICH_TASK = """import base64, nbcluster
from IPython.display import HTML, Image, display

PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="
)

@nbcluster.remote
def rich():
    display(HTML("<b class='rich-mark'>RICH-HTML</b><script>window.__nbcPwned = 1</script>"
                 "<img class='evil' src='data:image/png;base64,AAAA' onerror='window.__nbcPwned = 2'>"))
    display(Image(data=PNG))

nbcluster.get(rich.remote())"""


def wait_output(page: Any, i: int, text: str) -> str:
    """Wait until cell ``i``'s outputs contain ``text``; return them (JSON text)."""
    page.wait_for_function(
        "([i, text]) => JSON.stringify(window.jupyterapp.shell.currentWidget.model.cells"
        ".get(i).toJSON().outputs || []).includes(text)",
        arg=[i, text],
        timeout=TIMEOUT_MS,
    )
    return str(page.evaluate(OUTPUTS_JS, i))


def shot(target: Any, name: str) -> None:
    target.screenshot(path=str(ARTIFACTS / f"features-{name}.png"))


@pytest.mark.timeout(900)
def test_log_areas_and_notebook_metadata_in_jupyterlab(
    jupyter_lab: Callable[..., Any], chromium_page: Any
) -> None:
    from playwright.sync_api import expect

    lab = jupyter_lab()
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {
        "name": "python3",
        "display_name": "Python 3",
        "language": "python",
    }
    nbformat.write(nb, lab.root_dir / "carry.ipynb")
    page = chromium_page
    console: list[str] = []
    page.on("console", lambda m: console.append(f"{m.type}: {m.text}"))
    cells = page.locator(".jp-Notebook .jp-Cell")
    try:
        page.goto(lab.url, timeout=TIMEOUT_MS)
        page.wait_for_selector(".jp-Launcher", timeout=TIMEOUT_MS)
        page.evaluate(OPEN_JS)
        page.wait_for_function(KERNEL_IDLE_JS, timeout=TIMEOUT_MS)

        # 1. The start is recorded in the notebook's metadata by the lab extension.
        i = page.evaluate(RUN_CELL_JS, "%load_ext nbcluster\n%cluster start --num-cpus 1 --nodes 2")
        wait_output(page, i, "nbcluster at")
        page.wait_for_function(
            "() => { const m = window.jupyterapp.shell.currentWidget.model"
            ".getMetadata('nbcluster'); return !!m && !!m.cluster; }",
            timeout=TIMEOUT_MS,
        )
        record = page.evaluate(METADATA_JS)
        assert record["cluster"] == {"num_cpus": 1, "nodes": 2}, record
        page.evaluate(SAVE_JS)
        saved = json.loads((lab.root_dir / "carry.ipynb").read_text())
        assert saved["metadata"]["nbcluster"]["cluster"] == {"num_cpus": 1, "nodes": 2}
        page.wait_for_function(KERNEL_IDLE_JS, timeout=TIMEOUT_MS)

        # 2. Late output lands in the finished cell's log area while another cell runs.
        a = page.evaluate(RUN_CELL_JS, LATE_TASK)
        area = cells.nth(a).locator(".nbcluster-log")
        expect(area.locator(".nbcluster-log-body")).to_contain_text(
            "grumble-warning", timeout=TIMEOUT_MS
        )
        page.wait_for_function(KERNEL_IDLE_JS, timeout=TIMEOUT_MS)  # cell A is done
        b = page.evaluate(RUN_CELL_JS, "import time; time.sleep(8); print('B' + ' DONE')")
        page.wait_for_function(CELL_RUNNING_JS, arg=b, timeout=TIMEOUT_MS)
        expect(area.locator(".nbcluster-log-body")).to_contain_text(
            "LATE-OUTPUT", timeout=TIMEOUT_MS
        )
        assert page.evaluate(CELL_RUNNING_JS, b), "cell B finished before the late output came"
        assert cells.nth(b).locator(".nbcluster-log").count() == 0
        assert "LATE-OUTPUT" not in (cells.nth(b).text_content() or "")
        expect(area.locator(".nbcluster-log-summary")).to_have_text("nbcluster log: 2 lines")
        shot(cells.nth(a), "1-late-output")
        # The filters: warnings only, then one source; the toggle folds the body.
        area.locator(".nbcluster-log-level").select_option("warning")
        expect(area.locator(".nbcluster-log-body")).to_have_text(
            re.compile(r"^\(grumble pid=\d+\) WARNING:grumble:grumble-warning\s*$")
        )
        area.locator(".nbcluster-log-level").select_option("all")
        area.locator(".nbcluster-log-source").select_option("speak")
        expect(area.locator(".nbcluster-log-body")).not_to_contain_text("grumble")
        expect(area.locator(".nbcluster-log-summary")).to_have_text(
            "nbcluster log: 2 lines, 1 shown"
        )
        area.locator(".nbcluster-log-toggle").click()
        expect(area.locator(".nbcluster-log-body")).to_be_hidden()
        shot(cells.nth(a), "2-filtered-folded")
        wait_output(page, b, "B DONE")
        page.wait_for_function(KERNEL_IDLE_JS, timeout=TIMEOUT_MS)
        # Rich display() from a task: rendered in the log area, sanitised.
        r = page.evaluate(RUN_CELL_JS, RICH_TASK)
        rich_area = cells.nth(r).locator(".nbcluster-log")
        expect(rich_area.locator(".nbcluster-log-rich b.rich-mark")).to_have_text(
            "RICH-HTML", timeout=TIMEOUT_MS
        )
        png = rich_area.locator(".nbcluster-log-rich img:not(.evil)[src^='data:image/png;base64,']")
        expect(png).to_have_count(1, timeout=TIMEOUT_MS)
        expect(rich_area.locator(".nbcluster-log-summary")).to_have_text("nbcluster log: 2 lines")
        evil = rich_area.locator(".nbcluster-log-rich img.evil")
        expect(evil).to_have_count(1)
        assert evil.get_attribute("onerror") is None
        assert rich_area.locator(".nbcluster-log-rich script").count() == 0
        page.wait_for_function(KERNEL_IDLE_JS, timeout=TIMEOUT_MS)
        assert page.evaluate("() => window.__nbcPwned === undefined")
        shot(cells.nth(r), "2b-rich-display")

        # 3. Stop, restart the kernel, start with no arguments: the record comes back.
        first_session = page.evaluate(
            RUN_CELL_JS,
            "print('SESSION', nbcluster.state.session_info()['session_dir'])\n%cluster stop",
        )
        text = wait_output(page, first_session, "stopped the cluster")
        session_dir = text.split("SESSION ", 1)[1].split("\\n", 1)[0]
        assert_no_processes(session_dir, timeout=30)
        page.evaluate(RESTART_JS)
        page.wait_for_function(KERNEL_IDLE_JS, timeout=TIMEOUT_MS)
        again = page.evaluate(
            RUN_CELL_JS,
            "%load_ext nbcluster\n%cluster start\nimport nbcluster\n"
            "print('NODES', len(nbcluster.state.node_stats()), nbcluster.cluster_resources()['CPU'])",
        )
        text = wait_output(page, again, "NODES 2 2.0")
        assert (
            "starting the cluster recorded in the notebook's metadata: --num-cpus 1 --nodes 2"
        ) in text
        cells.nth(again).scroll_into_view_if_needed()
        shot(cells.nth(again), "3-recreated")
        assert page.locator("text=Traceback").count() == 0
        errors = [m for m in console if m.startswith("error") and "nbcluster" in m.lower()]
        assert not errors, errors
    except BaseException:
        page.screenshot(path=str(ARTIFACTS / "features-failure.png"))
        (ARTIFACTS / "features-lab.log").write_bytes(lab.log.read_bytes())
        (ARTIFACTS / "features-console.log").write_text("\n".join(console))
        raise
    finally:
        lab.stop()
    assert_no_processes(lab.sessions_dir, timeout=30)
