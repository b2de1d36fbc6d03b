"""Errors of actors: died, unavailable, too many pending calls or tasks."""

from __future__ import annotations

from typing import TYPE_CHECKING

from nbcluster._runtime.exceptions.base import (
    NbclusterError,
    _where,
)

if TYPE_CHECKING:
    from nbcluster._runtime.exceptions.task import TaskError


# --------------------------------------------------------------------------- actors


class AsyncioActorExit(NbclusterError):
    """Raised in an async actor's call by ``nbcluster.actor.exit_actor()``: the actor ends
    once its running calls finish (Ray's name). Do not catch it."""


class ActorError(NbclusterError):
    """Base class of the errors that mean an actor could not run a call.

    Ray's name is ``RayActorError``.
    """

    def __init__(self, message: str | None = None, *, actor_id: str | None = None) -> None:
        super().__init__(*([message] if message else []))
        self.message = message
        self.actor_id = actor_id

    def __str__(self) -> str:
        if self.message:
            return self.message
        who = f"The actor {self.actor_id}" if self.actor_id else "The actor"
        return f"{who} could not run this call."


class ActorDiedError(ActorError):
    """The actor is dead: its process died, it was killed, or its ``__init__`` raised.

    Every call to a dead actor raises this. ``actor_init_failed`` is True when the
    creation task (``__init__``) raised; ``cause`` then holds that :class:`TaskError`.
    ``preempted`` is True when the node was drained.
    """

    def __init__(
        self,
        actor_id: str | None = None,
        *,
        actor_init_failed: bool = False,
        reason: str | None = None,
        cause: TaskError | None = None,
        class_name: str | None = None,
        name: str | None = None,
        pid: int | None = None,
        hostname: str | None = None,
        preempted: bool = False,
        exited: bool = False,
    ) -> None:
        super().__init__(None, actor_id=actor_id)
        self.args = (actor_id,) if actor_id is not None else ()
        self.exited = exited  # it ended itself on purpose (exit_actor() or sys.exit(0))
        self.actor_init_failed = actor_init_failed
        self.reason = reason
        self.cause = cause
        self.class_name = class_name
        self.name = name
        self.pid = pid
        self.hostname = hostname
        self.preempted = preempted

    @classmethod
    def from_task_error(
        cls, task_error: TaskError, *, actor_id: str | None = None, class_name: str | None = None
    ) -> ActorDiedError:
        """The error for calls to an actor whose ``__init__`` raised ``task_error``."""
        return cls(
            actor_id,
            actor_init_failed=True,
            cause=task_error,
            class_name=class_name,
            pid=task_error.pid,
            hostname=task_error.hostname,
        )

    def _identity(self) -> str:
        parts = [
            f"class={self.class_name}" if self.class_name else "",
            f"actor_id={self.actor_id}" if self.actor_id else "",
            f"name={self.name!r}" if self.name else "",
            _where(pid=self.pid, hostname=self.hostname),
        ]
        return ", ".join(p for p in parts if p)

    def __str__(self) -> str:
        ident = self._identity()
        ident = f" ({ident})" if ident else ""
        if self.actor_init_failed:
            detail = str(self.cause) if self.cause is not None else (self.reason or "")
            return (
                f"The actor died because of an error raised in its creation task{ident}. "
                "Every call to this actor fails; fix __init__ and create a new actor.\n"
                f"{detail}"
            ).rstrip()
        if getattr(self, "exited", False):
            return (
                f"The actor ended itself before finishing this task{ident}. Reason: "
                f"{self.reason}. It is not restarted; create a new actor to go on."
            )
        text = f"The actor died unexpectedly before finishing this task{ident}."
        if self.preempted:
            text += " Its node was drained (preempted)."
        if self.reason:
            text += f" Reason: {self.reason}."
        return text + (
            " To survive process crashes, create the actor with max_restarts=N (and "
            "max_task_retries=N to retry calls that were running); check the actor's "
            "worker log for the cause."
        )


class ActorUnavailableError(ActorError):
    """The actor cannot be reached right now, for example during a network blip or restart.

    The call may or may not have run. Retry it only if running it twice is safe.
    """

    def __init__(
        self, message: str | None = None, *, actor_id: str | None = None, reason: str | None = None
    ) -> None:
        super().__init__(message, actor_id=actor_id)
        self.reason = reason

    def __str__(self) -> str:
        if self.message:
            return self.message
        who = f"The actor {self.actor_id}" if self.actor_id else "The actor"
        why = f" ({self.reason})" if self.reason else ""
        return (
            f"{who} is temporarily unavailable{why}. The call may or may not have run; "
            "retry it if running it twice is safe, or wait for the actor to come back."
        )


class PendingCallsLimitExceeded(NbclusterError):
    """An actor already has ``max_pending_calls`` calls queued; the new call was refused."""

    def __init__(
        self,
        message: str | None = None,
        *,
        actor_id: str | None = None,
        max_pending_calls: int | None = None,
    ) -> None:
        super().__init__(*([message] if message else []))
        self.message = message
        self.actor_id = actor_id
        self.max_pending_calls = max_pending_calls

    def __str__(self) -> str:
        if self.message:
            return self.message
        who = f"The actor {self.actor_id}" if self.actor_id else "The actor"
        limit = f" (max_pending_calls={self.max_pending_calls})" if self.max_pending_calls else ""
        return (
            f"{who} already has as many pending calls as it accepts{limit}. Wait for some "
            "to finish (nbcluster.get or nbcluster.wait) before submitting more, or create "
            "the actor with a larger max_pending_calls."
        )


class PendingTasksLimitExceeded(NbclusterError):
    """The driver already has as many tasks in flight as its configured cap allows."""

    def __init__(self, message: str | None = None, *, limit: int | None = None) -> None:
        super().__init__(*([message] if message else []))
        self.message = message
        self.limit = limit

    def __str__(self) -> str:
        if self.message:
            return self.message
        cap = f" ({self.limit})" if self.limit else ""
        return (
            f"Too many tasks are pending in this driver{cap}. Wait for some to finish "
            "(nbcluster.get or nbcluster.wait) before submitting more, or raise the limit."
        )
