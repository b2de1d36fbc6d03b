"""The hello that opens a raw-socket connection: task channels and control channels.

Both protocols (``core/channel.py``: ``b"NBCT"``, ``protocol/ctrl.py``: ``b"NBCC"``) open
with the same greeting, each with its own magic and version::

    client  4-byte magic, u8 version, u8 token-length, token, then the protocol's own tail
    server  u8 status                        OK (0), or REFUSED (1): a wrong token or hello

The token is compared in constant time (``hmac.compare_digest``) before anything else is
read; an unauthenticated peer can make a server buffer at most the head and the longest
token (``HEAD_SIZE + MAX_TOKEN`` bytes) plus the protocol's tail, and a silent one is
dropped after ``HELLO_TIMEOUT_S``. :class:`Hello` builds the client's greeting and checks
a received one, from an ``asyncio`` stream (:meth:`Hello.read`) or from a buffer an
``asyncio.Protocol`` fills (:meth:`Hello.take`).
"""

from __future__ import annotations

import asyncio
import hmac
from dataclasses import dataclass

__all__ = [
    "HEAD_SIZE",
    "HELLO_TIMEOUT_S",
    "MAX_TOKEN",
    "OK",
    "REFUSED",
    "Hello",
    "token_fits",
    "token_matches",
]

#: The server's one-byte answers to a hello.
OK, REFUSED = 0, 1
#: The longest token a hello carries (its length travels in one byte).
MAX_TOKEN = 255
#: Magic, version and token length: the bytes read before the token.
HEAD_SIZE = 6
#: How long a server waits for a complete hello before it drops the connection.
HELLO_TIMEOUT_S = 10.0


def token_fits(token: str) -> bool:
    """Whether ``token`` fits a hello (else callers stay on gRPC)."""
    return len(token.encode()) <= MAX_TOKEN


def token_matches(got: bytes, expected: bytes) -> bool:
    """Whether the token a peer sent is the cluster's, compared in constant time."""
    return hmac.compare_digest(got, expected)


@dataclass(frozen=True)
class Hello:
    """One protocol's hello: its 4-byte ``magic`` and its ``version``."""

    magic: bytes
    version: int

    def __post_init__(self) -> None:
        if len(self.magic) != 4 or not 0 <= self.version <= 255:
            raise ValueError("a hello's magic is 4 bytes and its version one byte")

    def encode(self, token: str, tail: bytes = b"") -> bytes:
        """The client's hello carrying ``token``, then ``tail`` (the protocol's own fields).

        Raises ``ValueError`` when the token is longer than :data:`MAX_TOKEN` bytes."""
        tok = token.encode()
        if len(tok) > MAX_TOKEN:
            raise ValueError(
                f"the cluster token is {len(tok)} bytes; a raw-socket hello carries at most "
                f"{MAX_TOKEN} (use a shorter token)"
            )
        return self.magic + bytes([self.version, len(tok)]) + tok + tail

    def token_length(self, head: bytes | bytearray) -> int | None:
        """The token length ``head`` (the first :data:`HEAD_SIZE` bytes) announces; None
        when its magic or version is not this protocol's or the length is over the limit."""
        if head[:4] != self.magic or head[4] != self.version or head[5] > MAX_TOKEN:
            return None
        return head[5]

    def take(self, buf: bytearray, token: bytes) -> bool | None:
        """Check a hello at the start of ``buf`` (bytes as they arrived) against ``token``:
        None while it is incomplete; else whether it is good, with its bytes removed from
        ``buf`` once the token has arrived (what follows is the protocol's)."""
        if len(buf) < HEAD_SIZE:
            return None
        n = self.token_length(buf)
        if n is None:
            return False
        end = HEAD_SIZE + n
        if len(buf) < end:
            return None
        ok = token_matches(bytes(buf[HEAD_SIZE:end]), token)
        del buf[:end]
        return ok

    async def read(self, reader: asyncio.StreamReader, token: bytes) -> bool:
        """Read a hello's head and token off ``reader``; whether it is good (the tail, if
        any, is left to read). Raises what ``readexactly`` raises on a short stream."""
        n = self.token_length(await reader.readexactly(HEAD_SIZE))
        if n is None:
            return False
        got = await reader.readexactly(n) if n else b""
        return token_matches(got, token)
