"""The token check every server runs, and the loopback test used when binding."""

from __future__ import annotations

import hmac
from collections import namedtuple
from typing import Any

import grpc
import pytest

from nbcluster._runtime.protocol import rpc
from nbcluster._runtime.protocol.rpc import TokenAuthInterceptor, auth_metadata, is_loopback

# grpc.aio hands the interceptor Metadatum objects with ``.key`` and ``.value``.
Metadatum = namedtuple("Metadatum", ["key", "value"])

TOKEN = "a3" * 32


def md(*pairs: tuple[str, Any]) -> tuple[Metadatum, ...]:
    return tuple(Metadatum(k, v) for k, v in pairs)


@pytest.fixture
def interceptor() -> TokenAuthInterceptor:
    return TokenAuthInterceptor(TOKEN)


# --------------------------------------------------------------------------- check


@pytest.mark.parametrize("metadata", [None, (), md(("user-agent", "grpc-python"))])
def test_missing_token_is_unauthenticated(interceptor: TokenAuthInterceptor, metadata: Any) -> None:
    assert interceptor.check(metadata) is grpc.StatusCode.UNAUTHENTICATED


@pytest.mark.parametrize(
    "value",
    [
        "Bearer " + "b4" * 32,  # another cluster's token
        "Bearer " + TOKEN[:-1],  # one character short
        "Bearer " + TOKEN + "0",  # one character long
        TOKEN,  # no "Bearer " prefix
        "bearer " + TOKEN,  # prefix is case-sensitive
        "Bearer ",
        "",
        b"Bearer " + b"b4" * 32,
    ],
)
def test_wrong_token_is_permission_denied(interceptor: TokenAuthInterceptor, value: Any) -> None:
    assert interceptor.check(md(("authorization", value))) is grpc.StatusCode.PERMISSION_DENIED


@pytest.mark.parametrize("value", ["Bearer " + TOKEN, ("Bearer " + TOKEN).encode()])
def test_right_token_passes_as_str_or_bytes(
    interceptor: TokenAuthInterceptor, value: str | bytes
) -> None:
    assert interceptor.check(md(("authorization", value))) is None


def test_token_found_among_other_metadata(interceptor: TokenAuthInterceptor) -> None:
    metadata = md(("user-agent", "x"), ("authorization", "Bearer " + TOKEN), ("x-trace", "1"))
    assert interceptor.check(metadata) is None


def test_first_authorization_entry_decides(interceptor: TokenAuthInterceptor) -> None:
    wrong_first = md(("authorization", "Bearer nope"), ("authorization", "Bearer " + TOKEN))
    assert interceptor.check(wrong_first) is grpc.StatusCode.PERMISSION_DENIED


def test_metadata_key_is_matched_exactly(interceptor: TokenAuthInterceptor) -> None:
    # grpc lower-cases keys on the wire; anything else is not the authorization header.
    assert interceptor.check(md(("Authorization", "Bearer " + TOKEN))) is (
        grpc.StatusCode.UNAUTHENTICATED
    )


def test_client_metadata_is_accepted_by_the_server_check(
    interceptor: TokenAuthInterceptor,
) -> None:
    assert auth_metadata(TOKEN) == (("authorization", "Bearer " + TOKEN),)
    assert interceptor.check(md(*auth_metadata(TOKEN))) is None
    assert interceptor.check(md(*auth_metadata("other"))) is grpc.StatusCode.PERMISSION_DENIED


def test_check_compares_with_hmac_compare_digest(
    interceptor: TokenAuthInterceptor, monkeypatch: pytest.MonkeyPatch
) -> None:
    # rpc.py does ``import hmac`` and calls ``hmac.compare_digest`` at call time.
    assert rpc.hmac is hmac
    calls: list[tuple[bytes, bytes]] = []
    real = hmac.compare_digest

    def spy(a: bytes, b: bytes) -> bool:
        calls.append((a, b))
        return real(a, b)

    monkeypatch.setattr(rpc.hmac, "compare_digest", spy)
    assert interceptor.check(md(("authorization", "Bearer wrong"))) is (
        grpc.StatusCode.PERMISSION_DENIED
    )
    assert interceptor.check(md(("authorization", "Bearer " + TOKEN))) is None
    expected = ("Bearer " + TOKEN).encode()
    assert calls == [(b"Bearer wrong", expected), (expected, expected)]

    # The decision is the comparison's: if it says no, the right token is refused.
    monkeypatch.setattr(rpc.hmac, "compare_digest", lambda a, b: False)
    assert interceptor.check(md(("authorization", "Bearer " + TOKEN))) is (
        grpc.StatusCode.PERMISSION_DENIED
    )


def test_missing_token_never_reaches_the_comparison(
    interceptor: TokenAuthInterceptor, monkeypatch: pytest.MonkeyPatch
) -> None:
    def boom(a: bytes, b: bytes) -> bool:
        raise AssertionError("compare_digest called without a presented token")

    monkeypatch.setattr(rpc.hmac, "compare_digest", boom)
    assert interceptor.check(None) is grpc.StatusCode.UNAUTHENTICATED


# --------------------------------------------------------------------------- is_loopback


@pytest.mark.parametrize(
    "host", ["127.0.0.1", "127.1.2.3", "127.255.255.254", "::1", "[::1]", "localhost"]
)
def test_is_loopback_true(host: str) -> None:
    assert is_loopback(host) is True


@pytest.mark.parametrize(
    "host",
    ["0.0.0.0", "::", "[::]", "10.0.0.1", "192.168.1.1", "128.0.0.1", "example.com", "", "local"],
)
def test_is_loopback_false(host: str) -> None:
    assert is_loopback(host) is False
