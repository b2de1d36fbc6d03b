"""Task channels (``_runtime/core/channel.py``): the raw-socket stream between an owner and
a worker, on loopback in one event loop, without processes."""

from __future__ import annotations

import asyncio
import socket
import ssl
import struct
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from nbcluster._runtime.core import channel
from nbcluster._runtime.protocol import tls
from nbcluster._runtime.protocol.protos import nbcluster_pb2 as pb

TOKEN = "t" * 64
LIMIT = 1 << 16


class Worker:
    """A serve() that answers every task with a reply carrying its id, and records what
    it saw (the lease, whether the owner hung up)."""

    def __init__(self) -> None:
        self.leases: list[str] = []
        self.ended = asyncio.Event()

    async def serve(self, batches: AsyncIterator[pb.TaskBatch], lease_hex: str) -> Any:
        self.leases.append(lease_hex)
        try:
            async for batch in batches:
                yield pb.ReplyBatch(replies=[pb.TaskReply(task_id=t.task_id) for t in batch.tasks])
        finally:
            self.ended.set()


def _run(coro: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coro, 30))


async def _server(worker: Worker, **kw: Any) -> channel.ChannelServer:
    server = channel.ChannelServer(TOKEN, worker.serve, max_frame=LIMIT, **kw)
    await server.start("127.0.0.1")
    return server


def test_batches_go_one_way_and_replies_come_back_in_order() -> None:
    async def main() -> None:
        worker = Worker()
        server = await _server(worker)
        ch = await channel.connect(server.address, TOKEN, "abcd", max_frame=LIMIT)
        for i in range(50):
            await ch.write(pb.TaskBatch(tasks=[pb.TaskSpec(task_id=b"%d" % i)]))
        got = []
        while len(got) < 50:
            batch = await ch.read()
            assert batch is not None
            got += [r.task_id for r in batch.replies]
        assert got == [b"%d" % i for i in range(50)]
        assert worker.leases == ["abcd"]
        ch.cancel()  # the owner hangs up: the worker's stream ends
        await asyncio.wait_for(worker.ended.wait(), 10)
        assert await ch.read() is None
        with pytest.raises(ConnectionError):
            await ch.write(pb.TaskBatch())
        await server.close()

    _run(main())


def test_a_wrong_token_is_refused_before_anything_is_served() -> None:
    async def main() -> None:
        worker = Worker()
        server = await _server(worker)
        with pytest.raises(channel.ChannelRefused):
            await channel.connect(server.address, "x" * 64, max_frame=LIMIT)
        assert worker.leases == []
        ch = await channel.connect(server.address, TOKEN, max_frame=LIMIT)  # still serving
        await ch.write(pb.TaskBatch(tasks=[pb.TaskSpec(task_id=b"ok")]))
        assert (await ch.read()).replies[0].task_id == b"ok"  # type: ignore[union-attr]
        ch.cancel()
        await server.close()

    _run(main())


def test_garbage_and_silent_peers_are_dropped_without_effect(monkeypatch) -> None:
    monkeypatch.setattr(channel, "HELLO_TIMEOUT_S", 0.3)

    async def main() -> None:
        worker = Worker()
        server = await _server(worker)
        host, port = server.address.rsplit(":", 1)
        r, w = await asyncio.open_connection(host, int(port))
        w.write(b"GET / HTTP/1.1\r\n\r\n")
        assert await r.read() in (b"", bytes([channel.REFUSED]))  # refused, then closed
        r2, w2 = await asyncio.open_connection(host, int(port))  # says nothing at all
        assert await asyncio.wait_for(r2.read(), 5) == b""
        w.close()
        w2.close()
        assert worker.leases == []
        await server.close()

    _run(main())


def test_a_frame_over_the_limit_ends_the_stream() -> None:
    async def main() -> None:
        worker = Worker()
        server = await _server(worker)
        ch = await channel.connect(server.address, TOKEN, max_frame=LIMIT)
        await ch.write(pb.TaskBatch(tasks=[pb.TaskSpec(task_id=b"x", args=b"a" * (2 * LIMIT))]))
        await asyncio.wait_for(worker.ended.wait(), 10)
        assert await ch.read() is None  # the worker closed the channel
        await server.close()

    _run(main())


def test_the_owner_sees_the_end_when_the_worker_goes_away() -> None:
    async def main() -> None:
        worker = Worker()
        server = await _server(worker)
        ch = await channel.connect(server.address, TOKEN, max_frame=LIMIT)
        await server.close()  # ends every channel
        assert await asyncio.wait_for(ch.read(), 10) is None

    _run(main())


def test_an_owner_that_resets_right_after_its_hello_is_dropped_quietly() -> None:
    # The hello and the reset arrive together: the worker's end reads the hello, its
    # transport closes, then it answers. uvloop raises RuntimeError on a write to a closed
    # transport (asyncio's loop only logs); the handler must end quietly, not leave an
    # "Unhandled exception in client_connected_cb", and the server serves on.
    uvloop = pytest.importorskip("uvloop")
    errors: list[dict[str, Any]] = []

    async def main() -> None:
        asyncio.get_running_loop().set_exception_handler(lambda _loop, ctx: errors.append(ctx))
        worker = Worker()
        server = await _server(worker, local=False)
        host, port = server.address.rsplit(":", 1)
        hello = channel._HELLO.encode(TOKEN, bytes([2]) + b"ab")
        for _ in range(10):
            sock = socket.create_connection((host, int(port)))
            sock.sendall(hello)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            sock.close()  # a reset, right behind the hello
        await asyncio.sleep(0.3)
        ch = await channel.connect(server.address, TOKEN, max_frame=LIMIT, local=False)
        await ch.write(pb.TaskBatch(tasks=[pb.TaskSpec(task_id=b"1")]))
        batch = await asyncio.wait_for(ch.read(), 10)
        assert batch is not None and [r.task_id for r in batch.replies] == [b"1"]
        ch.cancel()
        await server.close()

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(asyncio.wait_for(main(), 30))
    assert errors == []


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> tls.TlsSettings:
    return tls.make_cluster_certificates(tmp_path_factory.mktemp("chan-tls"))


def test_with_tls_only_a_peer_of_the_same_ca_gets_through(
    certs: tls.TlsSettings, tmp_path: Path
) -> None:
    foreign = tls.make_cluster_certificates(tmp_path / "foreign")

    async def main() -> None:
        worker = Worker()
        server = await _server(worker, ssl_context=tls.ssl_context(certs, server=True))
        ch = await channel.connect(
            server.address,
            TOKEN,
            max_frame=LIMIT,
            ssl_context=tls.ssl_context(certs, server=False),
            server_hostname=certs.server_name,
        )
        await ch.write(pb.TaskBatch(tasks=[pb.TaskSpec(task_id=b"tls")]))
        assert (await ch.read()).replies[0].task_id == b"tls"  # type: ignore[union-attr]
        ch.cancel()
        intruder = tls.TlsSettings(certs.ca_file, foreign.cert_file, foreign.key_file)
        with pytest.raises((ssl.SSLError, ConnectionError, asyncio.IncompleteReadError)):
            bad = await channel.connect(
                server.address,
                TOKEN,
                max_frame=LIMIT,
                ssl_context=tls.ssl_context(intruder, server=False),
                server_hostname=certs.server_name,
            )
            await bad.read()
            raise ConnectionError("the foreign certificate was let in")
        plain_r, plain_w = await asyncio.open_connection(*server.address.rsplit(":", 1))
        plain_w.write(channel.MAGIC + bytes([channel.VERSION, 64]) + TOKEN.encode() + b"\0")
        assert await asyncio.wait_for(plain_r.read(), 10) == b""  # plain text: no answer
        assert worker.leases == [""]
        await server.close()

    _run(main())


class _Stub:
    def __init__(self, address: str | None) -> None:
        self.address = address
        self.pushed: list[Any] = []

    async def TaskChannel(self, request: Any, timeout: float) -> pb.TaskChannelReply:
        return pb.TaskChannelReply(address=self.address or "")

    def PushTasks(self, metadata: Any, wait_for_ready: bool) -> str:
        self.pushed.append(metadata)
        return "grpc-stream"


class _Config:
    task_channels = True
    task_channel_local = True
    rpc_max_message_bytes = LIMIT


class _Client:
    def __init__(self, stub: _Stub) -> None:
        self.stub = stub
        self.token = TOKEN
        self.config = _Config()
        self.asked = 0

    def core(self, address: str) -> _Stub:
        self.asked += 1
        return self.stub


def test_the_opener_asks_a_worker_once_and_falls_back_to_grpc_without_a_channel() -> None:
    async def main() -> None:
        worker = Worker()
        server = await _server(worker)
        client = _Client(_Stub(server.address))
        opener = channel.StreamOpener(client)
        a = await opener.open("w:1", "aa")
        b = await opener.open("w:1", "bb")
        assert isinstance(a, channel.TaskChannel) and isinstance(b, channel.TaskChannel)
        assert client.asked == 1  # the address is cached per worker
        a.cancel()
        b.cancel()
        old = _Client(_Stub(None))  # a worker without channels
        assert await channel.StreamOpener(old).open("w:2", "cc") == "grpc-stream"
        assert old.stub.pushed == [(("nbc-lease", "cc"),)]
        off = _Client(_Stub(server.address))
        off.config.task_channels = False
        assert await channel.StreamOpener(off).open("w:3") == "grpc-stream"
        await server.close()

    _run(main())


def test_a_token_too_long_for_the_hello_stays_on_grpc() -> None:
    # A cluster token over the hello's 255 bytes (NBCLUSTER_TOKEN lets a user pick one) cannot
    # open a task channel: the owner uses gRPC streams instead of failing every lease.
    async def main() -> None:
        worker = Worker()
        server = await _server(worker)
        client = _Client(_Stub(server.address))
        client.token = "t" * 256
        assert await channel.StreamOpener(client).open("w:1", "aa") == "grpc-stream"
        assert client.stub.pushed == [(("nbc-lease", "aa"),)]
        assert client.asked == 1 and worker.leases == []  # only the PushTasks stub
        await server.close()

    _run(main())


class _MovingStub(_Stub):
    """A worker address first cached for a dead worker, then answered by a live one."""

    def __init__(self, addresses: list[str]) -> None:
        super().__init__(None)
        self.addresses = addresses

    async def TaskChannel(self, request: Any, timeout: float) -> pb.TaskChannelReply:
        return pb.TaskChannelReply(address=self.addresses.pop(0))


def test_a_stale_cached_address_is_asked_for_again_once() -> None:
    async def main() -> None:
        worker = Worker()
        server = await _server(worker)
        dead = socket.socket()
        dead.bind(("127.0.0.1", 0))
        dead_address = f"127.0.0.1:{dead.getsockname()[1]}"
        dead.close()  # nobody listens there now
        client = _Client(_MovingStub([dead_address, server.address]))
        ch = await channel.StreamOpener(client).open("w:1")
        assert isinstance(ch, channel.TaskChannel)
        ch.cancel()
        gone = _Client(_MovingStub([dead_address, dead_address]))
        with pytest.raises(OSError):
            await channel.StreamOpener(gone).open("w:2")
        await server.close()

    _run(main())


def test_batch_frame_is_the_frame_of_a_one_task_batch() -> None:
    for size in (0, 1, 127, 128, 300, 20_000, 70_000):
        spec = pb.TaskSpec(task_id=b"t", args=b"a" * size).SerializeToString()
        data = pb.TaskBatch(tasks=[pb.TaskSpec.FromString(spec)]).SerializeToString()
        assert channel.batch_frame(spec) == channel._LEN.pack(len(data)) + data


def test_frames_written_from_another_thread_arrive_whole_and_in_order() -> None:
    """What a caller's thread writes (with the loop's writes, under one lock) arrives in
    order, including when the socket fills and the rest is handed to the loop."""
    import threading

    class SlowWorker(Worker):
        async def serve(self, batches: AsyncIterator[pb.TaskBatch], lease_hex: str) -> Any:
            await asyncio.sleep(0.5)  # reads nothing for a while: the owner's socket fills
            async for reply in super().serve(batches, lease_hex):
                yield reply

    async def main() -> None:
        worker = SlowWorker()
        server = await _server(worker)
        ch = await channel.connect(server.address, TOKEN, max_frame=1 << 22)
        loop = asyncio.get_running_loop()
        assert ch.thread_writable()
        lock = threading.Lock()
        handoffs = 0
        pending = 0  # frames' rests not yet written by the loop

        def rest_on_loop(rest: bytes) -> None:
            nonlocal pending
            with lock:
                ch.write_bytes_nowait(rest)
                pending -= 1

        def writer() -> None:
            nonlocal handoffs, pending
            for i in range(300):
                spec = pb.TaskSpec(task_id=b"%d" % i, args=b"z" * 60_000)
                frame = channel.batch_frame(spec.SerializeToString())
                while True:
                    with lock:
                        if pending or not ch.thread_writable():
                            pass  # the loop has bytes queued: wait for them to leave
                        else:
                            sent = ch.send_from_thread(frame)
                            if sent < len(frame):
                                handoffs += 1
                                pending += 1
                                loop.call_soon_threadsafe(rest_on_loop, frame[sent:])
                            break
                    threading.Event().wait(0.001)

        thread = threading.Thread(target=writer)
        thread.start()
        got: list[bytes] = []
        while len(got) < 300:
            batch = await ch.read()
            assert batch is not None
            got += [r.task_id for r in batch.replies]
        await loop.run_in_executor(None, thread.join, 10)
        assert got == [b"%d" % i for i in range(300)]
        assert handoffs > 0  # the socket did fill: the loop wrote the rests
        ch.cancel()
        assert not ch.thread_writable()
        await server.close()

    _run(main())


def _family(ch: channel.TaskChannel) -> int:
    return ch._transport.get_extra_info("socket").family


def test_on_one_host_a_channel_goes_over_the_workers_unix_socket() -> None:
    async def main() -> None:
        worker = Worker()
        server = await _server(worker)
        ch = await channel.connect(server.address, TOKEN, "abcd", max_frame=LIMIT)
        assert _family(ch) == socket.AF_UNIX
        await ch.write(pb.TaskBatch(tasks=[pb.TaskSpec(task_id=b"1")]))
        batch = await ch.read()
        assert batch is not None and [r.task_id for r in batch.replies] == [b"1"]
        assert worker.leases == ["abcd"]
        # A frame written from another thread goes the same way.
        sent = ch.send_from_thread(
            channel.batch_frame(pb.TaskSpec(task_id=b"2").SerializeToString())
        )
        assert sent > 0
        batch = await ch.read()
        assert batch is not None and [r.task_id for r in batch.replies] == [b"2"]
        ch.cancel()
        # Asked not to, or with the Unix socket turned off on the worker: TCP.
        tcp = await channel.connect(server.address, TOKEN, max_frame=LIMIT, local=False)
        assert _family(tcp) == socket.AF_INET
        tcp.cancel()
        plain = await _server(Worker(), local=False)
        ch = await channel.connect(plain.address, TOKEN, max_frame=LIMIT)
        assert _family(ch) == socket.AF_INET
        ch.cancel()
        await plain.close()
        await server.close()

    _run(main())


def test_the_unix_socket_checks_the_token_and_is_named_per_cluster_and_address() -> None:
    async def main() -> None:
        server = await _server(Worker())
        # Another cluster's token names another socket: nothing there, so TCP, where the
        # worker refuses the hello.
        assert channel.local_name("x" * 64, server.address) != channel.local_name(
            TOKEN, server.address
        )
        with pytest.raises(channel.ChannelRefused):
            await channel.connect(server.address, "x" * 64, max_frame=LIMIT)

        # The right name with a wrong token in the hello is refused too.
        def wrong_token() -> bytes:
            with socket.socket(socket.AF_UNIX) as raw:
                raw.settimeout(5)
                raw.connect(channel.local_name(TOKEN, server.address))
                raw.sendall(b"NBCT\x01\x05wrong\x00")
                return raw.recv(1)

        assert await asyncio.to_thread(wrong_token) == b"\x01"  # REFUSED
        # After close() the name is gone: a new owner falls back to TCP (refused: closed).
        await server.close()
        with pytest.raises(OSError):
            await channel.connect(server.address, TOKEN, max_frame=LIMIT)

    _run(main())


def test_a_thread_reads_replies_while_the_loop_is_paused_then_the_loop_reads_on() -> None:
    """Thread reads (actor_submitter): with the loop's reading paused, a thread reads the
    socket (whole frames, a partial one kept for the next reader); after resume the loop
    delivers what follows; the end of the stream is reported, not swallowed."""

    async def main() -> None:
        worker = Worker()
        server = await _server(worker)
        ch = await channel.connect(server.address, TOKEN, "", max_frame=LIMIT)
        delivered: list[pb.ReplyBatch | None] = []
        ch.on_replies(delivered.append)
        assert ch.thread_readable()
        ch.pause_reads()
        assert ch.reads_paused
        for i in range(5):
            await ch.write(pb.TaskBatch(tasks=[pb.TaskSpec(task_id=b"%d" % i)]))
        got: list[bytes] = []
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 10
        while len(got) < 5:
            assert loop.time() < deadline, got
            batch, ok = await asyncio.to_thread(ch.read_from_thread)
            assert ok
            if batch is not None:
                got += [r.task_id for r in batch.replies]
            await asyncio.sleep(0.01)
        assert got == [b"%d" % i for i in range(5)]
        assert delivered == []  # the loop read nothing meanwhile
        # a partial frame read by the thread is completed by the loop after resume
        proto = ch._proto
        reply = pb.ReplyBatch(replies=[pb.TaskReply(task_id=b"x")]).SerializeToString()
        frame = channel._LEN.pack(len(reply)) + reply
        assert proto.feed(frame[:3]) is False
        ch.resume_reads()
        proto.data_received(frame[3:])
        assert [r.task_id for b in delivered if b for r in b.replies] == [b"x"]
        await ch.write(pb.TaskBatch(tasks=[pb.TaskSpec(task_id=b"after")]))
        while not any(r.task_id == b"after" for b in delivered if b for r in b.replies):
            await asyncio.sleep(0.01)
        # the end, seen by a reading thread, comes back as not ok
        ch.pause_reads()
        await server.close()
        deadline = loop.time() + 10
        while True:
            assert loop.time() < deadline
            _batch, ok = await asyncio.to_thread(ch.read_from_thread)
            if not ok:
                break
            await asyncio.sleep(0.01)
        ch.cancel()

    _run(main())


def test_a_frame_over_the_limit_read_by_a_thread_is_not_ok() -> None:
    async def main() -> None:
        a, b = socket.socketpair()
        loop = asyncio.get_running_loop()
        proto = channel._ClientProtocol(loop, max_frame=8)
        transport, _ = await loop.connect_accepted_socket(lambda: proto, a)
        proto.status.set_result(channel.OK)
        own = socket.socket(a.family, a.type, fileno=__import__("os").dup(a.fileno()))
        ch = channel.TaskChannel(transport, proto, own)
        ch.on_replies(lambda _b: None)
        ch.pause_reads()
        b.sendall(channel._LEN.pack(100) + b"y" * 100)
        deadline = loop.time() + 10
        while True:
            assert loop.time() < deadline
            batch, ok = ch.read_from_thread()
            if not ok:
                break
            await asyncio.sleep(0.01)
        assert batch is None
        ch.cancel()
        b.close()

    _run(main())
