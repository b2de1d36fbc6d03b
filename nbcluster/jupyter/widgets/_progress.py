"""``progress(refs)``: a progress bar that fills as refs complete, widget or text."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Iterable
from typing import IO, Any

from nbcluster import _api, state
from nbcluster._refs import ObjectRef
from nbcluster.jupyter.widgets._feed import Feed, FeedUpdate, Subscription, default_feed

__all__ = ["Progress", "progress"]

_TEXT_WIDTH = 30
_LINE_EVERY_S = 5.0  # how often a non-terminal text stream gets a progress line


def _in_notebook() -> bool:
    """True inside a Jupyter kernel (where widgets can render)."""
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    ip = get_ipython()
    return ip is not None and getattr(ip, "kernel", None) is not None


def _execution_count() -> int | None:
    try:
        from IPython import get_ipython
    except ImportError:
        return None
    ip = get_ipython()
    return None if ip is None else int(ip.execution_count)


class Progress:
    """A handle on a progress display for a set of refs (made by :func:`progress`).

    ``done``/``failed``/``total`` count the distinct refs; a ref is done when its value
    or its error has arrived (``failed`` counts the errors). The display updates from the
    kernel's widget feed a few times a second and stops updating when every ref is done.
    :meth:`wait` blocks until then. ``close()`` stops updates early.
    """

    def __init__(
        self,
        refs: Iterable[ObjectRef],
        *,
        description: str = "",
        widget: bool | None = None,
        file: IO[str] | None = None,
        feed: Feed | None = None,
        display: bool = True,
    ) -> None:
        refs = list(refs)
        for i, r in enumerate(refs):
            if not isinstance(r, ObjectRef):
                raise TypeError(
                    f"progress() expects ObjectRefs, but item {i} is a {type(r).__name__}; "
                    "pass refs returned by f.remote() or nbcluster.put()"
                )
        state.session_info()  # raises "nbcluster is not initialized: call nbcluster.init()"
        self._refs = list(dict.fromkeys(refs))
        self._pending = list(self._refs)
        self.total = len(self._refs)
        self.done = 0
        self.failed = 0
        self.description = description
        self._lock = threading.RLock()
        self._feed = feed if feed is not None else default_feed()
        self._sub: Subscription | None = None
        self._file = file
        self._widget_mode = _in_notebook() if widget is None else widget
        self._shown_in: int | None = None
        self._last_line = ""
        self._last_line_at = 0.0
        if self._refs:
            # Start status requests for borrowed refs (refs this process does not own).
            _api.wait(self._refs, num_returns=len(self._refs), timeout=0)
        self.widget: Any = self._build() if self._widget_mode else None
        self.refresh()
        if display:
            self._show()
        if not self.complete:
            self._sub = self._feed.subscribe(self._on_update, events=False, nodes=False)

    # -- state ------------------------------------------------------------------------------
    @property
    def complete(self) -> bool:
        """True when every ref is done."""
        return self.done >= self.total

    def refresh(self) -> None:
        """Check the refs that were pending and update the display (what each tick does)."""
        with self._lock:
            still = []
            for ref in self._pending:
                info = state.ref_info(ref)
                if info is not None and info.state == "pending":
                    still.append(ref)
                else:
                    self.done += 1
                    if info is None or info.state == "failed":
                        self.failed += 1
            self._pending = still
            self._render()
            if self.complete:
                self._unsubscribe()

    def _on_update(self, update: FeedUpdate) -> None:
        if not update.connected:
            self._sub = None
            return
        self.refresh()

    def _unsubscribe(self) -> None:
        sub, self._sub = self._sub, None
        if sub is not None:
            self._feed.unsubscribe(sub)

    def wait(self, timeout: float | None = None) -> bool:
        """Block until every ref is done (or ``timeout`` seconds); return whether all are.

        Like ``nbcluster.wait`` this does not fetch values or raise task errors; call
        ``nbcluster.get(refs)`` for those.
        """
        with self._lock:
            pending = list(self._pending)
        if pending:
            _api.wait(pending, num_returns=len(pending), timeout=timeout)
        self.refresh()
        return self.complete

    def close(self) -> None:
        """Stop updating (the display keeps its last state)."""
        self._unsubscribe()

    # -- display ----------------------------------------------------------------------------
    def _build(self) -> Any:
        import ipywidgets

        self._bar = ipywidgets.IntProgress(
            value=0, min=0, max=max(self.total, 1), description=self.description
        )
        self._label = ipywidgets.Label(value="")
        return ipywidgets.HBox([self._bar, self._label])

    def label(self) -> str:
        """``'k/n done'`` (plus ``', f failed'``)."""
        failed = f", {self.failed} failed" if self.failed else ""
        return f"{self.done}/{self.total} done{failed}"

    def text_line(self) -> str:
        """``'[#####     ] 50/100'`` (the text display)."""
        filled = _TEXT_WIDTH if not self.total else round(_TEXT_WIDTH * self.done / self.total)
        prefix = f"{self.description} " if self.description else ""
        failed = f" ({self.failed} failed)" if self.failed else ""
        bar = "#" * filled + " " * (_TEXT_WIDTH - filled)
        return f"{prefix}[{bar}] {self.done}/{self.total}{failed}"

    def _render(self) -> None:
        if self.widget is not None:
            self._bar.value = self.done
            self._label.value = self.label()
            if self.complete:
                self._bar.bar_style = "danger" if self.failed else "success"
            return
        if self._shown_in is None:
            return
        line = self.text_line()
        if line == self._last_line:
            return
        out = self._file or sys.stdout
        now = time.monotonic()
        if out.isatty():
            out.write("\r" + line + ("\n" if self.complete else ""))
        elif self.complete or now - self._last_line_at >= _LINE_EVERY_S:
            out.write(line + "\n")
        else:
            return
        out.flush()
        self._last_line, self._last_line_at = line, now

    def _show(self) -> None:
        self._shown_in = _execution_count() or 0
        if self.widget is not None:
            from IPython.display import display

            display(self.widget)
        else:
            self._render()

    def _ipython_display_(self) -> None:
        # progress() already showed it in this cell; show another view only in later cells.
        if self._shown_in is not None and self._shown_in == (_execution_count() or 0):
            return
        if self.widget is not None:
            from IPython.display import display

            self._shown_in = _execution_count() or 0
            display(self.widget)
        else:
            print(self.text_line())

    def __repr__(self) -> str:
        return f"Progress({self.label()})"


def progress(
    refs: Iterable[ObjectRef],
    *,
    description: str = "",
    widget: bool | None = None,
    file: IO[str] | None = None,
) -> Progress:
    """Show a progress bar that fills as ``refs`` complete, and return its handle.

    In a Jupyter kernel this displays an ``IntProgress`` bar with a ``"k/n done"`` label;
    elsewhere (or with ``widget=False``) it writes ``[#####     ] 50/100`` lines to
    ``file`` (default ``sys.stdout``): redrawn in place with ``\\r`` on a terminal, one line
    every few seconds otherwise. The bar is filled by the kernel's widget feed, so the
    cell returns at once and the bar keeps moving while other cells run.

    It does not return the values: call ``handle.wait()`` to block until every ref is done
    (it returns True then, False on ``timeout``), and ``nbcluster.get(refs)`` for the values.
    """
    return Progress(refs, description=description, widget=widget, file=file)
