"""Default-safe posture on real processes: issue acceptance 7, RELIABILITY S01-S03 and B07.

Raw gRPC calls use ``grpc.insecure_channel`` to 127.0.0.1 only (tests may; the package may
not, see the static test at the end). The module shares one 2-CPU cluster whose servers
accept messages of at most 8 MiB (so the oversized-message case stays cheap) and whose
processes log at DEBUG (so the token-leak scan sees everything the runtime can log).
"""

from __future__ import annotations

import ast
import ipaddress
import json
import os
import random
import secrets
import stat
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import psutil
import pytest
from google.protobuf.message import DecodeError

import nbcluster
from nbcluster import LocalCluster
from nbcluster._runtime import proc
from nbcluster._runtime.protocol.errors import Peer, to_exception
from nbcluster._runtime.protocol.rpc import pb, pb_grpc
from nbcluster.config import Config
from nbcluster.exceptions import AuthenticationError
from nbcluster.testing import (
    assert_cluster_healthy,
    assert_no_processes,
    assert_stays,
    cluster_processes,
    pid_alive,
    poll_for,
    quiet_period,
)

MiB = 2**20
MAX_MESSAGE = 8 * MiB
PACKAGE = Path(nbcluster.__file__).resolve().parent
LOOPBACK = {"127.0.0.1", "::1"}


def is_loopback_ip(ip: str) -> bool:
    """127.0.0.0/8, ::1, or IPv4-mapped loopback (gRPC binds 127.0.0.1 as ::ffff:127.0.0.1)."""
    addr = ipaddress.ip_address(ip.split("%")[0])
    mapped = getattr(addr, "ipv4_mapped", None)
    return addr.is_loopback or (mapped is not None and mapped.is_loopback)


REFUSALS = [
    pytest.param(None, grpc.StatusCode.UNAUTHENTICATED, id="no-token"),
    pytest.param("wrong", grpc.StatusCode.PERMISSION_DENIED, id="wrong-token"),
]
# What a malformed/oversized/unknown request may be answered with (B07).
REJECTION_CODES = {
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.INTERNAL,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.UNIMPLEMENTED,
}


# ------------------------------------------------------------------------------- helpers


class Raw:
    """Raw gRPC access to one server of the cluster, with a chosen token (or none)."""

    def __init__(self, address: str, token: str) -> None:
        host = address.rsplit(":", 1)[0].strip("[]")
        assert host in LOOPBACK, f"refusing to send test traffic to {address}"
        self.token = token
        self.channel = grpc.insecure_channel(address, options=[("grpc.enable_http_proxy", 0)])

    def _md(self, token: str | None) -> tuple[tuple[str, str], ...]:
        if token is None:
            return ()
        if token == "wrong":
            token = WRONG_TOKEN
        elif token == "right":
            token = self.token
        return (("authorization", f"Bearer {token}"),)

    def call(
        self,
        service: str,
        method: str,
        request: Any,
        token: str | None = "right",
        timeout: float = 10,
    ) -> Any:
        stub = getattr(pb_grpc, f"{service}Stub")(self.channel)
        return getattr(stub, method)(request, metadata=self._md(token), timeout=timeout)

    def code(
        self, service: str, method: str, request: Any, token: str | None
    ) -> grpc.RpcError | None:
        try:
            self.call(service, method, request, token)
        except grpc.RpcError as err:
            return err
        return None

    def raw_bytes(
        self, path: str, data: bytes, token: str | None = "right", timeout: float = 10
    ) -> Any:
        fn = self.channel.unary_unary(path, request_serializer=None, response_deserializer=None)
        return fn(data, metadata=self._md(token), timeout=timeout)

    def close(self) -> None:
        self.channel.close()


WRONG_TOKEN = secrets.token_hex(32)


def worker_pids(session_dir: str | os.PathLike[str]) -> set[int]:
    """PIDs of the session's workers: children of the fork server, itself a child of a node
    manager (all three run ``nbcluster._runtime.node.main``, since workers are forked).

    ``nbcluster.testing.worker_pids`` misses them (see test_lifecycle.py).
    """
    procs = {p.pid: p for p in cluster_processes(session_dir)}
    parent = {}
    for pid, p in procs.items():
        try:
            if "nbcluster._runtime.node.main" in " ".join(p.cmdline()):
                parent[pid] = p.ppid()
        except psutil.NoSuchProcess:
            continue
    managers = {pid for pid, pp in parent.items() if pp not in parent}
    zygotes = {pid for pid, pp in parent.items() if pp in managers}
    return {pid for pid, pp in parent.items() if pp in zygotes}


def status_of(fn: Callable[[], Any]) -> grpc.StatusCode:
    try:
        fn()
    except grpc.RpcError as err:
        return err.code()
    return grpc.StatusCode.OK


@pytest.fixture(scope="module")
def sec() -> Iterator[Any]:
    if nbcluster.is_initialized():
        nbcluster.shutdown()
    info = nbcluster.init(
        num_cpus=2, _system_config={"rpc_max_message_bytes": MAX_MESSAGE, "log_level": "DEBUG"}
    )
    yield info
    nbcluster.shutdown()
    assert_no_processes(info.session_dir, timeout=10)


@pytest.fixture
def token(sec) -> str:
    return proc.read_token(Path(sec.session_dir) / "token")


@pytest.fixture
def head(sec, token) -> Iterator[Raw]:
    raw = Raw(sec.address, token)
    yield raw
    raw.close()


@pytest.fixture
def node(sec, token) -> Iterator[Raw]:
    n = next(n for n in nbcluster.nodes() if n["Alive"])
    raw = Raw(f"{n['NodeManagerAddress']}:{n['NodeManagerPort']}", token)
    yield raw
    raw.close()


@pytest.fixture
def driver(sec, token) -> Iterator[Raw]:
    raw = Raw(nbcluster._api.context.require_client().address, token)
    yield raw
    raw.close()


@pytest.fixture
def leased_worker(sec, node, token) -> Iterator[tuple[Raw, pb.LeaseReply]]:
    """A worker leased with the right token over a raw channel (returned at teardown)."""
    owner = nbcluster._api.context.require_client().address
    reply = node.call(
        "NodeManager",
        "RequestWorkerLease",
        pb.LeaseRequest(resources={"CPU": 1.0}, owner_address=owner, request_id=os.urandom(16)),
        timeout=30,
    )
    assert reply.status == pb.LeaseReply.GRANTED, reply
    raw = Raw(reply.worker_address, token)
    try:
        yield raw, reply
    finally:
        raw.close()
        node.call(
            "NodeManager", "ReturnWorkerLease", pb.ReturnLeaseRequest(lease_id=reply.lease_id)
        )


def node_stats(node: Raw) -> pb.NodeStatsReply:
    return node.call("NodeManager", "GetNodeStats", pb.Empty())


def idle(node: Raw) -> pb.NodeStatsReply:
    """Node stats once no lease is held (the driver returns idle leases after ~0.5 s)."""
    return poll_for(
        lambda: (s := node_stats(node)).leased_workers == 0 and s.pending_leases == 0 and s,
        15,
        message="the node kept a lease",
    )


def check_refusal(err: grpc.RpcError | None, expected: grpc.StatusCode, token: str) -> None:
    assert err is not None, "the call was accepted"
    assert err.code() == expected, (err.code(), err.details())
    details = err.details() or ""
    assert "Traceback" not in details and token not in details
    assert (
        "missing cluster token"
        if expected == grpc.StatusCode.UNAUTHENTICATED
        else "wrong cluster token"
    ) in details


@nbcluster.remote
def add(a, b):
    return a + b


# ------------------------------------------------------------------------------- S03: token file


def test_token_file_is_private_and_256_bits(sec, token):
    path = Path(sec.session_dir) / "token"
    st = path.stat()
    assert stat.S_IMODE(st.st_mode) == 0o600
    assert st.st_uid == os.getuid()
    assert len(token) == 64 and all(c in "0123456789abcdef" for c in token), "not 32 bytes of hex"
    assert int(token, 16).bit_length() > 200  # not a constant or a short value padded out
    assert stat.S_IMODE(Path(sec.session_dir).stat().st_mode) == 0o700


def test_token_file_is_private_even_under_umask_0(tmp_path):
    old = os.umask(0)
    lc = LocalCluster(num_cpus=1, temp_dir=str(tmp_path / "umask0"))
    try:
        lc.start()
    finally:
        os.umask(old)
    try:
        assert lc.token_file is not None and lc.session_dir is not None
        assert stat.S_IMODE(lc.token_file.stat().st_mode) == 0o600
        assert len(lc.token) == 64
        assert stat.S_IMODE(lc.session_dir.stat().st_mode) == 0o700
        # The shared-memory store directory (in world-writable /dev/shm) is private too.
        (node_file,) = (lc.session_dir / "nodes").glob("*.json")
        store_dir = Path(json.loads(node_file.read_text())["store_dir"])
        assert stat.S_IMODE(store_dir.stat().st_mode) == 0o700
        assert stat.S_IMODE(store_dir.parent.stat().st_mode) == 0o700
    finally:
        lc.stop()
    assert_no_processes(lc.session_dir)


def test_every_cluster_gets_its_own_token(tmp_path, token):
    lc = LocalCluster(num_cpus=1, temp_dir=str(tmp_path / "other")).start()
    try:
        assert lc.token != token
        assert len(lc.token) == 64
    finally:
        lc.stop()
    assert_no_processes(lc.session_dir)


def test_token_is_not_on_any_command_line_or_in_reprs(sec, token):
    assert nbcluster.get(add.remote(1, 2)) == 3
    procs = cluster_processes(sec.session_dir)
    assert len(procs) >= 3, "expected head, node manager and workers"
    for p in procs:
        assert token not in " ".join(p.cmdline()), f"token on the command line of pid {p.pid}"
    client = nbcluster._api.context.require_client()
    texts = [
        repr(sec),
        str(sec),
        repr(client.cluster),
        str(client.cluster),
        repr(nbcluster.get_runtime_context()),
        repr(nbcluster.put(1)),
    ]
    for code in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED):
        err = to_exception(_FakeRpcError(code, "wrong cluster token"), Peer.HEAD, "GetNodes")
        assert isinstance(err, AuthenticationError)
        texts += [repr(err), str(err)]
    for text in texts:
        assert token not in text, text


class _FakeRpcError(grpc.aio.AioRpcError):
    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details=details)


_LEAK_SCRIPT = textwrap.dedent(
    """
    import numpy as np, nbcluster
    info = nbcluster.init(num_cpus=2, _system_config={"log_level": "DEBUG"})
    print("SESSION", info.session_dir, flush=True)

    @nbcluster.remote
    def square(x):
        print("task output", x)
        return x * x

    @nbcluster.remote
    def boom():
        raise ValueError("expected failure")

    assert nbcluster.get([square.remote(i) for i in range(50)]) == [i * i for i in range(50)]
    assert float(nbcluster.get(nbcluster.put(np.ones(10**6))).sum()) == 10**6
    try:
        nbcluster.get(boom.remote())
    except ValueError as e:
        print("ERROR", repr(e), e)
    try:
        nbcluster.get(square.remote(1), timeout=0)
    except Exception as e:
        print("ERROR", repr(e))
    print("INFO", repr(info), repr(nbcluster._api.context.require_client().cluster))
    print("NODES", nbcluster.nodes())
    nbcluster.shutdown()
    """
)


def test_token_never_appears_in_logs_or_output(tmp_path):
    env = {**os.environ, "NBCLUSTER_TEMP_DIR": str(tmp_path / "leak")}
    out = subprocess.run(
        [sys.executable, "-c", _LEAK_SCRIPT], env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-3000:]
    session = Path(
        next(ln.split(" ", 1)[1] for ln in out.stdout.splitlines() if ln.startswith("SESSION"))
    )
    assert_no_processes(session)
    token = proc.read_token(session / "token")
    assert "ERROR" in out.stdout and "expected failure" in out.stdout
    scanned = 0
    for path in session.rglob("*"):
        if path.is_file() and path.name != "token":
            data = path.read_bytes()
            scanned += len(data)
            assert token.encode() not in data, f"token found in {path}"
            assert bytes.fromhex(token) not in data, f"raw token bytes found in {path}"
    logs = list((session / "logs").iterdir())
    assert any(p.name.startswith("worker-") for p in logs) and any("head" in p.name for p in logs)
    assert scanned > 0
    assert "DEBUG" in "".join(p.read_text(errors="replace") for p in logs), (
        "debug logging was not on"
    )
    assert token not in out.stdout and token not in out.stderr


# ------------------------------------------------------------------------------- S01: loopback


def _listeners(p: psutil.Process) -> list[Any]:
    try:
        return [c for c in p.net_connections(kind="inet") if c.status == psutil.CONN_LISTEN]
    except psutil.NoSuchProcess:
        return []


def _role(p: psutil.Process, workers: set[int]) -> str:
    cmd = " ".join(p.cmdline())
    if "head.main" in cmd:
        return "head"
    if p.pid in workers:
        return "worker"
    return "node" if "node.main" in cmd else ""


def test_every_listening_socket_is_on_loopback(sec):
    assert nbcluster.get([add.remote(i, i) for i in range(20)]) == [2 * i for i in range(20)]
    procs = cluster_processes(sec.session_dir)
    roles: dict[str, int] = {"head": 0, "node": 0, "worker": 0}
    workers = worker_pids(sec.session_dir)
    found = []
    for p in [*procs, psutil.Process()]:
        socks = _listeners(p)
        found += [(p.pid, s.laddr) for s in socks]
        role = _role(p, workers)
        if role:
            roles[role] += len(socks)
    wildcard = [(pid, a) for pid, a in found if a.ip in ("0.0.0.0", "::", "::ffff:0.0.0.0")]
    assert not wildcard, f"listening on all interfaces: {wildcard}"
    bad = [(pid, addr) for pid, addr in found if not is_loopback_ip(addr.ip)]
    assert not bad, f"listening on non-loopback addresses: {bad}"
    assert all(roles[r] >= 1 for r in roles), f"listeners missing for some process kind: {roles}"
    driver = _listeners(psutil.Process())
    assert driver and all(is_loopback_ip(s.laddr.ip) for s in driver)


@pytest.mark.parametrize("host", ["0.0.0.0", "::"])
@pytest.mark.parametrize("module", ["nbcluster._runtime.head.main", "nbcluster._runtime.node.main"])
def test_non_loopback_listener_is_refused_without_allow_external(tmp_path, host, module):
    session = tmp_path / "session_manual"
    (session / "logs").mkdir(parents=True)
    proc.create_token_file(session)
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            module,
            "--session-dir",
            str(session),
            "--token-file",
            str(session / "token"),
            "--host",
            host,
        ],
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert out.returncode != 0
    assert f"refusing to listen on {host}" in out.stderr
    assert "--allow-external" in out.stderr
    assert "Traceback" not in out.stderr
    assert not (session / proc.HEAD_ADDRESS_FILE).exists()
    assert not (session / "nodes").exists()
    assert_no_processes(session)


# ------------------------------------------------------------------------------- S02: tokens


@pytest.mark.parametrize(("who", "expected"), REFUSALS)
def test_head_refuses_calls_without_the_right_token(head, token, who, expected):
    nodes_before = len(head.call("Head", "GetNodes", pb.GetNodesRequest(include_dead=True)).nodes)
    jobs_before = len(head.call("Head", "GetJobs", pb.Empty()).jobs)
    key = f"s02-{who}".encode()
    err = head.code(
        "Head", "KVPut", pb.KVRequest(ns="sec", key=key, value=b"evil", overwrite=True), who
    )
    check_refusal(err, expected, token)
    fake = pb.NodeInfo(
        node_id=os.urandom(16),
        node_name="intruder",
        address="127.0.0.1:9",
        hostname="x",
        total={"CPU": 64.0},
    )
    check_refusal(
        head.code("Head", "RegisterNode", pb.RegisterNodeRequest(node=fake), who), expected, token
    )
    check_refusal(head.code("Head", "GetNodes", pb.GetNodesRequest(), who), expected, token)
    job = pb.JobInfo(job_id=os.urandom(16), driver_address="127.0.0.1:9")
    check_refusal(
        head.code("Head", "RegisterJob", pb.RegisterJobRequest(job=job), who), expected, token
    )
    check_refusal(
        head.code("Head", "Shutdown", pb.ShutdownRequest(stop_nodes=True), who), expected, token
    )
    # Zero side effects.
    assert head.call("Head", "KVGet", pb.KVRequest(ns="sec", key=key)).found is False
    nodes = head.call("Head", "GetNodes", pb.GetNodesRequest(include_dead=True)).nodes
    assert len(nodes) == nodes_before and all(n.node_name != "intruder" for n in nodes)
    assert len(head.call("Head", "GetJobs", pb.Empty()).jobs) == jobs_before
    assert nbcluster.get(add.remote(2, 3)) == 5  # the head was not shut down


def test_head_accepts_calls_with_the_right_token(head):
    key = b"s02-right"
    reply = head.call("Head", "KVPut", pb.KVRequest(ns="sec", key=key, value=b"v1", overwrite=True))
    assert reply.added is True
    got = head.call("Head", "KVGet", pb.KVRequest(ns="sec", key=key))
    assert got.found and got.value == b"v1"
    before = len(head.call("Head", "GetNodes", pb.GetNodesRequest(include_dead=True)).nodes)
    node_id = os.urandom(16)
    fake = pb.NodeInfo(node_id=node_id, node_name="raw-ok", address="127.0.0.1:9", hostname="x")
    head.call("Head", "RegisterNode", pb.RegisterNodeRequest(node=fake))
    try:
        nodes = head.call("Head", "GetNodes", pb.GetNodesRequest(include_dead=True)).nodes
        assert len(nodes) == before + 1 and any(n.node_id == node_id for n in nodes)
    finally:
        head.call("Head", "UnregisterNode", pb.NodeRef(node_id=node_id, reason="test done"))
        head.call("Head", "KVDel", pb.KVRequest(ns="sec", key=key))
    live = head.call("Head", "GetNodes", pb.GetNodesRequest()).nodes
    assert all(n.node_id != node_id for n in live)


@pytest.mark.parametrize(("who", "expected"), REFUSALS)
def test_node_manager_refuses_calls_without_the_right_token(sec, node, token, who, expected):
    before = idle(node)
    store_before = node.call("NodeManager", "GetStoreStats", pb.Empty())
    pids_before = worker_pids(sec.session_dir)
    owner = nbcluster._api.context.require_client().address
    lease = pb.LeaseRequest(resources={"CPU": 1.0}, owner_address=owner, request_id=os.urandom(16))
    check_refusal(node.code("NodeManager", "RequestWorkerLease", lease, who), expected, token)
    oid = os.urandom(20)
    create = pb.CreateObjectRequest(object_id=oid, size=MiB, owner_address=owner)
    check_refusal(node.code("NodeManager", "CreateObject", create, who), expected, token)
    assert pids_before, "the node should have warm workers"
    check_refusal(node.code("NodeManager", "Shutdown", pb.Empty(), who), expected, token)
    # Zero side effects: no lease, no reservation, no new or missing worker process.
    after = node_stats(node)
    assert (after.leased_workers, after.pending_leases) == (0, 0)
    assert dict(after.node.available) == dict(before.node.available)
    store_after = node.call("NodeManager", "GetStoreStats", pb.Empty())
    assert (store_after.used, store_after.num_objects) == (
        store_before.used,
        store_before.num_objects,
    )
    assert node.call("NodeManager", "GetObjectInfo", pb.ObjectIds(object_ids=[oid])).found is False
    assert_stays(  # a wrongly started worker would have been forked by now
        lambda: worker_pids(sec.session_dir) == pids_before, quiet_period(0.2)
    )
    assert nbcluster.get(add.remote(3, 4)) == 7


def test_node_manager_accepts_calls_with_the_right_token(sec, node, leased_worker):
    raw_worker, reply = leased_worker
    assert reply.worker_address.rsplit(":", 1)[0] in LOOPBACK
    assert reply.worker_pid in worker_pids(sec.session_dir)
    owner = nbcluster._api.context.require_client().address
    store_dir = nbcluster._api.context.require_client().store_dir
    before = node.call("NodeManager", "GetStoreStats", pb.Empty())
    oid = os.urandom(20)
    created = node.call(
        "NodeManager",
        "CreateObject",
        pb.CreateObjectRequest(object_id=oid, size=4096, owner_address=owner),
    )
    assert created.path == os.path.join(store_dir, oid.hex())
    assert node.call("NodeManager", "GetStoreStats", pb.Empty()).used == before.used + 4096
    node.call("NodeManager", "FreeObjects", pb.ObjectIds(object_ids=[oid]))
    assert node.call("NodeManager", "GetStoreStats", pb.Empty()).used == before.used


@pytest.mark.parametrize(("who", "expected"), REFUSALS)
def test_core_workers_refuse_calls_without_the_right_token(
    sec, driver, leased_worker, token, who, expected
):
    raw_worker, reply = leased_worker
    ref = nbcluster.put({"secret": "value"})
    status = pb.ObjectStatusRequest(object_id=ref.binary())
    check_refusal(driver.code("CoreWorker", "GetObjectStatus", status, who), expected, token)
    check_refusal(raw_worker.code("CoreWorker", "GetObjectStatus", status, who), expected, token)
    borrow = pb.BorrowRequest(object_ids=[ref.binary()], borrower_address="127.0.0.1:9", add=True)
    check_refusal(driver.code("CoreWorker", "UpdateBorrows", borrow, who), expected, token)
    check_refusal(raw_worker.code("CoreWorker", "Exit", pb.Empty(), who), expected, token)
    check_refusal(driver.code("CoreWorker", "Exit", pb.Empty(), who), expected, token)
    assert_stays(lambda: pid_alive(reply.worker_pid), quiet_period(0.2))  # Exit: gone in 50 ms
    # The refused borrow was not recorded: dropping our ref frees the object as usual.
    entry = nbcluster._api.context.require_client().table.get(ref.binary())
    assert entry is not None and not entry.borrowers
    assert nbcluster.get(ref) == {"secret": "value"}


def test_core_workers_accept_calls_with_the_right_token(driver, leased_worker):
    raw_worker, _ = leased_worker
    ref = nbcluster.put({"k": 1})
    reply = driver.call(
        "CoreWorker", "GetObjectStatus", pb.ObjectStatusRequest(object_id=ref.binary())
    )
    assert reply.status == pb.ObjectStatusReply.READY and reply.location.data
    unknown = raw_worker.call(
        "CoreWorker", "GetObjectStatus", pb.ObjectStatusRequest(object_id=ref.binary())
    )
    assert unknown.status == pb.ObjectStatusReply.UNKNOWN


_JOIN_SCRIPT = textwrap.dedent(
    """
    import sys, nbcluster
    try:
        nbcluster.init(address=sys.argv[1])
    except nbcluster.exceptions.AuthenticationError as e:
        print("AUTH-ERROR", type(e).__name__, str(e))
        sys.exit(3)
    print("JOINED")
    nbcluster.shutdown()
    """
)


@pytest.mark.parametrize("how", ["host-port", "auto"])
def test_driver_with_a_wrong_token_gets_authentication_error(sec, head, token, how):
    jobs_before = len(head.call("Head", "GetJobs", pb.Empty()).jobs)
    env = {**os.environ, "NBCLUSTER_TOKEN": WRONG_TOKEN}
    address = sec.address if how == "host-port" else "auto"
    out = subprocess.run(
        [sys.executable, "-c", _JOIN_SCRIPT, address],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 3, out.stdout + out.stderr[-2000:]
    assert "AUTH-ERROR AuthenticationError" in out.stdout
    assert "token is wrong" in out.stdout and "NBCLUSTER_TOKEN" in out.stdout
    assert token not in out.stdout + out.stderr and WRONG_TOKEN not in out.stdout + out.stderr
    assert len(head.call("Head", "GetJobs", pb.Empty()).jobs) == jobs_before


def test_driver_without_any_token_gets_authentication_error(sec, tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("NBCLUSTER_TOKEN")}
    env["NBCLUSTER_TEMP_DIR"] = str(tmp_path / "elsewhere")  # no local session to read it from
    out = subprocess.run(
        [sys.executable, "-c", _JOIN_SCRIPT, sec.address],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 3, out.stdout + out.stderr[-2000:]
    assert f"no token for the cluster at {sec.address}" in out.stdout


def test_driver_with_the_right_token_joins(sec, token, tmp_path):
    env = {
        **os.environ,
        "NBCLUSTER_TOKEN": token,
        "NBCLUSTER_TEMP_DIR": str(tmp_path / "elsewhere"),
    }
    out = subprocess.run(
        [sys.executable, "-c", _JOIN_SCRIPT, sec.address],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0 and "JOINED" in out.stdout, out.stderr[-2000:]


# ------------------------------------------------------------------------------- B07: fuzz


FUZZ_READ_ONLY = [
    ("head", "/nbcluster.Head/KVGet", pb.KVRequest),
    ("head", "/nbcluster.Head/GetNodes", pb.GetNodesRequest),
    ("head", "/nbcluster.Head/GetFunction", pb.GetFunctionRequest),
    ("node", "/nbcluster.NodeManager/GetObjectInfo", pb.ObjectIds),
    ("node", "/nbcluster.NodeManager/GetWorkerExitInfo", pb.WorkerRef),
    ("driver", "/nbcluster.CoreWorker/GetObjectStatus", pb.ObjectStatusRequest),
]


def _truncated(msg: Any) -> bytes:
    data = msg.SerializeToString()
    cut = data[: len(data) - 3]
    with pytest.raises(DecodeError):
        type(msg).FromString(cut)
    return cut


def _mutating_truncated() -> list[tuple[str, str, bytes]]:
    node = pb.NodeInfo(node_id=os.urandom(16), node_name="n" * 40, address="127.0.0.1:9")
    return [
        (
            "head",
            "/nbcluster.Head/KVPut",
            _truncated(pb.KVRequest(ns="fuzz", key=b"k" * 40, value=b"v" * 40)),
        ),
        ("head", "/nbcluster.Head/RegisterNode", _truncated(pb.RegisterNodeRequest(node=node))),
        (
            "head",
            "/nbcluster.Head/ExportFunction",
            _truncated(pb.ExportFunctionRequest(function_id=b"f" * 32, payload=b"p" * 64)),
        ),
        (
            "node",
            "/nbcluster.NodeManager/RequestWorkerLease",
            _truncated(pb.LeaseRequest(resources={"CPU": 1.0}, owner_address="127.0.0.1:9" * 4)),
        ),
        (
            "node",
            "/nbcluster.NodeManager/CreateObject",
            _truncated(
                pb.CreateObjectRequest(object_id=os.urandom(20), size=10, owner_address="o" * 40)
            ),
        ),
        (
            "node",
            "/nbcluster.NodeManager/FreeObjects",
            _truncated(pb.ObjectIds(object_ids=[os.urandom(20)] * 3)),
        ),
        (
            "driver",
            "/nbcluster.CoreWorker/UpdateBorrows",
            _truncated(
                pb.BorrowRequest(object_ids=[os.urandom(20)], borrower_address="b" * 40, add=True)
            ),
        ),
    ]


@pytest.fixture
def servers(head, node, driver) -> dict[str, Raw]:
    return {"head": head, "node": node, "driver": driver}


def _services_alive(sec, head, healthy: bool = True) -> None:
    kinds = " ".join(" ".join(p.cmdline()) for p in cluster_processes(sec.session_dir))
    assert "head.main" in kinds and "node.main" in kinds
    assert len(head.call("Head", "GetNodes", pb.GetNodesRequest()).nodes) == 1
    assert nbcluster.get([add.remote(i, 1) for i in range(10)]) == [i + 1 for i in range(10)]
    if healthy:  # all resources back: not while a test holds a raw lease
        assert_cluster_healthy(timeout=15)


def test_malformed_requests_are_rejected_and_services_keep_serving(sec, servers, head):
    rng = random.Random(20260407)
    outcomes: dict[str, int] = {}
    for who, path, msg_type in FUZZ_READ_ONLY:
        for _ in range(25):
            blob = rng.randbytes(rng.randint(1, 96))
            try:
                msg_type.FromString(blob)
                parses = True
            except DecodeError:
                parses = False
            code = status_of(lambda: servers[who].raw_bytes(path, blob))  # noqa: B023
            assert code not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED), (
                f"{path} hung or crashed on {blob!r}"
            )
            if not parses:
                assert code != grpc.StatusCode.OK, f"{path} accepted undecodable bytes {blob!r}"
            outcomes[code.name] = outcomes.get(code.name, 0) + 1
    for who, path, blob in _mutating_truncated():
        code = status_of(lambda: servers[who].raw_bytes(path, blob))  # noqa: B023
        assert code not in (
            grpc.StatusCode.OK,
            grpc.StatusCode.UNAVAILABLE,
            grpc.StatusCode.DEADLINE_EXCEEDED,
        ), (path, code)
    assert outcomes.get("OK", 0) < sum(outcomes.values())
    # Nothing a truncated KVPut/RegisterNode carried was applied.
    assert head.call("Head", "KVKeys", pb.KVRequest(ns="fuzz")).keys == []
    _services_alive(sec, head)


def test_malformed_requests_get_invalid_argument_without_internals(servers):
    for who, path, blob in _mutating_truncated():
        with pytest.raises(grpc.RpcError) as info:
            servers[who].raw_bytes(path, blob)
        assert info.value.code() in REJECTION_CODES, (path, info.value.code(), info.value.details())
        assert "class '" not in (info.value.details() or ""), info.value.details()


def test_oversized_messages_are_rejected(sec, servers, head):
    assert 0 < Config().rpc_max_message_bytes <= 2**30, "the default message size is unbounded"
    big = b"x" * (MAX_MESSAGE + MiB)
    cases = [
        (
            "head",
            "/nbcluster.Head/KVPut",
            pb.KVRequest(ns="fuzz", key=b"big", value=big, overwrite=True).SerializeToString(),
        ),
        (
            "node",
            "/nbcluster.NodeManager/CreateObject",
            pb.CreateObjectRequest(
                object_id=os.urandom(20), size=1, owner_address=big.decode()
            ).SerializeToString(),
        ),
        (
            "driver",
            "/nbcluster.CoreWorker/UpdateBorrows",
            pb.BorrowRequest(
                object_ids=[os.urandom(20)], borrower_address=big.decode()
            ).SerializeToString(),
        ),
    ]
    for who, path, data in cases:
        with pytest.raises(grpc.RpcError) as info:
            servers[who].raw_bytes(path, data, timeout=30)
        assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, (path, info.value.details())
        assert "larger than max" in (info.value.details() or "")
    assert head.call("Head", "KVGet", pb.KVRequest(ns="fuzz", key=b"big")).found is False
    _services_alive(sec, head)


@pytest.mark.parametrize("who_token", ["right", None])
def test_unknown_methods_are_unimplemented(sec, servers, head, who_token):
    paths = [
        "/nbcluster.Head/NoSuchMethod",
        "/nbcluster.NodeManager/RunShell",
        "/nbcluster.CoreWorker/Eval",
        "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
        "/no.such.Service/Call",
    ]
    for who in ("head", "node", "driver"):
        for path in paths:
            code = status_of(lambda: servers[who].raw_bytes(path, b"", token=who_token))  # noqa: B023
            assert code == grpc.StatusCode.UNIMPLEMENTED, (who, path, code)
    _services_alive(sec, head)


def _push_garbage(raw_worker: Raw, frames: list[bytes]) -> list[grpc.StatusCode]:
    stream = raw_worker.channel.stream_stream(
        "/nbcluster.CoreWorker/PushTasks", request_serializer=None, response_deserializer=None
    )
    md = (("authorization", f"Bearer {raw_worker.token}"),)
    codes = []
    for frame in frames:
        call = stream(iter([frame]), metadata=md, timeout=10)
        try:
            replies = list(call)
        except grpc.RpcError as err:
            codes.append(err.code())
        else:
            assert replies == [], "garbage produced task replies"
            codes.append(call.code())
    return codes


def _garbage_frames() -> list[bytes]:
    rng = random.Random(7)
    spec = pb.TaskSpec(task_id=b"t" * 16, function_name="f" * 30)
    frames = [b"\xff" * 16, _truncated(pb.TaskBatch(tasks=[spec]))]
    return frames + [rng.randbytes(40) for _ in range(3)]


def test_garbage_on_a_worker_task_stream_does_not_kill_it(sec, leased_worker, head):
    raw_worker, reply = leased_worker
    codes = _push_garbage(raw_worker, _garbage_frames())
    assert (
        grpc.StatusCode.DEADLINE_EXCEEDED not in codes and grpc.StatusCode.UNAVAILABLE not in codes
    )
    assert_stays(lambda: pid_alive(reply.worker_pid), quiet_period(0.2))
    status = raw_worker.call(
        "CoreWorker", "GetObjectStatus", pb.ObjectStatusRequest(object_id=os.urandom(20))
    )
    assert status.status == pb.ObjectStatusReply.UNKNOWN
    _services_alive(sec, head, healthy=False)


def test_garbage_on_a_worker_task_stream_is_rejected_with_a_status(leased_worker):
    raw_worker, _ = leased_worker
    codes = _push_garbage(raw_worker, _garbage_frames())
    assert all(code in REJECTION_CODES for code in codes), codes


# ------------------------------------------------------------------------------- static checks


def _package_sources() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "labextension" not in p.parts)


_FORBIDDEN_GRPC = {"server", "insecure_channel", "secure_channel"}


def _grpc_factory_calls(tree: ast.AST) -> list[str]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "grpc":
            found += [
                f"from {node.module} import {a.name}"
                for a in node.names
                if a.name in _FORBIDDEN_GRPC
            ]
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in _FORBIDDEN_GRPC
            and ("grpc" in ast.unparse(node.func.value) or ast.unparse(node.func.value) == "aio")
        ):
            found.append(ast.unparse(node.func))
    return found


def _shell_true_calls(tree: ast.AST) -> list[str]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            for kw in node.keywords:
                if kw.arg == "shell" and not (
                    isinstance(kw.value, ast.Constant) and kw.value.value is False
                ):
                    found.append(ast.unparse(node)[:120])
            name = ast.unparse(node.func)
            if name in (
                "os.system",
                "os.popen",
                "subprocess.getoutput",
                "subprocess.getstatusoutput",
            ):
                found.append(name)
    return found


def test_static_checkers_detect_what_they_look_for():
    sample = ast.parse(
        "import grpc, grpc.aio, subprocess\n"
        "s = grpc.aio.server()\nt = grpc.server(None)\nc = grpc.insecure_channel('x')\n"
        "from grpc.aio import insecure_channel\n"
        "subprocess.run('ls', shell=True)\nos.system('ls')\n"
    )
    assert len(_grpc_factory_calls(sample)) == 4
    assert len(_shell_true_calls(sample)) == 2


def test_only_rpc_module_creates_grpc_servers_and_channels():
    sources = _package_sources()
    assert len(sources) > 20
    offenders = {}
    rpc_calls = []
    for path in sources:
        found = _grpc_factory_calls(ast.parse(path.read_text(), str(path)))
        rel = path.relative_to(PACKAGE).as_posix()
        if rel == "_runtime/protocol/rpc.py":
            rpc_calls = found
        elif found:
            offenders[rel] = found
    assert not offenders, f"gRPC servers/channels created outside protocol/rpc.py: {offenders}"
    assert any("server" in c for c in rpc_calls) and any("insecure_channel" in c for c in rpc_calls)
    # Text check too (catches getattr tricks and strings the AST walk might miss).
    for path in sources:
        rel = path.relative_to(PACKAGE).as_posix()
        if rel != "_runtime/protocol/rpc.py":
            text = path.read_text()
            for needle in ("insecure_channel", "grpc.server(", "aio.server("):
                assert needle not in text, f"{rel} mentions {needle}"


def test_no_shell_true_anywhere_in_the_package():
    offenders = {}
    for path in _package_sources():
        found = _shell_true_calls(ast.parse(path.read_text(), str(path)))
        if found or "shell=True" in path.read_text():
            offenders[path.relative_to(PACKAGE).as_posix()] = found or ["shell=True (text)"]
    assert not offenders, offenders
