"""The public error tree.

The names mirror Ray's ``ray.exceptions`` (2.60) one for one, so that code which catches
Ray's errors reads the same here: ``RayTaskError`` is :class:`TaskError`, ``RayActorError``
is :class:`ActorError`, ``RaySystemError`` is :class:`NbclusterSystemError`, and
``LocalRayletDiedError`` is :class:`LocalNodeDiedError`. Two types are new:
:class:`HeadUnavailableError` (Ray kills the process instead) and :class:`SerializationError`
(Ray raises a plain ``TypeError``).

Every message says what happened, where, and what to do next. Every exception survives a
(cloud)pickle round trip with its attributes: :meth:`NbclusterError.__reduce__` rebuilds the
object without calling ``__init__``, so constructor signatures are free to differ from
``args``.
"""

from __future__ import annotations

import contextlib
import functools
import os
import socket
import traceback
import types
from collections.abc import Mapping
from typing import Any

import cloudpickle

__all__ = [
    "ActorDiedError",
    "ActorError",
    "ActorUnavailableError",
    "ActorUnschedulableError",
    "AsyncioActorExit",
    "AuthenticationError",
    "GetTimeoutError",
    "HeadUnavailableError",
    "InfeasibleResourceWarning",
    "LocalNodeDiedError",
    "NbclusterError",
    "NbclusterSystemError",
    "NodeDiedError",
    "ObjectFetchTimedOutError",
    "ObjectFreedError",
    "ObjectLostError",
    "ObjectReconstructionFailedError",
    "ObjectReconstructionFailedLineageEvictedError",
    "ObjectReconstructionFailedMaxAttemptsExceededError",
    "ObjectStoreFullError",
    "OutOfDiskError",
    "OutOfMemoryError",
    "OwnerDiedError",
    "PendingCallsLimitExceeded",
    "PendingTasksLimitExceeded",
    "ReferenceCountingAssertionError",
    "RuntimeEnvSetupError",
    "SerializationError",
    "TaskCancelledError",
    "TaskError",
    "TaskUnschedulableError",
    "UnserializableException",
    "WorkerCrashedError",
]

#: Remote tracebacks longer than this many bytes (UTF-8) are cut in the middle.
MAX_TRACEBACK_BYTES = 64 * 1024

_RUNTIME_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_runtime") + os.sep
_REPR_LIMIT = 200


# --------------------------------------------------------------------------- helpers


def _rebuild_error(cls: type[BaseException], args: tuple[Any, ...], state: dict[str, Any]) -> Any:
    """Unpickle an nbcluster error without running its ``__init__``."""
    obj = cls.__new__(cls)
    obj.args = args
    obj.__dict__.update(state)
    return obj


def _short_repr(obj: object, limit: int = _REPR_LIMIT) -> str:
    try:
        text = repr(obj)
    except Exception:  # a user __repr__ may raise anything; a repr must not
        text = f"<{type(obj).__qualname__} object (repr failed)>"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _fmt_bytes(n: float) -> str:
    for unit in ("bytes", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{int(n)} bytes" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def _where(
    *,
    pid: int | None = None,
    hostname: str | None = None,
    node_id: str | None = None,
    task_id: str | None = None,
) -> str:
    """Format ``pid=…, host=…, node=…, task=…`` for the parts that are known."""
    parts = []
    if pid is not None:
        parts.append(f"pid={pid}")
    if hostname:
        parts.append(f"host={hostname}")
    if node_id:
        parts.append(f"node={node_id}")
    if task_id:
        parts.append(f"task={task_id}")
    return ", ".join(parts)


def _truncate_traceback(text: str, limit: int = MAX_TRACEBACK_BYTES) -> str:
    """Cut ``text`` to at most ``limit`` UTF-8 bytes, keeping its head and its tail.

    The middle is replaced by a ``... N bytes truncated ...`` line. Cuts fall on line
    boundaries when one is near, and never inside a multi-byte character.
    """
    data = text.encode("utf-8", errors="replace")
    if len(data) <= limit:
        return text
    # The marker's length is bounded by the one for len(data) (the most digits possible).
    budget = limit - len(_truncation_marker(len(data)).encode())
    head_bytes = budget // 2
    tail_bytes = budget - head_bytes
    head = data[:head_bytes].decode("utf-8", errors="ignore")
    tail = data[len(data) - tail_bytes :].decode("utf-8", errors="ignore")
    near = 2048
    cut = head.rfind("\n")
    if cut >= 0 and len(head) - cut <= near:
        head = head[:cut]
    cut = tail.find("\n")
    if 0 <= cut <= near:
        tail = tail[cut + 1 :]
    omitted = len(data) - len(head.encode()) - len(tail.encode())
    return head + _truncation_marker(omitted) + tail


def _truncation_marker(omitted: int) -> str:
    return f"\n... {omitted} bytes truncated ...\n"


def _format_remote_traceback(exc: BaseException) -> str:
    """Format ``exc`` with its chain, dropping the worker's own leading frames."""
    try:
        te = traceback.TracebackException.from_exception(exc)
        stack = te.stack
        first_user = next(
            (i for i, fr in enumerate(stack) if not fr.filename.startswith(_RUNTIME_DIR)), None
        )
        if first_user:  # keep everything when every frame is internal (an nbcluster bug)
            te.stack = traceback.StackSummary.from_list(stack[first_user:])
        return "".join(te.format())
    except Exception:  # formatting runs user __str__ and must never fail the worker
        name = type(exc).__qualname__
        return f"{name}: {_short_repr(exc)}\n(the traceback could not be formatted)"


def _round_trips(obj: object) -> bool:
    """Whether ``obj`` survives cloudpickle ``dumps`` and ``loads`` in this process."""
    try:
        cloudpickle.loads(cloudpickle.dumps(obj))
    except Exception:  # any failure (PicklingError, TypeError, RecursionError, ...) means no
        return False
    return True


# --------------------------------------------------------------------------- base


class NbclusterError(Exception):
    """Base class of every error that nbcluster raises.

    Catch this to handle any nbcluster failure. A task's own exception arrives as a
    :class:`TaskError`, which is also an instance of the original exception type.
    """

    def __reduce__(self) -> tuple[Any, ...]:
        # Rebuild without __init__, so subclasses with keyword-only or computed
        # constructor arguments round-trip with every attribute.
        return (_rebuild_error, (type(self), self.args, dict(self.__dict__)))


# --------------------------------------------------------------------------- tasks


class TaskError(NbclusterError):
    """A task's user code raised an exception.

    The error is stored as the task's result and raised by ``get``, and by any task that
    takes that result as an argument. ``get`` raises :meth:`as_instanceof_cause`, so the
    error is an instance of both ``TaskError`` and the original exception's class::

        try:
            nbcluster.get(ref)
        except ValueError as e:   # also a TaskError
            print(e.cause, e.pid, e.hostname)

    Attributes:
        function_name: qualified name of the function or actor method that raised.
        traceback_str: the remote traceback (at most 64 KiB, cut in the middle).
        cause: the original exception, or :class:`UnserializableException` if it could not
            be pickled.
        pid, hostname, node_id, task_id: where it ran, when known.
    """

    def __init__(
        self,
        function_name: str,
        traceback_str: str,
        cause: BaseException | None,
        *,
        pid: int | None = None,
        hostname: str | None = None,
        node_id: str | None = None,
        task_id: str | None = None,
    ) -> None:
        super().__init__(function_name, traceback_str, cause)
        self.function_name = function_name
        self.traceback_str = traceback_str
        self.cause = cause
        self.pid = pid
        self.hostname = hostname
        self.node_id = node_id
        self.task_id = task_id

    @classmethod
    def from_exception(
        cls,
        exc: BaseException,
        function_name: str,
        *,
        pid: int | None = None,
        hostname: str | None = None,
        node_id: str | None = None,
        task_id: str | None = None,
    ) -> TaskError:
        """Wrap ``exc``, raised by user code in this process (the worker), for the caller.

        The traceback is formatted here (the worker's own leading frames dropped) and cut
        to at most 64 KiB. ``exc`` is kept as ``cause`` if it survives a cloudpickle round
        trip; otherwise ``cause`` is an :class:`UnserializableException` holding the
        traceback text, so the result always pickles and never nests another error layer.
        ``pid`` and ``hostname`` default to this process.
        """
        tb = _truncate_traceback(_format_remote_traceback(exc))
        cause: BaseException
        if _round_trips(exc):
            cause = exc
        else:
            cause = UnserializableException(
                tb,
                exception_type=type(exc).__qualname__,
                reason="it could not be pickled with cloudpickle",
            )
        return cls(
            str(function_name),
            tb,
            cause,
            pid=os.getpid() if pid is None else pid,
            hostname=socket.gethostname() if hostname is None else hostname,
            node_id=node_id,
            task_id=task_id,
        )

    def _user_cause(self) -> BaseException | None:
        """The innermost cause that is not itself a TaskError (nested ``get`` in a task)."""
        cause = self.cause
        for _ in range(100):
            if not isinstance(cause, TaskError):
                break
            cause = cause.cause
        return cause

    def as_instanceof_cause(self) -> TaskError:
        """Return an equivalent error that is also an instance of the cause's class.

        The result's class is ``TaskError(<CauseClass>)``, a subclass of both, created once
        per cause class. It carries the cause's ``args`` and attributes. When that is not
        possible (no cause, a ``BaseException`` that is not an ``Exception``, an nbcluster
        error, or a class that cannot be subclassed or instantiated without its
        ``__init__``), ``self`` is returned unchanged.
        """
        cause = self._user_cause()
        if cause is None:
            return self
        cause_cls = type(cause)
        if not issubclass(cause_cls, Exception) or (
            issubclass(cause_cls, NbclusterError) and not issubclass(cause_cls, TaskCancelledError)
        ):  # a cancelled running call is both, as Ray's RayTaskError(TaskCancelledError)
            return self
        if isinstance(self, cause_cls):
            return self
        try:
            dual = _dual_class(cause_cls)
        except TypeError:  # a metaclass that makes the class unhashable
            return self
        if dual is None:
            return self
        try:
            return _instantiate_dual(dual, cause, self.__dict__)
        except Exception:  # user __new__ or property setters; plain TaskError still works
            return self

    def _plain(self) -> TaskError:
        plain = TaskError.__new__(TaskError)
        plain.__dict__.update(self.__dict__)
        plain.args = (self.function_name, self.traceback_str, self.cause)
        return plain

    def __reduce__(self) -> tuple[Any, ...]:
        if getattr(type(self), "_nbcluster_dual_of", None) is not None:
            # The dual class is rebuilt on the receiving side from the cause's class.
            return (_rebuild_dual, (self._plain(),))
        return super().__reduce__()

    def __str__(self) -> str:
        where = _where(
            pid=self.pid, hostname=self.hostname, node_id=self.node_id, task_id=self.task_id
        )
        head = f"{self.function_name} raised an exception" + (f" ({where})" if where else "")
        body = self.traceback_str.rstrip("\n") if self.traceback_str else _short_repr(self.cause)
        text = f"{head}:\n{body}"
        if isinstance(self.cause, UnserializableException):
            text += (
                f"\n(The {self.cause.exception_type or 'exception'} object could not be sent "
                "back because it cannot be pickled; define the exception class at module "
                "level and pass every __init__ argument to super().__init__() to get the "
                "object itself.)"
            )
        return text

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(function_name={self.function_name!r}, "
            f"cause={_short_repr(self.cause)})"
        )

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, str]:
        """Jupyter display: the function, where it ran, and the remote traceback."""
        from nbcluster.jupyter.display import task_error_mimebundle

        return task_error_mimebundle(self)

    def _repr_html_(self) -> str:
        """HTML display: the function, where it ran, and the remote traceback (escaped)."""
        from nbcluster.jupyter.display import task_error_html

        return task_error_html(self)


# Descriptors of attributes kept in C or __slots__ storage, copied to the dual instance.
_SLOT_TYPES = (types.MemberDescriptorType, types.GetSetDescriptorType)


def _dual_getattr(self: TaskError, name: str) -> Any:
    """Fall back to the cause for attributes the dual instance does not have."""
    cause = self.__dict__.get("cause")
    if cause is None or name.startswith("__"):
        raise AttributeError(name)
    return getattr(cause, name)


@functools.lru_cache(maxsize=256)
def _dual_class(cause_cls: type[Exception]) -> type[TaskError] | None:
    """The class ``TaskError(<cause_cls>)``, or None if ``cause_cls`` cannot be subclassed."""
    name = f"TaskError({cause_cls.__name__})"

    def body(ns: dict[str, Any]) -> None:
        ns["__module__"] = __name__
        ns["__qualname__"] = name
        ns["__doc__"] = f"A TaskError whose cause is a {cause_cls.__qualname__}."
        ns["_nbcluster_dual_of"] = cause_cls
        ns["__getattr__"] = _dual_getattr

    try:
        return types.new_class(name, (TaskError, cause_cls), exec_body=body)
    except Exception:  # final classes, layout or metaclass conflicts, user __init_subclass__
        return None


def _instantiate_dual(
    dual: type[TaskError], cause: BaseException, state: Mapping[str, Any]
) -> TaskError:
    """Create a ``dual`` instance without running any user ``__init__``."""
    try:
        obj = dual.__new__(dual, *cause.args)
    except Exception:  # a user __new__ with another signature
        obj = dual.__new__(dual)
    # Attributes kept in C or __slots__ storage (OSError.errno, SyntaxError.lineno, ...).
    for klass in type(cause).__mro__:
        if klass in (BaseException, object):
            continue
        for attr, descr in vars(klass).items():
            if attr.startswith("__") or not isinstance(descr, _SLOT_TYPES):
                continue
            # An unset slot (OSError.characters_written) or a read-only one is skipped.
            with contextlib.suppress(AttributeError, TypeError, ValueError):
                setattr(obj, attr, getattr(cause, attr))
    obj.args = tuple(cause.args)
    obj.__dict__.update(getattr(cause, "__dict__", {}))
    obj.__dict__.update(state)
    return obj


def _rebuild_dual(plain: TaskError) -> TaskError:
    """Unpickle a ``TaskError(<Cause>)``: recreate the dual class in this process."""
    return plain.as_instanceof_cause()


class UnserializableException(NbclusterError):
    """Stands in for a task's exception that could not be pickled.

    The original traceback is kept as text in ``original_stack_trace``. It is the
    ``cause`` of the :class:`TaskError`, never wrapped again.
    """

    def __init__(
        self,
        original_stack_trace: str,
        *,
        exception_type: str | None = None,
        reason: str | None = None,
    ) -> None:
        super().__init__(original_stack_trace)
        self.original_stack_trace = original_stack_trace
        self.exception_type = exception_type
        self.reason = reason

    def __str__(self) -> str:
        what = self.exception_type or "an exception"
        why = f" ({self.reason})" if self.reason else ""
        return (
            f"The task raised {what}, which could not be sent back to the caller{why}. "
            "To get the exception object itself, make its class picklable: define it at "
            "module level and pass every __init__ argument to super().__init__(). "
            f"The original traceback:\n{self.original_stack_trace.rstrip()}"
        )


class WorkerCrashedError(NbclusterError):
    """The worker process died while running a task, and the task's retries are used up.

    Raised for ``os._exit``, a signal, a segfault, or the OS killing the process. The task
    is retried up to ``max_retries`` times (default 3) before this is raised.
    """

    def __init__(
        self,
        message: str | None = None,
        *,
        task_id: str | None = None,
        pid: int | None = None,
        hostname: str | None = None,
        node_id: str | None = None,
        exit_detail: str | None = None,
    ) -> None:
        super().__init__(*([message] if message else []))
        self.message = message
        self.task_id = task_id
        self.pid = pid
        self.hostname = hostname
        self.node_id = node_id
        self.exit_detail = exit_detail

    def __str__(self) -> str:
        if self.message:
            return self.message
        where = _where(
            pid=self.pid, hostname=self.hostname, node_id=self.node_id, task_id=self.task_id
        )
        text = "The worker process died unexpectedly while running this task"
        text += f" ({where})." if where else "."
        if self.exit_detail:
            text += f" Exit detail: {self.exit_detail}."
        return text + (
            " Its retries (max_retries) are used up. Check the worker's log for the cause "
            "(os._exit, a signal, a segfault or the OOM killer); if the crash is transient, "
            "raise max_retries in @remote(...) or .options()."
        )


class TaskCancelledError(NbclusterError):
    """The task, or a task it depends on, was cancelled with ``nbcluster.cancel``.

    Cancelled tasks are never retried.
    """

    def __init__(self, task_id: str | None = None) -> None:
        super().__init__(*([task_id] if task_id is not None else []))
        self.task_id = task_id

    def __str__(self) -> str:
        if self.task_id is None:
            what = "This task or one of its dependencies"
        else:
            what = f"Task {self.task_id}"
        return f"{what} was cancelled. Cancelled tasks are not retried; submit it again to rerun."


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


# --------------------------------------------------------------------------- objects


class ObjectLostError(NbclusterError):
    """No copy of an object can be reached, so ``get`` cannot return it.

    Subclasses say why. Attributes: ``object_ref_hex`` (the object's id), ``reason`` (what
    the runtime observed, free text), and ``owner_address`` and ``call_site`` (where the ref
    was created), when known. Unlike Ray, the second positional argument is ``reason``.
    """

    def __init__(
        self,
        object_ref_hex: str,
        reason: str | None = None,
        *,
        owner_address: str | None = None,
        call_site: str | None = None,
    ) -> None:
        super().__init__(object_ref_hex, *([reason] if reason else []))
        self.object_ref_hex = object_ref_hex
        self.reason = reason
        self.owner_address = owner_address
        self.call_site = call_site

    def _base_str(self) -> str:
        text = f"Failed to retrieve object {self.object_ref_hex}"
        text += f": {self.reason.rstrip('.')}." if self.reason else "."
        if self.call_site:
            text += f" The ObjectRef was created at:\n  {self.call_site.strip()}"
        return text

    def _detail(self) -> str:
        return (
            f"All copies of {self.object_ref_hex} were lost, usually because the node that "
            "held them died. Objects made by tasks with retries left are rebuilt "
            "automatically; for others, get() important results while their node is alive, "
            "or create them again."
        )

    def __str__(self) -> str:
        return f"{self._base_str()}\n\n{self._detail()}"


class OwnerDiedError(ObjectLostError):
    """The process that owns the object (it called ``.remote()`` or ``put``) has died.

    nbcluster never recovers from owner failure.
    """

    def _detail(self) -> str:
        owner = f" ({self.owner_address})" if self.owner_address else ""
        return (
            f"The object's owner{owner} has exited. The owner is the process that created "
            "the ObjectRef with .remote() or put(), and nbcluster cannot recover an object "
            "whose owner died. Keep the owner (a driver or actor) alive while others use the "
            "object, or pass the value instead of the ref. Check the owner's log for why it "
            "exited."
        )


class ObjectReconstructionFailedError(ObjectLostError):
    """The object was lost and cannot be rebuilt by re-running the task that made it."""

    def _detail(self) -> str:
        return (
            "The object was lost and cannot be rebuilt, because it was created by put() or "
            "by an actor, or its ObjectRef came from another process. Keep such objects "
            "where they stay alive (get() the value on the driver), or create them again."
        )


class ObjectReconstructionFailedMaxAttemptsExceededError(ObjectReconstructionFailedError):
    """The object cannot be rebuilt because its task has used all its retries."""

    def _detail(self) -> str:
        return (
            "The object was lost and cannot be rebuilt, because the task that creates it "
            "has used all its retries. Set @remote(max_retries=N) (default 3) to allow more."
        )


class ObjectReconstructionFailedLineageEvictedError(ObjectReconstructionFailedError):
    """The object cannot be rebuilt because its lineage was evicted to save memory."""

    def _detail(self) -> str:
        return (
            "The object was lost and cannot be rebuilt, because its lineage (the record of "
            "the task that made it) was evicted to reduce the owner's memory use. Keep fewer "
            "refs alive at once, or get() important results while their node is alive."
        )


class ObjectFetchTimedOutError(ObjectLostError):
    """Fetching the object from another node timed out: no reachable node has a copy."""

    def _detail(self) -> str:
        return (
            f"Fetching object {self.object_ref_hex} timed out because no reachable node has "
            "a copy. This usually points to a network partition or an nbcluster bug; check "
            "the node logs and `nbcluster status`."
        )


class ObjectFreedError(ObjectLostError):
    """The object was freed explicitly and can no longer be read."""

    def _detail(self) -> str:
        return (
            "The object was freed explicitly, so it can no longer be read. Free objects only "
            "after every user of their refs is done with them."
        )


class ReferenceCountingAssertionError(ObjectLostError, AssertionError):
    """The object was deleted while a reference to it still existed (a bug in nbcluster)."""

    def _detail(self) -> str:
        return (
            "The object was already deleted by reference counting while a reference to it "
            "existed. This should not happen; please report it as an nbcluster bug."
        )


class ObjectStoreFullError(NbclusterError):
    """The node's object store cannot fit an object, even after evicting and spilling."""

    def __init__(
        self,
        message: str | None = None,
        *,
        requested_bytes: int | None = None,
        capacity_bytes: int | None = None,
        used_bytes: int | None = None,
        node_id: str | None = None,
        spilling_enabled: bool | None = None,
    ) -> None:
        super().__init__(*([message] if message else []))
        self.message = message
        self.requested_bytes = requested_bytes
        self.capacity_bytes = capacity_bytes
        self.used_bytes = used_bytes
        self.node_id = node_id
        self.spilling_enabled = spilling_enabled

    def __str__(self) -> str:
        node = f" on node {self.node_id}" if self.node_id else ""
        text = self.message or f"The object store{node} is full"
        if not self.message:
            if self.used_bytes is not None and self.capacity_bytes is not None:
                text += (
                    f" ({_fmt_bytes(self.used_bytes)} of {_fmt_bytes(self.capacity_bytes)} in use)"
                )
            if self.requested_bytes is not None:
                text += f" and cannot fit an object of {_fmt_bytes(self.requested_bytes)}"
            text += " after evicting every object that nobody references."
        if self.spilling_enabled is False:
            spill = (
                "turn spilling on (NBCLUSTER_SPILLING_ENABLED=1) so objects in use can move to disk"
            )
        else:
            spill = "make sure spilling has room (spill_dir, NBCLUSTER_SPILL_DIR)"
        return (
            f"{text}\nTip: delete ObjectRefs you no longer need (`del ref`) so their objects "
            "can be freed, start the cluster with a larger object_store_memory "
            f"(NBCLUSTER_OBJECT_STORE_MEMORY), or {spill}."
        )


class OutOfDiskError(NbclusterError):
    """The disk used for spilling or for the file-backed store is full."""

    def __init__(
        self, message: str | None = None, *, path: str | None = None, node_id: str | None = None
    ) -> None:
        super().__init__(*([message] if message else []))
        self.message = message
        self.path = path
        self.node_id = node_id

    def __str__(self) -> str:
        where = f" at {self.path}" if self.path else ""
        node = f" on node {self.node_id}" if self.node_id else ""
        text = self.message or f"The local disk{where}{node} is full (over 95% used)."
        return f"{text} Free disk space, or point spill_dir (NBCLUSTER_SPILL_DIR) at a larger disk."


class OutOfMemoryError(NbclusterError):
    """The memory monitor killed the worker because its node was running low on memory."""

    def __init__(
        self,
        message: str | None = None,
        *,
        task_id: str | None = None,
        node_id: str | None = None,
        pid: int | None = None,
        memory_used_bytes: int | None = None,
        memory_total_bytes: int | None = None,
    ) -> None:
        super().__init__(*([message] if message else []))
        self.message = message
        self.task_id = task_id
        self.node_id = node_id
        self.pid = pid
        self.memory_used_bytes = memory_used_bytes
        self.memory_total_bytes = memory_total_bytes

    def __str__(self) -> str:
        if self.message:
            return self.message
        where = _where(pid=self.pid, node_id=self.node_id, task_id=self.task_id)
        text = "Task was killed due to the node running low on memory"
        text += f" ({where})." if where else "."
        if self.memory_used_bytes is not None and self.memory_total_bytes is not None:
            text += (
                f" Memory in use: {_fmt_bytes(self.memory_used_bytes)} of "
                f"{_fmt_bytes(self.memory_total_bytes)}."
            )
        return text + (
            " Reduce the task's memory use, declare it with @remote(memory=...) so fewer such "
            "tasks run at once, or add memory to the node."
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
