"""The server extension's models: strict request parsing, addresses, load conversion, and
the TypeScript interfaces in ``labextension/src/models.ts`` mirroring the TypedDicts."""

from __future__ import annotations

import re
import typing
from pathlib import Path
from typing import Any

import pytest

from nbcluster.jupyter.server import models, status
from nbcluster.jupyter.server.models import (
    BadRequest,
    Limits,
    connect_code,
    parse_address_request,
    parse_scale_request,
    parse_start_request,
    valid_address,
    valid_cluster_id,
)

MODELS_TS = Path(__file__).resolve().parents[2] / "labextension" / "src" / "models.ts"


# -- requests ---------------------------------------------------------------------------------


def test_start_request_accepts_exactly_its_keys() -> None:
    assert parse_start_request({"num_cpus": 2, "nodes": 1}, Limits()) == {
        "num_cpus": 2,
        "nodes": 1,
    }
    assert parse_start_request({"nodes": 16, "num_cpus": 256}, Limits()) == {
        "num_cpus": 256,
        "nodes": 16,
    }


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (None, r"^the body must be a JSON object like \{\"num_cpus\": 2, \"nodes\": 1\}$"),
        ([], "must be a JSON object"),
        ({}, r"^missing 'num_cpus', 'nodes': send exactly"),
        ({"num_cpus": 2, "nodes": 1, "host": "0.0.0.0"}, r"^unexpected 'host': send exactly"),
        (
            {"num_cpus": True, "nodes": 1},
            r"^'num_cpus' must be a whole number from 1 to 4, got True$",
        ),
        ({"num_cpus": 1.0, "nodes": 1}, "whole number"),
        ({"num_cpus": "1", "nodes": 1}, "whole number"),
        ({"num_cpus": 5, "nodes": 1}, r"^'num_cpus' must be from 1 to 4, got 5$"),
        ({"num_cpus": 1, "nodes": 3}, r"^'nodes' must be from 1 to 2, got 3$"),
        ({"num_cpus": 1, "nodes": -1}, "from 1 to 2"),
    ],
)
def test_start_request_refuses_with_a_message(body: Any, message: str) -> None:
    with pytest.raises(BadRequest, match=message):
        parse_start_request(body, Limits(max_cpus=4, max_nodes=2))


def test_long_values_are_cut_in_messages() -> None:
    with pytest.raises(BadRequest) as info:
        parse_start_request({"num_cpus": "x" * 10_000, "nodes": 1}, Limits())
    assert len(str(info.value)) < 120


def test_scale_and_address_requests() -> None:
    assert parse_scale_request({"nodes": 3}, Limits()) == {"nodes": 3}
    with pytest.raises(BadRequest, match="unexpected 'num_cpus'"):
        parse_scale_request({"nodes": 3, "num_cpus": 1}, Limits())
    assert parse_address_request({"address": "10.0.0.5:6379"}) == {"address": "10.0.0.5:6379"}
    with pytest.raises(BadRequest, match=r"^'address' must be host:port"):
        parse_address_request({"address": 6379})


@pytest.mark.parametrize("address", ["127.0.0.1:1", "head-1.example.org:65535", "[::1]:6379"])
def test_valid_addresses(address: str) -> None:
    assert valid_address(address)


@pytest.mark.parametrize(
    "address",
    [
        "",
        ":1",
        "host",
        "host:",
        "host:0",
        "host:65536",
        "host:123456",
        "ho st:1",
        "host:1\n%system id",
        "host:1 --on-interrupt keep",
        "$(id):1",
        "-x:1",
        "x-:1",
        "[::1:1",
        "[fe80::1%eth0]:1",
        "x" * 300 + ":1",
    ],
)
def test_invalid_addresses(address: str) -> None:
    assert not valid_address(address)
    with pytest.raises(ValueError, match="not a cluster address"):
        connect_code(address)


def test_connect_code_is_the_magic() -> None:
    assert connect_code("127.0.0.1:6379") == "%load_ext nbcluster\n%cluster connect 127.0.0.1:6379"


def test_cluster_ids_are_matched_in_full() -> None:
    assert valid_cluster_id("0123456789ab")
    for bad in ("0123456789AB", "0123456789ab\n", " 0123456789ab", "0123456789abc", "", "../x"):
        assert not valid_cluster_id(bad)


# -- loads ------------------------------------------------------------------------------------

HEAD_STATUS: dict[str, Any] = {  # the shape nbcluster.state.cluster_status returns
    "address": "127.0.0.1:4000",
    "session_dir": "/tmp/nbcluster/session_x",
    "nodes": [
        {
            "node_id": "aa",
            "name": "node0",
            "address": "127.0.0.1:4001",
            "total": {"CPU": 2.0, "GPU": 1.0, "memory": 1e9},
            "available": {"CPU": 0.5, "GPU": 1.0, "memory": 1e9},
            "store_used": 100,
            "store_capacity": 1000,
            "num_workers": 3,
        },
        {
            "node_id": "bb",
            "name": "node1",
            "address": "127.0.0.1:4002",
            "total": {"CPU": 2.0},
            "available": {"CPU": 2.0},
            "store_used": 0,
            "store_capacity": 1000,
            "num_workers": 1,
        },
    ],
    "total": {"CPU": 4.0, "GPU": 1.0, "memory": 2e9},
    "available": {"CPU": 2.5, "GPU": 1.0, "memory": 2e9},
    "store_used": 100,
    "store_capacity": 2000,
    "num_workers": 4,
    "actors": 0,
}


def test_load_from_head_status() -> None:
    load = status.load_from_status("0123456789ab", HEAD_STATUS, now=5.0)
    assert load == {
        "cluster_id": "0123456789ab",
        "address": "127.0.0.1:4000",
        "source": "head",
        "nodes": 2,
        "cpu_used": 1.5,
        "cpu_total": 4.0,
        "gpu_used": 0.0,
        "gpu_total": 1.0,
        "store_used": 100,
        "store_capacity": 2000,
        "tasks_running": None,
        "tasks_queued": None,
        "time": 5.0,
        "autoscaler": None,
        "scaling_events": [],
    }


def test_load_carries_the_autoscalers_summary_and_events() -> None:
    events = [{"time": float(i), "kind": "launch", "message": f"m{i}"} for i in range(7)]
    info = {"summary": "autoscaler (local): 1 running", "events": events}
    load = status.load_from_status("x", {**HEAD_STATUS, "autoscaler": info})
    assert load["autoscaler"] == "autoscaler (local): 1 running"
    assert [e["message"] for e in load["scaling_events"]] == ["m2", "m3", "m4", "m5", "m6"]
    bad = {"summary": 3, "events": [{"kind": "x"}, "nonsense"]}
    load = status.load_from_status("x", {**HEAD_STATUS, "autoscaler": bad})
    assert load["autoscaler"] is None and load["scaling_events"] == []


def test_load_reports_tasks_when_the_head_does() -> None:
    load = status.load_from_status("x", {**HEAD_STATUS, "pending_leases": 3, "running_tasks": 2})
    assert (load["tasks_running"], load["tasks_queued"]) == (2, 3)


def test_load_of_a_cluster_without_gpus_or_nodes() -> None:
    load = status.load_from_status("x", {"address": "a:1", "nodes": [], "total": {}})
    assert load["nodes"] == 0 and load["cpu_total"] == 0.0 and load["cpu_used"] == 0.0
    assert load["store_used"] is None


def test_read_load_uses_the_reader_with_the_token_path(tmp_path: Path) -> None:
    calls = []

    def reader(address: str, token_file: str) -> dict[str, Any]:
        calls.append((address, token_file))
        return HEAD_STATUS

    load = status.read_load("x", "127.0.0.1:4000", tmp_path / "token", reader=reader)
    assert calls == [("127.0.0.1:4000", str(tmp_path / "token"))]
    assert load["cpu_total"] == 4.0


def test_unknown_load_is_all_none() -> None:
    load = status.unknown_load("x", "h:1")
    assert load["source"] == "none"
    numbers = [
        k
        for k in models.LoadModel.__annotations__
        if k not in ("cluster_id", "address", "source", "time", "scaling_events")
    ]
    assert all(load[k] is None for k in numbers)  # type: ignore[literal-required]
    assert load["scaling_events"] == []


# -- TypeScript mirror ------------------------------------------------------------------------

MIRRORED = [
    models.ClusterModel,
    models.ClusterListModel,
    models.LoadModel,
    models.ScalingEventModel,
    models.ConnectCodeModel,
    models.UpdatesModel,
    models.ErrorModel,
    models.StartRequest,
    models.ScaleRequest,
    models.AddressRequest,
]


def _ts_interfaces() -> dict[str, dict[str, str]]:
    text = MODELS_TS.read_text()
    out: dict[str, dict[str, str]] = {}
    for m in re.finditer(r"export interface (I\w+) \{(.*?)\n\}", text, re.S):
        fields = dict(re.findall(r"^\s+(\w+): ([^;]+);", m.group(2), re.M))
        out[m.group(1)] = fields
    return out


def _ts_type(py: Any) -> str:
    """The TypeScript spelling of a TypedDict field's type."""
    origin = typing.get_origin(py)
    args = typing.get_args(py)
    if py is str:
        return "string"
    if py in (int, float):
        return "number"
    if py is bool:
        return "boolean"
    if py is type(None):
        return "null"
    if origin is typing.Literal:
        return " | ".join(f"'{a}'" for a in args)
    if origin is list:
        return f"I{args[0].__name__}[]"
    if origin in (typing.Union, getattr(__import__("types"), "UnionType", None)):
        return " | ".join(_ts_type(a) for a in args)
    raise AssertionError(f"no TypeScript spelling for {py!r}")


@pytest.mark.parametrize("model", MIRRORED, ids=lambda m: m.__name__)
def test_typescript_interface_mirrors_the_typeddict(model: Any) -> None:
    interfaces = _ts_interfaces()
    name = f"I{model.__name__}"
    assert name in interfaces, f"labextension/src/models.ts has no interface {name}"
    hints = typing.get_type_hints(model)
    ts_fields = interfaces[name]
    assert list(ts_fields) == list(hints), f"{name}: keys differ from {model.__name__}"
    for key, py in hints.items():
        expected = _ts_type(py).replace("'panel' | 'kernel' | 'host' | 'address'", "Origin")
        assert ts_fields[key] == expected, f"{name}.{key}: {ts_fields[key]} != {expected}"


def test_origin_type_mirrors_the_literal() -> None:
    text = MODELS_TS.read_text()
    values = typing.get_args(models.Origin)
    assert f"export type Origin = {' | '.join(repr(v) for v in values)};" in text
