"""Streaming calls whose errors come out translated, as a unary call's do.

:class:`rpc.AuthedStub` returns an asyncio streaming call (server-streaming, client-streaming
or bidirectional) wrapped in :class:`TranslatingCall`, and :class:`rpc.SyncStub` a blocking
reply stream wrapped in :class:`TranslatingReplies`: reading, writing, iterating or awaiting
them raises the :class:`errors.RpcFailure` of the status code (``RpcUnavailable``,
``RpcNotFound``, ...), never grpc's own error. Everything else (``cancel()``, ``code()``,
``done()``, ``add_done_callback()``, ...) is the call's own.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Generator
from typing import Any

import grpc
import grpc.aio

from nbcluster._runtime.protocol import errors

__all__ = ["TranslatingCall", "TranslatingReplies"]


class TranslatingCall:
    """An asyncio streaming call (``grpc.aio.UnaryStreamCall``, ``StreamStreamCall`` or
    ``StreamUnaryCall``) whose failures raise :class:`errors.RpcFailure` subclasses.

    ``async for reply in call``, ``await call.read()``, ``await call.write(m)``,
    ``await call.done_writing()``, ``await call.wait_for_connection()`` and ``await call``
    (a client-streaming call's one reply) translate; other attributes are the call's.
    """

    __slots__ = ("_call", "_peer")

    def __init__(self, call: Any, peer: str = "") -> None:
        self._call = call
        self._peer = peer

    def __getattr__(self, name: str) -> Any:
        return getattr(self._call, name)

    def _failure(self, err: grpc.aio.AioRpcError) -> errors.RpcFailure:
        return errors.translated(err, self._peer).with_traceback(err.__traceback__)

    async def read(self) -> Any:
        """The next reply, or ``grpc.aio.EOF`` at the end of the stream."""
        try:
            return await self._call.read()
        except grpc.aio.AioRpcError as err:
            raise self._failure(err) from None

    async def write(self, request: Any) -> None:
        """Send one request on the stream."""
        try:
            await self._call.write(request)
        except grpc.aio.AioRpcError as err:
            raise self._failure(err) from None

    async def done_writing(self) -> None:
        """Half-close: no more requests."""
        try:
            await self._call.done_writing()
        except grpc.aio.AioRpcError as err:
            raise self._failure(err) from None

    async def wait_for_connection(self) -> None:
        """Wait until the call is established (raises when it failed to be)."""
        try:
            await self._call.wait_for_connection()
        except grpc.aio.AioRpcError as err:
            raise self._failure(err) from None

    def __aiter__(self) -> AsyncIterator[Any]:
        return self._replies()

    async def _replies(self) -> AsyncIterator[Any]:
        try:
            async for reply in self._call:
                yield reply
        except grpc.aio.AioRpcError as err:
            raise self._failure(err) from None

    def __await__(self) -> Generator[Any, None, Any]:
        return self._reply().__await__()

    async def _reply(self) -> Any:
        try:
            return await self._call
        except grpc.aio.AioRpcError as err:
            raise self._failure(err) from None


class TranslatingReplies:
    """A blocking channel's reply stream (iterate it, ``cancel()`` it) whose failure
    raises the :class:`errors.RpcFailure` of its code while it is read."""

    __slots__ = ("_call", "_peer")

    def __init__(self, call: Any, peer: str = "") -> None:
        self._call = call
        self._peer = peer

    def __getattr__(self, name: str) -> Any:
        return getattr(self._call, name)

    def __iter__(self) -> TranslatingReplies:
        return self

    def __next__(self) -> Any:
        try:
            return next(self._call)
        except grpc.RpcError as err:
            if not isinstance(err, (grpc.Call, grpc.aio.AioRpcError)):
                raise
            raise errors.translated(err, self._peer).with_traceback(err.__traceback__) from None
