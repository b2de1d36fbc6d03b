"""A cluster with TLS on every connection (RELIABILITY S08; issue 12, item 7).

The driver, head, node manager and workers all speak TLS with the cluster's certificate;
a plain client and a client whose certificate comes from another CA are refused in the
handshake (no effect on the head); with ``require_encryption`` a process without TLS
settings refuses to connect at all, saying "encryption required".
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import grpc
import numpy as np
import pytest

import nbcluster
from nbcluster._runtime import proc
from nbcluster._runtime.protocol import tls
from nbcluster._runtime.protocol.rpc import pb, pb_grpc
from nbcluster.testing import assert_no_processes
from nbcluster.util import NodeAffinitySchedulingStrategy as NA

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def foreign(tmp_path_factory: pytest.TempPathFactory) -> tls.TlsSettings:
    return tls.make_cluster_certificates(tmp_path_factory.mktemp("foreign-ca"))


def _register(
    address: str, token: str, creds: grpc.ChannelCredentials | None, opts: list, name: str
) -> str:
    """Try to register (and then unregister) a fake node with the head; "OK" or the status."""
    channel = (
        grpc.secure_channel(address, creds, options=opts)
        if creds is not None
        else grpc.insecure_channel(address, options=[("grpc.enable_http_proxy", 0)])
    )
    fake = pb.NodeInfo(node_id=os.urandom(16), node_name=name, address="127.0.0.1:9")
    md = (("authorization", f"Bearer {token}"),)
    try:
        head = pb_grpc.HeadStub(channel)
        head.RegisterNode(pb.RegisterNodeRequest(node=fake), metadata=md, timeout=10)
        head.UnregisterNode(pb.NodeRef(node_id=fake.node_id), metadata=md, timeout=10)
    except grpc.RpcError as err:
        return err.code().name
    finally:
        channel.close()
    return "OK"


def test_every_connection_uses_tls_and_foreign_or_plain_peers_are_refused(
    cluster, tls_env: tls.TlsSettings, foreign: tls.TlsSettings
) -> None:
    certs = tls_env  # in this driver's environment and every process it starts
    info = cluster(num_cpus=1, _nodes=2)

    @nbcluster.remote
    def square(x: int) -> int:
        return x * x

    @nbcluster.remote
    class Counter:
        def __init__(self) -> None:
            self.n = 0

        def inc(self) -> int:
            self.n += 1
            return self.n

    assert nbcluster.get([square.remote(i) for i in range(10)]) == [i * i for i in range(10)]
    c = Counter.remote()
    assert nbcluster.get([c.inc.remote() for _ in range(3)]) == [1, 2, 3]
    big = nbcluster.put(b"x" * 2_000_000)
    assert len(nbcluster.get(big)) == 2_000_000

    @nbcluster.remote
    def make() -> np.ndarray:
        return np.arange(3_000_000, dtype=np.int64)

    me = nbcluster.get_runtime_context().get_node_id()
    other = next(n["NodeID"] for n in nbcluster.nodes() if n["NodeID"] != me)
    made_there = make.options(scheduling_strategy=NA(other)).remote()
    # Pulled from the other node's store over the data plane, inside TLS.
    assert int(nbcluster.get(made_there, timeout=60).sum()) == int(np.arange(3_000_000).sum())

    token = proc.read_token(Path(info.session_dir) / proc.TOKEN_FILE)
    # Tasks and actor calls went on task channels, and those speak TLS only: a plain peer
    # with the right token gets no answer.
    from nbcluster._runtime import context as runtime_context
    from nbcluster._runtime.core import channel

    opened = runtime_context.current_client().submitter.streams._addresses  # type: ignore[union-attr]
    channels = [a for a in opened.values() if a]
    assert channels, "no task channel was used"
    for address in channels:
        host, _, port = address.rpartition(":")
        with socket.create_connection((host, int(port)), timeout=10) as s:
            s.sendall(channel.MAGIC + bytes([channel.VERSION, len(token)]) + token.encode() + b"\0")
            s.settimeout(10)
            try:
                answer = s.recv(1)
            except (ConnectionError, TimeoutError):
                answer = b""
            assert answer != bytes([channel.OK]), "a plain peer got through a task channel"
    # A plain client never gets a TLS server to answer (not even with the token).
    assert _register(info.address, token, None, [], "intruder") == "UNAVAILABLE"
    node_address = nbcluster.nodes()[-1]["NodeManagerAddress"]
    node_port = nbcluster.nodes()[-1]["NodeManagerPort"]
    plain = grpc.insecure_channel(f"{node_address}:{node_port}")
    with pytest.raises(grpc.RpcError) as err:  # the node manager too
        pb_grpc.NodeManagerStub(plain).GetNodeStats(
            pb.Empty(), metadata=(("authorization", f"Bearer {token}"),), timeout=10
        )
    plain.close()
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    # A client trusting the cluster CA but presenting another CA's certificate: refused.
    intruder = tls.TlsSettings(certs.ca_file, foreign.cert_file, foreign.key_file)
    creds = tls.channel_credentials(intruder)
    opts = tls.channel_options(intruder)
    assert _register(info.address, token, creds, opts, "intruder") == "UNAVAILABLE"
    assert all(n["NodeName"] != "intruder" for n in nbcluster.nodes())  # no effect
    # With the cluster's certificate the same raw call is accepted (the check above is real).
    good = tls.channel_credentials(certs)
    assert _register(info.address, token, good, tls.channel_options(certs), "tls-ok") == "OK"

    # require_encryption fails closed: a driver without TLS settings does not connect.
    env = {k: v for k, v in os.environ.items() if not k.startswith("NBCLUSTER_TLS_")}
    env.update(NBCLUSTER_TOKEN=token, PYTHONPATH=str(REPO))
    code = f"import nbcluster; nbcluster.init(address={info.address!r})"
    r = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert r.returncode != 0
    assert "encryption required" in r.stderr, r.stderr[-2000:]
    nbcluster.kill(c)


def test_cli_start_with_tls_prints_what_drivers_and_nodes_need(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("NBCLUSTER_")}
    env.update(NBCLUSTER_TEMP_DIR=str(tmp_path / "sessions"), PYTHONPATH=str(REPO))
    cli = [sys.executable, "-m", "nbcluster.cli"]
    started = subprocess.run(
        [*cli, "start", "--head", "--tls", "--num-cpus", "1"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    try:
        assert started.returncode == 0, started.stderr
        out = started.stdout
        assert "--tls-ca" in out and "--tls-cert" in out and "--tls-key" in out
        tls_line = next(line for line in out.splitlines() if line.strip().startswith("TLS:"))
        driver_env = dict(env)
        for word in tls_line.split():
            if word.startswith("NBCLUSTER_TLS_"):
                k, _, v = word.partition("=")
                driver_env[k] = v
        assert {"NBCLUSTER_TLS_CA_CERT", "NBCLUSTER_TLS_CERT", "NBCLUSTER_TLS_KEY"} <= set(
            driver_env
        )
        code = (
            "import nbcluster\nnbcluster.init(address='auto')\n"
            "print(nbcluster.get(nbcluster.remote(lambda: 41 + 1).remote()))\nnbcluster.shutdown()"
        )
        r = subprocess.run(
            [sys.executable, "-c", code],
            env=driver_env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert r.returncode == 0 and r.stdout.strip() == "42", r.stderr[-2000:]
        key = Path(driver_env["NBCLUSTER_TLS_KEY"])
        assert key.stat().st_mode & 0o777 == 0o600
    finally:
        subprocess.run([*cli, "stop"], env=env, capture_output=True, timeout=60)
        assert_no_processes(tmp_path / "sessions", timeout=15)
