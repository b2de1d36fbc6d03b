"""The object data plane: a raw socket server and client, on loopback, without processes."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import ssl
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator

import pytest

from nbcluster._runtime.objects import transfer

MiB = 1 << 20
TOKEN = "t" * 64


@pytest.fixture
def files() -> Iterator[dict[bytes, str]]:
    """Object files by id (in a private directory)."""
    root = tempfile.mkdtemp(prefix="nbc-test-transfer-")
    out: dict[bytes, str] = {}
    for oid, size in ((b"small", 1000), (b"big", 40 * MiB + 12345)):
        path = os.path.join(root, oid.decode())
        with open(path, "wb") as f:
            f.write(os.urandom(size))
        out[oid] = path
    yield out
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def server(files) -> Iterator[transfer.DataServer]:
    calls: list[bytes] = []

    def locate(oid: bytes) -> tuple[str, int] | None:
        calls.append(oid)
        if oid == b"broken":
            raise RuntimeError("the disk caught fire")
        path = files.get(oid)
        return (path, os.path.getsize(path)) if path else None

    srv = transfer.DataServer(TOKEN, locate, hello_timeout=1.0).start()
    srv.calls = calls  # type: ignore[attr-defined]
    yield srv
    srv.close()


def wait_for(check, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.01)


def closed_by_peer(s: socket.socket, timeout: float) -> bool:
    s.settimeout(timeout)
    try:
        return s.recv(10) == b""
    except ConnectionResetError:
        return True


def content(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


@pytest.mark.parametrize("parts", [1, 2, 3])
def test_pull_copies_the_object_exactly(server, files, parts) -> None:
    want = content(files[b"big"])
    dest = bytearray(len(want))
    transfer.pull_object(server.address, TOKEN, b"big", memoryview(dest), parts=parts)
    assert dest == want
    small = bytearray(1000)
    transfer.pull_object(server.address, TOKEN, b"small", memoryview(small), parts=parts)
    assert bytes(small) == content(files[b"small"])
    wait_for(lambda: server.served_bytes == len(want) + 1000)


def test_prepare_runs_once_per_range_in_each_thread(server, files) -> None:
    size = os.path.getsize(files[b"big"])
    seen: list[tuple[int, int, str]] = []
    dest = bytearray(size)
    transfer.pull_object(
        server.address,
        TOKEN,
        b"big",
        memoryview(dest),
        parts=2,
        prepare=lambda off, n: seen.append((off, n, threading.current_thread().name)),
    )
    assert sorted((off, n) for off, n, _ in seen) == transfer.split_ranges(size, 2)
    assert len({name for *_, name in seen}) == 2


def test_split_ranges() -> None:
    assert transfer.split_ranges(10, 4) == [(0, 10)]  # small: one range
    ranges = transfer.split_ranges(100 * MiB + 1, 3)
    assert len(ranges) == 3 and sum(n for _, n in ranges) == 100 * MiB + 1
    assert all(off % (2 * MiB) == 0 for off, _ in ranges)
    assert [off for off, _ in ranges] == sorted({off for off, _ in ranges})
    assert ranges[0][0] == 0 and ranges[-1][0] + ranges[-1][1] == 100 * MiB + 1


@pytest.mark.parametrize("token", ["", "wrong", "t" * 63 + "u"])
def test_a_wrong_token_is_refused_before_anything_is_read(server, token) -> None:
    with pytest.raises(transfer.AuthFailed, match="refused the cluster token"):
        transfer.pull_object(server.address, token, b"small", memoryview(bytearray(1000)))
    assert server.calls == []  # locate never ran: no side effect


def test_a_missing_object_and_a_failing_source(server) -> None:
    with pytest.raises(transfer.ObjectMissing):
        transfer.pull_object(server.address, TOKEN, b"nope", memoryview(bytearray(10)))
    with pytest.raises(transfer.TransferError, match="the disk caught fire"):
        transfer.pull_object(server.address, TOKEN, b"broken", memoryview(bytearray(10)))
    with pytest.raises(transfer.TransferError, match="size mismatch"):
        transfer.pull_object(server.address, TOKEN, b"small", memoryview(bytearray(999)))
    # The server still serves.
    transfer.pull_object(server.address, TOKEN, b"small", memoryview(bytearray(1000)))


def test_garbage_and_silent_clients_are_dropped(server) -> None:
    host, port = server.address.rsplit(":", 1)
    with socket.create_connection((host, int(port))) as s:
        s.sendall(b"GET / HTTP/1.1\r\n\r\n")
        assert closed_by_peer(s, 5)  # without an answer
    with socket.create_connection((host, int(port))) as s:
        start = time.monotonic()
        assert closed_by_peer(s, 10)  # said nothing: dropped after hello_timeout
        assert time.monotonic() - start < 8
    with socket.create_connection((host, int(port))) as s:  # a huge id length
        s.sendall(transfer.MAGIC + bytes([transfer.VERSION, len(TOKEN)]) + TOKEN.encode())
        assert s.recv(1) == bytes([transfer.OK])
        s.sendall((65535).to_bytes(2, "little"))
        assert closed_by_peer(s, 5)
    assert server.calls == []
    transfer.pull_object(server.address, TOKEN, b"small", memoryview(bytearray(1000)))


class CuttingProxy:
    """Forwards to ``target``; cuts the first ``cuts`` connections after ``after`` bytes."""

    def __init__(self, target: str, after: int, cuts: int) -> None:
        self.target = target
        self.after = after
        self.cuts = cuts
        self.connections = 0
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self.sock.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            cut = self.connections <= self.cuts
            host, port = self.target.rsplit(":", 1)
            upstream = socket.create_connection((host, int(port)))
            threading.Thread(target=self._pipe, args=(client, upstream, None), daemon=True).start()
            limit = self.after if cut else None
            threading.Thread(target=self._pipe, args=(upstream, client, limit), daemon=True).start()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket, limit: int | None) -> None:
        sent = 0
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                if limit is not None and sent + len(data) > limit:
                    dst.sendall(data[: limit - sent])
                    break
                dst.sendall(data)
                sent += len(data)
        except OSError:
            pass
        for s in (src, dst):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()

    def close(self) -> None:
        self.sock.close()


def test_a_broken_connection_resumes_where_it_stopped(server, files) -> None:
    proxy = CuttingProxy(server.address, after=5 * MiB, cuts=2)
    try:
        want = content(files[b"big"])
        dest = bytearray(len(want))
        transfer.pull_object(proxy.address, TOKEN, b"big", memoryview(dest), parts=1, attempts=3)
        assert dest == want
        assert proxy.connections == 3  # two cut, the third finished the rest
        # Resumed, not restarted: the source sent the object about once (plus the cut tails).
        assert server.served_bytes < 2 * len(want)
    finally:
        proxy.close()


def test_a_source_that_keeps_breaking_is_gone(server) -> None:
    proxy = CuttingProxy(server.address, after=MiB, cuts=100)
    try:
        with pytest.raises(transfer.SourceGone, match="kept breaking"):
            transfer.pull_object(
                proxy.address, TOKEN, b"big", memoryview(bytearray(40 * MiB + 12345)), attempts=2
            )
    finally:
        proxy.close()


def test_a_dead_source_is_gone(server) -> None:
    address = server.address
    server.close()
    with pytest.raises(transfer.SourceGone, match="cannot reach"):
        transfer.pull_object(address, TOKEN, b"small", memoryview(bytearray(1000)))


def test_token_is_required_to_serve() -> None:
    with pytest.raises(ValueError, match="token"):
        transfer.DataServer("", lambda oid: None)


def _self_signed(tmp: str) -> tuple[str, str] | None:
    if shutil.which("openssl") is None:
        return None
    cert, key = os.path.join(tmp, "cert.pem"), os.path.join(tmp, "key.pem")
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-subj", "/CN=localhost", "-addext", "subjectAltName=IP:127.0.0.1",
         "-keyout", key, "-out", cert],
        check=True, capture_output=True,
    )  # fmt: skip
    return cert, key


def test_the_same_protocol_runs_inside_tls(files, tmp_path) -> None:
    pair = _self_signed(str(tmp_path))
    if pair is None:
        pytest.skip("openssl is not installed")
    cert, key = pair
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_ctx.load_cert_chain(cert, key)
    client_ctx = ssl.create_default_context(cafile=cert)
    path = files[b"big"]
    srv = transfer.DataServer(
        TOKEN, lambda oid: (path, os.path.getsize(path)), ssl_context=server_ctx
    ).start()
    try:
        dest = bytearray(os.path.getsize(path))
        transfer.pull_object(
            srv.address, TOKEN, b"big", memoryview(dest), parts=2, ssl_context=client_ctx
        )
        assert dest == content(path)
        # A plain client cannot talk to a TLS server.
        with pytest.raises(transfer.TransferError):
            transfer.pull_object(srv.address, TOKEN, b"big", memoryview(dest), attempts=1)
    finally:
        srv.close()


# --------------------------------------------------------------------------- splicing into a file

needs_splice = pytest.mark.skipif(not transfer.CAN_SPLICE, reason="os.splice is Linux-only")


@needs_splice
@pytest.mark.parametrize("parts", [1, 2, 3])
def test_a_pull_spliced_into_a_file_copies_the_object_exactly(server, files, parts, tmp_path):
    want = content(files[b"big"])
    path = tmp_path / "dest"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        os.ftruncate(fd, len(want))
        transfer.pull_object(
            server.address, TOKEN, b"big", transfer.FileTarget(fd, len(want)), parts=parts
        )
    finally:
        os.close(fd)
    assert path.read_bytes() == want
    wait_for(lambda: server.served_bytes == len(want))


@needs_splice
def test_a_broken_spliced_pull_resumes_where_the_file_stopped(server, files, tmp_path) -> None:
    proxy = CuttingProxy(server.address, after=5 * MiB, cuts=2)
    want = content(files[b"big"])
    fd = os.open(tmp_path / "dest", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        os.ftruncate(fd, len(want))
        transfer.pull_object(
            proxy.address, TOKEN, b"big", transfer.FileTarget(fd, len(want)), parts=1, attempts=3
        )
        assert proxy.connections == 3
        assert server.served_bytes < 2 * len(want)  # resumed, not restarted
    finally:
        os.close(fd)
        proxy.close()
    assert (tmp_path / "dest").read_bytes() == want


@needs_splice
def test_a_file_that_cannot_be_written_fails_the_pull_at_once(server, files, tmp_path) -> None:
    """The file's side failing (here: opened read-only) is not a network fault: no retries,
    one request, and an error that says what failed."""
    size = os.path.getsize(files[b"big"])
    (tmp_path / "dest").write_bytes(b"")
    fd = os.open(tmp_path / "dest", os.O_RDONLY)
    try:
        with pytest.raises(transfer.TransferError, match="writing the object failed"):
            transfer.pull_object(
                server.address, TOKEN, b"big", transfer.FileTarget(fd, size), parts=1
            )
    finally:
        os.close(fd)
    assert server.calls == [b"big"]


def test_a_file_target_is_refused_with_tls(server) -> None:
    ctx = ssl.create_default_context()
    with pytest.raises(ValueError, match="plain"):
        transfer.pull_object(
            server.address, TOKEN, b"small", transfer.FileTarget(0, 1000), ssl_context=ctx
        )
    assert server.calls == []


@needs_splice
def test_a_store_writer_reserves_once_and_takes_a_spliced_pull(server, files, shm_dir) -> None:
    """``RawWriter.reserve`` allocates a new file's pages (so a full store fails before any
    byte moves); the spliced object is then sealed like one received into a mapping."""
    from nbcluster._runtime.objects import store as objstore

    want = content(files[b"big"])
    with objstore.RawWriter(shm_dir, b"o" * 20, len(want)) as writer:
        assert not writer.allocated
        writer.reserve()
        assert os.fstat(writer.fd).st_blocks * 512 >= len(want)
        writer.reserve()  # once only
        transfer.pull_object(
            server.address, TOKEN, b"big", transfer.FileTarget(writer.fd, writer.size), parts=2
        )
    assert content(objstore.object_path(shm_dir, b"o" * 20)) == want
