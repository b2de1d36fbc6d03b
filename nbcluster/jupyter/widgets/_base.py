"""What every live widget shares: a feed subscription, ``close()``, and a text/plain repr.

A live widget is a small Python object that owns an ipywidget (``.widget``: a plotly
``FigureWidget``, or a box of them) and subscribes to the kernel's :class:`Feed`, which
calls it when the head pushes something it asked for (task events, node changes) and, for
widgets that read this process's own state (``_wants_ticks``), every feed interval. It is
not itself an ipywidget, so that ``import nbcluster`` never imports ipywidgets or plotly
(they are imported when a widget is created). Displaying it shows the ipywidget, with the
widget's own text summary as the ``text/plain`` fallback (what a terminal, an email of the
notebook, or a front end without widget support shows).

The feed holds the subscription, so a widget shown with ``display(Timeline())`` keeps
updating although no variable refers to it. It stops when :meth:`LiveWidget.close` is
called (which also closes the ipywidget, removing its views) or when the driver
disconnects.
"""

from __future__ import annotations

import threading
from typing import Any

from nbcluster import state
from nbcluster.jupyter.widgets._feed import Feed, FeedUpdate, Subscription, default_feed

__all__ = ["LiveWidget", "format_bytes", "format_seconds", "node_label"]


class LiveWidget:
    """Base class: subclasses build ``self.widget`` in ``_build`` and apply feed updates."""

    _wants_events = True
    _wants_nodes = True
    #: Also called every feed interval (for widgets that read this process's own state).
    _wants_ticks = False

    def __init__(self, feed: Feed | None = None) -> None:
        state.session_info()  # raises "nbcluster is not initialized: call nbcluster.init()"
        self._lock = threading.RLock()
        self._closed = False
        self._connected = True
        self._feed = feed if feed is not None else default_feed()
        self.widget: Any = self._build()
        self.widget.observe(self._on_comm_change, names="comm")
        self._sub: Subscription | None = self._feed.subscribe(
            self._on_update,
            events=self._wants_events,
            nodes=self._wants_nodes,
            ticks=self._wants_ticks,
        )

    # -- subclass hooks ---------------------------------------------------------------------
    def _build(self) -> Any:
        """Create and return the ipywidget (called once, from ``__init__``)."""
        raise NotImplementedError

    def _apply(self, update: FeedUpdate) -> None:
        """Apply one feed update to the widget (called with ``self._lock`` held)."""
        raise NotImplementedError

    def _text(self) -> str:
        """The text/plain summary."""
        raise NotImplementedError

    def _disconnected(self) -> None:
        """The driver went away: mark the display (default: nothing)."""

    # -- feed -------------------------------------------------------------------------------
    def _on_update(self, update: FeedUpdate) -> None:
        with self._lock:
            if self._closed:
                return
            if not update.connected:
                self._connected = False
                self._sub = None
                self._disconnected()
                return
            self._apply(update)

    def _on_comm_change(self, change: dict[str, Any]) -> None:
        if change.get("new") is None and change.get("old") is not None:
            self._unsubscribe()

    def _unsubscribe(self) -> None:
        sub, self._sub = self._sub, None
        if sub is not None:
            self._feed.unsubscribe(sub)

    @property
    def live(self) -> bool:
        """True while the widget gets updates from the feed."""
        return self._sub is not None

    def close(self) -> None:
        """Stop updating and close the ipywidget (its views disappear)."""
        with self._lock:
            self._closed = True
        self._unsubscribe()
        self.widget.close()

    # -- display ----------------------------------------------------------------------------
    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, Any]:
        data: dict[str, Any] = {}
        bundle = getattr(self.widget, "_repr_mimebundle_", None)
        if callable(bundle) and not self._closed:
            data.update(bundle(include=include, exclude=exclude) or {})
        data["text/plain"] = self._text()
        return data

    def __repr__(self) -> str:
        return self._text()


def node_label(node: state.NodeStats | None, node_id: str) -> str:
    """A short, stable name for a node: its name, or the start of its id."""
    if node is not None and node.name:
        return node.name
    return node_id[:8] or "?"


def format_bytes(n: float) -> str:
    """``1536`` -> ``'1.5 KiB'``."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def format_seconds(s: float) -> str:
    """``0.0123`` -> ``'12.3 ms'``, ``75`` -> ``'75.0 s'``."""
    if s < 1e-3:
        return f"{s * 1e6:.0f} µs"
    if s < 1:
        return f"{s * 1e3:.1f} ms"
    return f"{s:.1f} s" if s < 600 else f"{s / 60:.1f} min"
