"""A streaming call's errors come out of the protocol layer translated, like a unary call's:
iterating, reading, writing, half-closing or awaiting an ``AuthedStub`` stream (reply
streams, bidirectional streams, uploads; also through a ``RetryingStub``), and iterating a
blocking ``SyncStub`` reply stream, raise the named ``RpcFailure`` of the status code with
the peer's address; replies before the failure, ``EOF``, ``cancel()`` and the token
metadata are as before. No process is started: the calls are fakes that raise grpc's own
errors."""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent import futures
from typing import Any

import grpc
import grpc.aio
import pytest

from nbcluster._runtime.protocol import errors
from nbcluster._runtime.protocol.protos import jobs_pb2 as jpb
from nbcluster._runtime.protocol.protos import jobs_pb2_grpc as jpb_grpc
from nbcluster._runtime.protocol.rpc import (
    AuthedStub,
    RetryingStub,
    SyncStub,
    authed_call,
    make_sync_channel,
    pb,
    pb_grpc,
)

NAMED = {
    grpc.StatusCode.UNAVAILABLE: errors.RpcUnavailable,
    grpc.StatusCode.NOT_FOUND: errors.RpcNotFound,
    grpc.StatusCode.ALREADY_EXISTS: errors.RpcAlreadyExists,
    grpc.StatusCode.INVALID_ARGUMENT: errors.RpcInvalidArgument,
    grpc.StatusCode.FAILED_PRECONDITION: errors.RpcFailedPrecondition,
    grpc.StatusCode.DEADLINE_EXCEEDED: errors.RpcDeadlineExceeded,
    grpc.StatusCode.CANCELLED: errors.RpcCancelled,
    grpc.StatusCode.UNAUTHENTICATED: errors.RpcUnauthenticated,
    grpc.StatusCode.PERMISSION_DENIED: errors.RpcPermissionDenied,
    grpc.StatusCode.RESOURCE_EXHAUSTED: errors.RpcResourceExhausted,
    grpc.StatusCode.ABORTED: errors.RpcAborted,
}
CODES = list(grpc.StatusCode)[1:]  # every code but OK
PEER = "10.0.0.3:7000"


def _aio_error(code: grpc.StatusCode) -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), f"{code.name} here")


class FakeStreamCall:
    """What a channel's asyncio streaming call is: replies ``replies`` then fails with
    ``code`` however it is read; writes and half-closing fail with ``code`` too."""

    def __init__(self, code: grpc.StatusCode, replies: list[Any]) -> None:
        self.code_, self.replies, self.cancelled = code, list(replies), False

    def __aiter__(self) -> Any:
        return self._iterate()

    async def _iterate(self) -> Any:
        for reply in self.replies:
            yield reply
        raise _aio_error(self.code_)

    async def read(self) -> Any:
        if self.replies:
            return self.replies.pop(0)
        raise _aio_error(self.code_)

    async def write(self, request: Any) -> None:
        raise _aio_error(self.code_)

    async def done_writing(self) -> None:
        raise _aio_error(self.code_)

    async def wait_for_connection(self) -> None:
        raise _aio_error(self.code_)

    def __await__(self) -> Any:
        async def reply() -> Any:
            raise _aio_error(self.code_)

        return reply().__await__()

    def cancel(self) -> bool:
        self.cancelled = True
        return True

    def done(self) -> bool:
        return True


class _Method:
    def __init__(self, channel: FakeChannel) -> None:
        self.channel = channel

    def __call__(self, request: Any = None, **kwargs: Any) -> FakeStreamCall:
        self.channel.seen.append((request, kwargs))
        call = FakeStreamCall(self.channel.code, self.channel.replies)
        self.channel.calls.append(call)
        return call


class _UnaryStream(_Method, grpc.aio.UnaryStreamMultiCallable):  # type: ignore[misc]
    pass


class _StreamStream(_Method, grpc.aio.StreamStreamMultiCallable):  # type: ignore[misc]
    pass


class _StreamUnary(_Method, grpc.aio.StreamUnaryMultiCallable):  # type: ignore[misc]
    pass


class _UnaryUnary(grpc.aio.UnaryUnaryMultiCallable):  # type: ignore[misc]
    def __init__(self, channel: FakeChannel) -> None:
        self.channel = channel

    def __call__(self, request: Any, **kwargs: Any) -> Any:
        self.channel.seen.append((request, kwargs))

        async def fail() -> Any:
            raise _aio_error(self.channel.code)

        return fail()


class FakeChannel:
    """An asyncio channel whose every call fails with ``code`` (after ``replies``)."""

    def __init__(self, code: grpc.StatusCode, replies: list[Any] | None = None) -> None:
        self.code = code
        self.replies = replies or []
        self.seen: list[Any] = []
        self.calls: list[FakeStreamCall] = []

    def unary_unary(self, *args: Any, **kwargs: Any) -> _UnaryUnary:
        return _UnaryUnary(self)

    def unary_stream(self, *args: Any, **kwargs: Any) -> _UnaryStream:
        return _UnaryStream(self)

    def stream_stream(self, *args: Any, **kwargs: Any) -> _StreamStream:
        return _StreamStream(self)

    def stream_unary(self, *args: Any, **kwargs: Any) -> _StreamUnary:
        return _StreamUnary(self)


def _check(err: BaseException, code: grpc.StatusCode) -> None:
    assert type(err) is NAMED.get(code, errors.RpcFailure)
    assert isinstance(err, grpc.aio.AioRpcError)  # sites checking codes keep working
    assert (err.code(), err.details(), err.peer) == (code, f"{code.name} here", PEER)  # type: ignore[attr-defined]


def _raises(coro: Any) -> BaseException:
    with pytest.raises(errors.RpcFailure) as info:
        asyncio.run(coro)
    return info.value


@pytest.mark.parametrize("code", CODES, ids=lambda c: c.name)
def test_a_reply_stream_raises_the_named_error_of_each_code_after_its_replies(
    code: grpc.StatusCode,
) -> None:
    chunks = [pb.ObjectChunk(offset=0, data=b"a"), pb.ObjectChunk(offset=1, data=b"b")]
    channel = FakeChannel(code, chunks)
    stub = AuthedStub(pb_grpc.NodeManagerStub(channel), "tok", PEER)
    got: list[Any] = []

    async def iterate() -> None:
        async for chunk in stub.ReadObject(pb.ReadObjectRequest(), timeout=600):
            got.append(chunk)

    _check(_raises(iterate()), code)
    assert got == chunks  # what came before the failure still arrives
    ((_, kwargs),) = channel.seen
    assert kwargs["timeout"] == 600
    assert any(key == "authorization" for key, _ in kwargs["metadata"])

    async def read() -> None:
        call = stub.ReadObject(pb.ReadObjectRequest())
        while True:
            await call.read()

    _check(_raises(read()), code)


@pytest.mark.parametrize("code", CODES, ids=lambda c: c.name)
def test_a_bidi_stream_translates_reads_writes_and_half_close(code: grpc.StatusCode) -> None:
    channel = FakeChannel(code)
    # the node/worker stubs of ``rpc.Channels`` are retrying stubs over authed ones
    stub = RetryingStub(AuthedStub(pb_grpc.CoreWorkerStub(channel), "tok", PEER), 3.0)
    call = stub.PushTasks(metadata=(("nbc-lease", "ab"),), wait_for_ready=True)
    _check(_raises(call.write(pb.TaskBatch())), code)
    _check(_raises(call.read()), code)
    _check(_raises(call.done_writing()), code)
    _check(_raises(call.wait_for_connection()), code)
    # the rest is the call's own
    assert call.cancel() is True and channel.calls[0].cancelled
    assert call.done() is True
    ((_, kwargs),) = channel.seen  # one call, not retried, carrying both metadata entries
    keys = [key for key, _ in kwargs["metadata"]]
    assert "authorization" in keys and "nbc-lease" in keys
    assert kwargs["wait_for_ready"] is True


def test_a_stream_passes_eof_through_untouched() -> None:
    channel = FakeChannel(grpc.StatusCode.UNAVAILABLE, [pb.ReplyBatch()])
    channel.replies.append(grpc.aio.EOF)
    stub = AuthedStub(pb_grpc.CoreWorkerStub(channel), "tok", PEER)

    async def reads() -> list[Any]:
        call = stub.PushTasks()
        return [await call.read(), await call.read()]

    assert asyncio.run(reads()) == [pb.ReplyBatch(), grpc.aio.EOF]


@pytest.mark.parametrize("code", CODES, ids=lambda c: c.name)
def test_an_asyncio_upload_and_download_translate(code: grpc.StatusCode) -> None:
    channel = FakeChannel(code)
    stub = AuthedStub(jpb_grpc.JobServiceStub(channel), "tok", PEER)

    async def upload() -> None:
        await stub.UploadPackage(iter([jpb.PackageChunk()]), timeout=600)

    async def download() -> None:
        async for _ in stub.DownloadPackage(jpb.PackageRef(uri="gcs://x"), timeout=600):
            pass

    _check(_raises(upload()), code)
    _check(_raises(download()), code)


def test_a_raw_method_gets_the_token_and_translation() -> None:
    channel = FakeChannel(grpc.StatusCode.UNAVAILABLE)
    call = authed_call(channel.unary_unary("/nbcluster.ClientProxy/Call"), "tok", PEER)
    _check(_raises(call(b"payload", timeout=None)), grpc.StatusCode.UNAVAILABLE)
    ((request, kwargs),) = channel.seen
    assert request == b"payload" and kwargs["timeout"] is None
    assert any(key == "authorization" for key, _ in kwargs["metadata"])


class _SyncReplies(grpc.RpcError, grpc.Call):  # type: ignore[misc]
    """A blocking channel's reply stream: an iterator that, once its replies are read,
    raises itself (as grpc's rendezvous does) with ``code``."""

    def __init__(self, code: grpc.StatusCode, replies: list[Any]) -> None:
        self._code, self._replies, self.cancelled = code, list(replies), False

    def __iter__(self) -> _SyncReplies:
        return self

    def __next__(self) -> Any:
        if self._replies:
            return self._replies.pop(0)
        raise self

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return f"{self._code.name} here"

    # grpc's blocking stream waits for these until they arrive: after a local cancel the
    # debug string (and, before the first reply, the metadata) never does
    def initial_metadata(self) -> tuple[Any, ...]:
        raise AssertionError("would wait forever")

    def trailing_metadata(self) -> tuple[Any, ...]:
        raise AssertionError("would wait forever")

    def debug_error_string(self) -> str:
        raise AssertionError("would wait forever")

    def is_active(self) -> bool:
        return False

    def time_remaining(self) -> float | None:
        return None

    def cancel(self) -> bool:
        self.cancelled = True
        return True

    def add_callback(self, callback: Any) -> bool:
        return False


class FakeSyncChannel:
    """A blocking channel whose reply streams fail with ``code`` after ``replies``."""

    def __init__(self, code: grpc.StatusCode, replies: list[Any]) -> None:
        self.code, self.replies = code, replies
        self.seen: list[Any] = []
        self.calls: list[_SyncReplies] = []

    def unary_stream(self, *args: Any, **kwargs: Any) -> Any:
        def stream(request: Any, **kw: Any) -> _SyncReplies:
            self.seen.append((request, kw))
            self.calls.append(_SyncReplies(self.code, self.replies))
            return self.calls[-1]

        return stream

    def __getattr__(self, name: str) -> Any:  # unary methods: not called here
        return lambda *a, **k: None


@pytest.mark.parametrize("code", CODES, ids=lambda c: c.name)
def test_a_blocking_reply_stream_raises_the_named_error_of_each_code(
    code: grpc.StatusCode,
) -> None:
    chunks = [jpb.LogChunk(data=b"line 1\n"), jpb.LogChunk(data=b"line 2\n")]
    channel = FakeSyncChannel(code, chunks)
    stub = SyncStub(jpb_grpc.JobServiceStub(channel), "tok", PEER)
    call = stub.TailJobLogs(jpb.JobLogRequest(submission_id="s"), timeout=None)
    got: list[Any] = []
    with pytest.raises(errors.RpcFailure) as info:
        for chunk in call:
            got.append(chunk)
    assert got == chunks
    _check(info.value, code)
    for peer in errors.Peer:  # the public exception is the one grpc's error gave
        assert str(errors.to_exception(info.value, peer)) == str(
            errors.to_exception(_SyncReplies(code, []), peer)  # type: ignore[arg-type]
        )
    assert call.cancel() is True and channel.calls[0].cancelled
    ((_, kwargs),) = channel.seen
    assert kwargs["timeout"] is None
    assert any(key == "authorization" for key, _ in kwargs["metadata"])


@pytest.mark.parametrize("replies_first", [1, 0], ids=["after-a-reply", "before-any-reply"])
def test_a_blocking_reply_stream_cancelled_by_its_reader_ends_with_cancelled(
    replies_first: int,
) -> None:
    """grpc's own blocking stream (an in-process server, no process): the event stream's
    ``close()`` cancels the call from another thread; the reading thread must end with
    ``RpcCancelled`` (translating must not wait for what a cancelled call never gets)."""
    release = threading.Event()

    def tail(request: jpb.JobLogRequest, context: grpc.ServicerContext) -> Any:
        for _ in range(replies_first):
            yield jpb.LogChunk(data=b"line\n")
        release.wait(30)

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    server.add_generic_rpc_handlers(
        (
            grpc.method_handlers_generic_handler(
                "nbcluster.jobs.JobService",
                {
                    "TailJobLogs": grpc.unary_stream_rpc_method_handler(
                        tail,
                        request_deserializer=jpb.JobLogRequest.FromString,
                        response_serializer=jpb.LogChunk.SerializeToString,
                    )
                },
            ),
        )
    )
    address = f"127.0.0.1:{server.add_insecure_port('127.0.0.1:0')}"
    server.start()
    channel = make_sync_channel(address, "tok")
    try:
        call = SyncStub(jpb_grpc.JobServiceStub(channel), "tok", address).TailJobLogs(
            jpb.JobLogRequest(submission_id="s"), timeout=None
        )
        got: list[Any] = []
        ended: list[BaseException] = []

        def read() -> None:
            try:
                for chunk in call:
                    got.append(chunk)
            except BaseException as err:  # noqa: BLE001 - handed to the test's thread
                ended.append(err)

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        if replies_first:
            assert _until(lambda: len(got) == 1)
        assert call.cancel() is True
        reader.join(20)  # a generous deadline against a hang: the bug waits forever
        assert not reader.is_alive(), "the reader still waits after its call was cancelled"
        assert len(got) == replies_first
        ((err,),) = [ended]
        assert type(err) is errors.RpcCancelled
        assert err.peer == address
    finally:
        release.set()
        channel.close()
        server.stop(0)


def _until(predicate: Any, timeout: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True
