"""The Timeline widget in a real JupyterLab, in Debian's headless chromium (TOOLCHAIN §4).

The test starts ``jupyter lab`` (the ``jupyter_lab`` fixture: fresh settings and
workspaces, a free port, a token), writes a notebook that starts a 2-CPU cluster, runs 20
tasks and displays ``Timeline()``, runs it in the browser (the ``chromium_page`` fixture:
Python playwright driving ``/usr/bin/chromium``, no browser download), and checks in the
page that the plotly plot holds 20 bars. A later cell runs 5 more tasks: the timeline's
cell picker lists that cell once it ran, and choosing a cell in the page redraws the plot
with that cell's bars only. Screenshots go to ``test-artifacts/``. The
server is stopped by its PID, which ends the kernel and, through the parent-death watch,
the kernel's cluster; the test checks that no cluster process is left.

Needs ``apt-get install -y chromium`` (see ``tests/browser/README.md``); skipped only when
``/usr/bin/chromium`` is absent.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import nbformat
import pytest

import nbcluster
from nbcluster.testing import assert_no_processes, cluster_processes

CHROMIUM = Path("/usr/bin/chromium")  # the same paths as conftest.py (no package imports)
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
N_TASKS = 20
DEADLINE_MS = 90_000

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
# Put `code` in a new cell at the end and run it, without waiting.
RUN_CELL_JS = """async (code) => {
    const app = window.jupyterapp;
    const nb = app.shell.currentWidget.content;
    nb.activeCellIndex = nb.widgets.length - 1;
    await app.commands.execute('notebook:insert-cell-below');
    nb.activeCell.model.sharedModel.setSource(code);
    app.commands.execute('notebook:run-cell');
    return nb.activeCellIndex;
}"""
OPEN_NOTEBOOK_JS = """() => window.jupyterapp.commands
    .execute('docmanager:open', {
        path: 'widgets.ipynb', factory: 'Notebook', kernel: {name: 'python3'}})
    .then(() => true)"""


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


@pytest.mark.timeout(600)
def test_timeline_renders_one_bar_per_task(
    jupyter_lab: Callable[..., Any], chromium_page: Any
) -> None:
    lab = jupyter_lab()
    write_notebook(lab.root_dir / "widgets.ipynb")
    page = chromium_page
    console: list[tuple[str, str]] = []
    page.on("console", lambda m: console.append((m.type, m.text)))
    try:
        page.goto(lab.url, timeout=DEADLINE_MS)
        page.wait_for_selector(".jp-Launcher", timeout=DEADLINE_MS)
        # Open with an explicit kernel, so JupyterLab asks nothing.
        page.evaluate(OPEN_NOTEBOOK_JS)
        page.wait_for_function(KERNEL_IDLE_JS, timeout=DEADLINE_MS)
        # Do not await the command's promise: it settles only when every cell ran.
        page.evaluate("() => { window.jupyterapp.commands.execute('notebook:run-all-cells'); }")
        page.get_by_text(f"TIMELINE BARS {N_TASKS}").wait_for(timeout=DEADLINE_MS)
        page.wait_for_function(f"() => ({BAR_COUNT_JS})() >= {N_TASKS}", timeout=DEADLINE_MS)
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
        # The cell picker: a cell that submits work later is listed when it ran, and
        # choosing a cell in the page redraws the plot with that cell's bars only.
        page.wait_for_function(KERNEL_IDLE_JS, timeout=DEADLINE_MS)
        page.evaluate(RUN_CELL_JS, "more = nbcluster.get([simulate.remote(i) for i in range(5)])")
        page.wait_for_function(f"() => ({BAR_COUNT_JS})() === {N_TASKS + 5}", timeout=DEADLINE_MS)
        picker = page.locator(".widget-dropdown select").first
        page.wait_for_function(
            "() => document.querySelector('.widget-dropdown select').options.length === 3",
            timeout=DEADLINE_MS,
        )
        # (ipywidgets shows the spaces of option labels as non-breaking spaces)
        labels = [t.replace("\xa0", " ") for t in picker.locator("option").all_text_contents()]
        assert labels[:2] == ["all cells", "In [2]"] and labels[2].startswith("In ["), labels
        picker.select_option(index=1)
        page.wait_for_function(f"() => ({BAR_COUNT_JS})() === {N_TASKS}", timeout=DEADLINE_MS)
        title = page.locator(".js-plotly-plot .gtitle").first.text_content() or ""
        assert f"Task timeline of In [2]: {N_TASKS} attempts" in title, title
        picker.select_option(index=2)
        page.wait_for_function(f"() => ({BAR_COUNT_JS})() === 5", timeout=DEADLINE_MS)
        plot.screenshot(path=str(ARTIFACTS / "timeline-one-cell.png"))
        widget_errors = [t for kind, t in console if kind == "error" and "widget" in t.lower()]
        assert not widget_errors, widget_errors
    except BaseException:
        page.screenshot(path=str(ARTIFACTS / "timeline-failure.png"))
        (ARTIFACTS / "timeline-lab.log").write_bytes(Path(lab.log).read_bytes())
        (ARTIFACTS / "timeline-console.log").write_text(
            "\n".join(f"{kind}: {text}" for kind, text in console)
        )
        raise
    lab.stop()
    assert_no_processes(lab.sessions_dir, timeout=30)
    assert not cluster_processes(lab.sessions_dir)
