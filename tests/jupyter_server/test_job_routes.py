"""The Jobs routes of the server extension against a real cluster (issue 17 item 4).

The auth, XSRF, Origin and route-inventory checks of ``test_routes.py`` cover these
routes too (they are part of ``routes()``); here: the submit → list → logs → stop →
delete cycle, and bad input (paths outside the root, unknown ids, bad bodies).
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from nbcluster.jupyter.server.manager import ClusterManager

pytestmark = pytest.mark.integration


async def _api(jp_fetch: Any, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    kwargs: dict[str, Any] = {"method": method, "raise_error": False, "request_timeout": 120}
    path, _, query = path.partition("?")
    if query:
        kwargs["params"] = dict(p.split("=", 1) for p in query.split("&"))
    if body is not None:
        kwargs["body"] = body if isinstance(body, str) else json.dumps(body)
    elif method in ("POST", "PATCH", "PUT"):
        kwargs["body"] = "{}"
    r = await jp_fetch("nbcluster", "api", *path.split("/"), **kwargs)
    return r.code, (json.loads(r.body) if r.body else None)


async def _wait_status(jp_fetch: Any, job: str, wanted: set[str]) -> dict[str, Any]:
    for _ in range(600):
        code, model = await _api(jp_fetch, "GET", job)
        assert code == 200, model
        if model["status"] in wanted:
            return model
        await asyncio.sleep(0.1)
    raise AssertionError(f"{job} never reached {wanted}")


async def test_submit_a_notebook_follow_its_log_stop_and_delete(
    jp_fetch: Any, jp_root_dir: Path, manager: ClusterManager
) -> None:
    code, created = await _api(jp_fetch, "POST", "clusters", {"num_cpus": 2, "nodes": 1})
    assert code == 201, created
    cid = created["id"]
    work = jp_root_dir / "work"
    work.mkdir()
    (work / "helper.py").write_text("WORD = 'neighbour'\n")
    nb = {
        "cells": [
            {
                "cell_type": "code",
                "metadata": {},
                "execution_count": None,
                "outputs": [],
                "source": "import helper\nprint('notebook job says', helper.WORD)",
            },
        ],
        "metadata": {},
        "nbformat": 4,
        "nbformat_minor": 5,
    }
    (work / "analysis.ipynb").write_text(json.dumps(nb))
    code, job = await _api(
        jp_fetch, "POST", f"clusters/{cid}/jobs", {"path": "work/analysis.ipynb"}
    )
    assert code == 201, job
    sid = job["submission_id"]
    assert job["source"] == "jupyterlab" and job["entrypoint"] == "python -m IPython analysis.ipynb"
    done = await _wait_status(jp_fetch, f"clusters/{cid}/jobs/{sid}", {"SUCCEEDED", "FAILED"})
    assert done["status"] == "SUCCEEDED", done
    code, logs = await _api(jp_fetch, "GET", f"clusters/{cid}/jobs/{sid}/logs?offset=0")
    assert code == 200 and "notebook job says neighbour" in logs["text"]
    code, rest = await _api(
        jp_fetch, "GET", f"clusters/{cid}/jobs/{sid}/logs?offset={logs['offset']}"
    )
    assert code == 200 and rest["text"] == "" and rest["offset"] == logs["offset"]
    code, listing = await _api(jp_fetch, "GET", f"clusters/{cid}/jobs")
    assert code == 200 and [j["submission_id"] for j in listing["jobs"]] == [sid]
    assert listing["jobs"][0]["duration_s"] >= 0

    (work / "slow.py").write_text(
        "import time\nprint('slow started', flush=True)\ntime.sleep(60)\n"
    )
    code, slow = await _api(jp_fetch, "POST", f"clusters/{cid}/jobs", {"path": "work/slow.py"})
    assert code == 201
    slow_path = f"clusters/{cid}/jobs/{slow['submission_id']}"
    await _wait_status(jp_fetch, slow_path, {"RUNNING"})
    code, body = await _api(jp_fetch, "DELETE", slow_path)
    assert code == 409 and "stop it first" in body["message"]
    code, stopped = await _api(jp_fetch, "POST", f"{slow_path}/stop")
    assert code == 200
    await _wait_status(jp_fetch, slow_path, {"STOPPED"})
    code, _ = await _api(jp_fetch, "DELETE", slow_path)
    assert code == 204
    code, body = await _api(jp_fetch, "GET", slow_path)
    assert code == 404 and "does not exist" in body["message"]


BAD_SUBMISSIONS = [
    ({"path": "../outside.py"}, 400, "inside the server's root"),
    ({"path": "missing.py"}, 404, "no file"),
    ({"path": "data.csv"}, 400, "only notebooks"),
    ({"path": "x.py", "extra": 1}, 400, "unknown key"),
    ("[1, 2]", 400, "JSON object"),
]


async def test_bad_submissions_are_refused(
    jp_fetch: Any, jp_root_dir: Path, manager: ClusterManager
) -> None:
    status, created = await _api(jp_fetch, "POST", "clusters", {"num_cpus": 1, "nodes": 1})
    assert status == 201
    cid = created["id"]
    for body, code, message in BAD_SUBMISSIONS:
        got, answer = await _api(jp_fetch, "POST", f"clusters/{cid}/jobs", body)
        assert got == code and message in answer["message"], (body, answer)
        assert "Traceback" not in json.dumps(answer)
    got, answer = await _api(jp_fetch, "GET", f"clusters/{cid}/jobs")
    assert got == 200 and answer["jobs"] == []  # nothing was submitted
    got, answer = await _api(jp_fetch, "GET", f"clusters/{cid}/jobs/nope")
    assert got == 404 and "does not exist" in answer["message"]
    got, answer = await _api(jp_fetch, "GET", f"clusters/{cid}/jobs/nope/logs?offset=-1")
    assert got == 400 and "offset" in answer["message"]
    got, answer = await _api(jp_fetch, "GET", "clusters/000000000000/jobs")
    assert got == 404
