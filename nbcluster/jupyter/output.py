"""Task output goes under the cell that submitted the task.

Two hooks of :mod:`nbcluster.state` do it (and :mod:`.log_area` gives each cell one log
area for that output, where widgets work):

- :func:`cell_header` is the submit-context provider: every task remembers the header of
  the Jupyter message (normally the cell's ``execute_request``) that was being handled
  when it was submitted.
- :class:`OutputRouter` is the output handler: it receives the task's stdout/stderr
  records on the driver's I/O thread. With ``mode="log"`` (the default in a kernel) it
  puts them in the submitting cell's log area (:class:`~.log_area.LogAreas`), whose
  widget shows them under that cell, also after the cell finished and while another
  cell runs. Otherwise (``mode="stream"``, or a cell without an area) it coalesces those
  that arrive within ``interval`` seconds into one ``stream`` message per cell and
  stream, and publishes it on iopub with the submitting cell's header as parent.

Rich output (``display()`` in a task) arrives as a record of the ``display`` stream whose
text is a JSON mime bundle (:func:`parse_display`). In ``"log"`` mode it goes into the
cell's log area, which renders it; otherwise it is published as a ``display_data``
message under the submitting cell, after that cell's buffered text (so the order the
task wrote in is kept).

``Session.send`` on the kernel's iopub socket is safe from any thread in ipykernel 7:
``iopub_socket`` is a ``BackgroundSocket`` whose ``send_multipart`` hands the frames to
the ``IOPubThread`` (thread-local event pipe), which does the actual zmq send. This is
also how ipykernel's own ``OutStream`` publishes from threads.
"""

from __future__ import annotations

import contextvars
import dataclasses
import json
import logging
import threading
import time
from typing import Any

from nbcluster.jupyter.log_area import LogAreas
from nbcluster.state import OutputRecord

__all__ = [
    "DISPLAY_STREAM",
    "OUTPUT_MODES",
    "OutputRouter",
    "cell_header",
    "format_record",
    "kernel_of",
    "latest_cell_header",
    "parse_display",
]

log = logging.getLogger(__name__)

#: Records arriving within this many seconds go out as one message per cell and stream.
COALESCE_INTERVAL_S = 0.05
#: Where task output goes: each cell's log area, or plain stream messages.
OUTPUT_MODES = ("log", "stream")
#: The stream name of a task's rich display output (set by the worker's output capture).
DISPLAY_STREAM = "display"


def kernel_of(shell: Any) -> Any:
    """The ipykernel ``Kernel`` behind ``shell``, or None for plain IPython (no iopub)."""
    kernel = getattr(shell, "kernel", None)
    if kernel is None or not hasattr(kernel, "session") or not hasattr(kernel, "iopub_socket"):
        return None
    return kernel


def cell_header(shell: Any) -> dict[str, Any] | None:
    """The header of the message the kernel is handling for the calling thread.

    This is ``shell.get_parent()`` (ipykernel ≥ 6): on the main thread, the running
    cell's ``execute_request``; on other threads, the message of the most recent cell
    (ipykernel's own rule for output from threads). None outside a kernel (plain IPython
    has no messages; :class:`~nbcluster.jupyter.hooks.KernelHooks` names cells there).
    """
    get_parent = getattr(shell, "get_parent", None)
    if get_parent is None:
        return None
    parent = get_parent()
    if not parent:
        return None
    header = parent.get("header", parent)
    return header if header.get("msg_id") else None


def latest_cell_header(shell: Any) -> dict[str, Any] | None:
    """The header of the most recent cell, whatever context the caller runs in.

    ipykernel keeps the parent in a ``ContextVar`` with a process-wide fallback. Code on
    the driver's I/O loop runs in contexts that asyncio copied from whichever cell
    scheduled it, so a plain lookup there returns an arbitrary earlier cell; looking it
    up in an empty context always gives the fallback, the latest cell.
    """
    return contextvars.Context().run(cell_header, shell)


def parse_display(text: str) -> dict[str, Any] | None:
    """The ``{"data": {mime: ...}, "metadata": {...}}`` of a display record, or None when
    ``text`` is empty or not such a bundle."""
    if not text:
        return None
    try:
        bundle = json.loads(text)
    except ValueError:
        return None
    if not isinstance(bundle, dict) or not isinstance(bundle.get("data"), dict):
        return None
    if not isinstance(bundle.get("metadata"), dict):
        bundle["metadata"] = {}
    return bundle


def format_record(record: OutputRecord) -> str:
    """The text of ``record``, each line prefixed ``(name pid=N)``, plus a folded-lines note."""
    prefix = f"({record.task_name} pid={record.pid}) "
    parts = []
    if record.text:
        parts.extend(prefix + line for line in record.text.splitlines(keepends=True))
        if not record.text.endswith("\n"):
            parts.append("\n")
    if record.dropped_lines:
        parts.append(
            f"{prefix}[... {record.dropped_lines} more lines folded by the output rate limit ...]\n"
        )
    return "".join(parts)


@dataclasses.dataclass
class _Pending:
    parent: dict[str, Any]
    parts: list[str]


class OutputRouter:
    """Publishes task output on iopub under the submitting cell, coalesced.

    Install it with ``nbcluster.state.set_output_handler(router.handle)``. A daemon thread
    (``nbcluster-output``) sends what :meth:`handle` buffered, at most once per
    ``interval`` seconds per cell and stream (or area). :meth:`close` sends what is left
    and stops the thread. ``mode``: ``"log"`` (each cell's log area, :attr:`areas`) or
    ``"stream"``.
    """

    def __init__(
        self, kernel: Any, interval: float = COALESCE_INTERVAL_S, mode: str = "log"
    ) -> None:
        self._kernel = kernel
        self._interval = interval
        self._cond = threading.Condition()
        self._pending: dict[tuple[str, str], _Pending] = {}
        self._areas_dirty = False
        self._closed = False
        self.areas = LogAreas(self._publish)
        self.mode = mode
        self._thread = threading.Thread(target=self._run, name="nbcluster-output", daemon=True)
        self._thread.start()

    @property
    def mode(self) -> str:
        """``"log"`` or ``"stream"`` (see the class docstring)."""
        return self._mode

    @mode.setter
    def mode(self, value: str) -> None:
        if value not in OUTPUT_MODES:
            raise ValueError(f"output mode must be one of {OUTPUT_MODES}, got {value!r}")
        self._mode = value
        self.areas.enabled = value == "log"

    def handle(self, context: Any, record: OutputRecord) -> None:
        """Buffer ``record`` for the cell whose header is ``context`` (runs on the I/O thread)."""
        parent = context if isinstance(context, dict) and context.get("msg_id") else None
        if parent is None:
            # Submitted by another process, or outside any cell: the latest cell, as
            # ipykernel does for output from threads.
            parent = latest_cell_header(self._kernel.shell) or {}
        if record.stream == DISPLAY_STREAM:
            self._handle_display(parent, record)
            return
        if self._mode == "log" and (record.text or record.dropped_lines):
            prefix = f"({record.task_name} pid={record.pid}) "
            if self.areas.add(
                parent, record.task_name, record.stream, record.text, prefix, record.dropped_lines
            ):
                with self._cond:
                    self._areas_dirty = True
                    self._cond.notify()
                return
        text = format_record(record)
        if not text:
            return
        key = (str(parent.get("msg_id", "")), "stderr" if record.stream == "stderr" else "stdout")
        with self._cond:
            if self._closed:
                return
            pending = self._pending.get(key)
            if pending is None:
                self._pending[key] = _Pending(parent, [text])
                self._cond.notify()
            else:
                pending.parts.append(text)

    def _handle_display(self, parent: dict[str, Any], record: OutputRecord) -> None:
        bundle = parse_display(record.text)
        prefix = f"({record.task_name} pid={record.pid}) "
        if self._mode == "log" and self.areas.add_display(
            parent, record.task_name, bundle, prefix, record.dropped_lines
        ):
            with self._cond:
                self._areas_dirty = True
                self._cond.notify()
            return
        msg_id = str(parent.get("msg_id", ""))
        with self._cond:
            if self._closed:
                return
            # The cell's text written before this display goes out first.
            before = [(k, p) for k, p in self._pending.items() if k[0] == msg_id]
            for k, _ in before:
                del self._pending[k]
        for (_, stream), pending in before:
            self._send(stream, "".join(pending.parts), pending.parent)
        if bundle is not None:
            content = {"data": bundle["data"], "metadata": bundle["metadata"], "transient": {}}
            self._publish("display_data", content, parent)
        if record.dropped_lines:
            note = f"{prefix}[... {record.dropped_lines} more display outputs folded by the output rate limit ...]\n"
            self._send("stdout", note, parent)

    def flush(self) -> None:
        """Send everything buffered now (from any thread)."""
        with self._cond:
            batch, self._pending = self._pending, {}
            self._areas_dirty = False
        self.areas.flush()
        for (_, stream), pending in batch.items():
            self._send(stream, "".join(pending.parts), pending.parent)

    def close(self) -> None:
        """Send what is buffered and stop the thread; later records are dropped."""
        with self._cond:
            self._closed = True
            self._cond.notify()
        self._thread.join(timeout=5)
        self.flush()
        self.areas.close()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._pending and not self._areas_dirty and not self._closed:
                    self._cond.wait()
                # Let the records of the next ``interval`` seconds join this message.
                deadline = time.monotonic() + self._interval
                while not self._closed and (remaining := deadline - time.monotonic()) > 0:
                    self._cond.wait(remaining)
                if self._closed:
                    return  # close() sends the rest
            try:
                self.flush()
            except Exception:  # noqa: BLE001 - keep routing later output
                log.exception("could not publish task output")

    def _send(self, stream: str, text: str, parent: dict[str, Any]) -> None:
        kernel = self._kernel
        kernel.session.send(
            kernel.iopub_socket,
            "stream",
            {"name": stream, "text": text},
            parent=parent,
            ident=f"stream.{stream}".encode(),
        )

    def _publish(self, msg_type: str, content: dict[str, Any], parent: dict[str, Any]) -> None:
        kernel = self._kernel
        topic = kernel._topic(msg_type) if hasattr(kernel, "_topic") else msg_type.encode()
        kernel.session.send(kernel.iopub_socket, msg_type, content, parent=parent, ident=topic)
