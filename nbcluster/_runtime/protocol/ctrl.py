"""Control channels: small request/reply calls on a raw connection instead of gRPC.

A gRPC unary call costs about half a millisecond of CPU per side in grpc's Python layer;
a placement group's create and remove are four such calls in series (driver -> head,
head -> node manager, twice). A control channel carries the same protobuf requests and
replies as length-prefixed frames on one TCP connection, served on the process's event
loop beside its gRPC server, dispatched to the same servicer coroutines (with a context
whose ``abort`` raises the code and details the caller would get from gRPC). The address
is asked once per peer over gRPC (``ctrl.proto``: ``Control.ControlAddress``); a peer that
serves none answers ``""`` (or UNIMPLEMENTED) and callers stay on gRPC. Protocol,
little-endian::

    client  b"NBCC" u8 version u8 token-length token          hello
    server  u8 status                                          0 ok, 1 wrong token / bad hello
    request u32 n, u32 call id, u8 method-length, method, protobuf request
    reply   u32 n, u32 call id, u8 status, protobuf reply      status 0: ok; else the gRPC
                                                               status code, then the details
                                                               (UTF-8) instead of a reply

``n`` counts the bytes after it. Calls on one connection may be answered out of order
(each runs as its own task). A request with an empty method is a ping, answered at once
from the loop (how a blocking caller tells a slow call from a stopped peer). The token is
checked in constant time before any request is read (the hello is ``protocol/hello.py``'s,
shared with the task channels); a silent peer is dropped after
``HELLO_TIMEOUT_S``; a frame over the cluster's message limit closes the connection. TLS:
with the cluster's certificates the same protocol runs inside mutual TLS
(``tls.ssl_context``), as the task channels do.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
import struct
import threading
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, NoReturn

import grpc

from nbcluster._runtime.netaddr import numeric_listener
from nbcluster._runtime.protocol import errors
from nbcluster._runtime.protocol.errors import RpcFailure
from nbcluster._runtime.protocol.hello import HELLO_TIMEOUT_S, OK, REFUSED, Hello, token_fits
from nbcluster._runtime.protocol.protos import ctrl_pb2, ctrl_pb2_grpc

__all__ = [
    "AsyncCtrlConnection",
    "ControlAddressService",
    "CtrlAbort",
    "CtrlBroken",
    "CtrlClient",
    "CtrlServer",
    "Method",
    "ServerContext",
    "open_async",
    "token_fits",
]

log = logging.getLogger(__name__)

MAGIC = b"NBCC"
VERSION = 1
_HELLO = Hello(MAGIC, VERSION)
PING_ID = 0
_LEN = struct.Struct("<I")
_HEAD = struct.Struct("<IIB")  # n, call id, method length (request) or status (reply)
_BAD_REQUEST = (
    "malformed request: the message could not be decoded (is the client the same version?)"
)

#: ``(handler(request, context) -> reply, request class)``: one method a server answers.
Method = tuple[Callable[[Any, Any], Awaitable[Any]], type]

_CODES: dict[int, grpc.StatusCode] = {c.value[0]: c for c in grpc.StatusCode}
_BY_CODE: dict[grpc.StatusCode, type[RpcFailure]] = {
    cls.CODE: cls
    for cls in (getattr(errors, name) for name in errors.__all__)
    if isinstance(cls, type) and issubclass(cls, RpcFailure) and cls.CODE is not None
}


def failure(code: grpc.StatusCode, details: str, peer: str = "") -> RpcFailure:
    """The :class:`RpcFailure` the gRPC stubs raise for ``code`` (same class, same details)."""
    return _BY_CODE.get(code, RpcFailure)(code, details, peer)


class CtrlBroken(errors.RpcUnavailable):
    """The control connection failed (refused, reset, closed): the call may not have run.
    Callers fall back to gRPC, which retries as it always did."""

    def __init__(self, details: str, peer: str = "") -> None:
        super().__init__(grpc.StatusCode.UNAVAILABLE, details, peer)


class CtrlAbort(Exception):
    """Raised by :meth:`ServerContext.abort`: the call fails with this code and details."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(code, details)
        self.code = code
        self.details = details


class ServerContext:
    """What a servicer coroutine gets as its ``context`` on a control channel."""

    def __init__(self, peer: str) -> None:
        self._peer = peer

    async def abort(
        self, code: grpc.StatusCode, details: str = "", trailing_metadata: Any = ()
    ) -> NoReturn:
        """End the call with ``code`` and ``details`` (as ``grpc.aio``'s ``abort``)."""
        raise CtrlAbort(code, details)

    def invocation_metadata(self) -> tuple[()]:
        """No metadata travels on a control channel (the token was checked at the hello)."""
        return ()

    def peer(self) -> str:
        """The caller's address."""
        return self._peer


def _nodelay(sock: Any) -> None:
    if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def _frame(call_id: int, byte: int, tail: bytes, payload: bytes) -> bytes:
    return _HEAD.pack(5 + len(tail) + len(payload), call_id, byte) + tail + payload


def _cut(buf: bytearray, max_frame: int) -> list[tuple[int, int, bytes]] | None:
    """Complete frames at the start of ``buf`` as (call id, byte, rest), removed from it;
    None when a frame is malformed or over ``max_frame`` (the connection must close)."""
    out = []
    pos = 0
    size = len(buf)
    while size - pos >= 4:
        (n,) = _LEN.unpack_from(buf, pos)
        if n < 5 or n > max_frame:
            return None
        if size - pos - 4 < n:
            break
        _, call_id, byte = _HEAD.unpack_from(buf, pos)
        out.append((call_id, byte, bytes(buf[pos + 9 : pos + 4 + n])))
        pos += 4 + n
    if pos:
        del buf[:pos]
    return out


# --------------------------------------------------------------------------- server


class _ServerProtocol(asyncio.Protocol):
    def __init__(self, server: CtrlServer) -> None:
        self.server = server
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
        self.authed = False
        self.peer = ""
        self.timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        _nodelay(transport.get_extra_info("socket"))
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        self.timer = asyncio.get_running_loop().call_later(HELLO_TIMEOUT_S, self._drop)
        self.server._conns.add(self)

    def _drop(self) -> None:
        if self.transport is not None:
            self.transport.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        # Calls in flight run to their end (a removal half done would leave the head's view
        # charged); their replies are dropped.
        if self.timer is not None:
            self.timer.cancel()
        self.server._conns.discard(self)

    def data_received(self, data: bytes) -> None:
        self.buf += data
        transport = self.transport
        assert transport is not None
        if not self.authed:
            ok = _HELLO.take(self.buf, self.server.token)
            if ok is None:
                return
            if not ok:
                transport.write(bytes([REFUSED]))
                transport.close()
                return
            self.authed = True
            if self.timer is not None:
                self.timer.cancel()
            transport.write(bytes([OK]))
        frames = _cut(self.buf, self.server.max_frame)
        if frames is None:
            log.warning("control channel: a malformed or oversized frame; closing")
            transport.abort()
            return
        for call_id, mlen, rest in frames:
            self._dispatch(call_id, rest[:mlen].decode("ascii", "replace"), rest[mlen:])

    def _reply(self, call_id: int, status: int, payload: bytes) -> None:
        transport = self.transport
        if transport is not None and not transport.is_closing():
            transport.write(_frame(call_id, status, b"", payload))

    def _dispatch(self, call_id: int, method: str, payload: bytes) -> None:
        if not method:  # a ping
            self._reply(call_id, OK, b"")
            return
        entry = self.server.methods.get(method)
        if entry is None:
            code = grpc.StatusCode.UNIMPLEMENTED
            self._reply(call_id, code.value[0], f"unknown method {method!r}".encode())
            return
        handler, request_type = entry
        try:
            request = request_type.FromString(payload)
        except Exception:  # noqa: BLE001 - any decode failure is the client's fault
            code = grpc.StatusCode.INVALID_ARGUMENT
            self._reply(call_id, code.value[0], _BAD_REQUEST.encode())
            return
        tasks = self.server._tasks
        task = asyncio.get_running_loop().create_task(self._run(call_id, handler, request))
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    async def _run(self, call_id: int, handler: Callable[..., Any], request: Any) -> None:
        try:
            reply = await handler(request, ServerContext(self.peer))
        except CtrlAbort as err:
            self._reply(call_id, err.code.value[0], err.details.encode())
            return
        except Exception as err:  # noqa: BLE001 - the caller gets UNKNOWN, as from gRPC
            log.exception("control call failed")
            details = f"Unexpected {type(err)}: {err}"
            self._reply(call_id, grpc.StatusCode.UNKNOWN.value[0], details.encode())
            return
        self._reply(call_id, OK, reply.SerializeToString())


class CtrlServer:
    """Serves ``methods`` (name -> handler, request class) on a control channel."""

    def __init__(
        self,
        token: str,
        methods: Mapping[str, Method],
        *,
        max_frame: int,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self.token = token.encode()
        self.methods = dict(methods)
        self.max_frame = max_frame
        self._ssl = ssl_context
        self._server: asyncio.base_events.Server | None = None
        self._conns: set[_ServerProtocol] = set()
        self._tasks: set[asyncio.Task[None]] = set()  # calls being served
        self.address = ""

    async def start(self, host: str) -> str:
        """Listen on ``host`` (an ephemeral port); return ``host:port``."""
        loop = asyncio.get_running_loop()
        listener = numeric_listener(host)  # no getaddrinfo: no libuv thread pool
        if listener is not None:
            self._server = await loop.create_server(
                lambda: _ServerProtocol(self), sock=listener, ssl=self._ssl
            )
        else:
            self._server = await loop.create_server(
                lambda: _ServerProtocol(self), host, 0, ssl=self._ssl
            )
        port = self._server.sockets[0].getsockname()[1]
        self.address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        return self.address

    async def close(self) -> None:
        """Stop listening, drop every connection and end the calls being served."""
        if self._server is not None:
            self._server.close()
        for conn in list(self._conns):
            conn._drop()
        for task in list(self._tasks):
            task.cancel()


class ControlAddressService(ctrl_pb2_grpc.ControlServicer):
    """``Control.ControlAddress`` on the gRPC server: where the control channel listens."""

    def __init__(self, address: str = "") -> None:
        self.address = address

    async def ControlAddress(
        self, request: ctrl_pb2.ControlAddressRequest, context: grpc.aio.ServicerContext
    ) -> ctrl_pb2.ControlAddressReply:
        """The control channel's ``host:port`` ("" when there is none)."""
        return ctrl_pb2.ControlAddressReply(address=self.address)


def _split(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port)


def _result(status: int, payload: bytes, reply_type: type, peer: str) -> Any:
    if status == OK:
        return reply_type.FromString(payload)
    code = _CODES.get(status, grpc.StatusCode.UNKNOWN)
    raise failure(code, payload.decode("utf-8", "replace"), peer)


# --------------------------------------------------------------------------- blocking client


class CtrlClient:
    """The blocking end, used from the caller's thread (no event loop), one call at a time.

    A broken connection raises :class:`CtrlBroken` (and is opened again on the next
    call). A call that hears nothing for ``silent_s`` pings the peer on the same
    connection at half of it; a peer silent for all of it (a stopped process) fails the
    call with UNAVAILABLE, and one that answers pings may take the call's whole timeout.
    """

    def __init__(
        self,
        address: str,
        token: str,
        *,
        max_frame: int,
        silent_s: float = 30.0,
        ssl_context: ssl.SSLContext | None = None,
        server_hostname: str | None = None,
    ) -> None:
        self.address = address
        self.max_frame = max_frame
        self.silent_s = silent_s
        self._hello = _HELLO.encode(token)
        self._ssl = ssl_context
        self._server_hostname = server_hostname
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None
        self._buf = bytearray()
        self._next = PING_ID

    def _connect(self, timeout: float) -> socket.socket:
        sock = socket.create_connection(_split(self.address), timeout=timeout)
        try:
            _nodelay(sock)
            if self._ssl is not None:
                sock = self._ssl.wrap_socket(sock, server_hostname=self._server_hostname)
            sock.sendall(self._hello)
            status = sock.recv(1)
        except BaseException:
            sock.close()
            raise
        if status != bytes([OK]):
            sock.close()
            if not status:
                raise CtrlBroken("the control channel closed during the hello", self.address)
            raise failure(
                grpc.StatusCode.PERMISSION_DENIED,
                "the control channel refused the hello: the cluster token is wrong",
                self.address,
            )
        self._buf.clear()
        self._sock = sock
        return sock

    def close(self) -> None:
        """Close the connection (a later call opens a new one)."""
        with self._lock:
            self._close()

    def _close(self) -> None:
        sock, self._sock = self._sock, None
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.close()

    def call(self, method: str, request: Any, reply_type: type, timeout: float) -> Any:
        """Send ``request`` to ``method``; the reply, or the :class:`RpcFailure` of its code."""
        name = method.encode()
        data = request.SerializeToString()
        with self._lock:
            self._next = self._next % 0xFFFFFFFF + 1
            call_id = self._next
            try:
                sock = self._sock or self._connect(min(timeout, 10.0))
                sock.sendall(_frame(call_id, len(name), name, data))
                status, payload = self._wait(sock, call_id, timeout)
            except RpcFailure:
                self._close()
                raise
            except (OSError, ssl.SSLError) as err:  # refused, reset, timed out connecting
                self._close()
                raise CtrlBroken(f"control channel failed: {err!r}", self.address) from None
        return _result(status, payload, reply_type, self.address)

    def _wait(self, sock: socket.socket, call_id: int, timeout: float) -> tuple[int, bytes]:
        start = time.monotonic()
        deadline = start + timeout
        heard = start  # when the peer last sent anything
        ping_out = False
        while True:
            frames = _cut(self._buf, self.max_frame)
            if frames is None:
                raise CtrlBroken("a malformed or oversized reply", self.address)
            for got, status, payload in frames:
                heard = time.monotonic()
                if got == call_id:
                    return status, payload
                if got == PING_ID:
                    ping_out = False
            now = time.monotonic()
            if now >= deadline:
                raise failure(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded", self.address)
            silent = now - heard
            if silent >= self.silent_s:
                raise failure(
                    grpc.StatusCode.UNAVAILABLE,
                    f"the peer has not answered for {silent:.0f}s",
                    self.address,
                )
            wake = min(deadline, heard + self.silent_s)
            if not ping_out:
                if silent >= self.silent_s / 2:
                    sock.sendall(_frame(PING_ID, 0, b"", b""))
                    ping_out = True
                else:
                    wake = min(wake, heard + self.silent_s / 2)
            sock.settimeout(max(wake - now, 0.001))
            try:
                chunk = sock.recv(1 << 16)
            except TimeoutError:
                continue
            if not chunk:
                raise CtrlBroken("the peer closed the control channel", self.address)
            self._buf += chunk


# --------------------------------------------------------------------------- asyncio client


class AsyncCtrlConnection(asyncio.Protocol):
    """The asyncio end: many calls at once on one connection (see :func:`open_async`)."""

    def __init__(self, address: str, max_frame: int) -> None:
        self.address = address
        self.max_frame = max_frame
        self.transport: asyncio.Transport | None = None
        self.status: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self.closed = False
        self._buf = bytearray()
        self._pending: dict[int, asyncio.Future[tuple[int, bytes]]] = {}
        self._next = PING_ID

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        buf = self._buf
        buf += data
        if not self.status.done():
            self.status.set_result(buf[0])
            del buf[:1]
        frames = _cut(buf, self.max_frame)
        if frames is None:
            self.close()
            return
        for call_id, status, payload in frames:
            fut = self._pending.pop(call_id, None)
            if fut is not None and not fut.done():
                fut.set_result((status, payload))

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if not self.status.done():
            self.status.set_exception(CtrlBroken("closed during the hello", self.address))
        pending, self._pending = self._pending, {}
        for fut in pending.values():
            if not fut.done():
                fut.set_exception(CtrlBroken("the peer closed the control channel", self.address))

    def close(self) -> None:
        """Close the connection (calls in flight fail with :class:`CtrlBroken`)."""
        self.closed = True
        if self.transport is not None:
            self.transport.abort()

    async def call(self, method: str, request: Any, reply_type: type, timeout: float | None) -> Any:
        """Send ``request`` to ``method``; the reply, or the :class:`RpcFailure` of its code
        (``timeout`` None: wait as long as the call runs)."""
        if self.closed or self.transport is None:
            raise CtrlBroken("the control channel is closed", self.address)
        self._next = self._next % 0xFFFFFFFF + 1
        call_id = self._next
        fut = asyncio.get_running_loop().create_future()
        self._pending[call_id] = fut
        name = method.encode()
        self.transport.write(_frame(call_id, len(name), name, request.SerializeToString()))
        try:
            status, payload = await asyncio.wait_for(fut, timeout)
        except TimeoutError:
            raise failure(
                grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded", self.address
            ) from None
        finally:
            self._pending.pop(call_id, None)
        return _result(status, payload, reply_type, self.address)


async def open_async(
    address: str,
    token: str,
    *,
    max_frame: int,
    ssl_context: ssl.SSLContext | None = None,
    server_hostname: str | None = None,
    timeout: float = 10.0,
) -> AsyncCtrlConnection:
    """Open a control channel to ``address`` on the running loop (:class:`CtrlBroken` or
    ``PERMISSION_DENIED`` when it fails)."""
    hello = _HELLO.encode(token)
    loop = asyncio.get_running_loop()
    conn = AsyncCtrlConnection(address, max_frame)
    host, port = _split(address)
    try:
        transport, _ = await asyncio.wait_for(
            loop.create_connection(
                lambda: conn,
                host,
                port,
                ssl=ssl_context,
                server_hostname=server_hostname if ssl_context is not None else None,
            ),
            timeout,
        )
    except (OSError, TimeoutError, ssl.SSLError) as err:
        raise CtrlBroken(f"control channel failed: {err!r}", address) from None
    try:
        _nodelay(transport.get_extra_info("socket"))
        transport.write(hello)
        status = await asyncio.wait_for(asyncio.shield(conn.status), timeout)
    except (OSError, TimeoutError) as err:
        transport.abort()
        raise CtrlBroken(f"control channel failed: {err!r}", address) from None
    except BaseException:
        transport.abort()
        raise
    if status != OK:
        transport.abort()
        raise failure(
            grpc.StatusCode.PERMISSION_DENIED,
            "the control channel refused the hello: the cluster token is wrong",
            address,
        )
    return conn
