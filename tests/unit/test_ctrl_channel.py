"""Control channels (``protocol/ctrl.py``): frames, dispatch, errors, hello, silence.

In-process: the server runs on an event loop in a background thread, the blocking client
in the test's thread (loopback sockets, no processes); the frame cutter on bytes alone.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import grpc
import pytest

from nbcluster._runtime.protocol import ctrl
from nbcluster._runtime.protocol.errors import (
    RpcDeadlineExceeded,
    RpcFailure,
    RpcInvalidArgument,
    RpcNotFound,
    RpcPermissionDenied,
    RpcUnavailable,
)
from nbcluster._runtime.protocol.rpc import pb

TOKEN = "s3cret-token"
MAX_FRAME = 1 << 16


class Loop:
    """An event loop on a background thread."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro: Any, timeout: float = 10) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


@pytest.fixture
def loop() -> Iterator[Loop]:
    lp = Loop()
    yield lp
    lp.close()


class Service:
    """Handlers shaped like servicer coroutines: ``(request, context) -> reply``."""

    def __init__(self) -> None:
        self.calls = 0
        self.finished: list[str] = []
        self.release = asyncio.Event()

    async def get(self, request: pb.PlacementGroupRequest, context: Any) -> pb.PlacementGroupInfo:
        self.calls += 1
        if request.name == "missing":
            await context.abort(grpc.StatusCode.NOT_FOUND, "no placement group named 'missing'")
        if request.name == "boom":
            raise RuntimeError("kaput")
        if request.name == "slow":
            await asyncio.sleep(request.timeout)
        if request.name == "wait":
            await self.release.wait()
        self.finished.append(request.name)
        return pb.PlacementGroupInfo(pg_id=request.pg_id, name=request.name, version=7)


class _Raw:
    """A "message" that serializes to the given bytes."""

    def __init__(self, data: bytes) -> None:
        self.data = data

    def SerializeToString(self) -> bytes:  # noqa: N802 - protobuf's name
        return self.data


def _serve(loop: Loop, service: Service, token: str = TOKEN) -> ctrl.CtrlServer:
    server = ctrl.CtrlServer(
        token, {"Get": (service.get, pb.PlacementGroupRequest)}, max_frame=MAX_FRAME
    )
    loop.run(server.start("127.0.0.1"))
    return server


def _client(address: str, token: str = TOKEN, silent_s: float = 30.0) -> ctrl.CtrlClient:
    return ctrl.CtrlClient(address, token, max_frame=MAX_FRAME, silent_s=silent_s)


def _get(client: ctrl.CtrlClient, name: str, timeout: float = 10, work_s: float = 0.0) -> Any:
    request = pb.PlacementGroupRequest(pg_id=b"\x01\x02", name=name, timeout=work_s)
    return client.call("Get", request, pb.PlacementGroupInfo, timeout)


def test_cut_takes_whole_frames_and_keeps_the_rest() -> None:
    one = ctrl._frame(5, 3, b"Get", b"abc")
    two = ctrl._frame(6, 0, b"", b"")
    buf = bytearray(one + two[:-1])
    assert ctrl._cut(buf, MAX_FRAME) == [(5, 3, b"Getabc")]
    assert bytes(buf) == two[:-1]  # an incomplete frame stays
    buf += two[-1:]
    assert ctrl._cut(buf, MAX_FRAME) == [(6, 0, b"")]
    assert buf == bytearray()
    # Over the limit, or too short to hold a call id: the connection must close.
    assert ctrl._cut(bytearray(ctrl._frame(1, 0, b"", b"x" * 100)), 50) is None
    assert ctrl._cut(bytearray(b"\x02\x00\x00\x00ab"), MAX_FRAME) is None


def test_calls_reach_the_handler_and_errors_keep_grpc_codes_and_details(loop: Loop) -> None:
    service = Service()
    server = _serve(loop, service)
    client = _client(server.address)
    try:
        reply = _get(client, "ok")
        assert (reply.pg_id, reply.name, reply.version) == (b"\x01\x02", "ok", 7)
        # context.abort: the code's class and the details, as the gRPC stubs raise them.
        with pytest.raises(RpcNotFound) as err:
            _get(client, "missing")
        assert err.value.code() == grpc.StatusCode.NOT_FOUND
        assert err.value.details() == "no placement group named 'missing'"
        # An exception in the handler: UNKNOWN, and the connection stays usable.
        with pytest.raises(RpcFailure) as err:
            _get(client, "boom")
        assert err.value.code() == grpc.StatusCode.UNKNOWN
        assert "kaput" in err.value.details()
        # An unknown method, an undecodable request.
        with pytest.raises(RpcFailure) as err:
            client.call("Nope", pb.Empty(), pb.Empty, 10)
        assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED
        with pytest.raises(RpcInvalidArgument, match="malformed request"):
            client.call("Get", _Raw(b"\xff" * 40), pb.Empty, 10)
        assert _get(client, "again").name == "again"
        assert service.calls == 4  # undecodable and unknown calls never reached it
    finally:
        client.close()
        loop.run(server.close())


def test_a_wrong_token_is_refused_before_any_call(loop: Loop) -> None:
    service = Service()
    server = _serve(loop, service)
    client = _client(server.address, token="wrong-token")
    try:
        with pytest.raises(RpcPermissionDenied, match="token"):
            _get(client, "ok")
        # A raw peer that sends garbage instead of the hello gets REFUSED, not a reply.
        with socket.create_connection(("127.0.0.1", int(server.address.split(":")[1]))) as s:
            s.settimeout(10)
            s.sendall(b"GET / HTTP/1.1\r\n\r\n")
            assert s.recv(1) == bytes([ctrl.REFUSED])
        assert service.calls == 0
    finally:
        client.close()
        loop.run(server.close())


def test_a_broken_connection_is_ctrlbroken_and_the_next_call_reconnects(loop: Loop) -> None:
    service = Service()
    server = _serve(loop, service)
    client = _client(server.address)
    try:
        assert _get(client, "one").name == "one"
        loop.run(server.close())  # drops every connection (a head that died)
        with pytest.raises(ctrl.CtrlBroken):
            _get(client, "two")
        with pytest.raises(ctrl.CtrlBroken):  # nothing listens: refused
            _get(client, "three")
        server2 = _serve(loop, service)
        client.address = server2.address  # (a restarted peer, found again by its caller)
        assert _get(client, "four").name == "four"
        loop.run(server2.close())
    finally:
        client.close()


def test_a_call_whose_caller_hung_up_still_runs_to_its_end(loop: Loop) -> None:
    service = Service()
    server = _serve(loop, service)
    client = _client(server.address)
    try:
        with pytest.raises(RpcDeadlineExceeded):
            _get(client, "wait", timeout=0.3)  # the client gives up and closes the connection
        assert client._sock is None
        deadline = time.monotonic() + 10
        while server._conns and time.monotonic() < deadline:  # the server saw it go
            time.sleep(0.01)
        assert not server._conns
        loop.loop.call_soon_threadsafe(service.release.set)
        while "wait" not in service.finished and time.monotonic() < deadline:
            time.sleep(0.01)
        assert service.finished == ["wait"]  # not cancelled half way (a removal must finish)
    finally:
        client.close()
        loop.run(server.close())


def test_a_slow_call_is_kept_alive_by_pings_and_a_silent_peer_fails_it(loop: Loop) -> None:
    service = Service()
    server = _serve(loop, service)
    client = _client(server.address, silent_s=0.6)
    try:
        # 1.5 s of work, 2.5 times the silence limit: the pings show the peer is alive.
        assert _get(client, "slow", timeout=20, work_s=1.5).name == "slow"
        # A call's own timeout still ends it.
        with pytest.raises(RpcDeadlineExceeded):
            _get(client, "wait", timeout=1.0)
    finally:
        client.close()
        loop.run(server.close())
    # A peer that took the hello and then went silent (a stopped process): UNAVAILABLE
    # after the silence limit, not after the call's timeout; not CtrlBroken (no fallback).
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def accept() -> None:
        conn, _ = listener.accept()
        conn.recv(100)
        conn.sendall(bytes([ctrl.OK]))
        time.sleep(5)
        conn.close()

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    silent = _client(f"127.0.0.1:{port}", silent_s=0.5)
    start = time.monotonic()
    with pytest.raises(RpcUnavailable, match="has not answered") as err:
        _get(silent, "x", timeout=60)
    assert not isinstance(err.value, ctrl.CtrlBroken)
    assert time.monotonic() - start < 30  # far below the call's 60 s timeout
    silent.close()
    listener.close()


def test_the_asyncio_client_multiplexes_calls_and_fails_them_when_the_peer_goes(
    loop: Loop,
) -> None:
    service = Service()
    server = _serve(loop, service)

    async def scenario() -> list[Any]:
        conn = await ctrl.open_async(server.address, TOKEN, max_frame=MAX_FRAME)
        req = pb.PlacementGroupRequest
        waiting = asyncio.ensure_future(
            conn.call("Get", req(name="wait"), pb.PlacementGroupInfo, 10)
        )
        quick = await conn.call("Get", req(name="quick"), pb.PlacementGroupInfo, 10)  # overtakes
        service.release.set()
        first = await waiting
        with pytest.raises(RpcNotFound):
            await conn.call("Get", req(name="missing"), pb.PlacementGroupInfo, 10)
        service.release.clear()
        with pytest.raises(RpcDeadlineExceeded):
            await conn.call("Get", req(name="wait"), pb.PlacementGroupInfo, 0.2)
        hanging = asyncio.ensure_future(
            conn.call("Get", req(name="wait"), pb.PlacementGroupInfo, 10)
        )
        await asyncio.sleep(0.1)
        await server.close()
        with pytest.raises(ctrl.CtrlBroken):
            await hanging
        with pytest.raises(ctrl.CtrlBroken):
            await conn.call("Get", req(name="after"), pb.PlacementGroupInfo, 10)
        with pytest.raises(RpcPermissionDenied):
            await ctrl.open_async(
                (await _restart()).address, "wrong", max_frame=MAX_FRAME, timeout=5
            )
        return [quick.name, first.name]

    async def _restart() -> ctrl.CtrlServer:
        server2 = ctrl.CtrlServer(
            TOKEN, {"Get": (service.get, pb.PlacementGroupRequest)}, max_frame=MAX_FRAME
        )
        await server2.start("127.0.0.1")
        return server2

    assert loop.run(scenario(), timeout=30) == ["quick", "wait"]


def test_context_shim_abort_raises_ctrlabort() -> None:
    context = ctrl.ServerContext("127.0.0.1:1")

    async def go() -> None:
        await context.abort(grpc.StatusCode.ALREADY_EXISTS, "taken")

    with pytest.raises(ctrl.CtrlAbort) as err:
        asyncio.run(go())
    assert (err.value.code, err.value.details) == (grpc.StatusCode.ALREADY_EXISTS, "taken")
    assert context.invocation_metadata() == ()


def test_a_token_too_long_for_the_hello_keeps_callers_on_grpc() -> None:
    from nbcluster._runtime.head.placement import NodeBundles

    assert ctrl.token_fits("x" * 255) and not ctrl.token_fits("x" * 256)

    class Channels:  # what NodeBundles reads of the head's channels
        retry_budget_s = 1.0
        max_message_bytes = MAX_FRAME

        def __init__(self, token: str) -> None:
            self.token = token

        def channel(self, address: str) -> Any:
            return self

        def unary_unary(self, *args: Any, **kwargs: Any) -> Any:
            return lambda *a, **k: None

    assert NodeBundles("127.0.0.1:1", Channels("x" * 300)).ctrl_address == ""  # type: ignore[arg-type]
    assert NodeBundles("127.0.0.1:1", Channels(TOKEN)).ctrl_address is None  # type: ignore[arg-type]
