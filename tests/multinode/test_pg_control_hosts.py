"""Placement groups over control channels between hosts (network namespaces; needs root).

The head, two joined nodes and a driver on different hosts: the driver's placement-group
calls reach the head's control channel, and the head's bundle reservations reach each
node's, on the addresses the hosts reach each other at (not loopback).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.multinode

Hosts = Any  # the `hosts` fixture from conftest.py
PORT = 7395

DRIVER = r"""
import json, sys, nbcluster
from nbcluster._runtime import context
from nbcluster._runtime.core.head_ctrl import head_control
from nbcluster.util import placement_group, placement_group_table, remove_placement_group
nbcluster.init(address=sys.argv[1])
client = context.current_client()
grpc_call = client.call_head
def call_head(what, *args, **kwargs):
    assert "PlacementGroup" not in what and "placement_group" not in what, what
    return grpc_call(what, *args, **kwargs)
client.call_head = call_head
pg = placement_group([{"CPU": 0.5}] * 3, strategy="STRICT_SPREAD")
ready = nbcluster.get(pg.ready(), timeout=60)
nodes = sorted(set(placement_group_table(pg)["bundles_to_node_id"].values()))
remove_placement_group(pg)
from nbcluster._runtime.protocol import ctrl
from nbcluster._runtime.protocol.protos import ctrl_pb2, ctrl_pb2_grpc
from nbcluster._runtime.protocol.rpc import AuthedStub
import socket
def node_ctrl(address):  # what the node manager advertises, asked over gRPC on the loop
    def ask():
        raw = ctrl_pb2_grpc.ControlStub(client.channels.channel(address))
        return AuthedStub(raw, client.token, address).ControlAddress(
            ctrl_pb2.ControlAddressRequest(), timeout=10)
    return client.run(ask).address
def hello_ok(address):  # the token opens it from another host
    host, _, port = address.rpartition(":")
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(ctrl.MAGIC + bytes([ctrl.VERSION, len(client.token)]) + client.token.encode())
        return s.recv(1) == bytes([ctrl.OK])
node_ctrls = {n["NodeName"]: node_ctrl(f"{n['NodeManagerAddress']}:{n['NodeManagerPort']}")
              for n in nbcluster.nodes() if n["Alive"]}
print(json.dumps({
    "node_ctrls": node_ctrls,
    "reachable": {k: hello_ok(v) for k, v in node_ctrls.items()},
    "ready": ready,
    "nodes": nodes,
    "alive": sorted(n["NodeID"] for n in nbcluster.nodes() if n["Alive"]),
    "state": placement_group_table(pg)["state"],
    "ctrl": head_control(client).address,
}))
nbcluster.shutdown()
"""


def _wait_line(hosts: Hosts, p: subprocess.Popen[str], needle: str, timeout: float = 60) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = "".join(hosts.output[p.pid])
        if needle in text:
            return text
        if p.poll() is not None:
            break
        time.sleep(0.05)
    text = "".join(hosts.output[p.pid])
    raise AssertionError(f"{needle!r} not printed within {timeout}s: {text[-3000:]}")


def test_placement_groups_use_control_channels_across_hosts(hosts: Hosts, tmp_path: Path) -> None:
    py = sys.executable
    head = hosts.spawn(
        0,
        [py, "-m", "nbcluster.cli", "start", "--head", "--host", hosts.addr(0)]
        + ["--port", str(PORT), "--num-cpus", "1", "--block"],
        hosts.env(0, tmp_path),
    )
    out = _wait_line(hosts, head, "join a node:")
    token_file = out.split("token file:", 1)[1].split()[0]
    head_addr = f"{hosts.addr(0)}:{PORT}"
    for i in (1, 2):
        env = hosts.env(i, tmp_path)
        del env["NBCLUSTER_TOKEN"]
        node = hosts.spawn(
            i,
            [py, "-m", "nbcluster.cli", "start", "--address", head_addr]
            + ["--token-file", token_file, "--node-name", f"host{i}", "--num-cpus", "1", "--block"],
            env,
        )
        _wait_line(hosts, node, "nbcluster node joined")
    r = hosts.run(1, [py, "-c", DRIVER, head_addr], hosts.env(1, tmp_path), timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["ready"] is True
    assert got["nodes"] == got["alive"] and len(got["nodes"]) == 3  # one bundle per host
    assert got["state"] == "REMOVED"
    assert got["ctrl"].startswith(hosts.addr(0) + ":")  # the head's host, not loopback
    # Each joined node's control channel is on its own host's address, reachable from others.
    for i in (1, 2):
        assert got["node_ctrls"][f"host{i}"].startswith(hosts.addr(i) + ":"), got
        assert got["reachable"][f"host{i}"], got
