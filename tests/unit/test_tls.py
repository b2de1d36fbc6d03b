"""TLS (RELIABILITY S08, issue 12 item 7): certificates, gRPC credentials, raw sockets.

No cluster processes: a small in-process gRPC server and socket pair on 127.0.0.1 show that
a peer with the cluster's certificate gets through, and that a plain client or one whose
certificate comes from another CA is refused in the handshake.
"""

from __future__ import annotations

import os
import socket
import ssl
import stat
import threading
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path

import grpc
import pytest

from nbcluster._runtime.protocol import tls

BACKENDS = ["cryptography", "openssl"]
METHOD = "/nbctest.Echo/Call"


@pytest.fixture(scope="module", params=BACKENDS)
def certs(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> tls.TlsSettings:
    """The cluster's CA and certificate, made by each backend."""
    return tls.make_cluster_certificates(
        tmp_path_factory.mktemp(f"tls-{request.param}"), backend=request.param, hosts=["10.0.0.7"]
    )


@pytest.fixture(scope="module")
def foreign(tmp_path_factory: pytest.TempPathFactory) -> tls.TlsSettings:
    """Another cluster's CA and certificate (same cluster name, different CA)."""
    return tls.make_cluster_certificates(tmp_path_factory.mktemp("tls-foreign"))


@pytest.fixture
def server(certs: tls.TlsSettings) -> Iterator[str]:
    """A TLS gRPC server (as rpc.bind makes them) answering one echo method."""
    srv = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    srv.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(
            "nbctest.Echo", {"Call": grpc.unary_unary_rpc_method_handler(lambda req, ctx: req)}
        ),)
    )  # fmt: skip
    port = srv.add_secure_port("127.0.0.1:0", tls.server_credentials(certs))
    srv.start()
    yield f"127.0.0.1:{port}"
    srv.stop(None)


def _call(channel: grpc.Channel) -> bytes:
    try:
        return channel.unary_unary(METHOD)(b"ping", timeout=5)
    finally:
        channel.close()


def _secure(address: str, client: tls.TlsSettings) -> grpc.Channel:
    return grpc.secure_channel(
        address, tls.channel_credentials(client), options=tls.channel_options(client)
    )


def test_keys_are_private_and_the_certificate_is_signed_by_the_ca(certs: tls.TlsSettings) -> None:
    for path in (certs.key_file, str(Path(certs.key_file).with_name(tls.CA_KEY_FILE))):
        assert stat.S_IMODE(Path(path).stat().st_mode) == 0o600
    ctx = ssl.create_default_context(cafile=certs.ca_file)
    assert ctx.get_ca_certs()  # the CA file is a CA certificate
    pem = Path(certs.cert_file).read_text()
    assert "BEGIN CERTIFICATE" in pem and "PRIVATE KEY" not in pem


def test_a_peer_with_the_cluster_certificate_gets_through(
    server: str, certs: tls.TlsSettings
) -> None:
    assert _call(_secure(server, certs)) == b"ping"


def test_a_plain_client_is_refused_by_a_tls_server(server: str) -> None:
    with pytest.raises(grpc.RpcError) as err:
        _call(grpc.insecure_channel(server, options=[("grpc.enable_http_proxy", 0)]))
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE


def test_a_client_whose_certificate_comes_from_another_ca_is_refused(
    server: str, certs: tls.TlsSettings, foreign: tls.TlsSettings
) -> None:
    # It trusts the right CA (so it would accept the server) but presents a foreign cert.
    intruder = tls.TlsSettings(certs.ca_file, foreign.cert_file, foreign.key_file)
    with pytest.raises(grpc.RpcError) as err:
        _call(_secure(server, intruder))
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE


def test_a_server_from_another_ca_is_not_trusted(server: str, foreign: tls.TlsSettings) -> None:
    with pytest.raises(grpc.RpcError) as err:
        _call(_secure(server, foreign))
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE


def _handshake(server_tls: tls.TlsSettings, client_tls: tls.TlsSettings) -> str:
    """A raw-socket TLS handshake (the data plane's way); "ok" or the error text."""
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    result: dict[str, str] = {}

    def serve() -> None:
        conn, _ = listener.accept()
        try:
            with tls.ssl_context(server_tls, server=True).wrap_socket(conn, server_side=True) as s:
                s.sendall(s.recv(4))
        except (ssl.SSLError, OSError) as e:
            result["server"] = repr(e)

    t = threading.Thread(target=serve)
    t.start()
    try:
        ctx = tls.ssl_context(client_tls, server=False)
        with (
            socket.create_connection(("127.0.0.1", port), timeout=5) as raw,
            ctx.wrap_socket(raw, server_hostname=client_tls.server_name) as s,
        ):
            s.sendall(b"ping")
            return "ok" if s.recv(4) == b"ping" else "bad echo"
    except (ssl.SSLError, OSError) as e:
        return repr(e)
    finally:
        t.join(10)
        listener.close()


def test_raw_sockets_use_the_same_rules(certs: tls.TlsSettings, foreign: tls.TlsSettings) -> None:
    assert _handshake(certs, certs) == "ok"
    assert _handshake(certs, foreign) != "ok"  # the server is not from the client's CA
    intruder = tls.TlsSettings(certs.ca_file, foreign.cert_file, foreign.key_file)
    assert _handshake(certs, intruder) != "ok"  # the client's certificate is foreign


def test_settings_come_from_the_environment_and_go_to_children(certs: tls.TlsSettings) -> None:
    assert tls.settings({}) is None  # TLS off by default
    env = certs.env()
    assert tls.TlsSettings.from_env(env) == certs
    with pytest.raises(ValueError, match="NBCLUSTER_TLS_KEY is not set"):
        tls.TlsSettings.from_env({k: v for k, v in env.items() if k != "NBCLUSTER_TLS_KEY"})
    with pytest.raises(FileNotFoundError, match="NBCLUSTER_TLS_CERT"):
        tls.TlsSettings.from_env({**env, "NBCLUSTER_TLS_CERT": "/nonexistent.pem"})


def test_require_encryption_fails_closed_without_tls() -> None:
    with pytest.raises(tls.EncryptionRequiredError, match="^encryption required") as err:
        tls.settings({"NBCLUSTER_REQUIRE_ENCRYPTION": "1"})
    assert isinstance(err.value, ConnectionError)
    assert tls.settings({"NBCLUSTER_REQUIRE_ENCRYPTION": "0"}) is None


def test_an_unknown_backend_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="backend must be"):
        tls.make_cluster_certificates(tmp_path, backend="gnutls")


def test_the_object_data_plane_uses_the_same_contexts(
    certs: tls.TlsSettings, foreign: tls.TlsSettings, tmp_path: Path
) -> None:
    """Node-to-node object pulls (objects/transfer.py) over TLS with these contexts; a plain
    or foreign-CA client gets nothing."""
    from nbcluster._runtime.objects import transfer

    data = os.urandom(3 * 2**20 + 17)
    path = tmp_path / "obj"
    path.write_bytes(data)
    token = "t" * 64
    srv = transfer.DataServer(
        token,
        lambda oid: (str(path), len(data)) if oid == b"o" else None,
        ssl_context=tls.ssl_context(certs, server=True),
        hello_timeout=2.0,
    ).start()
    try:

        def pull(client: tls.TlsSettings | None) -> bytes:
            dest = bytearray(len(data))
            transfer.pull_object(
                srv.address,
                token,
                b"o",
                memoryview(dest),
                parts=2,
                ssl_context=tls.ssl_context(client, server=False) if client else None,
                server_hostname=client.server_name if client else None,
                timeout=5,
                attempts=1,
            )
            return bytes(dest)

        assert pull(certs) == data
        intruder = tls.TlsSettings(certs.ca_file, foreign.cert_file, foreign.key_file)
        for client in (None, intruder, foreign):
            with pytest.raises((transfer.TransferError, OSError)):
                pull(client)
    finally:
        srv.close()
