"""The Jobs section of the sidebar in a real JupyterLab, in Debian's headless chromium.

Starts a cluster from the panel, opens a script and runs "Submit as nbcluster Job" on it
(the script's folder is its working_dir), sees the job's row go to SUCCEEDED with a
duration and its live log in the log view; submits a long job, stops it from its row and
removes it; then a job submitted through the SDK while the panel is idle appears in the
list by itself and goes to SUCCEEDED. The lab, the browser and the panel come from the ``nbcluster_panel`` fixture
(conftest.py: this tree's built extension). Screenshots: ``test-artifacts/jobs-*.png``.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from nbcluster.job_submission import JobSubmissionClient

CHROMIUM = Path("/usr/bin/chromium")
TIMEOUT_MS = 120_000
#: A job submitted elsewhere shows up within the panel's idle list refresh (10 s), with
#: room for a loaded machine; it never showed before (the panel only looked after its own
#: actions).
IDLE_APPEAR_MS = 60_000

pytestmark = [
    pytest.mark.browser,
    pytest.mark.slow,
    pytest.mark.skipif(
        not CHROMIUM.exists(),
        reason="/usr/bin/chromium is absent: `make chromium` installs it (tests/browser/README.md)",
    ),
]


@pytest.mark.timeout(600)
def test_jobs_section_submit_follow_stop_remove(
    nbcluster_panel: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from playwright.sync_api import expect

    lab = nbcluster_panel.lab
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
    page = nbcluster_panel.page
    panel = nbcluster_panel.panel
    jobs = nbcluster_panel.jobs
    expect(jobs.locator(".nbcluster-jobs-title")).to_have_text("Jobs")
    expect(jobs.locator(".nbcluster-jobs-empty")).to_contain_text("start one above")
    cluster = nbcluster_panel.start_cluster(cpus=2)

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
    nbcluster_panel.shot("1-succeeded")

    # A long job: RUNNING, stopped from its row, then removed.
    page.evaluate(
        "() => window.jupyterapp.commands"
        ".execute('nbcluster:submit-as-job', {path: 'work/forever.py'}).then(() => true)"
    )
    expect(jobs.locator(".nbcluster-job")).to_have_count(2, timeout=TIMEOUT_MS)
    newest = jobs.locator(".nbcluster-job").first
    expect(newest.locator(".nbcluster-job-status")).to_have_text("RUNNING", timeout=TIMEOUT_MS)
    expect(log).to_contain_text("FOREVER started", timeout=TIMEOUT_MS)
    nbcluster_panel.shot("2-running")
    newest.locator(".nbcluster-job-stop").click()
    expect(newest.locator(".nbcluster-job-status")).to_have_text("STOPPED", timeout=TIMEOUT_MS)
    newest.locator(".nbcluster-job-remove").click()
    expect(jobs.locator(".nbcluster-job")).to_have_count(1, timeout=TIMEOUT_MS)
    expect(panel.locator(".nbcluster-error")).to_have_text("")
    nbcluster_panel.shot("3-removed")

    # A job submitted elsewhere (the SDK, as the CLI does) while the panel is idle: it
    # shows up with no action in the panel, and its row follows it to SUCCEEDED.
    monkeypatch.setenv("NBCLUSTER_TEMP_DIR", str(lab.sessions_dir))
    with JobSubmissionClient(cluster["address"]) as client:
        sid = client.submit_job(entrypoint="python -c \"print('FROM THE SDK')\"")
    sdk_row = jobs.locator(f'.nbcluster-job[data-submission-id="{sid}"]')
    expect(sdk_row).to_have_count(1, timeout=IDLE_APPEAR_MS)
    expect(sdk_row.locator(".nbcluster-job-status")).to_have_text(
        "SUCCEEDED", timeout=IDLE_APPEAR_MS
    )
    expect(jobs.locator(".nbcluster-job")).to_have_count(2)
    nbcluster_panel.shot("4-from-sdk")

    nbcluster_panel.stop_cluster(cluster)
    errors = nbcluster_panel.console_errors("nbcluster")
    assert not errors, errors
