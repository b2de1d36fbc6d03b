"""The protocol layer's stubs translate gRPC errors once: each status code comes out of an
``AuthedStub`` (and a ``RetryingStub`` over it), and out of a blocking ``SyncStub``, as its
named ``RpcFailure`` subclass, carrying the code, the details and the peer's address, and
still a ``grpc.aio.AioRpcError`` for the sites that check codes. No process is started: the
channel is a fake."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import grpc.aio
import pytest

from nbcluster._runtime.protocol import errors
from nbcluster._runtime.protocol.protos import jobs_pb2 as jpb
from nbcluster._runtime.protocol.protos import jobs_pb2_grpc as jpb_grpc
from nbcluster._runtime.protocol.rpc import AuthedStub, RetryingStub, SyncStub, pb, pb_grpc

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


class _Failing(grpc.aio.UnaryUnaryMultiCallable):  # type: ignore[misc]
    """A unary method that fails with ``code`` (what a channel's call raises)."""

    def __init__(self, code: grpc.StatusCode, seen: list[Any]) -> None:
        self.code = code
        self.seen = seen

    def __call__(self, request: Any, **kwargs: Any) -> Any:
        self.seen.append((request, kwargs))

        async def fail() -> Any:
            raise grpc.aio.AioRpcError(
                self.code, grpc.aio.Metadata(), grpc.aio.Metadata(), f"{self.code.name} here"
            )

        return fail()


class FakeChannel:
    """Every unary method of every stub built on it fails with ``code``."""

    def __init__(self, code: grpc.StatusCode) -> None:
        self.code = code
        self.seen: list[Any] = []

    def unary_unary(self, *args: Any, **kwargs: Any) -> _Failing:
        return _Failing(self.code, self.seen)

    def __getattr__(self, name: str) -> Any:  # unary_stream, stream_stream: not called here
        return lambda *a, **k: None


def _raised(stub: Any) -> BaseException:
    async def call() -> None:
        await stub.GetNodes(pb.Empty(), timeout=1)

    with pytest.raises(grpc.aio.AioRpcError) as info:
        asyncio.run(call())
    return info.value


@pytest.mark.parametrize("code", list(grpc.StatusCode)[1:], ids=lambda c: c.name)
def test_the_stub_raises_the_named_error_of_each_code(code: grpc.StatusCode) -> None:
    channel = FakeChannel(code)
    err = _raised(AuthedStub(pb_grpc.HeadStub(channel), "tok", "10.0.0.1:6379"))
    assert type(err) is NAMED.get(code, errors.RpcFailure)
    assert isinstance(err, errors.RpcFailure)
    assert err.code() == code
    assert err.details() == f"{code.name} here"
    assert err.peer == "10.0.0.1:6379"
    # the call itself went out as before: the token rode along, the timeout too
    ((_, kwargs),) = channel.seen
    assert kwargs["timeout"] == 1
    assert any(key == "authorization" for key, _ in kwargs["metadata"])
    # what the sites did with grpc's error they still can: the public translation agrees
    plain = grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), err.details())
    for peer in errors.Peer:
        assert str(errors.to_exception(err, peer)) == str(errors.to_exception(plain, peer))
    assert errors.is_unavailable(err) == errors.is_unavailable(plain)


def test_a_retrying_stub_retries_the_named_unavailable_and_then_raises_it() -> None:
    channel = FakeChannel(grpc.StatusCode.UNAVAILABLE)
    stub = RetryingStub(AuthedStub(pb_grpc.NodeManagerStub(channel), "tok", "n:1"), 0.05)

    async def call() -> None:
        await stub.CancelWorkerLease(pb.CancelLeaseRequest())

    with pytest.raises(errors.RpcUnavailable):
        asyncio.run(call())
    assert len(channel.seen) > 1  # retried before giving up


def test_translation_is_done_once() -> None:
    first = errors.translated(
        grpc.aio.AioRpcError(
            grpc.StatusCode.NOT_FOUND, grpc.aio.Metadata(), grpc.aio.Metadata(), "gone"
        ),
        "a:1",
    )
    assert errors.translated(first, "b:2") is first


class _SyncError(grpc.RpcError, grpc.Call):  # type: ignore[misc]
    """What a blocking channel's failed call raises (``code()``, ``details()``, ...)."""

    def __init__(self, code: grpc.StatusCode) -> None:
        self._code = code

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return f"{self._code.name} here"

    def initial_metadata(self) -> tuple[Any, ...]:
        return ()

    def trailing_metadata(self) -> tuple[Any, ...]:
        return ()

    def debug_error_string(self) -> str:
        return ""

    def is_active(self) -> bool:
        return False

    def time_remaining(self) -> float | None:
        return None

    def cancel(self) -> bool:
        return False

    def add_callback(self, callback: Any) -> bool:
        return False


class _SyncFailing(grpc.UnaryUnaryMultiCallable):  # type: ignore[misc]
    def __init__(self, code: grpc.StatusCode, seen: list[Any]) -> None:
        self.code, self.seen = code, seen

    def __call__(self, request: Any, **kwargs: Any) -> Any:
        self.seen.append((request, kwargs))
        raise _SyncError(self.code)

    def with_call(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError

    def future(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError


class FakeSyncChannel(FakeChannel):
    """A blocking channel whose unary methods all fail with ``code``."""

    def unary_unary(self, *args: Any, **kwargs: Any) -> _SyncFailing:  # type: ignore[override]
        return _SyncFailing(self.code, self.seen)


@pytest.mark.parametrize("code", list(grpc.StatusCode)[1:], ids=lambda c: c.name)
def test_the_blocking_stub_raises_the_named_error_of_each_code(code: grpc.StatusCode) -> None:
    channel = FakeSyncChannel(code)
    stub = SyncStub(pb_grpc.HeadStub(channel), "tok", "10.0.0.2:6379")
    with pytest.raises(errors.RpcFailure) as info:
        stub.GetClusterInfo(pb.Empty(), timeout=2)
    err = info.value
    assert type(err) is NAMED.get(code, errors.RpcFailure)
    assert (err.code(), err.details(), err.peer) == (code, f"{code.name} here", "10.0.0.2:6379")
    ((_, kwargs),) = channel.seen
    assert kwargs["timeout"] == 2
    assert any(key == "authorization" for key, _ in kwargs["metadata"])
    for peer in errors.Peer:  # the public exception is the one the blocking error gave
        assert str(errors.to_exception(err, peer)) == str(
            errors.to_exception(_SyncError(code), peer)  # type: ignore[arg-type]
        )


class _SyncUploadFailing(_SyncFailing, grpc.StreamUnaryMultiCallable):  # type: ignore[misc]
    """A client-streaming method (one reply) that fails with ``code``."""


class FakeJobsChannel(FakeSyncChannel):
    """Client-streaming calls fail; server-streaming calls record what they were sent."""

    def stream_unary(self, *args: Any, **kwargs: Any) -> _SyncUploadFailing:
        return _SyncUploadFailing(self.code, self.seen)

    def unary_stream(self, *args: Any, **kwargs: Any) -> Any:
        def stream(request: Any, **kw: Any) -> Any:
            self.seen.append((request, kw))
            return iter(())

        return stream


def test_the_blocking_stub_translates_an_upload_and_passes_a_reply_stream_through() -> None:
    channel = FakeJobsChannel(grpc.StatusCode.RESOURCE_EXHAUSTED)
    stub = SyncStub(jpb_grpc.JobServiceStub(channel), "tok", "h:1")
    with pytest.raises(errors.RpcResourceExhausted):
        stub.UploadPackage(iter([jpb.PackageChunk()]), timeout=600)
    assert list(stub.TailJobLogs(jpb.JobLogRequest(), timeout=None)) == []
    # both went out with the token
    assert all(any(k == "authorization" for k, _ in kw["metadata"]) for _, kw in channel.seen)
    assert len(channel.seen) == 2


def test_only_the_protocol_layer_catches_grpc_errors() -> None:
    """Outside ``_runtime/protocol`` no module catches grpc's own error classes: the stubs
    translate, and callers catch what they mean (``RpcFailure``, ``RpcUnavailable``, ...)."""
    import ast
    from pathlib import Path

    import nbcluster

    root = Path(nbcluster.__file__).parent
    raw = {"RpcError", "AioRpcError"}
    found = []
    for path in sorted(root.rglob("*.py")):
        if "protocol" in path.relative_to(root).parts or "protos" in path.parts:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            caught: list[ast.expr] = []
            if isinstance(node, ast.ExceptHandler) and node.type is not None:
                caught = list(node.type.elts) if isinstance(node.type, ast.Tuple) else [node.type]
            elif isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "suppress":
                caught = list(node.args)
            for expr in caught:
                name = expr.attr if isinstance(expr, ast.Attribute) else getattr(expr, "id", "")
                if name in raw:
                    found.append(f"{path.relative_to(root)}:{node.lineno}")
    assert not found, "catch the translated errors of protocol/errors.py instead:\n" + "\n".join(
        found
    )
