"""Helpers of the actor submitter's unit tests: a submitter on a bare host, no processes."""

from __future__ import annotations

import asyncio
import threading
from types import SimpleNamespace
from typing import Any

from nbcluster._runtime.core.actor_submitter import ActorSubmitter


def bare_actor_submitter(loop: asyncio.AbstractEventLoop, **host: Any) -> ActorSubmitter:
    """An ``ActorSubmitter`` whose host has only a lock, the config it reads, ``loop`` and
    what ``host`` adds (``head=...``, say)."""
    client = SimpleNamespace(
        submitter=SimpleNamespace(lock=threading.RLock()),
        config=SimpleNamespace(actor_thread_reads=True),
        loop=loop,
        **host,
    )
    return ActorSubmitter(client)  # type: ignore[arg-type]
