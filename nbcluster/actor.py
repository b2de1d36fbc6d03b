"""Ray's ``ray.actor`` module: the actor types, ``method``, and :func:`exit_actor`.

``from nbcluster.actor import ActorHandle`` works as ``from ray.actor import ActorHandle``.
"""

from __future__ import annotations

from typing import NoReturn

from nbcluster import exceptions
from nbcluster._actor import ActorClass, ActorHandle, ActorMethod, method
from nbcluster._runtime import context
from nbcluster._runtime.worker import actor_exit
from nbcluster._runtime.worker.actor_exit import IntendedExit

__all__ = ["ActorClass", "ActorHandle", "ActorMethod", "exit_actor", "method"]


def exit_actor() -> NoReturn:
    """End the current actor from inside one of its methods (Ray's ``exit_actor``).

    Raises an exception in the calling method; the actor then ends on purpose: the caller
    of that call gets :class:`~nbcluster.exceptions.ActorDiedError` instead of a return
    value, calls that have not started fail with ``ActorDiedError``, calls already running
    (threaded and async actors) finish first, ``atexit`` handlers run, and the actor is not
    restarted (whatever its ``max_restarts``).

    Raises:
        TypeError: when called outside an actor method (in a driver or a task).
    """
    client = context.current_client()
    hook = getattr(client, "running_task", None)
    running = hook() if hook is not None else None
    if running is None or not running.actor_id:
        raise TypeError(
            "exit_actor() can only be called inside an actor method; to end an actor from "
            "outside, use nbcluster.kill(handle)"
        )
    # SystemExit would stop an async actor's event loop thread, not the actor (as in Ray).
    error: BaseException = (
        exceptions.AsyncioActorExit() if running.in_async_actor else IntendedExit()
    )
    executor = getattr(running, "_executor", None)
    if executor is not None:  # the actor ends after this call even if user code catches it
        executor.exit_request = actor_exit.request(executor, running.spec, error)
    raise error
