"""Calls to the head that retry while it is unreachable, up to the grace period."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from nbcluster._runtime.protocol.errors import RpcError

if TYPE_CHECKING:
    from nbcluster._runtime.core.client import CoreClient

__all__ = ["HeadRetry"]


class HeadRetry:
    """Calls to the head that retry while it is unreachable, up to the grace period.

    A head restart (or a short network cut) is then invisible to callers; after
    ``head_grace_period_s`` the last error surfaces (as ``HeadUnavailableError`` once
    translated).
    """

    def __init__(self, client: CoreClient) -> None:
        self._client = client

    def __getattr__(self, name: str) -> Callable[..., Any]:
        client = self._client

        async def call(*args: Any, **kwargs: Any) -> Any:
            deadline = time.monotonic() + client.config.head_grace_period_s
            delay = 0.05
            while True:
                method = getattr(client.channels.stub(client.head_address, "head"), name)
                try:
                    return await method(*args, **kwargs)
                except RpcError as err:
                    if (
                        err.code().name != "UNAVAILABLE"
                        or client.closed
                        or time.monotonic() > deadline
                    ):
                        raise
                await asyncio.sleep(delay)
                delay = min(delay * 2, 1.0)

        self.__dict__[name] = call
        return call
