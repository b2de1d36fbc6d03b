"""core/dormancy.py in one process: a gRPC server that closes while idle, a placeholder that
keeps its port, the wake-up on a connection, the relay, and calls in flight holding sleep
off. Real grpc.aio servers and channels on loopback; no cluster."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import grpc
import grpc.aio

from nbcluster._runtime.core.dormancy import Dormancy, placeholder
from nbcluster._runtime.protocol import rpc
from nbcluster._runtime.protocol.rpc import Channels, auth_metadata, bind, make_server

TOKEN = "t" * 32
METHOD = "/test.Echo/Say"


class _Host:
    """The parts of a CoreClient that Dormancy uses."""

    def __init__(self, gate: asyncio.Event) -> None:
        self.loop = asyncio.get_running_loop()
        self.channels = Channels(TOKEN, 2**20)
        self.server: Any = None
        self.address = ""
        self.gate = gate
        self.started = 0

    def new_server(self, port: int) -> tuple[Any, int]:
        server = make_server(TOKEN, reuse_port=True)

        async def say(request: bytes, context: Any) -> bytes:
            if request == b"wait":
                await self.gate.wait()
            return b"echo:" + request

        handler = grpc.unary_unary_rpc_method_handler(
            say, request_deserializer=bytes, response_serializer=bytes
        )
        server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler("test.Echo", {"Say": handler}),)
        )
        self.started += 1
        return server, bind(server, "127.0.0.1", port)

    async def start(self) -> None:
        self.server, port = self.new_server(0)
        self.address = f"127.0.0.1:{port}"
        await self.server.start()

    async def close(self, dormancy: Dormancy) -> None:
        """Stop ``dormancy``, then the server it left running (if any) and the channels."""
        await dormancy.stop()
        if self.server is not None:
            await self.server.stop(None)
        await self.channels.close()


async def _until(check: Any, timeout: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not check():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.01)


def _say(channel: grpc.aio.Channel) -> Any:
    return channel.unary_unary(METHOD)


def test_sleeps_when_idle_and_a_connection_wakes_it_through_the_relay() -> None:
    async def main() -> None:
        host = _Host(asyncio.Event())
        await host.start()
        dormancy = Dormancy(host, 0.1)  # type: ignore[arg-type]
        dormancy.start(lambda: False)
        try:
            await _until(lambda: dormancy.asleep)
            assert host.server is None and dormancy.sleeps == 1
            # The placeholder holds the port: connecting wakes the server, and the first
            # connection is relayed to it (the reply comes back through the relay).
            async with grpc.aio.insecure_channel(host.address) as ch:
                md = auth_metadata(TOKEN)
                assert await _say(ch)(b"hi", metadata=md, timeout=10) == b"echo:hi"
                assert dormancy.wakes == 1 and host.server is not None
                assert dormancy._relays, "the first connection is not relayed"
                # idle again: asleep again; the relayed connection is closed with the server
                await _until(lambda: dormancy.asleep and dormancy.sleeps == 2)
                await _until(lambda: not dormancy._relays)
                # the same channel reconnects and wakes it once more
                assert await _say(ch)(b"again", metadata=md, timeout=10) == b"echo:again"
                assert dormancy.wakes == 2
                # While awake the placeholder is closed: a new connection reaches the
                # server itself (no wake-up, no relay).
                dormancy.idle_s = 60.0
                assert dormancy._placeholder is None
                pipes = set(dormancy._relays)
                async with grpc.aio.insecure_channel(host.address) as ch2:
                    assert await _say(ch2)(b"x", metadata=md, timeout=10) == b"echo:x"
                assert dormancy.wakes == 2 and not (dormancy._relays - pipes)
        finally:
            await host.close(dormancy)
        assert rpc._activity is None  # stop() stops counting

    asyncio.run(main())


def test_a_worker_that_starts_asleep_starts_grpc_only_when_asked() -> None:
    """``start_asleep``: the placeholder takes the address and no server starts; the first
    connection starts one (relayed), and an idle spell closes it again."""

    async def main() -> None:
        host = _Host(asyncio.Event())
        dormancy = Dormancy(host, 0.1)  # type: ignore[arg-type]
        port = dormancy.start_asleep("127.0.0.1")
        host.address = f"127.0.0.1:{port}"
        dormancy.start(lambda: False)
        try:
            await asyncio.sleep(0.3)  # idle: still no server, nothing started
            assert host.server is None and host.started == 0
            assert dormancy.asleep and dormancy.sleeps == 1 and dormancy.wakes == 0
            async with grpc.aio.insecure_channel(host.address) as ch:
                md = auth_metadata(TOKEN)
                assert await _say(ch)(b"hi", metadata=md, timeout=10) == b"echo:hi"
                assert host.started == 1 and dormancy.wakes == 1
                await _until(lambda: dormancy.asleep and dormancy.sleeps == 2)
        finally:
            await host.close(dormancy)

    asyncio.run(main())


def test_a_call_in_flight_or_a_running_task_holds_sleep_off() -> None:
    async def main() -> None:
        gate = asyncio.Event()
        host = _Host(gate)
        await host.start()
        busy = [False]
        dormancy = Dormancy(host, 0.05)  # type: ignore[arg-type]
        dormancy.start(lambda: busy[0])
        try:
            async with grpc.aio.insecure_channel(host.address) as ch:
                call = _say(ch)(b"wait", metadata=auth_metadata(TOKEN), timeout=30)
                await _until(lambda: dormancy.activity.inflight == 1)
                await asyncio.sleep(0.4)  # eight idle periods: a served call holds it awake
                assert not dormancy.asleep
                busy[0] = True
                gate.set()
                assert await call == b"echo:wait"
                await asyncio.sleep(0.4)  # no call, but a task runs
                assert not dormancy.asleep
                busy[0] = False
                await _until(lambda: dormancy.asleep)
            # A client call through the process's own Channels counts too, and the sleep
            # closes the channel: the next call opens a new one.
            gate.clear()
            peer = _Host(gate)
            await peer.start()
            try:
                stub_channel = host.channels.channel(peer.address)
                say = rpc.authed_call(_say(stub_channel), TOKEN, peer.address)
                call = asyncio.ensure_future(say(b"wait", timeout=30))
                # both ends are in this process: the call and the peer's serving of it
                await _until(lambda: dormancy.activity.inflight == 2)
                await asyncio.sleep(0.3)
                assert len(host.channels) == 1, "a channel with a call in flight was closed"
                gate.set()
                assert await call == b"echo:wait"
                await _until(lambda: len(host.channels) == 0)
            finally:
                await peer.server.stop(None)
        finally:
            await host.close(dormancy)

    asyncio.run(main())


def test_placeholder_shares_the_port_of_a_reuse_port_listener() -> None:
    first = socket.socket()
    first.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    first.bind(("127.0.0.1", 0))
    first.listen()
    port = first.getsockname()[1]
    try:
        second = placeholder(f"127.0.0.1:{port}")
        assert second.getsockname()[1] == port and not second.getblocking()
        second.close()
    finally:
        first.close()
    plain = socket.socket()  # without SO_REUSEPORT the port cannot be shared
    plain.bind(("127.0.0.1", 0))
    plain.listen()
    try:
        try:
            placeholder(f"127.0.0.1:{plain.getsockname()[1]}").close()
        except OSError:
            pass
        else:
            raise AssertionError("a port held without SO_REUSEPORT was shared")
    finally:
        plain.close()


def test_a_relay_side_that_closed_before_linking_closes_the_other() -> None:
    """A peer that hangs up while the relay connects to the server must not leave the
    server's side of the relay open."""
    from nbcluster._runtime.core.dormancy import _Pipe

    class _Transport:
        def __init__(self, closing: bool) -> None:
            self.closing = closing
            self.written: list[bytes] = []

        def is_closing(self) -> bool:
            return self.closing

        def close(self) -> None:
            self.closing = True

        def write(self, data: bytes) -> None:
            self.written.append(data)

    relays: set[_Pipe] = set()
    down, up = _Pipe(relays), _Pipe(relays)
    down.connection_made(_Transport(closing=False))  # type: ignore[arg-type]
    up.connection_made(_Transport(closing=False))  # type: ignore[arg-type]
    up.data_received(b"server preface")  # before the link: kept
    down.transport.close()  # type: ignore[union-attr]  # the peer hung up meanwhile
    down.link(up)
    up.link(down)
    assert up.transport.is_closing()  # type: ignore[union-attr]
    assert down.transport.written == []  # type: ignore[union-attr]  # nothing to a closed side
