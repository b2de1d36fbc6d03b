"""One compact, collapsible log area per cell, for the output of the work the cell submitted.

Each cell that submitted tasks or actor calls gets one log area under it: an anywidget
(``static/cell_log.js``) with a header (a fold toggle, the number of lines, how many were
folded) and filters by task or actor and by level (stdout; stderr and logging; warnings
and errors; errors). Lines arrive through the widget's comm, so output that comes after
the cell finished, while other cells run, still lands in that cell's area. The area takes
no room while it is empty.

The area of a cell is displayed under it while the cell runs: at its first line of
output, or at the end of the cell (``post_run_cell``) when it submitted work, so that it
is in place for output that comes later. Output for a cell that has no area and has
finished (work submitted outside any cell, by another process) goes out as a plain
``stream`` message instead (see :class:`~nbcluster.jupyter.output.OutputRouter`).

Rich output: what a task shows with ``display()`` (``IPython.display.display`` or
``nbcluster.util.display`` on the worker) arrives as a mime bundle and takes one line of
the area (level ``display``, its ``text/plain``); the widget renders the bundle in its
place (HTML sanitised into a shadow root, images, SVG; scripts never run). The last
:data:`MAX_RICH` bundles (at most :data:`MAX_RICH_CHARS` in all) are kept; older ones
show as their text.

Each area keeps the last :data:`MAX_LINES` lines; older ones are counted as folded, like
the lines the workers' rate limit folds. At most :data:`MAX_AREAS` areas stay live; the
oldest are closed. :class:`CellLogState` holds an area's lines and is tested without a
kernel.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import re
import threading
from importlib import resources
from typing import Any

__all__ = [
    "DISPLAY_LEVEL",
    "MAX_AREAS",
    "MAX_LINES",
    "MAX_RICH",
    "MAX_RICH_CHARS",
    "RICH_MIMES",
    "CellLogState",
    "LogAreas",
    "cell_log_class",
    "line_level",
    "source_kind",
]

#: Lines an area keeps (older ones are counted as folded).
MAX_LINES = 400
#: Areas kept live at most (the oldest cells' areas are closed).
MAX_AREAS = 200
#: Rich display outputs an area keeps rendered (older ones show as their text/plain).
MAX_RICH = 20
#: ... and at most this many characters of them in all.
MAX_RICH_CHARS = 16 * 2**20
#: The level of a line that is a display output.
DISPLAY_LEVEL = "display"
#: Mime types the log area renders itself (besides text/plain).
RICH_MIMES = (
    "text/html",
    "image/svg+xml",
    "image/png",
    "image/jpeg",
    "image/gif",
    "text/markdown",
    "text/latex",
    "application/json",
)
_LEVEL = re.compile(r"^(?:\([^)]*\) )?(CRITICAL|ERROR|WARNING|INFO|DEBUG)\b[:\s]")


def line_level(stream: str, line: str) -> str:
    """``"stdout"``, or for stderr the logging level the line starts with, else ``"stderr"``."""
    if stream != "stderr":
        return "stdout"
    m = _LEVEL.match(line)
    return m.group(1) if m else "stderr"


def source_kind(name: str) -> str:
    """``"actor"`` for an actor method (``Class.method``), ``"task"`` for a function."""
    return "actor" if "." in name else "task"


@dataclasses.dataclass
class CellLogState:
    """The lines of one area: the last ``max_lines``, with what was folded counted, and the
    rich bundles of its display lines (``rich``: seq → ``{"data", "metadata"}``)."""

    max_lines: int = MAX_LINES
    lines: collections.deque[list[Any]] = dataclasses.field(default_factory=collections.deque)
    total: int = 0
    folded: int = 0
    sources: dict[str, str] = dataclasses.field(default_factory=dict)
    seq: int = 0
    rich: collections.OrderedDict[int, dict[str, Any]] = dataclasses.field(
        default_factory=collections.OrderedDict
    )
    #: Bumped whenever ``rich`` changes (the widget's ``rich`` trait is sent only then).
    rich_version: int = 0
    _rich_chars: dict[int, int] = dataclasses.field(default_factory=dict)

    def add(self, name: str, stream: str, text: str, prefix: str, dropped: int = 0) -> None:
        """Add what a task wrote (``text``; each line gets ``prefix``) and its folded count."""
        self.sources.setdefault(name, source_kind(name))
        kind = self.sources[name]
        for line in text.splitlines(keepends=True):
            if not line.endswith("\n"):
                line += "\n"
            self.seq += 1
            self.total += 1
            self.lines.append([self.seq, name, kind, line_level(stream, line), prefix + line])
            self._trim()
        if dropped:
            self.folded += dropped
            self.total += dropped

    def add_display(
        self, name: str, bundle: dict[str, Any] | None, prefix: str, dropped: int = 0
    ) -> None:
        """Add a display output (``bundle``: ``{"data": {mime: ...}, "metadata": {...}}``,
        or None) as one line with its text/plain, and the number of displays folded."""
        kind = self.sources.setdefault(name, source_kind(name))
        if bundle is not None:
            data = bundle.get("data") if isinstance(bundle.get("data"), dict) else {}
            plain = data.get("text/plain")
            text = plain if isinstance(plain, str) and plain else "<display output>"
            self.seq += 1
            self.total += 1
            self.lines.append(
                [self.seq, name, kind, DISPLAY_LEVEL, prefix + text.rstrip("\n") + "\n"]
            )
            shown = {m: v for m, v in data.items() if m in RICH_MIMES}
            if shown:
                metadata = bundle.get("metadata")
                md = {m: v for m, v in metadata.items() if m in shown} if metadata else {}
                self.rich[self.seq] = {"data": shown, "metadata": md}
                self._rich_chars[self.seq] = sum(
                    len(v) if isinstance(v, str) else len(str(v)) for v in shown.values()
                )
                self.rich_version += 1
            self._trim()
        if dropped:
            self.folded += dropped
            self.total += dropped

    def _trim(self) -> None:
        while len(self.lines) > self.max_lines:
            old = self.lines.popleft()
            self.folded += 1
            self._drop_rich(old[0])
        while self.rich and (
            len(self.rich) > MAX_RICH or sum(self._rich_chars.values()) > MAX_RICH_CHARS
        ):
            self._drop_rich(next(iter(self.rich)))

    def _drop_rich(self, seq: int) -> None:
        if self.rich.pop(seq, None) is not None:
            self._rich_chars.pop(seq, None)
            self.rich_version += 1

    def text(self) -> str:
        """The lines as plain text (what a front end without widgets shows)."""
        body = "".join(line[4] for line in self.lines)
        if self.folded:
            body += f"[... {self.folded} lines folded ...]\n"
        return body


@functools.cache
def _static(name: str) -> str:
    return resources.files("nbcluster.jupyter").joinpath("static", name).read_text("utf-8")


@functools.cache
def cell_log_class() -> type:
    """The ``CellLog`` anywidget class (made on first use: anywidget is imported then)."""
    import anywidget
    import traitlets

    class CellLog(anywidget.AnyWidget):  # type: ignore[misc]
        """The log area of one cell (see :mod:`nbcluster.jupyter.log_area`)."""

        _esm = _static("cell_log.js")
        _css = _static("cell_log.css")
        lines = traitlets.List([]).tag(sync=True)
        total = traitlets.Int(0).tag(sync=True)
        folded = traitlets.Int(0).tag(sync=True)
        sources = traitlets.List([]).tag(sync=True)
        collapsed = traitlets.Bool(False).tag(sync=True)
        rich = traitlets.Dict({}).tag(sync=True)

    return CellLog


@dataclasses.dataclass(eq=False)
class _Area:
    parent: dict[str, Any]
    state: CellLogState
    widget: Any
    dirty: bool = False
    rich_sent: int = 0


class LogAreas:
    """The log areas of one kernel, by the ``msg_id`` of their cell. Thread-safe.

    ``send(msg_type, content, parent)`` publishes on iopub (the router's kernel session);
    the areas' widgets are created with ``widget_class`` (default: :func:`cell_log_class`).
    """

    def __init__(self, send: Any, widget_class: type | None = None) -> None:
        self._send = send
        self._widget_class = widget_class
        self._lock = threading.RLock()
        self._areas: collections.OrderedDict[str, _Area] = collections.OrderedDict()
        self._running: str | None = None
        self._submitted: set[str] = set()
        #: When False (``%cluster output stream``) no area is opened.
        self.enabled = True

    # -- cells (the kernel hooks call these on the main thread) ----------------------------------
    def cell_started(self, msg_id: str | None) -> None:
        """A cell starts: output for it may open its area from now until it finishes."""
        with self._lock:
            self._running = msg_id

    def submitted(self, msg_id: str) -> None:
        """The cell ``msg_id`` submitted remote work (called on every submission)."""
        if msg_id not in self._submitted:
            with self._lock:
                self._submitted.add(msg_id)

    def cell_finished(self, parent: dict[str, Any] | None) -> None:
        """The cell of ``parent`` ends: it gets its area now if it submitted work."""
        msg_id = str(parent.get("msg_id", "")) if parent else ""
        with self._lock:
            if self.enabled and msg_id in self._submitted and msg_id not in self._areas:
                self._open(msg_id, parent)  # type: ignore[arg-type]
            self._submitted.discard(msg_id)
            if self._running == msg_id:
                self._running = None

    # -- output (the router's thread) ----------------------------------------------------------
    def add(self, parent: dict[str, Any], name: str, stream: str, text: str, prefix: str,
            dropped: int) -> bool:  # fmt: skip
        """Put output in its cell's area; False when the cell has none (and cannot get one)."""
        with self._lock:
            area = self._area_for(parent)
            if area is None:
                return False
            area.state.add(name, stream, text, prefix, dropped)
            area.dirty = True
        return True

    def add_display(
        self,
        parent: dict[str, Any],
        name: str,
        bundle: dict[str, Any] | None,
        prefix: str,
        dropped: int,
    ) -> bool:
        """Put a display output (a mime bundle) in its cell's area; False as for :meth:`add`."""
        with self._lock:
            area = self._area_for(parent)
            if area is None:
                return False
            area.state.add_display(name, bundle, prefix, dropped)
            area.dirty = True
        return True

    def _area_for(self, parent: dict[str, Any]) -> _Area | None:
        msg_id = str(parent.get("msg_id", ""))
        area = self._areas.get(msg_id)
        if area is None:
            if not self.enabled or not msg_id or msg_id != self._running:
                return None
            area = self._open(msg_id, parent)
        return area

    def flush(self) -> None:
        """Send the new lines of every area to its widget."""
        with self._lock:
            dirty = [a for a in self._areas.values() if a.dirty]
            for a in dirty:
                a.dirty = False
                s, w = a.state, a.widget
                with w.hold_sync():  # one comm message per area
                    w.lines = list(s.lines)
                    w.total = s.total
                    w.folded = s.folded
                    w.sources = [[n, k] for n, k in s.sources.items()]
                    if s.rich_version != a.rich_sent:
                        a.rich_sent = s.rich_version
                        w.rich = {str(seq): b for seq, b in s.rich.items()}

    def area(self, msg_id: str) -> Any:
        """The widget of the cell ``msg_id``'s area, or None."""
        with self._lock:
            a = self._areas.get(msg_id)
            return None if a is None else a.widget

    def close(self) -> None:
        """Close every area's widget."""
        with self._lock:
            areas = list(self._areas.values())
            self._areas.clear()
        for a in areas:
            a.widget.close()

    def _open(self, msg_id: str, parent: dict[str, Any]) -> _Area:
        cls = self._widget_class or cell_log_class()
        widget = cls()
        area = _Area(parent=parent, state=CellLogState(), widget=widget)
        self._areas[msg_id] = area
        self._send(
            "display_data",
            {
                "data": {
                    "application/vnd.jupyter.widget-view+json": {
                        "version_major": 2,
                        "version_minor": 0,
                        "model_id": widget.model_id,
                    },
                    "text/plain": "",
                },
                "metadata": {},
                "transient": {},
            },
            parent,
        )
        while len(self._areas) > MAX_AREAS:
            _, old = self._areas.popitem(last=False)
            old.widget.close()
        return area
