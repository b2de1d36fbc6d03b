"""Errors of the cluster itself: timeouts, dead nodes, the head, scheduling, auth, warnings."""

from __future__ import annotations

from collections.abc import Mapping

from nbcluster._runtime.exceptions.base import (
    NbclusterError,
)

# --------------------------------------------------------------------------- the cluster


class GetTimeoutError(NbclusterError, TimeoutError):
    """``get(..., timeout=)`` expired before the objects were ready. Also a ``TimeoutError``.

    The tasks are not cancelled: they keep running.
    """

    def __init__(
        self,
        message: str | None = None,
        *,
        timeout: float | None = None,
        num_pending: int | None = None,
    ) -> None:
        super().__init__(*([message] if message else []))
        self.message = message
        self.timeout = timeout
        self.num_pending = num_pending

    def __str__(self) -> str:
        if self.message:
            return self.message
        after = f" after {self.timeout:g}s" if self.timeout is not None else ""
        pending = (
            f" ({self.num_pending} object{'s' if self.num_pending != 1 else ''} not ready)"
            if self.num_pending is not None
            else ""
        )
        return (
            f"get() timed out{after}{pending}. The tasks keep running: call get() again to "
            "keep waiting, use wait() to take the ready results, or cancel() the tasks."
        )


class NodeDiedError(NbclusterError):
    """A node of the cluster died (or stopped sending heartbeats)."""

    def __init__(
        self,
        message: str | None = None,
        *,
        node_id: str | None = None,
        address: str | None = None,
        reason: str | None = None,
    ) -> None:
        super().__init__(*([message] if message else []))
        self.message = message
        self.node_id = node_id
        self.address = address
        self.reason = reason

    def __str__(self) -> str:
        if self.message:
            return self.message
        parts = [self.node_id or "", f"({self.address})" if self.address else ""]
        node = " ".join(p for p in parts if p)
        who = f"The node {node}" if node else "A node"
        why = f": {self.reason}" if self.reason else ""
        return (
            f"{who} died{why}. Tasks that ran there are "
            "retried on other nodes while their retries last; check that node's logs for the "
            "cause."
        )


class LocalNodeDiedError(NbclusterError):
    """The node manager on this host died. Ray's name is ``LocalRayletDiedError``."""

    def __init__(self, message: str | None = None) -> None:
        super().__init__(*([message] if message else []))
        self.message = message

    def __str__(self) -> str:
        return self.message or (
            "The node manager on this host died. Check its log in the session directory, "
            "then start the cluster again (%cluster start or nbcluster.init())."
        )


class HeadUnavailableError(NbclusterError, ConnectionError):
    """The head could not be reached for longer than the grace period.

    Ray kills the driver here; nbcluster raises this instead, so the kernel and its state
    survive. Also a ``ConnectionError``.
    """

    def __init__(
        self,
        message: str | None = None,
        *,
        address: str | None = None,
        grace_period_s: float | None = None,
    ) -> None:
        super().__init__(*([message] if message else []))
        self.message = message
        self.address = address
        self.grace_period_s = grace_period_s

    def __str__(self) -> str:
        if self.message:
            return self.message
        at = f" at {self.address}" if self.address else ""
        grace = f" for {self.grace_period_s:g}s" if self.grace_period_s is not None else ""
        return (
            f"The cluster head{at} could not be reached{grace}. This kernel and its "
            "variables are intact. Once the head is back, call nbcluster.init(address=...) "
            "to reconnect, or start a new cluster with %cluster start. To wait longer before "
            "giving up, raise NBCLUSTER_HEAD_GRACE_PERIOD_S."
        )


class _UnschedulableError(NbclusterError):
    """Shared body of the two unschedulable errors (siblings, as in Ray)."""

    _kind = "task"

    def __init__(
        self,
        error_message: str | None = None,
        *,
        name: str | None = None,
        resources: Mapping[str, float] | None = None,
    ) -> None:
        super().__init__(*([error_message] if error_message else []))
        self.error_message = error_message
        self.name = name
        self.resources = dict(resources) if resources is not None else None

    def __str__(self) -> str:
        who = f"The {self._kind} {self.name}" if self.name else f"The {self._kind}"
        why = self.error_message or "no node in the cluster has the resources it requests"
        text = f"{who} cannot be scheduled: {why}."
        if self.resources:
            text += f" It requests {self.resources}."
        return text + (
            " Lower its requests with .options(...), or add a node that has them "
            "(%cluster scale, or start a node with those resources)."
        )


class TaskUnschedulableError(_UnschedulableError):
    """The task can never be placed: no node can satisfy what it requests."""


class ActorUnschedulableError(_UnschedulableError):
    """The actor can never be placed: no node can satisfy what it requests."""

    _kind = "actor"


class RuntimeEnvSetupError(NbclusterError):
    """Setting up a task's or actor's runtime environment failed."""

    def __init__(self, error_message: str | None = None) -> None:
        super().__init__(*([error_message] if error_message else []))
        self.error_message = error_message

    def __str__(self) -> str:
        text = "Failed to set up the runtime environment."
        if self.error_message:
            text += f"\n{self.error_message}"
        return text + "\nCheck the runtime_env you passed (packages, paths, env vars)."


class AuthenticationError(NbclusterError):
    """The cluster refused the request: its token was missing or wrong.

    The message never contains the token itself.
    """

    def __init__(
        self,
        message: str | None = None,
        *,
        address: str | None = None,
        token_missing: bool = False,
    ) -> None:
        super().__init__(*([message] if message else []))
        self.message = message
        self.address = address
        self.token_missing = token_missing

    def __str__(self) -> str:
        at = f" at {self.address}" if self.address else ""
        why = "no token was sent" if self.token_missing else "the token was not accepted"
        text = self.message or f"The cluster{at} refused the request: {why}."
        if "NBCLUSTER_TOKEN" in text:  # the caller already said what to do
            return text
        return (
            f"{text} Every cluster has its own token, which the head writes (mode 0600) to "
            "the token file in its session directory. Set NBCLUSTER_TOKEN to that token, or "
            "NBCLUSTER_TOKEN_FILE to that file's path; clusters this kernel started pass it "
            "automatically."
        )


class SerializationError(NbclusterError, TypeError):
    """A value could not be pickled to send to the cluster. Also a ``TypeError``.

    Raised synchronously by ``.remote()`` and ``put``, before anything is submitted.
    ``object_path`` names the offending part (for example ``args[0]['lock']``).
    """

    def __init__(
        self,
        message: str,
        *,
        object_path: str | None = None,
        report: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.object_path = object_path
        self.report = report

    def __str__(self) -> str:
        text = self.message
        if self.object_path:
            text += f"\nThe object that cannot be pickled: {self.object_path}"
        if self.report:
            text += f"\n{self.report.rstrip()}"
        return text


class NbclusterSystemError(NbclusterError):
    """An internal error of nbcluster, for example a killed node manager.

    Ray's name is ``RaySystemError``. Not retried when raised from task code.
    """

    def __init__(self, client_exc: object, traceback_str: str | None = None) -> None:
        super().__init__(client_exc, *([traceback_str] if traceback_str else []))
        self.client_exc = client_exc
        self.traceback_str = traceback_str

    def __str__(self) -> str:
        text = f"System error: {self.client_exc}"
        if self.traceback_str:
            text += f"\ntraceback: {self.traceback_str.rstrip()}"
        return text + (
            "\nThis is a failure inside nbcluster, not in your code. If it repeats, "
            "restart the cluster and report it with the logs from the session directory."
        )


# --------------------------------------------------------------------------- warnings


class InfeasibleResourceWarning(UserWarning):
    """A task or actor requests resources that no node currently has.

    It waits (a node may join), but will not run until one does.
    """
