"""The progress display of an execution: a widget in Jupyter, tqdm bars in a terminal.

One display per execution. In a Jupyter kernel it is an ipywidgets box — a header line
and a table with a row per operator (a bar, rows and blocks done, bytes in flight,
throughput, and which limit holds the operator back) — updated in place from the
executor's thread a few times a second (``DataContext.progress_update_interval_s``), so a
cell never fills with lines. In a terminal it is one tqdm bar per operator, redrawn in
place. Anywhere else (a script piped to a file, CI) nothing is printed.

The same snapshots go to the plan graphs that listen (:func:`add_listener`), which is how
``Dataset.plan_view()`` shows live per-operator numbers.
"""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Callable, Sequence
from typing import Any

from nbcluster.data._display import Markup, render
from nbcluster.data._stats import ExecutionStats, OpSnapshot, format_bytes, format_count

__all__ = [
    "TextProgress",
    "WidgetProgress",
    "add_listener",
    "in_notebook",
    "make_progress",
    "render_rows",
]

Listener = Callable[[int, Sequence[OpSnapshot], bool], None]
_listeners: list[Listener] = []
_listeners_lock = threading.Lock()


def add_listener(fn: Listener) -> Callable[[], None]:
    """Call ``fn(plan_key, snapshots, finished)`` on every progress tick; returns a remover.

    ``plan_key`` identifies the dataset plan that runs (``id`` of its logical root)."""
    with _listeners_lock:
        _listeners.append(fn)

    def remove() -> None:
        with _listeners_lock:
            if fn in _listeners:
                _listeners.remove(fn)

    return remove


def _notify(key: int, snaps: Sequence[OpSnapshot], finished: bool) -> None:
    with _listeners_lock:
        listeners = list(_listeners)
    for fn in listeners:
        with contextlib.suppress(Exception):  # a listener must not break the pipeline
            fn(key, snaps, finished)


def in_notebook() -> bool:
    """True inside a Jupyter kernel (where widgets render)."""
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    ip = get_ipython()
    return ip is not None and getattr(ip, "kernel", None) is not None


def render_rows(snaps: Sequence[OpSnapshot]) -> str:
    """The operator table as HTML (from ``templates/progress_*.html``; values escaped)."""
    rows = []
    for s in snaps:
        frac = 1.0 if s.done else (min(s.rows_out / s.total_rows, 1.0) if s.total_rows else 0.0)
        state = (
            "done"
            if s.done
            else (f"held: {s.held}" if s.held else "running" if s.tasks_running else "")
        )
        if s.actors:
            state += f" · {s.actors} actors"
        rows.append(
            render(
                "progress_row.html",
                name=s.name,
                width=f"{frac * 90:.0f}",
                color="#2ca02c" if s.done else "#1f77b4",
                rows=format_count(s.rows_out),
                blocks=s.blocks_out,
                in_flight=format_bytes(s.usage_bytes),
                rate=format_count(s.rows_per_s),
                state=state,
            )
        )
    return render("progress_table.html", rows=Markup("".join(rows)))


def _header(label: str, state: str, details: str = "") -> str:
    return render(
        "progress_header.html", label=label or "Dataset execution", state=state, details=details
    )


class WidgetProgress:
    """An ipywidgets display, updated in place (created in the consuming thread)."""

    def __init__(self, label: str, names: Sequence[str], key: int = 0) -> None:
        import ipywidgets
        from IPython.display import display

        self.label = label
        self.key = key
        self._header = ipywidgets.HTML(value=self._header_text(0, 0, False))
        self._table = ipywidgets.HTML(value=render_rows([OpSnapshot(n, "") for n in names]))
        self.widget = ipywidgets.VBox([self._header, self._table])
        self.text = f"{label or 'Dataset execution'} (live progress): " + " -> ".join(names)
        display(self)

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, Any]:
        data = dict(self.widget._repr_mimebundle_(include=include, exclude=exclude) or {})
        data["text/plain"] = self.text  # what a front end without widgets shows
        return data

    def _header_text(self, used: int, budget: int, finished: bool) -> str:
        mem = (
            f" · {format_bytes(used)} of {format_bytes(budget)} budget in flight" if budget else ""
        )
        return _header(self.label, "finished" if finished else "running", mem)

    def update(self, snaps: Sequence[OpSnapshot], used: int, budget: int) -> None:
        """Redraw with new counters."""
        self._table.value = render_rows(snaps)
        self._header.value = self._header_text(used, budget, False)
        _notify(self.key, snaps, False)

    def close(self, stats: ExecutionStats) -> None:
        """The final state (the widget stays, frozen)."""
        self._table.value = render_rows(stats.ops)
        self._header.value = _header(
            self.label,
            f"{stats.status} in {stats.wall_time_s:.2f}s",
            f" · peak {format_bytes(stats.peak_bytes_in_flight)} in flight of a "
            f"{format_bytes(stats.budget_bytes)} budget",
        )
        _notify(self.key, stats.ops, True)


class TextProgress:
    """One tqdm bar per operator, redrawn in place on a terminal."""

    def __init__(self, label: str, names: Sequence[str], key: int = 0, file: Any = None) -> None:
        from tqdm import tqdm

        self.label = label
        self.key = key
        self._bars = [
            tqdm(
                total=None,
                position=i,
                desc=f"- {n}"[:40],
                unit=" rows",
                leave=True,
                file=file or sys.stderr,
                dynamic_ncols=True,
            )
            for i, n in enumerate(names)
        ]

    def update(self, snaps: Sequence[OpSnapshot], used: int, budget: int) -> None:
        """Redraw the bars."""
        for bar, s in zip(self._bars, snaps, strict=False):
            bar.n = s.rows_out
            state = "done" if s.done else (s.held or "running")
            bar.set_postfix_str(
                f"{s.blocks_out} blocks, {format_bytes(s.usage_bytes)} in flight, {state}",
                refresh=False,
            )
            bar.refresh()
        _notify(self.key, snaps, False)

    def close(self, stats: ExecutionStats) -> None:
        """Final counts, then release the terminal lines."""
        self.update(stats.ops, 0, stats.budget_bytes)
        for bar in self._bars:
            bar.close()
        _notify(self.key, stats.ops, True)


class _ListenersOnly:
    """No display, but plan graphs still get the snapshots."""

    def __init__(self, label: str, key: int = 0) -> None:
        self.label = label
        self.key = key

    def update(self, snaps: Sequence[OpSnapshot], used: int, budget: int) -> None:
        _notify(self.key, snaps, False)

    def close(self, stats: ExecutionStats) -> None:
        _notify(self.key, stats.ops, True)


def make_progress(label: str, names: Sequence[str], key: int = 0, visible: bool = True) -> Any:
    """The display for this process: a widget, tqdm bars, or nothing visible (plan views
    still get the snapshots)."""
    if visible and in_notebook():
        try:
            return WidgetProgress(label, names, key)
        except ImportError:
            pass
    if visible and getattr(sys.stderr, "isatty", lambda: False)():
        try:
            return TextProgress(label, names, key)
        except ImportError:
            pass
    return _ListenersOnly(label, key)
