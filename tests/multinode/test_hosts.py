"""A cluster on three "hosts" (network namespaces): join over the network, move objects,
survive a hung node. Every process that talks to the cluster runs inside a namespace."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

Hosts = Any  # the `hosts` fixture from conftest.py


def python() -> str:
    return sys.executable


pytestmark = pytest.mark.multinode

PORT = 7391


def _wait_line(hosts: Hosts, p: subprocess.Popen[str], needle: str, timeout: float = 60) -> str:
    deadline = time.monotonic() + timeout
    lines = hosts.output[p.pid]
    while time.monotonic() < deadline:
        text = "".join(lines)
        if needle in text:
            return text
        if p.poll() is not None:
            time.sleep(0.2)
            break
        time.sleep(0.05)
    text = "".join(lines)
    raise AssertionError(
        f"{needle!r} not printed within {timeout}s (exit {p.poll()}): {text[-3000:]}"
    )


def _start_head(hosts: Hosts, tmp: Path) -> tuple[str, str]:
    """``nbcluster start --head --host ADDRESS`` on host 0, as the README shows; returns the
    head's address and the token file it printed."""
    head = hosts.spawn(
        0,
        [
            python(),
            "-m",
            "nbcluster.cli",
            "start",
            "--head",
            "--host",
            hosts.addr(0),
            "--port",
            str(PORT),
            "--num-cpus",
            "1",
            "--block",
        ],
        hosts.env(0, tmp),
    )
    out = _wait_line(hosts, head, "join a node:")
    token_file = out.split("token file:", 1)[1].split()[0]
    return f"{hosts.addr(0)}:{PORT}", token_file


def _join(
    hosts: Hosts, i: int, tmp: Path, head_addr: str, token_file: str, *extra: str
) -> subprocess.Popen[str]:
    """``nbcluster start --address HOST:PORT --token-file PATH`` on host ``i``, as the README
    shows: no --host (the node finds the address through which it reaches the head) and no
    token in the environment."""
    env = hosts.env(i, tmp)
    del env["NBCLUSTER_TOKEN"]
    node = hosts.spawn(
        i,
        [
            python(),
            "-m",
            "nbcluster.cli",
            "start",
            "--address",
            head_addr,
            "--token-file",
            token_file,
            "--node-name",
            f"host{i}",
            "--num-cpus",
            "1",
            *extra,
            "--block",
        ],
        env,
    )
    _wait_line(hosts, node, "nbcluster node joined")
    return node


def _start_cluster(hosts: Hosts, tmp: Path) -> str:
    head_addr, token_file = _start_head(hosts, tmp)
    for i in (1, 2):
        _join(hosts, i, tmp, head_addr, token_file)
    return head_addr


DRIVER = r"""
import json, sys, numpy as np, nbcluster
from nbcluster.util import NodeAffinitySchedulingStrategy as NA
nbcluster.init(address=sys.argv[1])
nodes = [n for n in nbcluster.nodes() if n["Alive"]]
by_name = {n["NodeName"]: n["NodeID"] for n in nodes}

@nbcluster.remote
def where():
    return nbcluster.get_runtime_context().get_node_id()

@nbcluster.remote
def make(n):
    return np.arange(n, dtype=np.int64)

@nbcluster.remote
class Where:
    def node(self):
        return nbcluster.get_runtime_context().get_node_id()

spread = sorted(set(nbcluster.get([where.options(scheduling_strategy="SPREAD").remote() for _ in range(9)])))
arr = nbcluster.get(make.options(scheduling_strategy=NA(by_name["host2"])).remote(4_000_000))
actor = Where.options(scheduling_strategy=NA(by_name["host2"]), num_cpus=0).remote()
print(json.dumps({
    "addresses": {n["NodeName"]: n["NodeManagerAddress"] for n in nodes},
    "names": sorted(by_name),
    "cpus": nbcluster.cluster_resources().get("CPU"),
    "spread": spread,
    "ids": sorted(by_name.values()),
    "driver_node": nbcluster.get_runtime_context().get_node_id(),
    "host1": by_name["host1"],
    "transfer_ok": bool((arr == np.arange(4_000_000)).all()),
    "actor_node_ok": nbcluster.get(actor.node.remote()) == by_name["host2"],
}))
nbcluster.shutdown()
"""


def test_three_hosts_run_tasks_actors_and_move_objects(hosts: Hosts, tmp_path: Path) -> None:
    head_addr = _start_cluster(hosts, tmp_path)
    r = hosts.run(1, [python(), "-c", DRIVER, head_addr], hosts.env(1, tmp_path), timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert len(out["names"]) == 3 and {"host1", "host2"} <= set(out["names"])
    # Joined without --host, each node advertises the address the other hosts reach it at.
    assert out["addresses"]["host1"] == hosts.addr(1)
    assert out["addresses"]["host2"] == hosts.addr(2)
    # Listening beyond loopback without TLS is said on the terminal, not only in a log.
    for i, proc in enumerate(hosts.procs[:3]):
        said = "".join(hosts.output[proc.pid])
        assert f"listening on {hosts.addr(i)}, beyond this machine, without TLS" in said, said
    assert out["cpus"] == 3.0  # resources add up across hosts
    assert out["spread"] == out["ids"]  # SPREAD used every host
    assert out["driver_node"] == out["host1"]  # the driver found its own host's node
    assert out["transfer_ok"]  # made on host2, pulled to host1 in chunks, equal
    assert out["actor_node_ok"]


HANG_DRIVER = r"""
import json, sys, time, nbcluster
from nbcluster.util import NodeAffinitySchedulingStrategy as NA
nbcluster.init(address=sys.argv[1])
by_name = {n["NodeName"]: n["NodeID"] for n in nbcluster.nodes() if n["Alive"]}

@nbcluster.remote(max_retries=3)
def slow(path):
    import os
    open(path, "a").write(nbcluster.get_runtime_context().get_node_id() + "\n")
    time.sleep(6)
    return nbcluster.get_runtime_context().get_node_id()

@nbcluster.remote(max_restarts=1, num_cpus=0)
class Where:
    def node(self):
        return nbcluster.get_runtime_context().get_node_id()

host2 = NA(by_name["host2"], soft=True)
actor = Where.options(scheduling_strategy=host2).remote()
assert nbcluster.get(actor.node.remote(), timeout=60) == by_name["host2"]
ref = slow.options(scheduling_strategy=host2).remote(sys.argv[2])
once = slow.options(scheduling_strategy=host2, max_retries=0, num_cpus=0).remote(sys.argv[2])
print("SUBMITTED", flush=True)
node = nbcluster.get(ref, timeout=90)
try:
    nbcluster.get(once, timeout=90)
    lost = "no error"
except nbcluster.exceptions.NbclusterError as e:
    lost = type(e).__name__
print(json.dumps({"ran_on": node, "hung": by_name["host2"], "non_retriable": lost,
                  "actor_now_on": nbcluster.get(actor.node.remote(), timeout=90)}), flush=True)
nbcluster.shutdown()
"""


def _node_manager_pid(cli_pid: int) -> int:
    kids = [
        c
        for c in psutil.Process(cli_pid).children()
        if "nbcluster._runtime.node.main" in " ".join(c.cmdline())
    ]
    assert kids, "the node manager process of the joined node was not found"
    return kids[0].pid


def test_hung_node_is_declared_dead_its_task_reruns_elsewhere_and_it_is_fenced(
    hosts: Hosts, tmp_path: Path
) -> None:
    head_addr = _start_cluster(hosts, tmp_path)
    node2_cli = hosts.procs[2]
    nm_pid = _node_manager_pid(node2_cli.pid)
    trace = tmp_path / "attempts.txt"
    drv = hosts.spawn(
        1, [python(), "-c", HANG_DRIVER, head_addr, str(trace)], hosts.env(1, tmp_path)
    )
    _wait_line(hosts, drv, "SUBMITTED")
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not (
        trace.exists() and len(trace.read_text().split()) >= 2
    ):
        time.sleep(0.05)  # both tasks are running on host2
    os.kill(nm_pid, signal.SIGSTOP)  # a hung node, not a dead one
    try:
        out = _wait_line(hosts, drv, '"ran_on"', timeout=120)
    finally:
        os.kill(nm_pid, signal.SIGCONT)
    result = json.loads([line for line in out.splitlines() if '"ran_on"' in line][-1])
    assert result["ran_on"] != result["hung"]  # retried on a live node
    assert result["non_retriable"] == "NodeDiedError"  # F12: not rerun; Ray's NODE_DIED
    assert result["actor_now_on"] not in (result["hung"], "")  # restarted on another node
    # After SIGCONT the hung node learns it was fenced and joins under a new id.
    check = r"""
import json, sys, time, nbcluster
nbcluster.init(address=sys.argv[1])
deadline = time.time() + 30
while time.time() < deadline:
    alive = [n for n in nbcluster.nodes() if n["Alive"]]
    if len(alive) == 3:
        break
    time.sleep(0.2)
print(json.dumps({"alive": [(n["NodeName"], n["NodeID"]) for n in nbcluster.nodes() if n["Alive"]],
                  "dead": [n["NodeID"] for n in nbcluster.nodes() if not n["Alive"]]}))
nbcluster.shutdown()
"""
    r = hosts.run(1, [python(), "-c", check, head_addr], hosts.env(1, tmp_path), timeout=90)
    assert r.returncode == 0, r.stdout + r.stderr
    state = json.loads(r.stdout.strip().splitlines()[-1])
    assert result["hung"] in state["dead"]
    host2 = [nid for name, nid in state["alive"] if name == "host2"]
    assert host2 and host2[0] != result["hung"]  # re-registered under a new id


CLIENT = r"""
import json, sys, time, nbcluster
nbcluster.init("nbcluster://" + sys.argv[1])

@nbcluster.remote
def slow(v):
    time.sleep(6)
    return v

ref = slow.remote(42)
print("SUBMITTED", flush=True)
print(json.dumps({"value": nbcluster.get(ref)}), flush=True)
print("LONGCUT_READY", flush=True)
sys.stdin.readline()  # the test cut the link: call now
try:
    nbcluster.get(slow.remote(1))
    print("NO_ERROR", flush=True)
except nbcluster.exceptions.HeadUnavailableError as e:
    print("HEAD_UNAVAILABLE", flush=True)
print("ALIVE", flush=True)
"""


def test_client_mode_rides_out_a_short_link_loss_and_fails_cleanly_on_a_long_one(
    hosts: Hosts, tmp_path: Path
) -> None:
    head_addr = _start_cluster(hosts, tmp_path)
    env = hosts.env(1, tmp_path, NBCLUSTER_HEAD_GRACE_PERIOD_S="6")
    drv = hosts.spawn(1, [python(), "-c", CLIENT, head_addr], env, stdin=True)
    ns = hosts.names[1]
    _wait_line(hosts, drv, "SUBMITTED")
    subprocess.run(["ip", "-n", ns, "link", "set", "eth0", "down"], check=True)
    time.sleep(4)  # shorter than the grace period
    subprocess.run(["ip", "-n", ns, "link", "set", "eth0", "up"], check=True)
    out = _wait_line(hosts, drv, '"value"', timeout=60)
    assert '{"value": 42}' in out  # the blocked call resumed; nothing lost
    _wait_line(hosts, drv, "LONGCUT_READY")
    subprocess.run(["ip", "-n", ns, "link", "set", "eth0", "down"], check=True)
    assert drv.stdin is not None
    drv.stdin.write("go\n")
    drv.stdin.flush()
    try:
        out = _wait_line(hosts, drv, "ALIVE", timeout=60)
    finally:
        subprocess.run(["ip", "-n", ns, "link", "set", "eth0", "up"], check=True)
    assert "HEAD_UNAVAILABLE" in out  # the cell got an error after the grace period...
    assert drv.wait(30) == 0  # ...and the process (the kernel) kept running to the end


RUNTIME_ENV_DRIVER = r"""
import json, os, sys, nbcluster
from nbcluster.job_submission import JobSubmissionClient
from nbcluster.util import NodeAffinitySchedulingStrategy as NA
nbcluster.init(address=sys.argv[1])
wd = sys.argv[2]
by_name = {n["NodeName"]: n["NodeID"] for n in nbcluster.nodes() if n["Alive"]}

@nbcluster.remote(runtime_env={"working_dir": wd, "env_vars": {"SHIPPED": "yes"}})
def probe():
    import shipped
    return shipped.VALUE, os.getcwd(), os.environ["SHIPPED"]

out = {"host2": nbcluster.get(probe.options(scheduling_strategy=NA(by_name["host2"])).remote())}
jobs = JobSubmissionClient(sys.argv[1])
sid = jobs.submit_job(
    entrypoint="python -c \"import os, shipped; print('JOB', shipped.VALUE, os.getcwd())\"",
    runtime_env={"working_dir": wd},
)
out["job"] = [jobs.wait_until_finished(sid, timeout=120).value, jobs.get_job_logs(sid)]
print(json.dumps(out))
nbcluster.shutdown()
"""


def test_a_working_dir_reaches_the_other_hosts(hosts: Hosts, tmp_path: Path) -> None:
    """issue 17: packed on host1, uploaded to the head (host0), fetched by host2's node and
    by the job on host0 into their own caches (each host has its own temp dir)."""
    head_addr = _start_cluster(hosts, tmp_path)
    wd = tmp_path / "project"
    wd.mkdir()
    (wd / "shipped.py").write_text("VALUE = 'made on host1'\n")
    r = hosts.run(
        1,
        [python(), "-c", RUNTIME_ENV_DRIVER, head_addr, str(wd)],
        hosts.env(1, tmp_path),
        timeout=180,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    value, cwd, flag = out["host2"]
    assert (value, flag) == ("made on host1", "yes")
    assert cwd.startswith(str(tmp_path / "host2" / "runtime_resources" / "packages"))
    status, logs = out["job"]
    assert status == "SUCCEEDED", logs
    assert f"JOB made on host1 {tmp_path / 'host0' / 'runtime_resources' / 'packages'}" in logs


UNREACHABLE_DRIVER = r"""
import json, sys, nbcluster
nbcluster.init(address=sys.argv[1])

@nbcluster.remote
def where():
    return nbcluster.get_runtime_context().get_node_id()

nodes = nbcluster.nodes()
ran = set(nbcluster.get([where.options(scheduling_strategy="SPREAD").remote() for _ in range(8)]))
print(json.dumps({"ran": sorted(ran), "ids": {n["NodeName"]: n["NodeID"] for n in nodes}}))
nbcluster.shutdown()
"""


def test_a_node_the_head_cannot_reach_is_reported_once_and_gets_no_work(
    hosts: Hosts, tmp_path: Path
) -> None:
    head_addr, token_file = _start_head(hosts, tmp_path)
    _join(hosts, 1, tmp_path, head_addr, token_file)
    # The mistake from the issue: a node on another host that advertises loopback.
    bad = _join(hosts, 2, tmp_path, head_addr, token_file, "--host", "127.0.0.1")
    said = "".join(hosts.output[bad.pid])
    assert "warning: node host2 advertised 127.0.0.1:" in said, said
    assert "--host" in said and head_addr in said  # the flag that fixes it
    r = hosts.run(
        1, [python(), "-c", UNREACHABLE_DRIVER, head_addr], hosts.env(1, tmp_path), timeout=120
    )
    assert r.returncode == 0, r.stdout + r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["ids"]["host2"] not in out["ran"]  # no task was leased there (SPREAD)
    assert len(out["ran"]) == 2  # the reachable nodes share the work
    assert "127.0.0.1" not in r.stderr  # and no driver tried (and logged) leases to it
    head_logs = list((tmp_path / "host0").glob("session_*/logs/head.log"))
    assert head_logs
    text = head_logs[0].read_text()
    assert text.count("advertised 127.0.0.1:") == 1  # reported once, though probed again
