"""Task channels: tasks and actor calls between an owner and a worker on a raw socket.

gRPC's Python stream costs most of a tiny task's round trip: each message crosses grpc's
completion-queue poller thread on both sides and is framed as HTTP/2. A task channel
carries the very same messages (``TaskBatch`` one way, ``ReplyBatch`` the other) as
length-prefixed protobuf frames on one TCP connection per lease or per actor, served on
the worker's I/O loop beside its gRPC server (``asyncio`` streams; ``uvloop`` when it is
installed). The worker's address for it is asked once per worker over gRPC
(``CoreWorker.TaskChannel``) and cached. Protocol, little-endian::

    client  b"NBCT" u8 version u8 token-length token u8 lease-length lease   hello
    server  u8 status                                   0 ok, 1 wrong token or bad hello
    then    u32 length, protobuf                        frames, both ways, until either
                                                        side closes

The hello is ``protocol/hello.py``'s (shared with the control channels). The token is
checked in constant time before anything else is read; an unauthenticated peer can make
the server buffer at most the hello (a few hundred bytes), and a silent one is dropped
after ``HELLO_TIMEOUT_S``. A frame longer than the cluster's message limit
closes the connection. TLS: with the cluster's certificates, the same protocol runs inside
mutual TLS (``tls.ssl_context``).

**Same host.** Without TLS, a worker also listens on a Linux abstract Unix socket named
after the cluster's token and its TCP address (:func:`local_name`), and an owner tries that
name before TCP: on one host a Unix socket skips the TCP/IP stack, which is about a fifth
of a small message's round trip here. An abstract name belongs to a network namespace and
needs no file; from another host (or namespace) the name is not there, the connect fails
at once and the owner uses TCP. The same hello and token check apply.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import socket
import ssl
import struct
from collections.abc import AsyncIterator, Callable
from typing import Any

from nbcluster._runtime.netaddr import numeric_listener
from nbcluster._runtime.protocol import tls
from nbcluster._runtime.protocol.errors import RpcFailure
from nbcluster._runtime.protocol.hello import HELLO_TIMEOUT_S, OK, REFUSED, Hello, token_fits
from nbcluster._runtime.protocol.protos import nbcluster_pb2 as pb

__all__ = [
    "ChannelRefused",
    "ChannelServer",
    "StreamOpener",
    "TaskChannel",
    "batch_frame",
    "connect",
    "reply_handler",
    "local_name",
]

log = logging.getLogger(__name__)

MAGIC = b"NBCT"
VERSION = 1
_HELLO = Hello(MAGIC, VERSION)
_LEN = struct.Struct("<I")
_MAX_LEASE = 255
_THREAD_READ = 1 << 16  # bytes a caller's thread reads per recv (below malloc's mmap threshold)

#: ``serve(batches, lease_hex)``: the worker's stream handler (replies for the batches).
Serve = Callable[[AsyncIterator[pb.TaskBatch], str], AsyncIterator[pb.ReplyBatch]]


def batch_frame(spec: bytes) -> bytes:
    """The frame of a ``TaskBatch`` holding one serialized ``TaskSpec`` (field 1), built
    without copying the spec into a batch message."""
    n = len(spec)
    size = bytearray()
    while n >= 0x80:
        size.append((n & 0x7F) | 0x80)
        n >>= 7
    size.append(n)
    return _LEN.pack(1 + len(size) + len(spec)) + b"\x0a" + bytes(size) + spec


class ChannelRefused(ConnectionError):
    """The worker refused the hello (a wrong token)."""


def local_name(token: str, address: str) -> str:
    """The abstract Unix socket name of the worker whose task channel listens at
    ``address`` (``host:port``) in the cluster of ``token`` (unique per address and
    cluster; the token itself is not in it)."""
    digest = hashlib.sha256(f"{token}\0{address}".encode()).hexdigest()[:32]
    return f"\0nbcluster-ch-{digest}"


_PLAIN_FAMILIES = (socket.AF_INET, socket.AF_INET6, getattr(socket, "AF_UNIX", -1))


def _unix_socket(name: str, listen: bool) -> socket.socket | None:
    """A non-blocking Unix socket at the abstract ``name``: listening on it (None where
    abstract sockets do not exist, not Linux, or the name is taken) or connected to it (None
    when nobody listens there: another host or network namespace; or its backlog is full).
    A Unix connect completes or fails at once, so it is made here, not awaited."""
    if not hasattr(socket, "AF_UNIX"):
        return None
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        if listen:
            sock.bind(name)
            sock.listen(128)
        else:
            sock.setblocking(False)
            sock.connect(name)
    except OSError:
        sock.close()
        return None
    sock.setblocking(False)
    return sock


def _nodelay(writer: asyncio.StreamWriter) -> None:
    sock = writer.get_extra_info("socket")
    if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


async def _frames(
    reader: asyncio.StreamReader, max_frame: int, message: type
) -> AsyncIterator[object]:
    """Messages read off ``reader`` until EOF (a frame over ``max_frame`` ends it)."""
    unpack = _LEN.unpack
    while True:
        try:
            head = await reader.readexactly(4)
            (n,) = unpack(head)
            if n > max_frame:
                log.warning("task channel: a %d-byte frame is over the limit; closing", n)
                return
            data = await reader.readexactly(n) if n else b""
        except (asyncio.IncompleteReadError, ConnectionError, ssl.SSLError):
            return
        msg = message()
        msg.ParseFromString(data)
        yield msg


class ChannelServer:
    """The worker's end: accepts channels and runs ``serve`` for each."""

    def __init__(
        self,
        token: str,
        serve: Serve,
        *,
        max_frame: int,
        ssl_context: ssl.SSLContext | None = None,
        adopt: Callable[[asyncio.StreamWriter, str], bool] | None = None,
        local: bool = True,
    ) -> None:
        self._token = token.encode()
        self._local = local and ssl_context is None  # TLS clusters: every byte encrypted
        self._unix: asyncio.base_events.Server | None = None
        self._adopt = adopt
        self._serve = serve
        self._max_frame = max_frame
        self._ssl = ssl_context
        self._server: asyncio.base_events.Server | None = None
        self._handlers: set[asyncio.Task[None]] = set()
        self.address = ""

    async def start(self, host: str) -> str:
        """Listen on ``host`` (an ephemeral port); return ``host:port``."""
        listener = numeric_listener(host)  # no getaddrinfo: no libuv thread pool
        if listener is not None:
            self._server = await asyncio.start_server(
                self._handle, sock=listener, ssl=self._ssl, limit=1 << 20
            )
        else:
            self._server = await asyncio.start_server(
                self._handle, host, 0, ssl=self._ssl, limit=1 << 20
            )
        port = self._server.sockets[0].getsockname()[1]
        self.address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        if self._local:  # owners on this host connect here (see "Same host" above)
            sock = _unix_socket(local_name(self._token.decode(), self.address), listen=True)
            if sock is not None:
                self._unix = await asyncio.start_unix_server(self._handle, sock=sock, limit=1 << 20)
        return self.address

    async def _hello(self, reader: asyncio.StreamReader) -> str | None:
        if not await _HELLO.read(reader, self._token):
            return None
        (n,) = await reader.readexactly(1)
        lease = await reader.readexactly(n) if n else b""
        return lease.decode("ascii", "replace")

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._handlers.add(task)
        try:
            try:
                lease_hex = await asyncio.wait_for(self._hello(reader), HELLO_TIMEOUT_S)
            except (TimeoutError, asyncio.IncompleteReadError, ConnectionError, ssl.SSLError):
                return
            if lease_hex is None:
                with contextlib.suppress(Exception):
                    writer.write(bytes([REFUSED]))
                return
            if writer.is_closing():
                return  # the owner hung up behind its hello (uvloop raises on a write)
            _nodelay(writer)
            # The worker's main thread may take the socket (a task lease's, or a plain sync
            # actor's: worker/direct.py); the hello is answered on it once it is theirs.
            adopt = self._adopt
            idle = not getattr(reader, "_buffer", b"")  # nothing read past the hello
            if adopt is not None and idle and adopt(writer, lease_hex):
                return
            writer.write(bytes([OK]))
            pack = _LEN.pack
            replies = self._serve(_frames(reader, self._max_frame, pb.TaskBatch), lease_hex)  # type: ignore[arg-type]
            try:
                async for batch in replies:
                    if writer.is_closing():
                        break  # the owner hung up: nobody reads the rest
                    data = batch.SerializeToString()
                    writer.write(pack(len(data)) + data)
                    await writer.drain()
            finally:
                with contextlib.suppress(Exception):
                    await replies.aclose()  # type: ignore[attr-defined]
        except (ConnectionError, ssl.SSLError) as err:
            log.debug("task channel ended: %r", err)
        except asyncio.CancelledError:
            pass  # close(): ends quietly (a cancelled handler is logged as an error by 3.11)
        finally:
            if task is not None:
                self._handlers.discard(task)
            with contextlib.suppress(Exception):
                writer.close()

    async def close(self) -> None:
        """Stop listening and end every channel."""
        if self._server is not None:
            self._server.close()
        if self._unix is not None:
            self._unix.close()
        for task in list(self._handlers):
            task.cancel()


def _parse_replies(frames: list[bytes]) -> pb.ReplyBatch:
    """Frames of reply batches as one batch (protobuf messages concatenated are one)."""
    batch = pb.ReplyBatch()
    batch.ParseFromString(frames[0] if len(frames) == 1 else b"".join(frames))
    return batch


class _ClientProtocol(asyncio.Protocol):
    """The owner's end on the loop: frames are cut out as they arrive (no coroutine per
    frame) and parsed together when read."""

    def __init__(self, loop: asyncio.AbstractEventLoop, max_frame: int) -> None:
        self.max_frame = max_frame
        self.transport: asyncio.Transport | None = None
        self.status: asyncio.Future[int] = loop.create_future()  # the hello's answer
        self.frames: list[bytes] = []  # complete frames not read yet
        self.ended = False
        self.paused = False
        self._loop = loop
        self._buf = bytearray()
        self._waiter: asyncio.Future[None] | None = None
        self._drain: list[asyncio.Future[None]] = []
        #: Called with each batch of replies as it arrives, then with None at the end
        #: (instead of :meth:`TaskChannel.read`): see :meth:`TaskChannel.on_replies`.
        self.on_replies: Callable[[pb.ReplyBatch | None], None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        if not self.status.done():
            self.status.set_result(data[0])
            data = data[1:]
        got = self.feed(data)
        if got is None:
            if self.transport is not None:
                self.transport.abort()
            self._end()
        elif got:
            self._wake()

    def feed(self, data: bytes) -> bool | None:
        """Add received bytes; cut the frames they complete into :attr:`frames`. True
        when a frame was completed; None when a frame is over the limit (the connection
        must be closed). Runs on the loop, or on a caller's thread while the loop's
        reading is paused (:meth:`TaskChannel.read_from_thread`)."""
        buf = self._buf
        buf += data
        pos = 0
        n_buf = len(buf)
        got = False
        while n_buf - pos >= 4:
            (n,) = _LEN.unpack_from(buf, pos)
            if n > self.max_frame:
                log.warning("task channel: a %d-byte frame is over the limit; closing", n)
                return None
            if n_buf - pos - 4 < n:
                break
            self.frames.append(bytes(buf[pos + 4 : pos + 4 + n]))
            pos += 4 + n
            got = True
        if pos:
            del buf[:pos]
        return got

    def eof_received(self) -> bool:
        self._end()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.status.done():
            self.status.set_exception(ConnectionError("the worker closed the task channel"))
        self._end()
        self.resume_writing()

    def pause_writing(self) -> None:
        self.paused = True

    def resume_writing(self) -> None:
        self.paused = False
        waiters, self._drain = self._drain, []
        for fut in waiters:
            if not fut.done():
                fut.set_result(None)

    def _end(self) -> None:
        if self.ended:
            return
        self.ended = True
        self._wake()
        if self.on_replies is not None:
            self._deliver()
            self.on_replies(None)

    def _deliver(self) -> None:
        frames, self.frames = self.frames, []
        if frames and self.on_replies is not None:
            self.on_replies(_parse_replies(frames))

    def _wake(self) -> None:
        if self.on_replies is not None:
            self._deliver()
            return
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def wait_frames(self) -> None:
        """Until a frame is here or the channel ended."""
        while not self.frames and not self.ended:
            self._waiter = self._loop.create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None

    async def drain(self) -> None:
        """Until the transport's write buffer is below its high mark again."""
        if self.paused and not self.ended:
            fut = self._loop.create_future()
            self._drain.append(fut)
            await fut


class TaskChannel:
    """The owner's end of one channel, shaped like a gRPC stream call: ``write``,
    ``read`` (``None`` at the end) and ``cancel``; ``write_nowait`` for the loop's own
    callers (no task per write)."""

    def __init__(
        self, transport: asyncio.Transport, proto: _ClientProtocol, sock: socket.socket | None
    ) -> None:
        self._transport = transport
        self._proto = proto
        self._closed = False
        # A duplicate of the socket of a channel without TLS, for writes from other threads: the
        # loop may close its own descriptor at any time, ours stays valid until cancel().
        self._sock = sock
        self._reads_paused = False

    def thread_writable(self) -> bool:
        """True when a frame written now from another thread (the writers' lock held) goes
        out in order: a channel without TLS (TCP or Unix), open, with nothing waiting in
        the transport."""
        return (
            self._sock is not None
            and not self._closed
            and not self._proto.ended
            and not self._proto.paused
            and not self._transport.get_write_buffer_size()
        )

    def send_from_thread(self, frame: bytes) -> int:
        """Write as much of ``frame`` as the socket takes now, from any thread, without
        blocking; the bytes written. What is left goes through :meth:`write_bytes_nowait`
        on the loop (which also meets any error the socket has)."""
        assert self._sock is not None
        try:
            return self._sock.send(frame, socket.MSG_DONTWAIT)
        except OSError:
            return 0

    def write_bytes_nowait(self, data: bytes) -> None:
        """Write already framed bytes (on the loop)."""
        if self._closed or self._proto.ended:
            raise ConnectionError("the task channel is closed")
        self._transport.write(data)

    def write_nowait(self, batch: pb.TaskBatch) -> bool:
        """Send a batch of tasks now (on the loop); True when the caller should await
        :meth:`drain` before writing more (the socket's buffer is full)."""
        if self._closed or self._proto.ended:
            raise ConnectionError("the task channel is closed")
        data = batch.SerializeToString()
        self._transport.write(_LEN.pack(len(data)) + data)
        return self._proto.paused

    async def drain(self) -> None:
        """Until the write buffer has room again."""
        await self._proto.drain()

    async def write(self, batch: pb.TaskBatch) -> None:
        """Send a batch of tasks (raises ``ConnectionError`` once the channel is closed)."""
        if self.write_nowait(batch):
            await self._proto.drain()

    async def read(self) -> pb.ReplyBatch | None:
        """The replies that arrived (every frame received so far, as one batch: protobuf
        messages concatenated are one message), or ``None`` when the channel ended."""
        proto = self._proto
        if self._closed:
            return None
        if not proto.frames:
            await proto.wait_frames()
            if not proto.frames:
                return None
        frames, proto.frames = proto.frames, []
        return _parse_replies(frames)

    def on_replies(self, callback: Callable[[pb.ReplyBatch | None], None]) -> None:
        """Have ``callback`` called on the loop with each batch of replies as it arrives
        (frames that came together as one batch), then once with ``None`` when the channel
        ends; instead of :meth:`read`, and without a task waiting on it."""
        proto = self._proto
        proto.on_replies = callback
        proto._deliver()  # what came before
        if proto.ended:
            callback(None)

    # -- replies read by a caller's thread (core/actor_submitter.py, "Thread reads") -------
    def thread_readable(self) -> bool:
        """True when a caller's thread can read this channel's replies: no TLS (the loop
        owns the TLS state), open, and its frames delivered as they arrive."""
        return (
            self._sock is not None
            and not self._closed
            and not self._proto.ended
            and self._proto.on_replies is not None
        )

    @property
    def reads_paused(self) -> bool:
        """True while the loop does not read the socket (:meth:`pause_reads`)."""
        return self._reads_paused

    def pause_reads(self) -> None:
        """Stop the loop reading the socket (on the loop): a caller's thread reads it."""
        if not self._reads_paused and not self._closed:
            self._reads_paused = True
            self._transport.pause_reading()

    def resume_reads(self) -> None:
        """The loop reads the socket again (on the loop)."""
        if self._reads_paused:
            self._reads_paused = False
            if not self._closed:
                self._transport.resume_reading()

    def thread_quiet(self) -> bool:
        """True when the socket has nothing to read and has not ended (any thread; for a
        channel whose reading is paused, where the loop would not see its end)."""
        assert self._sock is not None
        try:
            self._sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
        except (BlockingIOError, InterruptedError):
            return True
        except OSError:
            return False
        return False  # its end, or bytes nobody asked for

    def fileno(self) -> int:
        """The descriptor a caller's thread polls while the loop's reading is paused."""
        assert self._sock is not None
        return self._sock.fileno()

    def read_from_thread(self) -> tuple[pb.ReplyBatch | None, bool]:
        """Read what the socket holds now, without blocking, on a caller's thread while
        the loop's reading is paused (the caller holds the lock that orders the two):
        the replies that completed frames (None: none yet), and False when the channel
        met its end or an error, or a frame over the limit (the loop then reads on and
        meets it as usual). Bytes of a partial frame stay for the next reader."""
        proto = self._proto
        sock = self._sock
        assert sock is not None
        ok = True
        while True:
            try:
                data = sock.recv(_THREAD_READ, socket.MSG_DONTWAIT)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                ok = False
                break
            if not data or proto.feed(data) is None:
                ok = False
                break
            if len(data) < _THREAD_READ:
                break
        frames, proto.frames = proto.frames, []
        return (_parse_replies(frames) if frames else None), ok

    def cancel(self) -> None:
        """Close the channel (the worker sees its owner hang up)."""
        self._closed = True
        with contextlib.suppress(Exception):
            self._transport.close()
        if self._sock is not None:
            self._sock.close()


def reply_handler(
    call: TaskChannel,
    handle: Callable[[pb.ReplyBatch], None],
    ended: Callable[[], None],
) -> Callable[[pb.ReplyBatch | None], None]:
    """A callback for :meth:`TaskChannel.on_replies`: ``handle`` each batch of replies; at
    the channel's end, or when ``handle`` raises (the stream is broken), close the channel
    and call ``ended``, once."""
    done = False

    def on_replies(batch: pb.ReplyBatch | None) -> None:
        nonlocal done
        if done:
            return
        if batch is not None:
            try:
                handle(batch)
                return
            except Exception as err:  # noqa: BLE001 - a broken stream
                log.debug("task channel ended: %r", err)
        done = True
        call.cancel()
        ended()

    return on_replies


async def connect(
    address: str,
    token: str,
    lease_hex: str = "",
    *,
    max_frame: int,
    ssl_context: ssl.SSLContext | None = None,
    server_hostname: str | None = None,
    timeout: float = 10.0,
    local: bool = True,
) -> TaskChannel:
    """Open a channel to the worker listening at ``address`` (``host:port``); ``local``:
    try its same-host Unix socket first (see "Same host" above; never with TLS)."""
    host, _, port = address.rpartition(":")
    host = host.strip("[]")
    lease = lease_hex.encode()
    if len(lease) > _MAX_LEASE:
        raise ValueError("lease id too long for a task channel")
    hello = _HELLO.encode(token, bytes([len(lease)]) + lease)
    loop = asyncio.get_running_loop()
    proto = _ClientProtocol(loop, max_frame)
    transport: Any = None
    if local and ssl_context is None:
        usock = _unix_socket(local_name(token, address), listen=False)
        if usock is not None:
            try:
                transport, _ = await loop.create_unix_connection(lambda: proto, sock=usock)
            except OSError:
                usock.close()
    if transport is None:
        transport, _ = await asyncio.wait_for(
            loop.create_connection(
                lambda: proto,
                host,
                int(port),
                ssl=ssl_context,
                server_hostname=server_hostname if ssl_context is not None else None,
            ),
            timeout,
        )
    own: socket.socket | None = None
    try:
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in _PLAIN_FAMILIES:
            if sock.family != socket.AF_UNIX:
                with contextlib.suppress(OSError):
                    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if ssl_context is None:
                own = socket.socket(sock.family, sock.type, fileno=os.dup(sock.fileno()))
        transport.write(hello)
        status = await asyncio.wait_for(asyncio.shield(proto.status), timeout)
        if status != OK:
            raise ChannelRefused(f"the worker at {address} refused the task channel")
    except BaseException:
        transport.abort()
        if own is not None:
            own.close()
        raise
    return TaskChannel(transport, proto, own)  # type: ignore[arg-type]


class StreamOpener:
    """Opens an owner's task stream to a worker: a task channel when the worker serves
    one (its address asked once per worker, then cached) and the cluster's token fits
    the hello, else gRPC's ``PushTasks``."""

    MAX_CACHED = 10_000

    def __init__(self, client: Any) -> None:
        self.client = client
        self._addresses: dict[str, str] = {}  # worker gRPC address -> channel address, or ""

    async def _channel_address(self, worker_address: str) -> str:
        address = self._addresses.get(worker_address)
        if address is None:
            try:
                reply = await self.client.core(worker_address).TaskChannel(pb.Empty(), timeout=10)
                address = reply.address
            except RpcFailure as err:
                if err.code().name != "UNIMPLEMENTED":
                    raise
                address = ""  # an older worker: gRPC streams
            self._remember(worker_address, address)
        return address

    def _remember(self, worker_address: str, address: str) -> None:
        if len(self._addresses) >= self.MAX_CACHED:
            self._addresses.clear()
        self._addresses[worker_address] = address

    async def open_lease(self, lease: Any) -> Any:
        """:meth:`open` for a leased worker (``core/records.Lease``): its node told us its
        task channel's address, so the worker itself is not asked (it may be asleep:
        ``core/dormancy.py``)."""
        return await self.open(lease.worker_address, lease.lease_id.hex(), lease.channel_address)

    async def open(self, worker_address: str, lease_hex: str = "", known: str = "") -> Any:
        """A stream call (``write`` / ``read`` / ``cancel``) to the worker (``known``: its
        task channel's address, from the lease; else the worker is asked once)."""
        client = self.client
        if known and client.config.task_channels:
            self._remember(worker_address, known)
        if client.config.task_channels and token_fits(client.token):
            for attempt in range(2):
                address = await self._channel_address(worker_address)
                if not address:
                    break
                settings = tls.current()
                try:
                    return await connect(
                        address,
                        client.token,
                        lease_hex,
                        max_frame=client.config.rpc_max_message_bytes,
                        ssl_context=tls.ssl_context(settings, server=False) if settings else None,
                        server_hostname=settings.server_name if settings else None,
                        local=client.config.task_channel_local,
                    )
                except (TimeoutError, OSError):
                    # A cached address can be stale: a new worker may listen on a port a
                    # dead one used. Ask the worker again once.
                    self._addresses.pop(worker_address, None)
                    if attempt:
                        raise
        metadata = (("nbc-lease", lease_hex),) if lease_hex else ()
        return client.core(worker_address).PushTasks(metadata=metadata, wait_for_ready=True)
