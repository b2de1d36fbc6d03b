"""gRPC that sleeps: an idle worker closes its gRPC server and channels, so that gRPC's own
threads exit and the process is not woken while it waits.

grpc keeps its C-core threads (the timer manager, the EventEngine pool and its lifeguard)
only while a server, a channel or a call exists: each holds a ``grpc_init`` reference.
Those threads wake on their own several times a second, so every idle worker did too
(``benchmarks/actors_bench.py``: 5-7 wake-ups/s per idle actor worker, all in gRPC).

After ``worker_grpc_idle_s`` seconds with no gRPC call in flight in either direction
(streams count while open, :class:`protocol.rpc.Activity`) and no task running, the worker:

1. binds a placeholder listener to its own address. The placeholder uses ``SO_REUSEPORT``,
   as the worker's server does, so no connection attempt is refused while one hands over
   to the other. The loop watches it, with no timer;
2. stops its gRPC server and closes every channel. The next outgoing call opens a new
   channel (``Channels.detach``).

A connection to the address wakes the server. It starts again on the same port and on a
private loopback port. The connections the placeholder accepted are relayed to the private
port byte for byte: TLS passes through, since the relay never reads what it carries. Then
the placeholder closes, so later connections reach the server directly. A relay ends when
either side closes. Task channels are plain asyncio sockets and stay open throughout, so an
actor call wakes nothing of gRPC.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from collections.abc import Callable
from typing import Any, Protocol

from nbcluster._runtime.protocol.rpc import Activity, Channels, bind, track_activity

log = logging.getLogger("nbcluster.dormancy")

_RELAY_HOST = "127.0.0.1"


def _split(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port)


def placeholder(address: str) -> socket.socket:
    """A non-blocking listener on ``address`` that shares the port (``SO_REUSEPORT``)."""
    host, port = _split(address)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, port))
        sock.listen(128)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock


class DormancyHost(Protocol):
    """What :class:`Dormancy` uses of the core client."""

    loop: asyncio.AbstractEventLoop
    server: Any  # the started grpc.aio server, None while asleep
    address: str  # host:port of the server (the placeholder takes it over)
    channels: Channels

    def new_server(self, port: int) -> tuple[Any, int]: ...


class _Pipe(asyncio.Protocol):
    """One side of a relay: what arrives here is written to the other side, with back
    pressure (a full write buffer there pauses reading here)."""

    def __init__(self, relays: set[_Pipe]) -> None:
        self.transport: asyncio.Transport | None = None
        self.peer: _Pipe | None = None
        self._early: list[bytes] = []
        self._relays = relays

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self._relays.add(self)

    def link(self, peer: _Pipe) -> None:
        self.peer = peer
        early, self._early = self._early, []
        for data in early:
            peer.write(data)
        if self.transport is None or self.transport.is_closing():
            peer.close()  # this side closed before the relay was linked

    def write(self, data: bytes) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)

    def data_received(self, data: bytes) -> None:
        if self.peer is None:
            self._early.append(data)
        else:
            self.peer.write(data)

    def eof_received(self) -> bool:
        return False  # close this side; connection_lost closes the other

    def connection_lost(self, exc: Exception | None) -> None:
        self._relays.discard(self)
        if self.peer is not None:
            self.peer.close()

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    def pause_writing(self) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.resume_reading()


class Dormancy:
    """Closes a worker's gRPC server and channels while it is idle, and opens them again
    on demand. Runs on the client's I/O loop; :meth:`start` it there."""

    def __init__(self, client: DormancyHost, idle_s: float) -> None:
        self.client = client
        self.idle_s = idle_s
        self.busy: Callable[[], bool] = lambda: False
        self.activity = Activity(self._quiet)
        self.asleep = False  # the gRPC server is closed, the placeholder listens
        self.sleeps = 0
        self.wakes = 0
        self._last = time.monotonic()
        self._timer: asyncio.TimerHandle | None = None
        self._placeholder: socket.socket | None = None
        self._accepted: list[socket.socket] = []
        self._waking: asyncio.Task[None] | None = None
        self._private = 0
        self._relays: set[_Pipe] = set()
        self._closing: set[asyncio.Task[None]] = set()
        self._stopped = False

    # -- life cycle ----------------------------------------------------------------------
    def start_asleep(self, host: str) -> int:
        """Take the worker's address with the placeholder, the gRPC server not started, and
        return the port (call on the loop). A worker nobody asks over gRPC (an actor the head
        created over its control channel, called over task channels) never starts it: that
        server costs a new worker 4-5 ms of CPU and 530 page faults."""
        sock = placeholder(f"[{host}]:0" if ":" in host else f"{host}:0")
        self._placeholder = sock
        self.client.loop.add_reader(sock.fileno(), self._on_connect)
        self.asleep = True
        self.sleeps += 1
        return int(sock.getsockname()[1])

    def start(self, busy: Callable[[], bool]) -> None:
        """Count gRPC calls from now on and sleep once idle (``busy()``: a task runs)."""
        self.busy = busy
        track_activity(self.activity)
        self._quiet()

    async def stop(self) -> None:
        """Stop watching; close the placeholder and the relays (the client stops its server)."""
        self._stopped = True
        track_activity(None)
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._close_placeholder()
        if self._waking is not None:
            self._waking.cancel()
            with contextlib.suppress(BaseException):
                await self._waking
        for pipe in list(self._relays):
            pipe.close()
        accepted, self._accepted = self._accepted, []
        for conn in accepted:  # reached the placeholder, never relayed
            conn.close()
        if self._closing:
            await asyncio.gather(*self._closing, return_exceptions=True)

    # -- when to sleep -------------------------------------------------------------------
    def _quiet(self) -> None:
        """No call in flight now: sleep ``idle_s`` from now unless something else happens."""
        self._last = time.monotonic()
        self._arm(self.idle_s)

    def _arm(self, delay: float) -> None:
        if self._timer is None and not self._stopped:
            self._timer = self.client.loop.call_later(delay, self._check)

    def _check(self) -> None:
        self._timer = None
        if self._stopped or self.activity.inflight or self._waking is not None:
            return  # the last call's end, or the wake-up, arms the next check
        if self.busy():
            self._arm(self.idle_s)  # a task runs: look again later
            return
        left = self._last + self.idle_s - time.monotonic()
        if left > 0:
            self._arm(left)
            return
        if self.asleep and not len(self.client.channels):
            return  # nothing of gRPC is open
        self._sleep()

    # -- sleep and wake ------------------------------------------------------------------
    def _sleep(self) -> None:
        """Close the server and the channels (nothing is in flight: checked just before)."""
        client = self.client
        server = None
        if not self.asleep and client.server is not None:
            try:
                self._placeholder = placeholder(client.address)
            except OSError as err:  # keep the server: it still answers
                log.warning("gRPC stays open: no placeholder on %s (%s)", client.address, err)
            else:
                client.loop.add_reader(self._placeholder.fileno(), self._on_connect)
                server, client.server = client.server, None
                self.asleep = True
                self.sleeps += 1
        channels = client.channels.detach()
        if self.asleep and server is None and channels:  # asleep: the outgoing ones close
            self.sleeps += 1
        task = client.loop.create_task(self._close(server, channels))
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    @staticmethod
    async def _close(server: Any, channels: list[Any]) -> None:
        if server is not None:
            with contextlib.suppress(Exception):
                await server.stop(grace=0.1)
        for channel in channels:
            with contextlib.suppress(Exception):
                await channel.close(grace=0.1)

    def _on_connect(self) -> None:
        """The placeholder has connections: accept them and start the server."""
        self._accept_all()
        if self._waking is None and self.asleep:
            self._waking = self.client.loop.create_task(self._wake())

    def _accept_all(self) -> None:
        sock = self._placeholder
        while sock is not None:
            try:
                conn, _ = sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as err:
                log.warning("placeholder accept failed: %s", err)
                return
            conn.setblocking(False)
            self._accepted.append(conn)

    async def _wake(self) -> None:
        client = self.client
        try:
            _, port = _split(client.address)
            server, _ = client.new_server(port)
            self._private = bind(server, _RELAY_HOST, 0)
            await server.start()
            client.server = server
            self.asleep = False
            self.wakes += 1
            self._accept_all()  # the last ones that reached the placeholder
            self._close_placeholder()
            accepted, self._accepted = self._accepted, []
            for conn in accepted:
                await self._relay(conn)
        except Exception:  # noqa: BLE001 - the placeholder keeps the address; try again later
            log.exception("waking the gRPC server failed")
        finally:
            self._waking = None
            self._quiet()

    def _close_placeholder(self) -> None:
        sock, self._placeholder = self._placeholder, None
        if sock is not None:
            self.client.loop.remove_reader(sock.fileno())
            sock.close()

    async def _relay(self, conn: socket.socket) -> None:
        loop = self.client.loop
        down, up = _Pipe(self._relays), _Pipe(self._relays)
        try:
            await loop.create_connection(lambda: up, _RELAY_HOST, self._private)
            await loop.connect_accepted_socket(lambda: down, conn)
        except OSError as err:
            log.warning("relay to the gRPC server failed: %s", err)
            conn.close()
            up.close()
            return
        down.link(up)
        up.link(down)
