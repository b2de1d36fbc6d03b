"""The ``hosts`` node provider on three "hosts" (network namespaces): ``nbcluster up`` on the
first, whose autoscaler starts node managers on the other two when work arrives (with
``ip netns exec`` in place of SSH) and stops them when they are idle. Every process that
talks to the cluster runs inside a namespace."""

from __future__ import annotations

import json
import secrets
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

pytestmark = pytest.mark.multinode

Hosts = Any  # the `hosts` fixture from conftest.py
PORT = 7393

DRIVER = r"""
import json, sys, time, warnings, nbcluster
from nbcluster import state
warnings.simplefilter("ignore")  # "Infeasible" until the first worker host joins
nbcluster.init(address=sys.argv[1])

@nbcluster.remote
def where(s):
    time.sleep(s)
    return nbcluster.get_runtime_context().get_node_id()

names = lambda: sorted(n["NodeName"] for n in nbcluster.nodes() if n["Alive"])
by_id = lambda: {n["NodeID"]: n["NodeName"] for n in nbcluster.nodes() if n["Alive"]}
ran = nbcluster.get([where.remote(3.0) for _ in range(4)], timeout=120)
ran_on = sorted({by_id().get(r, r) for r in ran})
grown = names()
deadline = time.time() + 60
while time.time() < deadline and len(names()) > 1:
    time.sleep(0.5)
events = lambda: [(e.kind, e.message) for e in state.autoscaler_status().events]
while time.time() < deadline and [k for k, _ in events()].count("removed") < 2:
    time.sleep(0.5)
events = events()
print(json.dumps({"ran_on": ran_on, "grown": grown, "after": names(), "events": events}))
nbcluster.shutdown()
"""


def _wait_line(hosts: Hosts, p: subprocess.Popen[str], needle: str, timeout: float = 90) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = "".join(hosts.output[p.pid])
        if needle in text:
            return text
        if p.poll() is not None:
            break
        time.sleep(0.05)
    raise AssertionError(f"{needle!r} not printed: {''.join(hosts.output[p.pid])[-3000:]}")


def test_hosts_provider_grows_onto_idle_machines_and_releases_them(
    hosts: Hosts, tmp_path: Path
) -> None:
    name = f"ns{secrets.token_hex(3)}"
    workers = [hosts.addr(1), hosts.addr(2)]
    cfg = {
        "cluster_name": name,
        "max_workers": 2,
        "idle_timeout_minutes": 0.05,
        "provider": {
            "type": "hosts",
            "head_ip": hosts.addr(0),
            "worker_ips": workers,
            "python": sys.executable,
            "command_prefix": {
                hosts.addr(i): ["ip", "netns", "exec", hosts.names[i]] for i in (1, 2)
            },
        },
        "head": {"host": hosts.addr(0), "port": PORT},
        "head_node_type": "head",
        "available_node_types": {
            "head": {"resources": {"CPU": 0}, "max_workers": 0},
            "host": {"resources": {"CPU": 2}, "max_workers": 2},
        },
        "update_interval_s": 0.5,
    }
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump(cfg))
    up = hosts.spawn(
        0,
        [sys.executable, "-m", "nbcluster.cli", "up", str(path), "--block"],
        hosts.env(0, tmp_path),
    )
    _wait_line(hosts, up, "(hosts provider) is up")
    head = f"{hosts.addr(0)}:{PORT}"
    r = hosts.run(0, [sys.executable, "-c", DRIVER, head], hosts.env(0, tmp_path), timeout=180)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    # 4 one-CPU tasks with only the head's CPU-less node: two 2-CPU hosts are started (where
    # the scheduler then places the tasks is its business), and removed once idle.
    joined = sorted(m.split()[1] for k, m in out["events"] if k == "joined")
    removed = sorted(m.split()[1] for k, m in out["events"] if k == "removed")
    assert joined == sorted(workers) and removed == sorted(workers), out["events"]
    assert out["ran_on"] and set(out["ran_on"]) <= set(workers)
    assert out["after"] == [n for n in out["grown"] if n not in workers]  # only the head's node
    assert any("idle for" in m for k, m in out["events"] if k == "terminate")
    # The token went to the hosts over stdin into a private file, never on a command line.
    token_file = Path.home() / ".nbcluster" / f"{name}.token"
    assert oct(token_file.stat().st_mode & 0o777) == "0o600"
    token_file.unlink()
