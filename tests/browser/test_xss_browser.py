"""Hostile text in the lab extension's panel is shown as text, never run (RELIABILITY S07).

In a real JupyterLab (this tree's built extension) in Debian's headless chromium: a cluster
started from the panel runs two jobs submitted through ``JobSubmissionClient`` with
hostile strings (``<script>``, ``<img onerror>``, ``<svg onload>``, ``<iframe srcdoc>``)

- in the entrypoint (the job row's tooltip) and the metadata;
- in a task's printed output, a named actor's name and a task's error message, which the
  Jobs section's live log view shows;
- as the entrypoint command itself, so the job's failure reason (its row) holds it;

and "Submit as nbcluster Job" on a hostile path makes the server's error message (shown at
the top of the panel) hold one. The test asserts the strings are visible verbatim (so
escaped), that the panel holds no element they could create, and that ``window.__xss``
stays undefined. Screenshots: ``test-artifacts/xss-*.png``.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

import pytest

from nbcluster.job_submission import JobSubmissionClient

CHROMIUM = Path("/usr/bin/chromium")
TIMEOUT_MS = 120_000

HOSTILE = [
    "<script>window.__xss=1</script>",
    '<img src=x onerror="window.__xss=1">',
    '<svg onload="window.__xss=1"></svg>',
    '<iframe srcdoc="<script>parent.__xss=1</script>"></iframe>',
]
#: Elements or attributes the hostile strings would create if parsed as HTML.
INJECTED = "script, img, iframe, [onerror], [onload], [srcdoc]"

JOB_SCRIPT = """\
import sys
import nbcluster

nbcluster.init()
hostile = sys.argv[1:]

@nbcluster.remote
def shout(text):
    print("TASK SAYS", text, flush=True)
    return text

@nbcluster.remote
class Named:
    def ping(self):
        return "pong"

@nbcluster.remote
def boom(text):
    raise ValueError(text)

print("RESULTS", nbcluster.get([shout.remote(h) for h in hostile]), flush=True)
actor = Named.options(name=hostile[1]).remote()
nbcluster.get(actor.ping.remote())
print("ACTOR", nbcluster.get_actor(hostile[1]) is not None, hostile[1], flush=True)
nbcluster.get(boom.remote(hostile[0]))
"""

pytestmark = [
    pytest.mark.browser,
    pytest.mark.slow,
    pytest.mark.skipif(
        not CHROMIUM.exists(),
        reason="/usr/bin/chromium is absent: `make chromium` installs it (tests/browser/README.md)",
    ),
]


@pytest.mark.timeout(600)
def test_hostile_text_in_the_panel_is_escaped(
    nbcluster_panel: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from playwright.sync_api import expect

    lab = nbcluster_panel.lab
    script = lab.root_dir / "xss_job.py"
    script.write_text(JOB_SCRIPT)
    (lab.root_dir / "quiet_job.py").write_text("print('QUIET')\n")
    page = nbcluster_panel.page
    panel = nbcluster_panel.panel
    jobs = nbcluster_panel.jobs
    cluster = nbcluster_panel.start_cluster(cpus=2)

    # A server error message that holds a hostile path, shown at the top of the panel.
    bad_path = f"{HOSTILE[1]}.py"
    page.evaluate(
        "p => window.jupyterapp.commands.execute('nbcluster:submit-as-job', {path: p})"
        ".then(() => true)",
        bad_path,
    )
    error = panel.locator(".nbcluster-error")
    expect(error).to_contain_text(bad_path, timeout=TIMEOUT_MS)

    # Jobs submitted elsewhere (a client of the cluster), which the panel lists.
    monkeypatch.setenv("NBCLUSTER_TEMP_DIR", str(lab.sessions_dir))
    entrypoint = shlex.join(["python", str(script), *HOSTILE])
    with JobSubmissionClient(cluster["address"]) as client:
        sid = client.submit_job(entrypoint=entrypoint, metadata={"note": HOSTILE[0]})
        bad_sid = client.submit_job(entrypoint=shlex.quote(HOSTILE[1]))

    # A job submitted from the panel refreshes its list, which then shows all three.
    page.evaluate(
        "() => window.jupyterapp.commands"
        ".execute('nbcluster:submit-as-job', {path: 'quiet_job.py'}).then(() => true)"
    )
    rows = jobs.locator(".nbcluster-job")
    expect(rows).to_have_count(3, timeout=TIMEOUT_MS)
    row = jobs.locator(f'.nbcluster-job[data-submission-id="{sid}"]')
    bad_row = jobs.locator(f'.nbcluster-job[data-submission-id="{bad_sid}"]')
    expect(bad_row.locator(".nbcluster-job-status")).to_have_text("FAILED", timeout=TIMEOUT_MS)
    expect(bad_row.locator(".nbcluster-job-reason")).to_contain_text(HOSTILE[1])
    expect(row.locator(".nbcluster-job-status")).to_have_text("FAILED", timeout=TIMEOUT_MS)
    # The panel selected its own job: let its log view read that finished log to the
    # end (polled every second), so the switch below is from a fully read log.
    expect(jobs.locator(".nbcluster-job-log")).to_contain_text("QUIET", timeout=TIMEOUT_MS)
    page.wait_for_timeout(3000)
    row.locator(".nbcluster-job-id").click()  # not the row's middle: its Stop button
    log = jobs.locator(".nbcluster-job-log")
    expect(row).to_have_attribute("title", entrypoint)
    expect(log).to_contain_text(f"ValueError: {HOSTILE[0]}", timeout=TIMEOUT_MS)
    for text in HOSTILE:
        expect(log).to_contain_text(f"TASK SAYS {text}")
    expect(log).to_contain_text(f"ACTOR True {HOSTILE[1]}")
    nbcluster_panel.shot("panel")

    assert panel.locator(INJECTED).count() == 0, panel.inner_html()
    assert page.evaluate("() => window.__xss") is None

    nbcluster_panel.stop_cluster(cluster)
    assert page.evaluate("() => window.__xss") is None
    errors = nbcluster_panel.console_errors("xss")
    assert not errors, errors
