"""Rich displays: the cluster card, ``ObjectRef`` and ``TaskError``.

Every display is a ``text/plain`` + ``text/html`` mimebundle. The HTML comes from the
``string.Template`` files in ``templates/``; every value substituted into them is
HTML-escaped first, because much of it (task names, tracebacks, addresses) comes from
user code and must never be interpreted as markup.

Data comes from :mod:`nbcluster.state` only. Rendering a ref or an error needs no RPC;
rendering the cluster asks the head for its nodes once. :data:`RENDERERS` names the
``ObjectRef`` and ``TaskError`` renderers; ``nbcluster`` installs them in the runtime's
display registry on the first display (this layer never imports ``nbcluster._runtime``).
"""

from __future__ import annotations

import dataclasses
import functools
import html
import string
from collections.abc import Callable
from importlib import resources
from typing import TYPE_CHECKING, Any

from nbcluster import state
from nbcluster._refs import ObjectRef
from nbcluster.exceptions import NbclusterError, TaskError

if TYPE_CHECKING:
    from nbcluster._api import ClusterInfo

__all__ = [
    "RENDERERS",
    "ClusterStatus",
    "ClusterView",
    "NodeRow",
    "format_bytes",
    "object_ref_html",
    "object_ref_mimebundle",
    "render_template",
    "task_error_html",
    "task_error_mimebundle",
]

_STATE_COLORS = {"pending": "#b80", "ready": "#292", "failed": "#b22", "unknown": "#666"}


# ------------------------------------------------------------------------------ helpers


@functools.cache
def _template(name: str) -> string.Template:
    text = resources.files("nbcluster.jupyter").joinpath("templates", name).read_text("utf-8")
    return string.Template(text)


def render_template(name: str, /, **values: object) -> str:
    """Fill ``templates/<name>`` with ``values``, HTML-escaping every one of them.

    Values wrapped in :class:`_Markup` (HTML this module built from escaped parts) are
    inserted as they are. A placeholder without a value raises ``KeyError``.
    """
    escaped = {
        key: value.html if isinstance(value, _Markup) else html.escape(str(value), quote=True)
        for key, value in values.items()
    }
    return _template(name).substitute(escaped)


@dataclasses.dataclass(frozen=True)
class _Markup:
    """HTML already assembled from escaped values (only this module creates these)."""

    html: str


def format_bytes(n: float) -> str:
    """``1536`` → ``"1.5 KiB"``; whole bytes below 1 KiB."""
    value = float(n)
    unit = "B"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):  # noqa: B007 - the last unit is kept
        if abs(value) < 1024 or unit == "TiB":
            break
        value /= 1024
    return f"{int(value)} B" if unit == "B" else f"{value:.1f} {unit}"


def _amount(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:.2f}".rstrip("0").rstrip(".")


def _used_of(used: float, total: float) -> str:
    return f"{_amount(used)} / {_amount(total)}"


# ------------------------------------------------------------------------------ cluster


@dataclasses.dataclass(frozen=True)
class NodeRow:
    """One node of a :class:`ClusterStatus`."""

    name: str
    address: str
    cpu_used: float
    cpu_total: float
    gpu_used: float
    gpu_total: float
    store_used: int
    store_capacity: int
    num_workers: int


@dataclasses.dataclass(frozen=True)
class ClusterStatus:
    """A snapshot of the cluster a :class:`ClusterView` shows (``connected`` False once stopped)."""

    address: str
    session_dir: str
    started_here: bool
    connected: bool
    nodes: tuple[NodeRow, ...]
    message: str = ""

    @property
    def cpu_used(self) -> float:
        """CPUs in use on all live nodes."""
        return sum(n.cpu_used for n in self.nodes)

    @property
    def cpu_total(self) -> float:
        """CPUs of all live nodes."""
        return sum(n.cpu_total for n in self.nodes)

    @property
    def gpu_used(self) -> float:
        """GPUs in use on all live nodes."""
        return sum(n.gpu_used for n in self.nodes)

    @property
    def gpu_total(self) -> float:
        """GPUs of all live nodes."""
        return sum(n.gpu_total for n in self.nodes)

    @property
    def store_used(self) -> int:
        """Bytes in the object stores of all live nodes."""
        return sum(n.store_used for n in self.nodes)

    @property
    def store_capacity(self) -> int:
        """Object-store capacity of all live nodes, in bytes."""
        return sum(n.store_capacity for n in self.nodes)


class ClusterView:
    """The cluster this kernel is connected to, displayed as a status card.

    ``%cluster start``, ``%cluster connect`` and ``%cluster status`` return one. Each time
    it is displayed it asks the cluster for its current state, so re-displaying the same
    object (``view`` in a later cell) shows fresh numbers. ``repr()`` is cheap and makes
    no call.
    """

    def __init__(self, info: ClusterInfo) -> None:
        self._info = info

    @property
    def address(self) -> str:
        """The head's ``host:port``; pass it to ``%cluster connect`` from another kernel."""
        return self._info.address

    @property
    def session_dir(self) -> str:
        """The cluster's session directory (logs, token file)."""
        return self._info.session_dir

    @property
    def job_id(self) -> str:
        """This kernel's job id in the cluster."""
        return self._info.job_id

    @property
    def started_here(self) -> bool:
        """True when this kernel started the cluster (it then ends with the kernel)."""
        return self._info.started_here

    def is_current(self) -> bool:
        """True while this kernel is still connected through the connection this view shows."""
        return state.is_connected() and state.session_info()["job_id"] == self._info.job_id

    def status(self) -> ClusterStatus:
        """Ask the cluster for its nodes and resources now."""
        base = {
            "address": self.address,
            "session_dir": self.session_dir,
            "started_here": self.started_here,
        }
        if not self.is_current():
            return ClusterStatus(
                **base,
                connected=False,
                nodes=(),
                message="Not connected any more: run %cluster start or %cluster connect ADDRESS.",
            )
        try:
            stats = state.node_stats()
        except (NbclusterError, ConnectionError, TimeoutError) as err:
            return ClusterStatus(
                **base, connected=True, nodes=(), message=f"Cluster state unavailable: {err}"
            )
        rows = tuple(
            NodeRow(
                name=n.name or n.node_id[:8],
                address=n.address,
                cpu_used=n.total.get("CPU", 0.0) - n.available.get("CPU", 0.0),
                cpu_total=n.total.get("CPU", 0.0),
                gpu_used=n.total.get("GPU", 0.0) - n.available.get("GPU", 0.0),
                gpu_total=n.total.get("GPU", 0.0),
                store_used=n.store_used,
                store_capacity=n.store_capacity,
                num_workers=n.num_workers,
            )
            for n in stats
            if n.alive
        )
        return ClusterStatus(**base, connected=True, nodes=rows)

    def _origin(self) -> str:
        return "started by this kernel" if self.started_here else "joined"

    def _text(self, status: ClusterStatus) -> str:
        lines = [f"nbcluster at {status.address} ({self._origin()})"]
        if status.connected and not status.message:
            lines.append(
                f"  nodes: {len(status.nodes)}"
                f" | CPUs used: {_used_of(status.cpu_used, status.cpu_total)}"
                f" | GPUs used: {_used_of(status.gpu_used, status.gpu_total)}"
                f" | object store used: {format_bytes(status.store_used)}"
                f" / {format_bytes(status.store_capacity)}"
            )
        if status.message:
            lines.append(f"  {status.message}")
        lines.append(f"  session: {status.session_dir}")
        lines.append("  live view: %cluster widgets")
        return "\n".join(lines)

    def _html(self, status: ClusterStatus) -> str:
        rows = "".join(
            render_template(
                "cluster_node_row.html",
                name=n.name,
                address=n.address,
                cpu=_used_of(n.cpu_used, n.cpu_total),
                gpu=_used_of(n.gpu_used, n.gpu_total),
                store=f"{format_bytes(n.store_used)} / {format_bytes(n.store_capacity)}",
                workers=n.num_workers,
            )
            for n in status.nodes
        )
        return render_template(
            "cluster.html",
            address=status.address,
            origin=self._origin(),
            num_nodes=len(status.nodes),
            cpu=_used_of(status.cpu_used, status.cpu_total),
            gpu=_used_of(status.gpu_used, status.gpu_total),
            store=f"{format_bytes(status.store_used)} / {format_bytes(status.store_capacity)}",
            node_rows=_Markup(rows),
            session_dir=status.session_dir,
            message=status.message,
        )

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, str]:
        status = self.status()
        return {"text/plain": self._text(status), "text/html": self._html(status)}

    def _repr_html_(self) -> str:
        return self._html(self.status())

    def __repr__(self) -> str:
        return f"ClusterView(address={self.address!r}, {self._origin()})"


# ------------------------------------------------------------------------------ ObjectRef


def _ref_summary(ref: ObjectRef) -> tuple[str, str]:
    """(state, details) of ``ref`` as this process knows it, without any RPC."""
    info = state.ref_info(ref)
    if info is None:
        return "unknown", "not tracked by this process (borrowed, freed, or not connected)"
    if info.state == "pending":
        return "pending", "the task that makes it has not finished"
    if info.state == "failed":
        return "failed", "nbcluster.get(ref) raises the task's error"
    if info.in_store:
        where = f"in the object store of node {info.node_id[:12]}"
    else:
        where = "inline in the owner's memory"
    return "ready", f"{format_bytes(info.size)}, {where}"


def object_ref_mimebundle(ref: ObjectRef) -> dict[str, str]:
    """``text/plain`` and ``text/html`` for an ``ObjectRef``: state, size and location."""
    ref_state, details = _ref_summary(ref)
    return {
        "text/plain": f"ObjectRef({ref.hex()}) {ref_state}: {details}",
        "text/html": _object_ref_html(ref, ref_state, details),
    }


def object_ref_html(ref: ObjectRef) -> str:
    """The HTML display of an ``ObjectRef``."""
    return _object_ref_html(ref, *_ref_summary(ref))


def _object_ref_html(ref: ObjectRef, ref_state: str, details: str) -> str:
    return render_template(
        "object_ref.html",
        object_id=ref.hex(),
        state=ref_state,
        color=_STATE_COLORS[ref_state],
        details=details,
    )


# ------------------------------------------------------------------------------ TaskError


def _error_where(err: TaskError) -> str:
    parts = []
    if err.hostname:
        parts.append(f"host {err.hostname}")
    if err.pid is not None:
        parts.append(f"pid {err.pid}")
    if err.node_id:
        parts.append(f"node {err.node_id[:12]}")
    if err.task_id:
        parts.append(f"task {err.task_id}")
    return "ran on " + ", ".join(parts) if parts else "where it ran is unknown"


def _cause_type(err: TaskError) -> str:
    cause = err.cause
    if cause is None:
        return "an exception"
    exception_type = getattr(cause, "exception_type", None)  # UnserializableException
    return str(exception_type or type(cause).__qualname__)


def task_error_mimebundle(err: TaskError) -> dict[str, str]:
    """``text/plain`` and ``text/html`` for a ``TaskError``: function, where, remote traceback."""
    return {"text/plain": f"{type(err).__name__}: {err}", "text/html": task_error_html(err)}


def task_error_html(err: TaskError) -> str:
    """The HTML display of a ``TaskError`` (the traceback in a ``<pre>``, escaped)."""
    return render_template(
        "task_error.html",
        error_type=type(err).__name__,
        function_name=err.function_name,
        cause_type=_cause_type(err),
        where=_error_where(err),
        traceback=err.traceback_str or repr(err.cause),
    )


#: class -> (mimebundle, html): what ``nbcluster`` installs in the runtime's display registry.
RENDERERS: dict[type, tuple[Callable[[Any], dict[str, str]], Callable[[Any], str]]] = {
    ObjectRef: (object_ref_mimebundle, object_ref_html),
    TaskError: (task_error_mimebundle, task_error_html),
}
