"""Small helpers for Serve's own actors, used from an event loop: await a ref, find or kill
an actor by name, and the text of an actor's failure."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import nbcluster
from nbcluster.exceptions import ActorDiedError, TaskError
from nbcluster.serve._client import SERVE_NAMESPACE

__all__ = ["await_ref", "error_text", "find_actor", "kill", "replica_actor_name"]


def replica_actor_name(app: str, deployment: str, replica_id: str) -> str:
    """The actor name of a replica (Ray's ``SERVE_REPLICA::`` prefix)."""
    return f"SERVE_REPLICA::{app}#{deployment}#{replica_id}"


async def await_ref(ref: Any, timeout: float | None = None) -> Any:
    """The value of an actor call's ref, awaited on the running loop (the core wakes the
    loop when the answer arrives: no thread per ref)."""
    if timeout is None:
        return await ref
    return await asyncio.wait_for(_value(ref), timeout)


async def _value(ref: Any) -> Any:
    return await ref


def find_actor(name: str) -> Any:
    """The named actor in Serve's namespace, or None (blocking: call in a thread)."""
    try:
        return nbcluster.get_actor(name, namespace=SERVE_NAMESPACE)
    except ValueError:
        return None


async def kill(handle: Any) -> None:
    """End an actor now (no restart); nothing happens if it is already gone."""
    if handle is None:
        return
    with contextlib.suppress(Exception):
        await asyncio.to_thread(nbcluster.kill, handle)


def error_text(err: BaseException) -> str:
    """What a failed call says: the constructor's traceback for a failed start."""
    cause = getattr(err, "cause", None)
    if isinstance(err, ActorDiedError) and cause is not None:
        return str(cause)
    if isinstance(err, TaskError):
        return str(err)
    return f"{type(err).__name__}: {err}"
