"""Placement groups over control channels (``protocol/ctrl.py``; issue 11's placement target).

The driver's placement-group calls go to the head, and the head's bundle reservations to
the node managers, on raw control connections instead of gRPC. These tests start real
clusters and check that the calls really take that path (the driver's ``call_head`` is
made to fail; the head holds connections to each node's control port), that results and
errors are what they were over gRPC, and that a dead node, a stopped head, a restarted
head and a TLS cluster behave as before. The placement-group semantics themselves are
``test_placement_groups.py``'s, which runs over the same path.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import threading
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

import nbcluster
from nbcluster._runtime import context as runtime_context
from nbcluster._runtime import proc
from nbcluster._runtime.core.head_ctrl import head_control
from nbcluster._runtime.protocol import ctrl
from nbcluster._runtime.protocol.protos import ctrl_pb2, ctrl_pb2_grpc
from nbcluster._runtime.protocol.rpc import AuthedStub
from nbcluster.state import local_cluster
from nbcluster.util import (
    get_placement_group,
    placement_group,
    placement_group_table,
    remove_placement_group,
)


@pytest.fixture
def fast_failure_detection(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NBCLUSTER_HEARTBEAT_INTERVAL_S", "0.2")
    monkeypatch.setenv("NBCLUSTER_NODE_DEATH_TIMEOUT_S", "2")


def _no_grpc(monkeypatch: pytest.MonkeyPatch) -> Any:
    """Make the driver's placement-group calls over gRPC fail: what passes went over the
    control channel."""
    client = runtime_context.current_client()
    grpc_call = client.call_head

    def call_head(what: str, *args: Any, **kwargs: Any) -> Any:
        if "PlacementGroup" in what or "placement_group" in what:
            raise AssertionError(f"{what} went to the head over gRPC")
        return grpc_call(what, *args, **kwargs)

    monkeypatch.setattr(client, "call_head", call_head)
    return client


def _ctrl_address(client: Any, address: str) -> str:
    """The control-channel address the process serving gRPC at ``address`` advertises."""

    def ask() -> Any:  # on the client's loop, where its channels live
        raw = ctrl_pb2_grpc.ControlStub(client.channels.channel(address))
        stub = AuthedStub(raw, client.token, address)
        return stub.ControlAddress(ctrl_pb2.ControlAddressRequest(), timeout=10)

    return client.run(ask).address


def _node_addresses() -> dict[str, str]:
    """Node id (hex) -> the node manager's gRPC address, for the live nodes."""
    return {
        n["NodeID"]: f"{n['NodeManagerAddress']}:{n['NodeManagerPort']}"
        for n in nbcluster.nodes()
        if n["Alive"]
    }


def _node_ctrl_ports(client: Any) -> dict[str, int]:
    """Node id (hex) -> the port of that node manager's control channel."""
    return {
        node: int(_ctrl_address(client, address).rpartition(":")[2])
        for node, address in _node_addresses().items()
    }


def _head_connected_to(ports: dict[str, int]) -> bool:
    """Whether the head process holds a connection to each of ``ports``."""
    head = psutil.Process(local_cluster().head.pid)
    remote = {c.raddr.port for c in head.net_connections("tcp") if c.raddr}
    return set(ports.values()) <= remote


def _node_pid(node_id: str) -> int:
    for f in (Path(local_cluster().session_dir) / "nodes").glob("*.json"):
        d = json.loads(f.read_text())
        if d["node_id"] == node_id:
            return int(d["pid"])
    raise AssertionError(f"no node file for {node_id}")


def test_placement_groups_go_over_control_channels_with_the_same_results_and_errors(
    cluster, fast_failure_detection, monkeypatch: pytest.MonkeyPatch
) -> None:
    cluster(num_cpus=2, _nodes=2)
    client = _no_grpc(monkeypatch)
    spread = placement_group(
        [{"CPU": 0.5}, {"CPU": 0.5}], strategy="STRICT_SPREAD", name="spread", lifetime="detached"
    )
    assert nbcluster.get(spread.ready(), timeout=60) is True
    row = placement_group_table(spread)
    assert row["state"] == "CREATED" and len(set(row["bundles_to_node_id"].values())) == 2
    assert get_placement_group("spread").id == spread.id
    assert spread.id.hex() in placement_group_table()
    # Errors as over gRPC: a name taken, a name unknown.
    with pytest.raises(ValueError, match="a placement group named 'spread' already exists"):
        placement_group([{"CPU": 0.1}], name="spread")
    with pytest.raises(ValueError, match="Failed to look up placement group with name 'nope'"):
        get_placement_group("nope")
    packed = placement_group([{"CPU": 0.5}])
    assert packed.wait(30)
    control = head_control(client)
    assert control.ctrl is not None and control.address
    # The head reserved the bundles on both nodes over their control channels.
    ports = _node_ctrl_ports(client)
    assert len(ports) == 2 and _head_connected_to(ports)
    remove_placement_group(packed)
    assert placement_group_table(packed)["state"] == "REMOVED"

    # A node holding a bundle dies: the removal still returns (the head's call to that node
    # falls back to gRPC, which gives up), and groups are placed on the node that is left.
    me = nbcluster.get_runtime_context().get_node_id()
    other = next(node for node in ports if node != me)
    os.kill(_node_pid(other), signal.SIGKILL)
    start = time.monotonic()
    remove_placement_group(spread)
    assert time.monotonic() - start < 30
    assert placement_group_table(spread)["state"] == "REMOVED"
    left = placement_group([{"CPU": 1}])
    assert left.wait(30)
    assert set(placement_group_table(left)["bundles_to_node_id"].values()) == {me}
    remove_placement_group(left)


def test_a_stopped_or_restarted_head_gives_the_same_errors_and_retries(
    cluster, fast_failure_detection, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NBCLUSTER_HEAD_GRACE_PERIOD_S", "3")
    cluster(num_cpus=2)
    control = head_control(runtime_context.current_client())
    first = placement_group([{"CPU": 0.1}])
    assert first.wait(30)
    channel = control.ctrl
    assert channel is not None
    head = local_cluster().head

    # A stop shorter than the grace period is a pause: the call goes through afterwards,
    # on the same control connection (pings show the head alive; no gRPC fallback).
    os.kill(head.pid, signal.SIGSTOP)
    resume = threading.Timer(1.0, os.kill, (head.pid, signal.SIGCONT))
    resume.start()
    try:
        paused = placement_group([{"CPU": 0.1}])
    finally:
        resume.join()
        os.kill(head.pid, signal.SIGCONT)
    assert paused.wait(30)
    assert control.ctrl is channel

    # A longer stop: HeadUnavailableError within the grace period, not the call's timeout.
    os.kill(head.pid, signal.SIGSTOP)
    try:
        start = time.monotonic()
        with pytest.raises(nbcluster.exceptions.HeadUnavailableError, match="head"):
            remove_placement_group(paused)
        assert time.monotonic() - start < 20
    finally:
        os.kill(head.pid, signal.SIGCONT)
    remove_placement_group(paused)  # the same driver carries on once the head continues

    # A restarted head listens on a new control port: the first call after it goes over
    # gRPC (retried as before), the next ones over the new control channel.
    old = control.address
    local_cluster().restart_head()
    remove_placement_group(first)
    assert control.address is None  # the broken channel was dropped
    assert placement_group_table(first)["state"] == "REMOVED"
    again = placement_group([{"CPU": 0.1}])
    assert again.wait(30)
    assert control.ctrl is not None and control.address not in (None, "", old)
    remove_placement_group(again)


def test_a_tls_cluster_runs_its_control_channels_inside_tls(
    cluster, tls_env: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    info = cluster(num_cpus=1, _nodes=2)
    client = _no_grpc(monkeypatch)
    pg = placement_group([{"CPU": 0.5}, {"CPU": 0.5}], strategy="STRICT_SPREAD")
    assert nbcluster.get(pg.ready(), timeout=60) is True
    assert _head_connected_to(_node_ctrl_ports(client))
    remove_placement_group(pg)
    assert placement_group_table(pg)["state"] == "REMOVED"
    control = head_control(client)
    assert control.ctrl is not None and control.address
    # A plain peer with the right token gets no answer from the head's control channel.
    token = proc.read_token(Path(info.session_dir) / proc.TOKEN_FILE)
    host, _, port = control.address.rpartition(":")
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(ctrl.MAGIC + bytes([ctrl.VERSION, len(token)]) + token.encode())
        s.settimeout(10)
        try:
            answer = s.recv(1)
        except (ConnectionError, TimeoutError):
            answer = b""
        assert answer != bytes([ctrl.OK]), "a plain peer got through a control channel"


def test_with_control_channels_off_placement_groups_stay_on_grpc(
    cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NBCLUSTER_CONTROL_CHANNELS", "0")
    info = cluster(num_cpus=1)
    client = runtime_context.current_client()
    pg = placement_group([{"CPU": 0.5}], name="g")
    assert pg.wait(30)
    assert get_placement_group("g").id == pg.id
    with pytest.raises(ValueError, match="a placement group named 'g' already exists"):
        placement_group([{"CPU": 0.1}], name="g")
    remove_placement_group(pg)
    assert placement_group_table(pg)["state"] == "REMOVED"
    control = head_control(client)
    assert control.address == "" and control.ctrl is None
    # Neither the head nor the node manager serves one.
    assert _ctrl_address(client, info.address) == ""
    assert [_ctrl_address(client, a) for a in _node_addresses().values()] == [""]
