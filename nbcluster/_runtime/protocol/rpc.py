"""The one place that creates gRPC servers and channels.

Every server checks the cluster token on every call (``authorization: Bearer <hex>``
metadata) in constant time; every channel sends it. No other module may call
``grpc.aio.server`` or ``grpc.aio.insecure_channel`` directly (a test enforces it).

A call without the token is refused with ``UNAUTHENTICATED``; a call with a wrong
token with ``PERMISSION_DENIED``. Refused calls never reach the servicer, so they
have no side effects.
"""

from __future__ import annotations

import contextlib
import hmac
import ipaddress
from collections.abc import Awaitable, Callable, Iterator, Sequence
from typing import Any

import grpc
import grpc.aio

from nbcluster._runtime.protocol import errors, faults, tls
from nbcluster._runtime.protocol.protos import nbcluster_pb2 as pb
from nbcluster._runtime.protocol.protos import nbcluster_pb2_grpc as pb_grpc
from nbcluster._runtime.protocol.streams import TranslatingCall, TranslatingReplies

__all__ = [
    "Channels",
    "pb",
    "pb_grpc",
    "Activity",
    "AuthedStub",
    "LazyStub",
    "SyncStub",
    "TokenAuthInterceptor",
    "auth_metadata",
    "authed_call",
    "bind",
    "is_loopback",
    "make_channel",
    "make_server",
    "make_sync_channel",
    "track_activity",
]

_AUTH_KEY = "authorization"
_PREFIX = "Bearer "


def _message_options(max_message_bytes: int) -> list[tuple[str, Any]]:
    return [
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.max_receive_message_length", max_message_bytes),
    ]


class Activity:
    """The gRPC calls of this process in flight, client side and server side (streams count
    while open). A worker tracks them to close its gRPC runtime while idle
    (``core/dormancy.py``). Loop thread only: calls are made, and handlers run, there."""

    __slots__ = ("inflight", "on_idle")

    def __init__(self, on_idle: Callable[[], None]) -> None:
        self.inflight = 0
        self.on_idle = on_idle  # called each time the count falls to zero

    def begin(self) -> None:
        self.inflight += 1

    def end(self, _call: Any = None) -> None:
        self.inflight -= 1
        if not self.inflight:
            self.on_idle()


_activity: Activity | None = None


def track_activity(activity: Activity | None) -> None:
    """Count every call made through :class:`AuthedStub` and every call served by a server
    of :func:`make_server` in ``activity`` from now on (None: stop counting)."""
    global _activity
    _activity = activity


class TokenAuthInterceptor(grpc.aio.ServerInterceptor):
    """Refuse every call whose ``authorization`` metadata is not ``Bearer <token>``."""

    def __init__(self, token: str) -> None:
        self._expected = (_PREFIX + token).encode()

    def check(self, metadata: Sequence[Any] | None) -> grpc.StatusCode | None:
        """Return the status to refuse with, or None when the call carries the token."""
        presented = None
        for item in metadata or ():
            if item.key == _AUTH_KEY:
                presented = item.value
                break
        if presented is None:
            return grpc.StatusCode.UNAUTHENTICATED
        if isinstance(presented, str):
            presented = presented.encode()
        if not hmac.compare_digest(presented, self._expected):
            return grpc.StatusCode.PERMISSION_DENIED
        return None

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        code = self.check(handler_call_details.invocation_metadata)
        if handler is None:
            return handler
        if code is None:
            return _validating_handler(handler)
        return _refusing_handler(handler, code)


class _Malformed:
    """What a request that cannot be decoded turns into (instead of an opaque UNKNOWN)."""


_MALFORMED = _Malformed()
_BAD_REQUEST = (
    "malformed request: the message could not be decoded (is the client the same version?)"
)


def _validating_handler(handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
    """Answer undecodable requests with INVALID_ARGUMENT, without internal details."""
    des = handler.request_deserializer
    if des is None:
        return handler

    def safe_des(data: bytes) -> Any:
        try:
            return des(data)
        except Exception:  # noqa: BLE001 - any decode failure is the client's fault
            return _MALFORMED

    ser = handler.response_serializer
    if handler.request_streaming:
        inner_stream = handler.stream_stream or handler.stream_unary

        async def checked_iter(it: Any, context: grpc.aio.ServicerContext) -> Any:
            async for item in it:
                if item is _MALFORMED:
                    await context.abort(grpc.StatusCode.INVALID_ARGUMENT, _BAD_REQUEST)
                yield item

        if handler.response_streaming:

            async def stream_stream(it: Any, context: grpc.aio.ServicerContext) -> Any:
                with _serving():
                    async for reply in inner_stream(checked_iter(it, context), context):
                        yield reply

            return grpc.stream_stream_rpc_method_handler(stream_stream, safe_des, ser)

        async def stream_unary(it: Any, context: grpc.aio.ServicerContext) -> Any:
            with _serving():
                return await inner_stream(checked_iter(it, context), context)

        return grpc.stream_unary_rpc_method_handler(stream_unary, safe_des, ser)
    if handler.response_streaming:
        inner_us = handler.unary_stream

        async def unary_stream(request: Any, context: grpc.aio.ServicerContext) -> Any:
            if request is _MALFORMED:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, _BAD_REQUEST)
            with _serving():
                async for reply in inner_us(request, context):
                    yield reply

        return grpc.unary_stream_rpc_method_handler(unary_stream, safe_des, ser)
    inner = handler.unary_unary

    async def unary_unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
        if request is _MALFORMED:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, _BAD_REQUEST)
        activity = _activity
        if activity is None:
            return await inner(request, context)
        activity.begin()
        try:
            return await inner(request, context)
        finally:
            activity.end()

    return grpc.unary_unary_rpc_method_handler(unary_unary, safe_des, ser)


@contextlib.contextmanager
def _serving() -> Iterator[None]:
    """Count a served streaming call in the tracked :class:`Activity` while it runs."""
    activity = _activity
    if activity is None:
        yield
        return
    activity.begin()
    try:
        yield
    finally:
        activity.end()


def _refusing_handler(
    handler: grpc.RpcMethodHandler, code: grpc.StatusCode
) -> grpc.RpcMethodHandler:
    detail = (
        "missing cluster token: pass it as 'authorization: Bearer <token>' metadata"
        if code == grpc.StatusCode.UNAUTHENTICATED
        else "wrong cluster token"
    )

    async def refuse(request: Any, context: grpc.aio.ServicerContext) -> None:
        await context.abort(code, detail)

    async def refuse_stream(request: Any, context: grpc.aio.ServicerContext):  # noqa: ANN202
        await context.abort(code, detail)
        yield  # pragma: no cover - makes this an async generator

    des = handler.request_deserializer
    ser = handler.response_serializer
    if handler.request_streaming and handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(refuse_stream, des, ser)
    if handler.request_streaming:
        return grpc.stream_unary_rpc_method_handler(refuse, des, ser)
    if handler.response_streaming:
        return grpc.unary_stream_rpc_method_handler(refuse_stream, des, ser)
    return grpc.unary_unary_rpc_method_handler(refuse, des, ser)


def is_loopback(host: str) -> bool:
    """True for 127.0.0.0/8, ::1 and 'localhost'."""
    if host in ("localhost", ""):
        return host == "localhost"
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def make_server(
    token: str, *, max_message_bytes: int = 512 * 2**20, reuse_port: bool = False
) -> grpc.aio.Server:
    """A grpc.aio server that enforces the cluster token on every method (``reuse_port``:
    its listeners set ``SO_REUSEPORT``, so a worker's placeholder can share its port while
    the server starts or stops; ``core/dormancy.py``)."""
    if not token:
        raise ValueError("a cluster token is required to start a server")
    interceptors: list[grpc.aio.ServerInterceptor] = [TokenAuthInterceptor(token)]
    injector = faults.current()  # testing only: never without NBCLUSTER_TESTING=1
    if injector is not None:
        interceptors.append(injector)
    return grpc.aio.server(
        interceptors=interceptors,
        options=[
            *_message_options(max_message_bytes),
            ("grpc.so_reuseport", int(reuse_port)),
        ],
    )


def bind(server: grpc.aio.Server, host: str = "127.0.0.1", port: int = 0) -> int:
    """Bind ``server`` to ``host:port`` (port 0 lets the OS choose); return the port."""
    secure = tls.current()  # TLS when configured (protocol/tls.py); never plain once required
    target = f"{_fmt_host(host)}:{port}"
    if secure is not None:
        bound = server.add_secure_port(target, tls.server_credentials(secure))
    else:
        bound = server.add_insecure_port(target)
    if bound == 0:
        raise OSError(f"could not listen on {host}:{port} (address in use or not available)")
    return bound


def _fmt_host(host: str) -> str:
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


def make_channel(
    address: str, token: str, *, max_message_bytes: int = 512 * 2**20
) -> grpc.aio.Channel:
    """A grpc.aio channel to ``address``; use :func:`auth_metadata` on every call."""
    options = [
        *_message_options(max_message_bytes),
        ("grpc.enable_http_proxy", 0),
        # Reconnect quickly after a peer restarts (the default backoff grows to 2 minutes).
        ("grpc.initial_reconnect_backoff_ms", 100),
        ("grpc.min_reconnect_backoff_ms", 100),
        ("grpc.max_reconnect_backoff_ms", 2000),
    ]
    secure = tls.current()
    if secure is not None:
        return grpc.aio.secure_channel(
            address, tls.channel_credentials(secure), [*options, *tls.channel_options(secure)]
        )
    return grpc.aio.insecure_channel(address, options=options)


def make_sync_channel(
    address: str, token: str, *, max_message_bytes: int = 64 * 2**20
) -> grpc.Channel:
    """A blocking channel for one-shot reads from tools (status, the server extension)."""
    options = [
        *_message_options(max_message_bytes),
        ("grpc.enable_http_proxy", 0),
        ("grpc.initial_reconnect_backoff_ms", 100),
        ("grpc.min_reconnect_backoff_ms", 100),
        ("grpc.max_reconnect_backoff_ms", 1000),
    ]
    secure = tls.current()
    if secure is not None:
        return grpc.secure_channel(
            address, tls.channel_credentials(secure), [*options, *tls.channel_options(secure)]
        )
    return grpc.insecure_channel(address, options=options)


def auth_metadata(token: str) -> tuple[tuple[str, str], ...]:
    """The metadata every call carries."""
    return ((_AUTH_KEY, _PREFIX + token),)


class AuthedStub:
    """A generated stub whose calls all carry the token metadata.

    ``AuthedStub(pb_grpc.HeadStub(channel), token).GetNodes(req, timeout=5)``. A failed
    call raises the :class:`errors.RpcFailure` of its status code (carrying ``peer``): a
    unary call when awaited, a streaming call (:class:`streams.TranslatingCall`) when it
    is read, written, iterated or awaited.
    Attribute lookups are cached so the per-call cost is one dict hit.
    """

    def __init__(self, stub: Any, token: str, peer: str = "") -> None:
        self._stub = stub
        self._md = auth_metadata(token)
        self._peer = peer

    def __getattr__(self, name: str) -> Callable[..., Any]:
        call = _authed(getattr(self._stub, name), self._md, self._peer)
        self.__dict__[name] = call
        return call


def authed_call(method: Any, token: str, peer: str = "") -> Callable[..., Any]:
    """One method of an asyncio channel without a generated stub (``channel.unary_unary(
    path, ...)``) as :class:`AuthedStub` gives it: carrying the token, failing with the
    :class:`errors.RpcFailure` of the status code."""
    return _authed(method, auth_metadata(token), peer)


def _authed(method: Any, md: tuple[tuple[str, str], ...], peer: str) -> Callable[..., Any]:
    def call(request: Any = None, **kwargs: Any) -> Any:
        extra = kwargs.pop("metadata", None)
        meta = md + tuple(extra) if extra else md
        if request is None:
            made = method(metadata=meta, **kwargs)
        else:
            made = method(request, metadata=meta, **kwargs)
        activity = _activity
        if activity is not None:
            activity.begin()
            made.add_done_callback(activity.end)
        return made

    if isinstance(method, grpc.aio.UnaryUnaryMultiCallable):
        return _translating(call, peer)
    if isinstance(
        method,
        (
            grpc.aio.UnaryStreamMultiCallable,
            grpc.aio.StreamStreamMultiCallable,
            grpc.aio.StreamUnaryMultiCallable,
        ),
    ):

        def stream(request: Any = None, **kwargs: Any) -> TranslatingCall:
            return TranslatingCall(call(request, **kwargs), peer)

        return stream
    return call


def _translating(call: Callable[..., Any], peer: str) -> Callable[..., Any]:
    """``call`` (an asyncio unary call) raising :class:`errors.RpcFailure` subclasses."""

    async def translated_call(request: Any = None, **kwargs: Any) -> Any:
        try:
            return await call(request, **kwargs)
        except grpc.aio.AioRpcError as err:
            raise errors.translated(err, peer).with_traceback(err.__traceback__) from None

    return translated_call


class SyncStub:
    """A generated stub on a blocking channel (:func:`make_sync_channel`) whose calls carry
    the token. A call with one reply (unary or client-streaming) raises a failure as the
    :class:`errors.RpcFailure` of its code, as :class:`AuthedStub`'s asyncio calls do; a
    call that streams its replies (iterate it, cancel it) raises it while it is read.

    ``SyncStub(pb_grpc.HeadStub(make_sync_channel(address, token)), token, address)``.
    """

    def __init__(self, stub: Any, token: str, peer: str = "") -> None:
        self._stub = stub
        self._md = auth_metadata(token)
        self._peer = peer

    def __getattr__(self, name: str) -> Callable[..., Any]:
        method = getattr(self._stub, name)
        md, peer = self._md, self._peer
        if not isinstance(method, (grpc.UnaryUnaryMultiCallable, grpc.StreamUnaryMultiCallable)):

            def stream(request: Any, **kwargs: Any) -> TranslatingReplies:
                return TranslatingReplies(method(request, metadata=md, **kwargs), peer)

            self.__dict__[name] = stream
            return stream

        def call(request: Any, **kwargs: Any) -> Any:
            try:
                return method(request, metadata=md, **kwargs)
            except grpc.RpcError as err:
                if not isinstance(err, grpc.Call):
                    raise
                raise errors.translated(err, peer).with_traceback(err.__traceback__) from None

        self.__dict__[name] = call
        return call


class _RecordingChannel:
    """Stands in for a channel while a generated stub's constructor runs: records each
    method's kind, path and arguments instead of registering it."""

    def __getattr__(self, kind: str) -> Callable[..., tuple[str, str, dict[str, Any]]]:
        return lambda path, **kwargs: (kind, path, kwargs)


_METHOD_SPECS: dict[type, dict[str, tuple[str, str, dict[str, Any]]]] = {}


class LazyStub:
    """A generated stub whose methods are registered on the channel on first use.

    ``LazyStub(pb_grpc.HeadStub, channel)`` answers the stub's methods like
    ``HeadStub(channel)``, but a generated constructor registers every method of the
    service on the channel (28 for the head), which is most of a new worker's start-up
    CPU after its imports; a process uses a few of them.
    """

    def __init__(self, stub_class: type, channel: Any) -> None:
        specs = _METHOD_SPECS.get(stub_class)
        if specs is None:
            recorded = stub_class.__new__(stub_class)
            stub_class.__init__(recorded, _RecordingChannel())
            specs = _METHOD_SPECS[stub_class] = dict(vars(recorded))
        self._specs = specs
        self._channel = channel

    def __getattr__(self, name: str) -> Any:
        try:
            kind, path, kwargs = self._specs[name]
        except KeyError:
            raise AttributeError(name) from None
        method = getattr(self._channel, kind)(path, **kwargs)
        self.__dict__[name] = method
        return method


_STREAMING = frozenset({"PushTasks", "ReadObject"})


class RetryingStub:
    """Unary calls that retry UNAVAILABLE for ``budget_s`` seconds (same request each time).

    Every retried method is idempotent on the server (leases are keyed by request id,
    objects and bundles by id), so a lost reply followed by a retry has one effect.
    """

    def __init__(self, stub: AuthedStub, budget_s: float) -> None:
        self._stub = stub
        self._budget = budget_s

    def __getattr__(self, name: str) -> Callable[..., Any]:
        method = getattr(self._stub, name)
        if name in _STREAMING:
            self.__dict__[name] = method
            return method
        budget = self._budget

        async def call(*args: Any, **kwargs: Any) -> Any:
            import asyncio
            import time

            deadline = time.monotonic() + budget
            delay = 0.02
            while True:
                try:
                    return await method(*args, **kwargs)
                except grpc.aio.AioRpcError as err:
                    if err.code() != grpc.StatusCode.UNAVAILABLE or time.monotonic() > deadline:
                        raise
                await asyncio.sleep(delay)
                delay = min(delay * 2, 0.5)

        self.__dict__[name] = call
        return call


class Channels:
    """One channel (and stubs) per peer address, created on first use on the loop."""

    def __init__(self, token: str, max_message_bytes: int) -> None:
        self.token = token
        self.max_message_bytes = max_message_bytes
        self._channels: dict[str, Any] = {}
        self._stubs: dict[tuple[str, str], AuthedStub] = {}
        self.retry_budget_s = 3.0

    def __len__(self) -> int:
        """How many channels are open."""
        return len(self._channels)

    def channel(self, address: str) -> Any:
        """The shared channel to ``address`` (for stubs of other services)."""
        channel = self._channels.get(address)
        if channel is None:
            channel = make_channel(address, self.token, max_message_bytes=self.max_message_bytes)
            self._channels[address] = channel
        return channel

    def stub(self, address: str, kind: str) -> AuthedStub:
        key = (address, kind)
        stub = self._stubs.get(key)
        if stub is None:
            channel = self.channel(address)
            raw = LazyStub(
                {
                    "head": pb_grpc.HeadStub,
                    "node": pb_grpc.NodeManagerStub,
                    "core": pb_grpc.CoreWorkerStub,
                }[kind],
                channel,
            )
            stub = AuthedStub(raw, self.token, address)
            if kind != "head":  # head calls have their own, longer, grace period
                stub = RetryingStub(stub, self.retry_budget_s)  # type: ignore[assignment]
            self._stubs[key] = stub
        return stub

    def detach(self) -> list[Any]:
        """Forget every channel and stub (the next call opens a new channel) and return the
        old channels for the caller to close."""
        old = list(self._channels.values())
        self._channels.clear()
        self._stubs.clear()
        return old

    async def close(self) -> None:
        for ch in self._channels.values():
            with contextlib.suppress(Exception):
                await ch.close(grace=0.1)
        self._channels.clear()
        self._stubs.clear()
