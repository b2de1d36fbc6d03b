"""The root of nbcluster's error tree, and the helpers every error module shares.

Every error survives a (cloud)pickle round trip with its attributes:
:meth:`NbclusterError.__reduce__` rebuilds the object without calling ``__init__``, so
constructor signatures are free to differ from ``args``. Public classes say they live in
:mod:`nbcluster.exceptions` (their ``__module__``), where users import them from, so
tracebacks and reprs read as before the split.
"""

from __future__ import annotations

import os
import traceback
from typing import Any

import cloudpickle

#: The module users import the errors from (and the one tracebacks name).
PUBLIC_MODULE = "nbcluster.exceptions"

#: Remote tracebacks longer than this many bytes (UTF-8) are cut in the middle.
MAX_TRACEBACK_BYTES = 64 * 1024

#: Frames under this directory are the worker's own, dropped from remote tracebacks.
_RUNTIME_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
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
