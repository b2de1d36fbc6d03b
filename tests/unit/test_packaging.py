"""Packaging invariants: dependency floors match the committed generated code; CI runs make test."""

from __future__ import annotations

import os
import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]
PROTOS = ROOT / "nbcluster" / "_runtime" / "protocol" / "protos"


def _pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def _requirements(names: list[str]) -> dict[str, Requirement]:
    reqs = [Requirement(r) for r in names]
    return {r.name.lower(): r for r in reqs}


def _floor(req: Requirement) -> Version:
    """The lowest version a requirement admits (from its >=, == or ~= clauses)."""
    floors = [Version(s.version) for s in req.specifier if s.operator in (">=", "==", "~=")]
    assert floors, f"{req} declares no lower bound"
    return max(floors)


def _grpc_generated_version() -> Version:
    text = (PROTOS / "nbcluster_pb2_grpc.py").read_text()
    m = re.search(r"^GRPC_GENERATED_VERSION\s*=\s*['\"]([^'\"]+)['\"]", text, re.M)
    assert m, "GRPC_GENERATED_VERSION not found in nbcluster_pb2_grpc.py"
    return Version(m.group(1))


def _protobuf_gencode_version() -> Version:
    text = (PROTOS / "nbcluster_pb2.py").read_text()
    m = re.search(
        r"ValidateProtobufRuntimeVersion\(\s*_runtime_version\.Domain\.PUBLIC,\s*"
        r"(\d+),\s*(\d+),\s*(\d+),\s*'([^']*)'",
        text,
    )
    assert m, "ValidateProtobufRuntimeVersion(...) not found in nbcluster_pb2.py"
    major, minor, patch, suffix = m.groups()
    return Version(f"{major}.{minor}.{patch}{suffix}")


def test_grpcio_floor_covers_generated_code():
    deps = _requirements(_pyproject()["project"]["dependencies"])
    assert _floor(deps["grpcio"]) >= _grpc_generated_version()


def test_protobuf_floor_covers_generated_code():
    deps = _requirements(_pyproject()["project"]["dependencies"])
    assert _floor(deps["protobuf"]) >= _protobuf_gencode_version()


def test_grpcio_tools_pin_matches_generated_code():
    """The stale-check regenerates with grpcio-tools; another version would differ textually."""
    test_extra = _requirements(_pyproject()["project"]["optional-dependencies"]["test"])
    spec = test_extra["grpcio-tools"].specifier
    pinned = [Version(s.version) for s in spec if s.operator == "=="]
    assert pinned == [_grpc_generated_version()], f"grpcio-tools{spec}"


def test_ci_runs_make_test():
    ci = ROOT / ".ci" / "run"
    lines = [ln.split("#", 1)[0].strip() for ln in ci.read_text().splitlines()]
    assert ci.read_text().startswith("#!/usr/bin/env bash")
    calls = [ln for ln in lines if re.fullmatch(r"(exec\s+)?make\s+test", ln)]
    assert calls, ".ci/run must call make test"
    assert "set -euo pipefail" in lines
    assert os.access(ci, os.X_OK), ".ci/run is not executable"
