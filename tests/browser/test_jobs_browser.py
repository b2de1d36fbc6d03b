"""The Jobs section of the sidebar in a real JupyterLab, in Debian's headless chromium.

Starts a cluster from the panel, opens a script and runs "Submit as nbcluster Job" on it
(the script's folder is its working_dir), sees the job's row go to SUCCEEDED with a
duration and its live log in the log view; submits a long job, stops it from its row and
removes it. The lab loads this tree's built extension (``nbcluster/labextension``, put
first on ``JUPYTER_PATH``). Screenshots: ``test-artifacts/jobs-*.png``.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from nbcluster.testing import assert_no_processes

CHROMIUM = Path("/usr/bin/chromium")
REPO = Path(__file__).resolve().parents[2]
BUILT = REPO / "nbcluster" / "labextension"
ARTIFACTS = REPO / "test-artifacts"
TIMEOUT_MS = 120_000

pytestmark = [
    pytest.mark.browser,
    pytest.mark.slow,
    pytest.mark.skipif(
        not CHROMIUM.exists(),
        reason="/usr/bin/chromium is absent: `make chromium` installs it (tests/browser/README.md)",
    ),
]


def shot(target: Any, name: str) -> None:
    target.screenshot(path=str(ARTIFACTS / f"jobs-{name}.png"))


@pytest.fixture
def this_trees_extension(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Make the lab load the extension built from this tree (first on JUPYTER_PATH)."""
    assert (BUILT / "package.json").exists(), (
        "the lab extension of this tree is not built: run `jlpm install && jlpm build` in "
        "labextension/ (or `make`)"
    )
    path = tmp_path / "jupyter_path" / "labextensions"
    path.mkdir(parents=True)
    (path / "nbcluster").symlink_to(BUILT)
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter_path"))


@pytest.mark.timeout(600)
def test_jobs_section_submit_follow_stop_remove(
    this_trees_extension: None, jupyter_lab: Callable[..., Any], chromium_page: Any
) -> None:
    from playwright.sync_api import expect

    lab = jupyter_lab(settings={"nbcluster:plugin": {"pollInterval": 500}})
    work = lab.root_dir / "work"
    work.mkdir()
    (work / "words.py").write_text("WORD = 'browser'\n")
    (work / "job_demo.py").write_text(
        "import time, words\n"
        "for i in range(3):\n"
        "    print('BROWSER JOB', words.WORD, i, flush=True)\n"
        "    time.sleep(0.3)\n"
    )
    (work / "forever.py").write_text(
        "import time\nprint('FOREVER started', flush=True)\ntime.sleep(300)\n"
    )
    page = chromium_page
    console: list[str] = []
    page.on("console", lambda m: console.append(f"{m.type}: {m.text}"))
    try:
        page.goto(lab.url, timeout=TIMEOUT_MS)
        page.wait_for_function("() => window.jupyterapp && window.jupyterapp.shell")
        page.wait_for_selector(".jp-Launcher", timeout=TIMEOUT_MS)
        page.locator('.jp-SideBar.jp-mod-left li[data-id="nbcluster-panel"]').click()
        panel = page.locator("#nbcluster-panel")
        jobs = panel.locator(".nbcluster-jobs")
        expect(jobs.locator(".nbcluster-jobs-title")).to_have_text("Jobs")
        expect(jobs.locator(".nbcluster-jobs-empty")).to_contain_text("start one above")

        panel.locator(".nbcluster-start-cpus").fill("2")
        panel.locator(".nbcluster-start-button").click()
        expect(panel.locator(".nbcluster-card")).to_have_count(1, timeout=TIMEOUT_MS)
        expect(jobs.locator(".nbcluster-jobs-empty")).to_contain_text(
            "No jobs yet", timeout=TIMEOUT_MS
        )

        # Open the script and run "Submit as nbcluster Job" on it (what the palette does).
        page.evaluate(
            "() => window.jupyterapp.commands.execute('docmanager:open', {path: 'work/job_demo.py'})"
            ".then(() => true)"
        )
        page.wait_for_selector(".jp-FileEditor", timeout=TIMEOUT_MS)
        page.evaluate(
            "() => window.jupyterapp.commands.execute('nbcluster:submit-as-job').then(() => true)"
        )
        row = jobs.locator(".nbcluster-job").first
        expect(row).to_have_count(1, timeout=TIMEOUT_MS)
        expect(row.locator(".nbcluster-job-status")).to_have_text("SUCCEEDED", timeout=TIMEOUT_MS)
        expect(row.locator(".nbcluster-job-duration")).to_have_text(re.compile(r"^\d+\.\ds$"))
        log = jobs.locator(".nbcluster-job-log")
        expect(log).to_contain_text("BROWSER JOB browser 2", timeout=TIMEOUT_MS)
        shot(panel, "1-succeeded")

        # A long job: RUNNING, stopped from its row, then removed.
        page.evaluate(
            "() => window.jupyterapp.commands"
            ".execute('nbcluster:submit-as-job', {path: 'work/forever.py'}).then(() => true)"
        )
        expect(jobs.locator(".nbcluster-job")).to_have_count(2, timeout=TIMEOUT_MS)
        newest = jobs.locator(".nbcluster-job").first
        expect(newest.locator(".nbcluster-job-status")).to_have_text("RUNNING", timeout=TIMEOUT_MS)
        expect(log).to_contain_text("FOREVER started", timeout=TIMEOUT_MS)
        shot(panel, "2-running")
        newest.locator(".nbcluster-job-stop").click()
        expect(newest.locator(".nbcluster-job-status")).to_have_text("STOPPED", timeout=TIMEOUT_MS)
        newest.locator(".nbcluster-job-remove").click()
        expect(jobs.locator(".nbcluster-job")).to_have_count(1, timeout=TIMEOUT_MS)
        expect(panel.locator(".nbcluster-error")).to_have_text("")
        shot(panel, "3-removed")

        code, listing = lab.api("GET", "nbcluster/api/clusters")
        (cluster,) = listing["clusters"]
        session_dir = Path(cluster["session_dir"])
        panel.locator(".nbcluster-stop").click()
        expect(panel.locator(".nbcluster-card")).to_have_count(0, timeout=TIMEOUT_MS)
        assert_no_processes(session_dir, timeout=30)
        errors = [m for m in console if m.startswith("error") and "nbcluster" in m.lower()]
        assert not errors, errors
    except BaseException:
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "jobs-failure.png"))
        (ARTIFACTS / "jobs-lab.log").write_bytes(lab.log.read_bytes())
        (ARTIFACTS / "jobs-console.log").write_text("\n".join(console))
        raise
    finally:
        lab.stop()
    assert_no_processes(lab.sessions_dir, timeout=30)
