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


async def _raw(client: Any, base_url: str, auth: dict[str, str], method: str, path: str) -> int:
    """``path`` sent as is (jp_fetch would encode its '%'): the status code."""
    r = await client.fetch(
        base_url.rstrip("/") + "/nbcluster/api/" + path,
        method=method,
        headers=dict(auth),
        body="{}" if method == "POST" else None,
        allow_nonstandard_methods=True,
        raise_error=False,
        request_timeout=60,
    )
    return r.code


async def _wait_status(jp_fetch: Any, job: str, wanted: set[str]) -> dict[str, Any]:
    for _ in range(600):
        code, model = await _api(jp_fetch, "GET", job)
        assert code == 200, model
        if model["status"] in wanted:
            return model
        await asyncio.sleep(0.1)
    raise AssertionError(f"{job} never reached {wanted}")


SID_VARIANTS = [
    "{sid}%00",
    "{sid}%0a",
    "{sid}%2F..%2F..%2Ftoken",
    "..%2F{sid}",
    "%2e%2e%2f{sid}",
    "%252e%252e%252f{sid}",
    "%2Fetc%2Fpasswd",
    "%5C%5Chost%5Cshare",
    "..",
]


async def test_submit_a_notebook_follow_its_log_stop_and_delete(
    jp_fetch: Any,
    jp_root_dir: Path,
    manager: ClusterManager,
    http_server_client: Any,
    jp_base_url: str,
    jp_auth_header: dict[str, str],
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
    # S06: the job's id with traversal around it names no other job and no other file
    raw = (http_server_client, jp_base_url, jp_auth_header)
    for bad in [v.format(sid=sid) for v in SID_VARIANTS]:
        for method, suffix in (("GET", ""), ("GET", "/logs"), ("POST", "/stop"), ("DELETE", "")):
            code = await _raw(*raw, method, f"clusters/{cid}/jobs/{bad}{suffix}")
            assert code == 404, (bad, method, suffix, code)
    code, again = await _api(jp_fetch, "GET", f"clusters/{cid}/jobs/{sid}")
    assert code == 200 and again["status"] == "SUCCEEDED"  # not stopped, not deleted
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
    ({"path": "work/../../outside.py"}, 400, "inside the server's root"),
    ({"path": "../{root}-evil/x.py"}, 400, "inside the server's root"),  # sibling prefix
    ({"path": "link.py"}, 400, "inside the server's root"),  # symlink to a file outside
    ({"path": "evil/x.py"}, 400, "inside the server's root"),  # symlink to the sibling
    ({"path": "%2e%2e%2foutside.py"}, 404, "no file"),  # never decoded
    ({"path": "%252e%252e%252foutside.py"}, 404, "no file"),
    ({"path": "..\\outside.py"}, 404, "no file"),
    ({"path": "\\\\host\\share\\x.py"}, 404, "no file"),  # UNC
    ({"path": "{parent}/outside.py"}, 404, "no file"),  # absolute: relative to the root
    ({"path": "x.py\u0000/../../outside.py"}, 400, "not a valid path"),
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
    outside = jp_root_dir.parent
    (outside / "outside.py").write_text("print('ran outside the root')\n")
    evil = outside / f"{jp_root_dir.name}-evil"
    evil.mkdir()
    (evil / "x.py").write_text("print('ran in the sibling')\n")
    (jp_root_dir / "link.py").symlink_to(outside / "outside.py")
    (jp_root_dir / "evil").symlink_to(evil)
    (jp_root_dir / "work").mkdir()
    names = {"root": jp_root_dir.name, "parent": outside}
    for body, code, message in BAD_SUBMISSIONS:
        if isinstance(body, dict):
            body = {**body, "path": body["path"].format(**names)}
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
