"""The record a notebook keeps of its cluster: round trip, checks, where it is found."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest

from nbcluster.jupyter.notebook_spec import (
    ENV_VAR,
    METADATA_KEY,
    ClusterSpec,
    NotebookMetadataError,
    find_saved_metadata,
    spec_from_metadata,
)


def test_round_trip_and_arguments() -> None:
    spec = ClusterSpec(
        num_cpus=2,
        num_gpus=0.5,
        nodes=3,
        object_store_memory=256 << 20,
        max_nodes=5,
        idle_timeout=30.0,
        runtime_env={"env_vars": {"A": "1"}},
    )
    record = spec.to_metadata()
    assert record["version"] == 1
    assert record["cluster"] == {
        "num_cpus": 2,
        "num_gpus": 0.5,
        "nodes": 3,
        "object_store_memory": 256 << 20,
        "max_nodes": 5,
        "idle_timeout": 30.0,
    }
    assert set(record["recorded_with"]) == {"python", "nbcluster"}
    assert spec_from_metadata(json.loads(json.dumps(record))) == spec
    assert spec.arguments() == (
        "--num-cpus 2 --num-gpus 0.5 --nodes 3 --object-store-memory 268435456 --max-nodes 5 "
        '--idle-timeout 30 --runtime-env \'{"env_vars": {"A": "1"}}\''
    )
    assert ClusterSpec().arguments() == "(no arguments)"
    assert spec_from_metadata(ClusterSpec(num_cpus=1).to_metadata()) == ClusterSpec(num_cpus=1)


@pytest.mark.parametrize(
    ("record", "message"),
    [
        ([], r"it must be an object, got list"),
        ({"version": 9, "cluster": {}}, r"version 9 is not one this nbcluster reads \(1\)"),
        ({"version": 1, "cluster": []}, r"cluster must be an object"),
        ({"version": 1, "cluster": {"cpus": 2}}, r"unknown fields \['cpus'\]; known: num_cpus"),
        ({"version": 1, "cluster": {"num_cpus": -1}}, r"cluster\.num_cpus must be a number >= 0"),
        ({"version": 1, "cluster": {"num_cpus": "2"}}, r"cluster\.num_cpus must be a number"),
        ({"version": 1, "cluster": {"num_cpus": True}}, r"cluster\.num_cpus must be a number"),
        ({"version": 1, "cluster": {"nodes": 1.5}}, r"cluster\.nodes must be a whole number >= 1"),
        ({"version": 1, "cluster": {"nodes": 0}}, r"cluster\.nodes must be a whole number >= 1"),
        (
            {"version": 1, "cluster": {"idle_timeout": float("inf")}},
            r"cluster\.idle_timeout must be a number >= 0",
        ),
        (
            {"version": 1, "cluster": {"nodes": 3, "max_nodes": 2}},
            r"cluster\.max_nodes \(2\) is less than cluster\.nodes \(3\)",
        ),
        ({"version": 1, "runtime_env": "pip"}, r"runtime_env must be an object"),
    ],
)
def test_bad_records_are_refused_with_a_reason(record: Any, message: str) -> None:
    with pytest.raises(NotebookMetadataError, match=message):
        spec_from_metadata(record)


def _notebook(path: Path, metadata: dict[str, Any]) -> Path:
    path.write_text(json.dumps({"cells": [], "metadata": metadata, "nbformat": 4}))
    return path


def test_found_in_what_jupyterlab_sent_first(tmp_path: Path, monkeypatch: Any) -> None:
    record = ClusterSpec(num_cpus=1).to_metadata()
    other = ClusterSpec(num_cpus=3).to_metadata()
    nb = _notebook(tmp_path / "a.ipynb", {METADATA_KEY: other})
    monkeypatch.setenv(ENV_VAR, base64.b64encode(json.dumps(record).encode()).decode())
    assert find_saved_metadata({"__session__": str(nb)}) == (record, "the notebook's metadata")
    monkeypatch.setenv(ENV_VAR, "not base64!")
    with pytest.raises(NotebookMetadataError, match="is not base64 JSON"):
        find_saved_metadata({})


def test_found_in_the_notebook_file(tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.delenv(ENV_VAR, raising=False)
    monkeypatch.delenv("JPY_SESSION_NAME", raising=False)
    record = ClusterSpec(nodes=2).to_metadata()
    nb = _notebook(tmp_path / "b.ipynb", {METADATA_KEY: record, "kernelspec": {}})
    assert find_saved_metadata({"__session__": str(nb)}) == (record, "the metadata of b.ipynb")
    assert find_saved_metadata({"__vsc_ipynb_file__": str(nb)})[0] == record  # type: ignore[index]
    monkeypatch.setenv("JPY_SESSION_NAME", str(nb))
    assert find_saved_metadata({})[0] == record  # type: ignore[index]
    # Nothing recorded, no notebook, not a notebook: nothing found, no error.
    bare = _notebook(tmp_path / "c.ipynb", {})
    assert find_saved_metadata({"__session__": str(bare)}) is None
    monkeypatch.delenv("JPY_SESSION_NAME")
    assert find_saved_metadata({}) is None
    assert find_saved_metadata({"__session__": str(tmp_path / "missing.ipynb")}) is None
    (tmp_path / "junk.ipynb").write_text("{not json")
    assert find_saved_metadata({"__session__": str(tmp_path / "junk.ipynb")}) is None
