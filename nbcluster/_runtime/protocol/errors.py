"""Translate gRPC transport errors into ``nbcluster.exceptions`` — here and nowhere else.

The stubs (``rpc.AuthedStub``, ``rpc.SyncStub``) raise a failed call as the
:class:`RpcFailure` of its code (:class:`RpcUnavailable`, :class:`RpcNotFound`, ...,
carrying the peer's address): a unary call when it returns, a stream while it is read,
written or iterated (``protocol/streams.py``). Callers catch those named errors, never
``grpc.aio.AioRpcError`` or ``grpc.RpcError``, and turn one into the public exception a
user sees with :func:`to_exception` (or ``async with translate(Peer.HEAD, "GetNodes"):``).
"""

from __future__ import annotations

import contextlib
import enum
from collections.abc import AsyncIterator
from typing import ClassVar

import grpc
import grpc.aio

from nbcluster._runtime import exceptions as exc

__all__ = [
    "Peer",
    "RpcAborted",
    "RpcAlreadyExists",
    "RpcCancelled",
    "RpcDeadlineExceeded",
    "RpcError",
    "RpcFailedPrecondition",
    "RpcFailure",
    "RpcInvalidArgument",
    "RpcNotFound",
    "RpcPermissionDenied",
    "RpcResourceExhausted",
    "RpcUnauthenticated",
    "RpcUnavailable",
    "is_unavailable",
    "to_exception",
    "translate",
    "translated",
]

RpcError = grpc.aio.AioRpcError


class Peer(enum.Enum):
    """Which kind of process the failed call was talking to."""

    HEAD = "head"
    NODE = "node manager"
    WORKER = "worker"
    OWNER = "owner"


_UNAVAILABLE = {
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.CANCELLED,
    grpc.StatusCode.DEADLINE_EXCEEDED,
    grpc.StatusCode.UNKNOWN,
    grpc.StatusCode.INTERNAL,
}


def is_unavailable(err: BaseException) -> bool:
    """True when ``err`` means the peer could not be reached (rather than refused the call)."""
    return isinstance(err, RpcError) and err.code() in _UNAVAILABLE


def to_exception(
    err: RpcError, peer: Peer, what: str = "", *, not_found: str | None = None
) -> Exception:
    """Map one gRPC error from ``peer`` to the public exception a user should see.

    ``ALREADY_EXISTS`` (a name taken) is a ``ValueError`` with the peer's text; ``NOT_FOUND``
    is a ``ValueError(not_found)`` when the caller gives that text (a lookup by name).
    """
    code = err.code()
    details = err.details() or ""
    where = f"{peer.value} ({what})" if what else peer.value
    if code == grpc.StatusCode.ALREADY_EXISTS:
        return ValueError(details)
    if code == grpc.StatusCode.NOT_FOUND and not_found is not None:
        return ValueError(not_found)
    if code == grpc.StatusCode.UNAUTHENTICATED:
        return exc.AuthenticationError(
            f"the {where} refused the call: no cluster token was sent. "
            "Set NBCLUSTER_TOKEN or point NBCLUSTER_TOKEN_FILE at the cluster's token file."
        )
    if code == grpc.StatusCode.PERMISSION_DENIED:
        return exc.AuthenticationError(
            f"the {where} refused the call: the cluster token is wrong. "
            "Use the token file of the cluster you connect to (see `nbcluster status`)."
        )
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
        if details.startswith("ObjectStoreFull:"):
            return exc.ObjectStoreFullError(details.split(":", 1)[1].strip())
        if details.startswith("OutOfDisk:"):
            return exc.OutOfDiskError(details.split(":", 1)[1].strip())
        return exc.NbclusterSystemError(f"message too large for the {where}: {details}")
    if code == grpc.StatusCode.INVALID_ARGUMENT:
        return ValueError(f"the {where} rejected the request: {details}")
    if code in _UNAVAILABLE:
        if peer is Peer.HEAD:
            return exc.HeadUnavailableError(
                f"the cluster head cannot be reached ({details or code.name}). "
                "Check that the cluster is running (`nbcluster status`)."
            )
        if peer is Peer.NODE:
            return exc.LocalNodeDiedError(
                f"the node manager cannot be reached ({details or code.name})"
            )
        if peer is Peer.WORKER:
            return exc.WorkerCrashedError(
                f"the worker died or cannot be reached ({details or code.name})"
            )
        return exc.NbclusterSystemError(
            f"the owner process cannot be reached ({details or code.name})"
        )
    return exc.NbclusterSystemError(f"{where} failed: {code.name}: {details}")


@contextlib.asynccontextmanager
async def translate(peer: Peer, what: str = "") -> AsyncIterator[None]:
    """Re-raise any gRPC error inside the block as the matching public exception."""
    try:
        yield
    except RpcError as err:
        raise to_exception(err, peer, what) from None


class RpcFailure(grpc.aio.AioRpcError):
    """A failed call, raised by the protocol layer's stubs (``rpc.AuthedStub``) in place of
    grpc's own error: one class per status code (:class:`RpcUnavailable`,
    :class:`RpcNotFound`, ...), carrying the code, the details and the peer's address.

    It is still a ``grpc.aio.AioRpcError`` (``code()``, ``details()``), so a site that
    checks the code keeps doing so while it moves to catching the named class.
    """

    #: The status code of every instance of this class (None: decided per instance).
    CODE: ClassVar[grpc.StatusCode | None] = None

    def __init__(
        self,
        code: grpc.StatusCode,
        details: str | None = None,
        peer: str = "",
        *,
        initial_metadata: grpc.aio.Metadata | None = None,
        trailing_metadata: grpc.aio.Metadata | None = None,
        debug_error_string: str | None = None,
    ) -> None:
        super().__init__(
            code,
            initial_metadata if initial_metadata is not None else grpc.aio.Metadata(),
            trailing_metadata if trailing_metadata is not None else grpc.aio.Metadata(),
            details,
            debug_error_string,
        )
        #: The address the call went to ("" when the stub was not told).
        self.peer = peer


class RpcUnavailable(RpcFailure):
    """UNAVAILABLE: the peer could not be reached."""

    CODE = grpc.StatusCode.UNAVAILABLE


class RpcNotFound(RpcFailure):
    """NOT_FOUND: the peer does not know what the call names."""

    CODE = grpc.StatusCode.NOT_FOUND


class RpcAlreadyExists(RpcFailure):
    """ALREADY_EXISTS: a name or id is taken."""

    CODE = grpc.StatusCode.ALREADY_EXISTS


class RpcInvalidArgument(RpcFailure):
    """INVALID_ARGUMENT: the peer rejected the request."""

    CODE = grpc.StatusCode.INVALID_ARGUMENT


class RpcFailedPrecondition(RpcFailure):
    """FAILED_PRECONDITION: the peer is not in a state to do it."""

    CODE = grpc.StatusCode.FAILED_PRECONDITION


class RpcDeadlineExceeded(RpcFailure):
    """DEADLINE_EXCEEDED: no answer within the call's timeout."""

    CODE = grpc.StatusCode.DEADLINE_EXCEEDED


class RpcCancelled(RpcFailure):
    """CANCELLED: the call was cancelled (by either side)."""

    CODE = grpc.StatusCode.CANCELLED


class RpcUnauthenticated(RpcFailure):
    """UNAUTHENTICATED: no cluster token was sent."""

    CODE = grpc.StatusCode.UNAUTHENTICATED


class RpcPermissionDenied(RpcFailure):
    """PERMISSION_DENIED: the cluster token is wrong."""

    CODE = grpc.StatusCode.PERMISSION_DENIED


class RpcResourceExhausted(RpcFailure):
    """RESOURCE_EXHAUSTED: a message too large, or a full store or disk."""

    CODE = grpc.StatusCode.RESOURCE_EXHAUSTED


class RpcAborted(RpcFailure):
    """ABORTED: the peer gave up on the call."""

    CODE = grpc.StatusCode.ABORTED


_BY_CODE: dict[grpc.StatusCode, type[RpcFailure]] = {
    cls.CODE: cls
    for cls in (
        RpcUnavailable,
        RpcNotFound,
        RpcAlreadyExists,
        RpcInvalidArgument,
        RpcFailedPrecondition,
        RpcDeadlineExceeded,
        RpcCancelled,
        RpcUnauthenticated,
        RpcPermissionDenied,
        RpcResourceExhausted,
        RpcAborted,
    )
    if cls.CODE is not None
}


def translated(err: grpc.aio.AioRpcError | grpc.Call, peer: str = "") -> RpcFailure:
    """``err`` (an asyncio call's error, or a blocking call's) as the :class:`RpcFailure`
    of its code (itself when it is one already); codes without a class of their own
    (UNKNOWN, INTERNAL, ...) are a plain ``RpcFailure``."""
    if isinstance(err, RpcFailure):
        return err
    code = err.code()
    if not isinstance(err, grpc.aio.AioRpcError):
        # A blocking call keeps the code and details only: a blocking stream cancelled by
        # its reader never gets a debug string (nor, before its first reply, metadata),
        # and asking a blocking stream for them waits forever.
        return _BY_CODE.get(code, RpcFailure)(code, err.details(), peer)
    return _BY_CODE.get(code, RpcFailure)(
        code,
        err.details(),
        peer,
        initial_metadata=err.initial_metadata(),
        trailing_metadata=err.trailing_metadata(),
        debug_error_string=err.debug_error_string(),
    )
