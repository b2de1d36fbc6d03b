"""protocol/errors.py: the one place gRPC status codes become nbcluster exceptions."""

from __future__ import annotations

import asyncio

import grpc
import grpc.aio
import pytest

from nbcluster import exceptions as exc
from nbcluster._runtime.protocol.errors import Peer, is_unavailable, to_exception, translate

TOKEN = "5e" * 32


def rpc_error(code: grpc.StatusCode, details: str = "") -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(
        code,
        initial_metadata=grpc.aio.Metadata(),
        trailing_metadata=grpc.aio.Metadata(),
        details=details,
    )


# --------------------------------------------------------------------------- authentication


def test_unauthenticated_is_authentication_error() -> None:
    err = to_exception(
        rpc_error(grpc.StatusCode.UNAUTHENTICATED, "missing cluster token"), Peer.HEAD, "GetNodes"
    )
    assert type(err) is exc.AuthenticationError
    assert str(err) == (
        "the head (GetNodes) refused the call: no cluster token was sent. "
        "Set NBCLUSTER_TOKEN or point NBCLUSTER_TOKEN_FILE at the cluster's token file."
    )


def test_permission_denied_is_authentication_error() -> None:
    err = to_exception(
        rpc_error(grpc.StatusCode.PERMISSION_DENIED, "wrong cluster token"), Peer.NODE
    )
    assert type(err) is exc.AuthenticationError
    assert str(err).startswith(
        "the node manager refused the call: the cluster token is wrong. "
        "Use the token file of the cluster you connect to"
    )


@pytest.mark.parametrize(
    "code", [grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED]
)
@pytest.mark.parametrize("peer", list(Peer))
def test_authentication_messages_never_contain_a_token(code: grpc.StatusCode, peer: Peer) -> None:
    # Even when the server's details echo what was presented, the message leaves it out.
    err = to_exception(rpc_error(code, f"got 'Bearer {TOKEN}'"), peer, "Call")
    assert isinstance(err, exc.AuthenticationError)
    text = str(err) + repr(err) + repr(err.args)
    assert TOKEN not in text
    assert "Bearer" not in text


# --------------------------------------------------------------------------- unavailable


@pytest.mark.parametrize(
    "code",
    [
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.CANCELLED,
        grpc.StatusCode.UNKNOWN,
        grpc.StatusCode.INTERNAL,
    ],
)
def test_unreachable_head_is_head_unavailable(code: grpc.StatusCode) -> None:
    err = to_exception(rpc_error(code, "connection refused"), Peer.HEAD)
    assert type(err) is exc.HeadUnavailableError
    assert isinstance(err, ConnectionError)
    assert str(err) == (
        "the cluster head cannot be reached (connection refused). "
        "Check that the cluster is running (`nbcluster status`)."
    )
    assert is_unavailable(rpc_error(code))


def test_unreachable_head_without_details_names_the_code() -> None:
    err = to_exception(rpc_error(grpc.StatusCode.UNAVAILABLE), Peer.HEAD)
    assert "cannot be reached (UNAVAILABLE)" in str(err)


def test_unreachable_worker_is_worker_crashed() -> None:
    err = to_exception(rpc_error(grpc.StatusCode.UNAVAILABLE, "Socket closed"), Peer.WORKER)
    assert type(err) is exc.WorkerCrashedError
    assert str(err) == "the worker died or cannot be reached (Socket closed)"


def test_unreachable_node_is_local_node_died() -> None:
    err = to_exception(rpc_error(grpc.StatusCode.UNAVAILABLE, "eof"), Peer.NODE)
    assert type(err) is exc.LocalNodeDiedError
    assert "the node manager cannot be reached (eof)" in str(err)


def test_unreachable_owner_is_system_error() -> None:
    err = to_exception(rpc_error(grpc.StatusCode.UNAVAILABLE, "eof"), Peer.OWNER)
    assert type(err) is exc.NbclusterSystemError
    assert str(err).startswith("System error: the owner process cannot be reached (eof)")


def test_is_unavailable_is_false_for_refusals_and_other_errors() -> None:
    assert not is_unavailable(rpc_error(grpc.StatusCode.PERMISSION_DENIED))
    assert not is_unavailable(rpc_error(grpc.StatusCode.RESOURCE_EXHAUSTED))
    assert not is_unavailable(ConnectionError("not a grpc error"))


# --------------------------------------------------------------------------- other codes


def test_object_store_full_details_become_object_store_full_error() -> None:
    err = to_exception(
        rpc_error(grpc.StatusCode.RESOURCE_EXHAUSTED, "ObjectStoreFull:  cannot fit 1.0 GiB "),
        Peer.NODE,
        "Put",
    )
    assert type(err) is exc.ObjectStoreFullError
    assert err.message == "cannot fit 1.0 GiB"
    assert str(err).startswith("cannot fit 1.0 GiB\nTip: delete ObjectRefs you no longer need")


def test_out_of_disk_details_become_out_of_disk_error() -> None:
    err = to_exception(
        rpc_error(grpc.StatusCode.RESOURCE_EXHAUSTED, "OutOfDisk: the spill directory /s is full"),
        Peer.NODE,
        "CreateObject",
    )
    assert type(err) is exc.OutOfDiskError
    assert str(err).startswith("the spill directory /s is full Free disk space")


def test_other_resource_exhausted_is_message_too_large() -> None:
    err = to_exception(
        rpc_error(grpc.StatusCode.RESOURCE_EXHAUSTED, "Received message larger than max"),
        Peer.WORKER,
        "PushTasks",
    )
    assert type(err) is exc.NbclusterSystemError
    assert str(err).startswith(
        "System error: message too large for the worker (PushTasks): "
        "Received message larger than max"
    )


def test_invalid_argument_is_value_error() -> None:
    err = to_exception(rpc_error(grpc.StatusCode.INVALID_ARGUMENT, "bad id"), Peer.HEAD, "KvGet")
    assert type(err) is ValueError
    assert str(err) == "the head (KvGet) rejected the request: bad id"


def test_unmapped_code_is_system_error_naming_code_and_peer() -> None:
    err = to_exception(rpc_error(grpc.StatusCode.NOT_FOUND, "no such actor"), Peer.OWNER, "Get")
    assert type(err) is exc.NbclusterSystemError
    assert str(err).startswith("System error: owner (Get) failed: NOT_FOUND: no such actor")


# --------------------------------------------------------------------------- translate


def test_translate_reraises_as_public_exception_without_grpc_context() -> None:
    async def call() -> None:
        async with translate(Peer.HEAD, "GetNodes"):
            raise rpc_error(grpc.StatusCode.UNAVAILABLE, "down")

    match = r"^the cluster head cannot be reached \(down\)"
    with pytest.raises(exc.HeadUnavailableError, match=match) as info:
        asyncio.run(call())
    assert info.value.__cause__ is None
    assert info.value.__suppress_context__ is True


def test_translate_lets_other_exceptions_through() -> None:
    async def call() -> None:
        async with translate(Peer.HEAD):
            raise KeyError("not grpc")

    with pytest.raises(KeyError, match="not grpc"):
        asyncio.run(call())


# --------------------------------------------------------------------------- names taken or unknown


def test_already_exists_is_a_value_error_with_the_peers_text() -> None:
    err = to_exception(
        rpc_error(grpc.StatusCode.ALREADY_EXISTS, "actor name 'a' is taken in namespace ''"),
        Peer.HEAD,
        "RegisterActor",
    )
    assert type(err) is ValueError
    assert str(err) == "actor name 'a' is taken in namespace ''"


def test_not_found_is_the_callers_value_error_when_it_gives_one() -> None:
    missing = rpc_error(grpc.StatusCode.NOT_FOUND, "no such actor")
    err = to_exception(missing, Peer.HEAD, "GetNamedActor", not_found="Failed to look up actor")
    assert type(err) is ValueError and str(err) == "Failed to look up actor"
    plain = to_exception(missing, Peer.HEAD, "GetNamedActor")
    assert type(plain) is exc.NbclusterSystemError
