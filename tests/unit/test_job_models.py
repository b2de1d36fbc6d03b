"""The job routes' models: strict parsing, and the TypeScript interfaces mirroring them."""

from __future__ import annotations

import re
import typing
from pathlib import Path
from typing import Any

import pytest

from nbcluster.jupyter.server import job_models
from nbcluster.jupyter.server.job_models import parse_submit_request, valid_submission_id
from nbcluster.jupyter.server.models import BadRequest

JOBS_TS = Path(__file__).resolve().parents[2] / "labextension" / "src" / "jobsModels.ts"


def test_submit_request_takes_a_notebook_or_script_path_only() -> None:
    assert parse_submit_request({"path": "work/a.ipynb"}) == {"path": "work/a.ipynb"}
    for body, message in [
        (None, "JSON object"),
        ({"path": "a.csv"}, "only notebooks"),
        ({"path": ""}, "'path' must be"),
        ({"path": 3}, "'path' must be"),
        ({"path": "a.py", "cwd": "/"}, "unknown key"),
        ({"path": "a\0.py"}, "not a valid path"),
    ]:
        with pytest.raises(BadRequest, match=message):
            parse_submit_request(body)


def test_submission_ids_are_matched_in_full() -> None:
    assert valid_submission_id("nbcsubmit_0123abcd") and valid_submission_id("my-job.1")
    for bad in ("", "../x", "a/b", "x\n", "-lead", "a" * 200):
        assert not valid_submission_id(bad)


def _ts_interfaces() -> dict[str, dict[str, str]]:
    out: dict[str, dict[str, str]] = {}
    for m in re.finditer(r"export interface (I\w+) \{(.*?)\n\}", JOBS_TS.read_text(), re.S):
        out[m.group(1)] = dict(re.findall(r"^\s+(\w+): ([^;]+);", m.group(2), re.M))
    return out


def _ts_type(py: Any) -> str:
    origin, args = typing.get_origin(py), typing.get_args(py)
    if py is str:
        return "string"
    if py in (int, float):
        return "number"
    if py is type(None):
        return "null"
    if origin is list:
        return f"I{args[0].__name__}[]"
    return " | ".join(_ts_type(a) for a in args)


@pytest.mark.parametrize(
    "model",
    [
        job_models.JobModel,
        job_models.JobListModel,
        job_models.JobLogsModel,
        job_models.SubmitJobRequest,
    ],
)
def test_typescript_interface_mirrors_the_typeddict(model: Any) -> None:
    interfaces = _ts_interfaces()
    name = f"I{model.__name__}"
    assert name in interfaces, f"jobsModels.ts has no interface {name}"
    hints = typing.get_type_hints(model)
    assert list(interfaces[name]) == list(hints)
    for key, py in hints.items():
        assert interfaces[name][key] == _ts_type(py), f"{name}.{key}"
