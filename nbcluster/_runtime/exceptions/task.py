"""Errors of a task's run: the user's exception (:class:`TaskError`), a crashed worker, a cancel."""

from __future__ import annotations

import contextlib
import functools
import os
import socket
import types
from collections.abc import Mapping
from typing import Any

from nbcluster._runtime import display
from nbcluster._runtime.exceptions.base import (
    PUBLIC_MODULE,
    NbclusterError,
    _format_remote_traceback,
    _round_trips,
    _short_repr,
    _truncate_traceback,
    _where,
)

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
        return display.mimebundle(self, f"{type(self).__name__}: {self}")

    def _repr_html_(self) -> str | None:
        """HTML display: the function, where it ran, and the remote traceback (escaped)."""
        return display.html(self)


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
        ns["__module__"] = PUBLIC_MODULE
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
