"""The data plane: object bytes between node managers on a raw socket, not through gRPC.

A gRPC stream moves an object in 4 MiB messages, and grpc-python's per-message cost
(allocate the bytes, protobuf, the event loop, then one more copy into the file) held a
node-to-node pull to about a quarter of loopback TCP. Here the sending node hands the
object file to the kernel with ``os.sendfile`` (no copy through Python) and the receiving
node moves the bytes from the socket into the destination file in its store with
``os.splice`` (socket to pipe to file: the kernel copies each byte once, into the file's
pages), or ``recv_into``\\ s a mapped view where splicing cannot work (TLS, not Linux).
A large object is pulled as a few ranges on parallel connections.

Splicing beats receiving into a mapping of the file because the mapping must be built first:
for a 1 GiB file that is 262,144 page-table entries, about 0.1 s of the 0.45 s a pull took
(``benchmarks/transfer_bench.py``), and the bytes are no faster to copy afterwards.

Every node manager runs a :class:`DataServer` next to its gRPC server, on the same host
(loopback by default, the node's address otherwise). Its address is asked for once per
peer over gRPC (``transfer.proto``). Protocol, little-endian, one connection per range::

    client  b"NBCD" u8 version u8 token-length token           hello
    server  u8 status                                          0 ok, 1 wrong token
    client  u16 id-length id u64 offset u64 length             one request (length 0: to end)
    server  u8 status u64 total-size u64 n, then n bytes       0 ok, 2 not here, 3 error
                                                               (3: the n bytes are a message)

The token is checked in constant time before anything else is read; a wrong or missing
token, a malformed hello or a silent client (``hello_timeout``) closes the connection
with no effect. TLS-ready: pass an ``ssl.SSLContext`` to both ends and the same protocol
runs inside TLS (the sender then reads and sends, as ``sendfile`` cannot encrypt).

A pull resumes from the last byte received when a connection breaks, up to ``attempts``
times per range; when the source cannot be reached any more (it died) it raises
:class:`SourceGone`, which callers treat like an unavailable node.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hmac
import logging
import os
import socket
import ssl
import struct
import threading
from collections.abc import Callable
from typing import NamedTuple

from nbcluster._runtime.objects.readers import open_locked

__all__ = [
    "AuthFailed",
    "CAN_SPLICE",
    "DataServer",
    "FileTarget",
    "ObjectMissing",
    "SourceGone",
    "TransferError",
    "pull_object",
    "split_ranges",
]

log = logging.getLogger(__name__)

MAGIC = b"NBCD"
VERSION = 1
OK, BAD_TOKEN, MISSING, ERROR = 0, 1, 2, 3
#: Smallest range worth its own connection.
MIN_RANGE = 16 << 20

_REQUEST = struct.Struct("<QQ")
_REPLY = struct.Struct("<BQQ")
_MAX_TOKEN = 255  # the hello carries its length in one byte (protocol/hello.py: MAX_TOKEN)
_MAX_ID = 256
_SOCK_BUF = 4 << 20

#: ``locate(object_id) -> (path, size)`` of the object's file on this node, or ``None``.
Locate = Callable[[bytes], "tuple[str, int] | None"]


class TransferError(OSError):
    """A pull failed."""


class SourceGone(TransferError):
    """The source node could not be reached (or went away in the middle of a pull)."""


class ObjectMissing(TransferError):
    """The source node does not hold the object (any more)."""


class AuthFailed(TransferError):
    """The source refused the cluster token."""


# --------------------------------------------------------------------------------------------
# server


class DataServer:
    """Serves this node's object files to other nodes (one thread per connection)."""

    def __init__(
        self,
        token: str,
        locate: Locate,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        ssl_context: ssl.SSLContext | None = None,
        hello_timeout: float = 10.0,
        send_timeout: float = 60.0,
    ) -> None:
        if not token:
            raise ValueError("a cluster token is required to serve objects")
        self._token = token.encode()
        self._locate = locate
        self._ssl = ssl_context
        self._hello_timeout = hello_timeout
        self._send_timeout = send_timeout
        family = socket.AF_INET6 if ":" in host.strip("[]") else socket.AF_INET
        self._sock = socket.socket(family, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind((host.strip("[]"), port))
        self._sock.listen(64)
        self.host = host
        self.port = self._sock.getsockname()[1]
        self._closed = False
        self._conns: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._accept, name="nbc-data-accept", daemon=True)
        self.served_bytes = 0

    @property
    def address(self) -> str:
        """``host:port`` that peers connect to."""
        host = f"[{self.host}]" if ":" in self.host and not self.host.startswith("[") else self.host
        return f"{host}:{self.port}"

    def start(self) -> DataServer:
        """Start accepting connections (in a thread that blocks in ``accept``)."""
        self._thread.start()
        return self

    def close(self) -> None:
        """Stop accepting and end open connections."""
        self._closed = True
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()
        with self._lock:
            conns = list(self._conns)
        for conn in conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        if self._thread.is_alive():
            self._thread.join(timeout=5)

    def _accept(self) -> None:
        while not self._closed:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                if self._closed:
                    return
                continue
            threading.Thread(
                target=self._serve, args=(conn,), name="nbc-data-conn", daemon=True
            ).start()

    def _serve(self, conn: socket.socket) -> None:
        with self._lock:
            self._conns.add(conn)
        try:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn.settimeout(self._hello_timeout)
            if self._ssl is not None:
                conn = self._ssl.wrap_socket(conn, server_side=True)
            if not self._hello(conn):
                return
            _blocking_with_timeouts(conn, self._send_timeout)
            while self._request(conn):
                pass
        except (OSError, ValueError, ssl.SSLError):
            pass  # the peer went away, sent garbage, or stalled: drop the connection
        finally:
            with self._lock:
                self._conns.discard(conn)
            with contextlib.suppress(OSError):
                conn.close()

    def _hello(self, conn: socket.socket) -> bool:
        head = _recv_exact(conn, 6)
        if head[:4] != MAGIC or head[4] != VERSION:
            return False
        token = _recv_exact(conn, head[5]) if head[5] else b""
        if not hmac.compare_digest(token, self._token):
            with contextlib.suppress(OSError):
                conn.sendall(bytes([BAD_TOKEN]))
            return False
        conn.sendall(bytes([OK]))
        return True

    def _request(self, conn: socket.socket) -> bool:
        """Answer one request; False when the client closed the connection."""
        try:
            size_bytes = conn.recv(2)
        except (TimeoutError, BlockingIOError):  # the client stayed silent: drop it
            return False
        if len(size_bytes) < 2:
            if size_bytes:
                size_bytes += _recv_exact(conn, 1)
            else:
                return False
        id_len = int.from_bytes(size_bytes, "little")
        if not 0 < id_len <= _MAX_ID:
            raise ValueError("bad object id length")
        object_id = _recv_exact(conn, id_len)
        offset, length = _REQUEST.unpack(_recv_exact(conn, _REQUEST.size))
        try:
            where = self._locate(object_id)
        except Exception as err:  # noqa: BLE001 - report it to the puller, keep serving
            _send_error(conn, f"{type(err).__name__}: {err}")
            return True
        if where is None:
            conn.sendall(_REPLY.pack(MISSING, 0, 0))
            return True
        path, _ = where
        fd = open_locked(path)  # (the file is not reused while we send it)
        if fd is None:  # freed or spilled between locate and open
            conn.sendall(_REPLY.pack(MISSING, 0, 0))
            return True
        with os.fdopen(fd, "rb", buffering=0) as f:
            total = os.fstat(fd).st_size
            if offset > total:
                _send_error(conn, f"offset {offset} is past the end ({total} bytes)")
                return True
            n = total - offset if length == 0 else min(length, total - offset)
            conn.sendall(_REPLY.pack(OK, total, n))
            if isinstance(conn, ssl.SSLSocket):  # TLS: read and send
                if n and conn.sendfile(f, offset, n) != n:
                    raise OSError(errno.EIO, "object file ended early")
            else:  # straight from the page cache, no copy through Python
                _sendfile_all(conn.fileno(), fd, offset, n)
            with self._lock:
                self.served_bytes += n
        return True


def _sendfile_all(out: int, fd: int, offset: int, count: int) -> None:
    while count:
        sent = os.sendfile(out, fd, offset, min(count, 1 << 30))
        if sent == 0:
            raise OSError(errno.EIO, "object file ended early")
        offset += sent
        count -= sent


def _blocking_with_timeouts(conn: socket.socket, seconds: float) -> None:
    """Blocking mode (one syscall per send/receive, no poll first), with kernel timeouts
    (``SO_RCVTIMEO``/``SO_SNDTIMEO``) so that a stalled peer still ends in an error."""
    conn.settimeout(None)
    whole = int(seconds)
    value = struct.pack("ll", whole, int((seconds - whole) * 1e6))
    conn.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, value)
    conn.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, value)


def _send_error(conn: socket.socket, message: str) -> None:
    msg = message.encode()[:1000]
    conn.sendall(_REPLY.pack(ERROR, 0, len(msg)) + msg)


# --------------------------------------------------------------------------------------------
# client


def split_ranges(size: int, parts: int, align: int = 2 << 20) -> list[tuple[int, int]]:
    """Cut ``[0, size)`` into at most ``parts`` ranges of at least ``MIN_RANGE`` bytes,
    their starts aligned to ``align`` (so each can map and fault in its own pages)."""
    parts = max(1, min(parts, size // MIN_RANGE))
    step = -(-size // parts)
    step = -(-step // align) * align
    return [(start, min(step, size - start)) for start in range(0, size, step)] or [(0, 0)]


#: Whether :class:`FileTarget` works here (``os.splice``: Linux, Python 3.10+).
CAN_SPLICE = hasattr(os, "splice")
_PIPE_SIZE = 1 << 20  # a pipe of 1 MiB (the unprivileged maximum by default): fewer splices
_F_SETPIPE_SZ = 1031


class FileTarget(NamedTuple):
    """Where :func:`pull_object` writes when it splices: an open file, written with
    ``pwrite`` semantics (offsets from 0), of ``nbytes`` (reserve the space first: a file
    system that fills up fails the pull with ``ENOSPC``, which is not retried)."""

    fd: int
    nbytes: int


def pull_object(
    address: str,
    token: str,
    object_id: bytes,
    dest: memoryview | FileTarget,
    *,
    parts: int = 2,
    ssl_context: ssl.SSLContext | None = None,
    server_hostname: str | None = None,
    timeout: float = 30.0,
    attempts: int = 3,
    prepare: Callable[[int, int], None] | None = None,
) -> None:
    """Fill ``dest`` with the object from ``address``: a writable view of the whole object
    (received into), or a :class:`FileTarget` (spliced into; not with ``ssl_context``).

    Ranges go over ``parts`` connections at once (threads; the copies release the GIL).
    ``prepare(offset, length)``, if given, runs in each range's thread before it receives
    (the store uses it to fault in the destination pages). Raises :class:`SourceGone`,
    :class:`ObjectMissing`, :class:`AuthFailed` or :class:`TransferError`.
    """
    size = dest.nbytes
    if size == 0:
        return
    if isinstance(dest, FileTarget) and (ssl_context is not None or not CAN_SPLICE):
        raise ValueError("a FileTarget needs os.splice and a plain (not TLS) connection")
    ranges = split_ranges(size, parts)
    errors: list[BaseException] = []

    def run(offset: int, length: int) -> None:
        try:
            if prepare is not None:
                prepare(offset, length)
            _pull_range(
                address, token, object_id, dest, offset, length, size,
                ssl_context, server_hostname, timeout, attempts,
            )  # fmt: skip
        except BaseException as err:  # noqa: BLE001 - re-raised in the caller's thread
            errors.append(err)

    threads = [
        threading.Thread(target=run, args=r, name="nbc-data-pull", daemon=True) for r in ranges[1:]
    ]
    for t in threads:
        t.start()
    run(*ranges[0])
    for t in threads:
        t.join()
    if errors:
        # A missing object or a refused token says more than a broken connection.
        errors.sort(key=lambda e: 0 if isinstance(e, ObjectMissing | AuthFailed) else 1)
        raise errors[0]


def _pull_range(
    address: str,
    token: str,
    object_id: bytes,
    dest: memoryview | FileTarget,
    offset: int,
    length: int,
    size: int,
    ssl_context: ssl.SSLContext | None,
    server_hostname: str | None,
    timeout: float,
    attempts: int,
) -> None:
    done = 0
    failures = 0
    while done < length:
        try:
            conn = _connect(address, token, ssl_context, server_hostname, timeout)
        except (AuthFailed, SourceGone):
            raise
        except (ConnectionRefusedError, socket.gaierror) as err:  # nobody listens any more
            raise SourceGone(errno.EHOSTUNREACH, f"cannot reach {address}: {err}") from None
        except OSError as err:  # timed out, reset: maybe transient
            failures += 1
            if failures >= attempts:
                raise SourceGone(errno.EHOSTUNREACH, f"cannot reach {address}: {err}") from None
            continue
        try:
            done += _receive(conn, object_id, dest, offset + done, length - done, size)
        except _Progress as p:  # the connection broke after some bytes: resume from there
            done += p.received
            failures += 1
            if failures >= attempts:
                raise SourceGone(
                    errno.ECONNRESET, f"the connection to {address} kept breaking: {p.cause}"
                ) from None
        finally:
            with contextlib.suppress(OSError):
                conn.close()


class _Progress(Exception):
    def __init__(self, received: int, cause: BaseException) -> None:
        self.received = received
        self.cause = cause


def _connect(
    address: str,
    token: str,
    ssl_context: ssl.SSLContext | None,
    server_hostname: str | None,
    timeout: float,
) -> socket.socket:
    host, _, port = address.rpartition(":")
    host = host.strip("[]")
    conn = socket.create_connection((host, int(port)), timeout=timeout)
    try:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, _SOCK_BUF)
        if ssl_context is not None:
            conn = ssl_context.wrap_socket(conn, server_hostname=server_hostname or host)
        else:
            _blocking_with_timeouts(conn, timeout)
        raw = token.encode()
        if len(raw) > _MAX_TOKEN:
            raise AuthFailed(errno.EACCES, "the cluster token is too long")
        conn.sendall(MAGIC + bytes([VERSION, len(raw)]) + raw)
        status = conn.recv(1)
        if status != bytes([OK]):
            if status == bytes([BAD_TOKEN]):
                raise AuthFailed(errno.EACCES, f"{address} refused the cluster token")
            raise SourceGone(errno.ECONNRESET, f"{address} closed the connection at hello")
        return conn
    except BaseException:
        conn.close()
        raise


def _receive(
    conn: socket.socket,
    object_id: bytes,
    dest: memoryview | FileTarget,
    offset: int,
    length: int,
    size: int,
) -> int:
    """Request ``[offset, offset + length)`` and receive it into ``dest``; return bytes."""
    got = 0
    pipe: tuple[int, int] | None = None
    try:
        conn.sendall(len(object_id).to_bytes(2, "little") + object_id)
        conn.sendall(_REQUEST.pack(offset, length))
        status, total, n = _REPLY.unpack(_recv_exact(conn, _REPLY.size))
        if status == MISSING:
            raise ObjectMissing(errno.ENOENT, "the source node does not hold the object")
        if status != OK:
            message = _recv_exact(conn, min(n, 1000)).decode(errors="replace")
            raise TransferError(errno.EIO, f"the source failed: {message}")
        if total != size or n != length:
            raise TransferError(
                errno.EIO, f"size mismatch: the source has {total} bytes, expected {size}"
            )
        if isinstance(dest, FileTarget):
            pipe = os.pipe()
            with contextlib.suppress(OSError):  # a smaller pipe only means more splices
                fcntl.fcntl(pipe[1], _F_SETPIPE_SZ, _PIPE_SIZE)
            while got < n:
                r = os.splice(conn.fileno(), pipe[1], min(_PIPE_SIZE, n - got))
                if r == 0:
                    raise ConnectionResetError(errno.ECONNRESET, "the source closed the connection")
                while r:  # out of the pipe into the file; ``got`` counts what is in the file
                    try:
                        w = os.splice(pipe[0], dest.fd, r, offset_dst=offset + got)
                    except OSError as err:  # the file's side (ENOSPC, EIO): not the network's
                        raise TransferError(
                            err.errno, f"writing the object failed: {err}"
                        ) from None
                    if w == 0:
                        raise TransferError(errno.EIO, "writing the object made no progress")
                    got += w
                    r -= w
            return got
        view = dest[offset : offset + n]
        while got < n:
            r = conn.recv_into(view[got:])
            if r == 0:
                raise ConnectionResetError(errno.ECONNRESET, "the source closed the connection")
            got += r
        return got
    except (ObjectMissing, TransferError):
        raise
    except (OSError, ValueError) as err:  # broken, reset or timed out: resume elsewhere
        raise _Progress(got, err) from None
    finally:
        if pipe is not None:
            os.close(pipe[0])
            os.close(pipe[1])


def _recv_exact(conn: socket.socket, n: int) -> bytes:
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        r = conn.recv_into(view[got:])
        if r == 0:
            raise ConnectionResetError(errno.ECONNRESET, "connection closed")
        got += r
    return bytes(buf)
