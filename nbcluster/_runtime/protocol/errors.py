"""Translate gRPC transport errors into ``nbcluster.exceptions`` — here and nowhere else.

Callers wrap RPCs in ``async with translate(Peer.HEAD, "GetNodes"):`` (or call
:func:`to_exception`) and never catch ``grpc.aio.AioRpcError`` themselves.
"""

from __future__ import annotations

import contextlib
import enum
from collections.abc import AsyncIterator

import grpc
import grpc.aio

from nbcluster._runtime import exceptions as exc

__all__ = ["Peer", "translate", "to_exception", "is_unavailable", "RpcError"]

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
