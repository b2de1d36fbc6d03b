"""The raw-socket hello (``protocol/hello.py``) shared by task channels (``core/channel.py``)
and control channels (``protocol/ctrl.py``): golden bytes on the wire for each protocol, the
checks a server makes, and the constant-time token compare. In one event loop on loopback,
without processes."""

from __future__ import annotations

import asyncio
import hmac
from collections.abc import AsyncIterator
from typing import Any

import pytest

from nbcluster._runtime.core import channel
from nbcluster._runtime.protocol import ctrl, hello
from nbcluster._runtime.protocol.protos import nbcluster_pb2 as pb

TOKEN = "s3cret"
LIMIT = 1 << 16

# The bytes each client sent before the hello was shared (written out by hand from the
# protocols' docstrings: magic, version 1, token length, token; the task channel then
# its lease's length and the lease).
CTRL_GOLDEN = b"NBCC\x01\x06s3cret"
TASK_GOLDEN = b"NBCT\x01\x06s3cret\x04ab12"
TASK_GOLDEN_NO_LEASE = b"NBCT\x01\x06s3cret\x00"


def _run(coro: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coro, 30))


def _read(data: bytes, token: bytes, eof: bool = True) -> tuple[bool, bytes]:
    """:meth:`Hello.read` (of ``GOOD``) on a stream holding ``data`` (then its end, with
    ``eof``): the verdict, and what it left to read when the stream ends."""

    async def main() -> tuple[bool, bytes]:
        reader = asyncio.StreamReader()
        reader.feed_data(data)
        if eof:
            reader.feed_eof()
        ok = await GOOD.read(reader, token)
        return ok, await reader.read() if eof else b""

    return _run(main())


class _Worker:
    """A task channel's serve(): records each lease and ends at once."""

    def __init__(self) -> None:
        self.leases: list[str] = []

    async def serve(self, batches: AsyncIterator[pb.TaskBatch], lease_hex: str) -> Any:
        self.leases.append(lease_hex)
        async for _ in batches:
            yield pb.ReplyBatch()


async def _get(request: Any, context: Any) -> Any:
    return pb.Empty()


async def _servers() -> tuple[ctrl.CtrlServer, channel.ChannelServer, _Worker]:
    worker = _Worker()
    task = channel.ChannelServer(TOKEN, worker.serve, max_frame=LIMIT)
    control = ctrl.CtrlServer(TOKEN, {"Get": (_get, pb.Empty)}, max_frame=LIMIT)
    await task.start("127.0.0.1")
    await control.start("127.0.0.1")
    return control, task, worker


async def _answer(address: str, data: bytes) -> bytes:
    """What a server answers a raw peer that sends ``data`` (until it closes, or the
    first byte when it stays open: an accepted hello)."""
    host, port = address.rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(data)
        first = await asyncio.wait_for(reader.read(1), 10)
        if first != bytes([hello.OK]):
            first += await asyncio.wait_for(reader.read(), 10)  # then it closes
        return first
    finally:
        writer.close()


# --------------------------------------------------------------------------- golden bytes


def test_each_protocol_builds_its_golden_hello() -> None:
    assert ctrl._HELLO.encode(TOKEN) == CTRL_GOLDEN
    assert channel._HELLO.encode(TOKEN, b"\x04ab12") == TASK_GOLDEN
    assert (ctrl.MAGIC, ctrl.VERSION, channel.MAGIC, channel.VERSION) == (
        b"NBCC",
        1,
        b"NBCT",
        1,
    )
    assert (hello.OK, hello.REFUSED) == (0, 1)
    assert (ctrl.OK, ctrl.REFUSED, channel.OK, channel.REFUSED) == (0, 1, 0, 1)
    assert hello.Hello(b"ABCD", 7).encode("") == b"ABCD\x07\x00"


def test_the_real_clients_send_the_golden_bytes() -> None:
    """Each client (task channel, asyncio and blocking control channel) against a raw
    server that answers OK to the hello and records every byte the client sent."""
    got: list[bytes] = []
    sizes = iter([len(TASK_GOLDEN), len(TASK_GOLDEN_NO_LEASE), len(CTRL_GOLDEN), len(CTRL_GOLDEN)])

    async def record(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        data = await reader.readexactly(next(sizes))
        writer.write(bytes([hello.OK]))
        await writer.drain()
        got.append(data + await reader.read())  # and nothing more before it hangs up
        writer.close()

    async def main() -> None:
        server = await asyncio.start_server(record, "127.0.0.1", 0)
        address = f"127.0.0.1:{server.sockets[0].getsockname()[1]}"
        ch = await channel.connect(address, TOKEN, "ab12", max_frame=LIMIT)
        ch.cancel()
        ch = await channel.connect(address, TOKEN, max_frame=LIMIT)
        ch.cancel()
        conn = await ctrl.open_async(address, TOKEN, max_frame=LIMIT)
        conn.close()
        client = ctrl.CtrlClient(address, TOKEN, max_frame=LIMIT)
        await asyncio.to_thread(client._connect, 10)
        client.close()
        server.close()

    _run(main())
    assert got == [TASK_GOLDEN, TASK_GOLDEN_NO_LEASE, CTRL_GOLDEN, CTRL_GOLDEN]


def test_the_real_servers_accept_the_golden_bytes_and_refuse_bad_hellos() -> None:
    async def main() -> None:
        control, task, worker = await _servers()
        try:
            assert await _answer(control.address, CTRL_GOLDEN) == bytes([hello.OK])
            assert await _answer(task.address, TASK_GOLDEN) == bytes([hello.OK])
            for _ in range(100):  # the lease reaches serve() right after the answer
                if worker.leases:
                    break
                await asyncio.sleep(0.05)
            assert worker.leases == ["ab12"]
            refused = bytes([hello.REFUSED])
            for address, good, other, tail in (
                (control.address, CTRL_GOLDEN, b"NBCT\x01\x06s3cret", b""),
                (task.address, TASK_GOLDEN, CTRL_GOLDEN, b"\x04ab12"),
            ):
                bad = {
                    "the other protocol's magic": other + tail,
                    "wrong version": good[:4] + b"\x02" + good[5:],
                    "wrong token, same length": good.replace(b"s3cret", b"s3creT"),
                    "wrong token, shorter": good[:5] + b"\x05s3cre" + tail,
                    "wrong token, longer": good[:5] + b"\x07s3crets" + tail,
                    "no token": good[:5] + b"\x00" + tail,
                    "not a hello": b"GET / HTTP/1.1\r\n\r\n",
                }
                for what, data in bad.items():
                    assert await _answer(address, data) == refused, what
            assert worker.leases == ["ab12"]  # nothing refused reached serve()
        finally:
            await control.close()
            await task.close()

    _run(main())


# --------------------------------------------------------------------------- the checks


GOOD = hello.Hello(b"NBCX", 3)


def test_take_waits_for_a_whole_hello_and_leaves_what_follows() -> None:
    data = GOOD.encode(TOKEN, b"tail")
    buf = bytearray()
    for byte in data[: hello.HEAD_SIZE + len(TOKEN) - 1]:  # byte by byte: incomplete
        buf.append(byte)
        assert GOOD.take(buf, TOKEN.encode()) is None
    buf += data[hello.HEAD_SIZE + len(TOKEN) - 1 :]
    assert GOOD.take(buf, TOKEN.encode()) is True
    assert buf == bytearray(b"tail")


def test_take_and_read_refuse_a_wrong_magic_version_or_token() -> None:
    token = TOKEN.encode()
    bad = {
        "magic": b"NBCY\x03\x06s3cret",
        "version": b"NBCX\x04\x06s3cret",
        "token": b"NBCX\x03\x06s3creT",
        "token length": b"NBCX\x03\x05s3cre",
        "empty token": b"NBCX\x03\x00",
    }
    for what, data in bad.items():
        assert GOOD.take(bytearray(data + b"more"), token) is False, what
        assert _read(data + b"more", token)[0] is False, what
    # A wrong head is refused as soon as it is here, before the token arrives.
    assert GOOD.take(bytearray(b"NBCY\x03\x06"), token) is False
    assert _read(b"NBCY\x03\x06", token, eof=False) == (False, b"")
    # A good one; read leaves the tail for the protocol.
    assert _read(GOOD.encode(TOKEN, b"\x04ab12"), token) == (True, b"\x04ab12")
    # A stream that ends inside the hello raises, as readexactly does.
    with pytest.raises(asyncio.IncompleteReadError):
        _read(b"NBCX\x03\x06s3c", token)


def test_a_token_length_over_the_limit_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    # The limit is one byte's range, so a received length cannot pass it on the real wire;
    # a smaller limit shows the bound is checked (before the token is waited for).
    monkeypatch.setattr(hello, "MAX_TOKEN", 5)
    token = b"s3cret"
    head = b"NBCX\x03\x06"
    assert GOOD.token_length(head) is None
    assert GOOD.take(bytearray(head), token) is False
    assert _read(head, token, eof=False) == (False, b"")
    assert GOOD.token_length(b"NBCX\x03\x05") == 5
    with pytest.raises(ValueError, match="at most 5"):
        GOOD.encode(TOKEN)


def test_clients_refuse_a_token_too_long_for_the_hello() -> None:
    long = "x" * (hello.MAX_TOKEN + 1)
    assert hello.token_fits("x" * hello.MAX_TOKEN) and not hello.token_fits(long)
    assert ctrl.token_fits is hello.token_fits
    assert len(GOOD.encode("x" * hello.MAX_TOKEN)) == hello.HEAD_SIZE + hello.MAX_TOKEN
    with pytest.raises(ValueError, match="at most 255"):
        GOOD.encode(long)
    with pytest.raises(ValueError, match="at most 255"):
        ctrl.CtrlClient("127.0.0.1:1", long, max_frame=LIMIT)
    # Refused before any connection is tried (nothing listens on port 1).
    with pytest.raises(ValueError, match="at most 255"):
        _run(ctrl.open_async("127.0.0.1:1", long, max_frame=LIMIT))
    with pytest.raises(ValueError, match="at most 255"):
        _run(channel.connect("127.0.0.1:1", long, max_frame=LIMIT))
    with pytest.raises(ValueError, match="lease id too long"):
        _run(channel.connect("127.0.0.1:1", TOKEN, "a" * 256, max_frame=LIMIT))
    with pytest.raises(ValueError, match="4 bytes"):
        hello.Hello(b"NBC", 1)


def test_the_token_is_compared_with_hmac_compare_digest(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[bytes, bytes]] = []
    real = hmac.compare_digest

    def spy(a: bytes, b: bytes) -> bool:
        calls.append((bytes(a), bytes(b)))
        return real(a, b)

    monkeypatch.setattr(hmac, "compare_digest", spy)
    token = TOKEN.encode()
    assert GOOD.take(bytearray(GOOD.encode("wrong!")), token) is False
    assert _read(GOOD.encode(TOKEN), token) == (True, b"")
    assert calls == [(b"wrong!", token), (token, token)]
    calls.clear()

    async def main() -> None:  # and the real servers go through it
        control, task, _ = await _servers()
        try:
            assert await _answer(control.address, CTRL_GOLDEN) == bytes([hello.OK])
            assert await _answer(task.address, TASK_GOLDEN.replace(b"s3cret", b"s3creT")) == (
                bytes([hello.REFUSED])
            )
        finally:
            await control.close()
            await task.close()

    _run(main())
    assert calls == [(token, token), (b"s3creT", token)]
