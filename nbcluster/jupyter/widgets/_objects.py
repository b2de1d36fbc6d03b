"""``ObjectStore``: store use per node over time, the largest objects this driver owns, and a
release button for each notebook variable that holds them."""

from __future__ import annotations

import collections
import dataclasses
import datetime
import functools
import html
import itertools
import re
import string
import threading
from collections.abc import Mapping, MutableMapping
from importlib import resources
from typing import Any

from nbcluster import state
from nbcluster._refs import ObjectRef
from nbcluster.jupyter.memory import freed_bytes, release_variable
from nbcluster.jupyter.widgets._base import LiveWidget, format_bytes, node_label
from nbcluster.jupyter.widgets._feed import Feed, FeedUpdate

__all__ = ["ObjectRow", "ObjectStore", "find_ref_names", "releasable"]

_NUMBERED_OUT = re.compile(r"_\d+")
_MAX_NAMES_SHOWN = 3


def find_ref_names(
    namespace: Mapping[str, Any], object_ids: set[str] | None = None, *, max_items: int = 10_000
) -> dict[str, list[str]]:
    """Which notebook variables hold which refs: ``{object id hex: [names]}``.

    A variable holds a ref when its value is that :class:`~nbcluster.ObjectRef` (``x``)
    or a list, tuple or dict containing it (``refs[3]``, ``d['a']``), one level deep.
    Cell outputs count too: ``Out[5]`` (and its alias ``_5``). Other names starting with
    ``_`` (IPython's ``_``, ``__``, ``_i3``, ``_oh``...) are skipped. Only the first
    ``max_items`` items of each container are looked at. ``object_ids`` limits the answer
    to those ids.
    """
    found: dict[str, list[str]] = {}

    def add(ref: ObjectRef, name: str) -> None:
        key = ref.hex()
        if object_ids is None or key in object_ids:
            found.setdefault(key, []).append(name)

    def visit(name: str, value: Any) -> None:
        if isinstance(value, ObjectRef):
            add(value, name)
        elif isinstance(value, (list, tuple)):
            for i, item in enumerate(itertools.islice(value, max_items)):
                if isinstance(item, ObjectRef):
                    add(item, f"{name}[{i}]")
        elif isinstance(value, dict):
            for k, item in itertools.islice(_items(value), max_items):
                if isinstance(item, ObjectRef):
                    add(item, f"{name}[{k!r}]")

    for name, value in _items(namespace):
        if not isinstance(name, str):
            continue
        if name == "Out" and isinstance(value, dict):
            for n, out in _items(value):
                visit(f"Out[{n}]", out)
        elif not name.startswith("_") or _NUMBERED_OUT.fullmatch(name):
            visit(name, value)
    return found


def _items(mapping: Mapping[Any, Any]) -> list[tuple[Any, Any]]:
    """A copy of the items; the kernel's thread may change the dict while the feed reads it."""
    for _ in range(5):
        try:
            return list(mapping.items())
        except RuntimeError:  # "dictionary changed size during iteration"
            continue
    return []


@functools.cache
def _template(name: str) -> string.Template:
    text = (
        resources.files("nbcluster.jupyter.widgets").joinpath("templates", name).read_text("utf-8")
    )
    return string.Template(text)


def _render(name: str, /, *, raw: frozenset[str] = frozenset(), **values: object) -> str:
    """Fill a template, HTML-escaping every value except those named in ``raw``."""
    return _template(name).substitute(
        {k: (str(v) if k in raw else html.escape(str(v), quote=True)) for k, v in values.items()}
    )


@dataclasses.dataclass(frozen=True)
class ObjectRow:
    """One owned object in the table, with the variables that hold a ref to it."""

    object_id: str
    size: int
    state: str
    where: str
    local_refs: int
    names: tuple[str, ...]


def releasable(names: tuple[str, ...]) -> list[str]:
    """The names a release button can drop for a row: variables (``refs[3]`` → ``refs``)
    and outputs (``Out[7]``; its alias ``_7`` is the same entry)."""
    out: list[str] = []
    for name in names:
        if _NUMBERED_OUT.fullmatch(name):
            name = f"Out[{name[1:]}]"
        elif not name.startswith("Out["):
            name = name.split("[", 1)[0]
        if name not in out:
            out.append(name)
    return out


def _shell() -> Any:
    """The IPython shell (its display hook holds the latest outputs too), or None."""
    try:
        from IPython import get_ipython
    except ImportError:
        return None
    return get_ipython()


def _user_namespace() -> Mapping[str, Any]:
    try:
        from IPython import get_ipython
    except ImportError:
        return {}
    ip = get_ipython()
    return ip.user_ns if ip is not None else {}


class ObjectStore(LiveWidget):
    """Live object-store use per node, and the largest objects this driver owns.

    The chart has, per node, the bytes in its shared-memory store (solid) and the bytes
    spilled to disk (dashed), a point per feed tick, keeping the last ``history`` points
    (default 600: five minutes at 2 Hz). Below it a table lists the ``max_rows`` largest
    objects this driver owns (``nbcluster.state.owned_objects()``) with the notebook
    variables that hold a ref to each (see :func:`find_ref_names`), and a **release**
    button per variable: it deletes the variable (or drops the output ``Out[n]``) and shows
    the bytes the cluster freed (:meth:`release`). Values stored inline in this process
    (small ones) count as 0 bytes in the store.

    ``user_ns``: the namespace searched for variable names (default: the IPython user
    namespace, ``get_ipython().user_ns``; no names outside IPython).
    """

    _wants_events = False
    _wants_ticks = True  # the table reads this process's refs, which the head never sees

    def __init__(
        self,
        *,
        max_rows: int = 10,
        history: int = 600,
        user_ns: Mapping[str, Any] | None = None,
        feed: Feed | None = None,
    ) -> None:
        self.max_rows = max_rows
        self.history = history
        self._user_ns = user_ns
        self._series: dict[str, collections.deque[tuple[datetime.datetime, int, int]]] = {}
        self._capacity: dict[str, int] = {}
        self._nodes: dict[str, state.NodeStats] = {}
        self.rows: list[ObjectRow] = []
        self._table_html = ""
        self._buttons_for: tuple[tuple[str, int], ...] = ()
        #: What the last release did ("released x: 76.3 MiB freed").
        self.last_release = ""
        super().__init__(feed)

    def _build(self) -> Any:
        import ipywidgets
        import plotly.graph_objects as go

        self._fig = go.FigureWidget(
            layout=go.Layout(
                title={
                    "text": "Object store: waiting for the first heartbeat",
                    "font": {"size": 13},
                },
                height=260,
                margin={"l": 10, "r": 10, "t": 50, "b": 40},
                yaxis={"title": {"text": "bytes"}, "tickformat": ".3s", "rangemode": "tozero"},
                xaxis={"type": "date"},
                legend={"orientation": "h", "y": -0.2},
            )
        )
        self._html = ipywidgets.HTML(value="")
        self._actions = ipywidgets.HBox(layout=ipywidgets.Layout(flex_flow="row wrap"))
        self._status = ipywidgets.Label(value="")
        return ipywidgets.VBox([self._fig, self._html, self._actions, self._status])

    @property
    def buttons(self) -> list[Any]:
        """The release buttons (one per variable holding a listed object)."""
        return list(self._actions.children)

    @property
    def figure(self) -> Any:
        """The plotly ``FigureWidget`` of the chart."""
        return self._fig

    @property
    def table(self) -> Any:
        """The ``ipywidgets.HTML`` of the table."""
        return self._html

    def _apply(self, update: FeedUpdate) -> None:
        if update.nodes is not None:
            self._add_points(update.time, update.nodes)
        self.refresh_table()

    def _add_points(self, t: float, nodes: Any) -> None:
        import plotly.graph_objects as go

        when = datetime.datetime.fromtimestamp(t)
        self._nodes = {n.node_id: n for n in nodes}
        for n in nodes:
            if not n.alive:
                continue
            label = node_label(n, n.node_id)
            series = self._series.get(label)
            if series is None:
                series = self._series[label] = collections.deque(maxlen=self.history)
            series.append((when, n.store_used, n.store_spilled))
            self._capacity[label] = n.store_capacity
        fig = self._fig
        have = {t.name for t in fig.data}
        for label in self._series:
            if f"{label} used" not in have:
                fig.add_trace(
                    go.Scatter(
                        name=f"{label} used",
                        mode="lines",
                        line={"shape": "hv"},
                        hovertemplate="%{y:.3s}B",
                    )
                )
                fig.add_trace(
                    go.Scatter(
                        name=f"{label} spilled",
                        mode="lines",
                        line={"dash": "dash", "shape": "hv"},
                        hovertemplate="%{y:.3s}B",
                    )
                )
        with fig.batch_update():
            for trace in fig.data:
                label, _, kind = trace.name.rpartition(" ")
                points = self._series.get(label, ())
                trace.x = [p[0] for p in points]
                trace.y = [p[1] if kind == "used" else p[2] for p in points]
            fig.layout.title.text = self._title()

    def refresh_table(self) -> None:
        """Re-read the owned objects and the variable names; redraw the table if it changed."""
        with self._lock:
            objects = state.owned_objects()[: self.max_rows]
            ns = self._user_ns if self._user_ns is not None else _user_namespace()
            names = find_ref_names(ns, {o.object_id for o in objects}) if objects else {}
            nodes = self._nodes
            rows = []
            for o in objects:
                if o.in_store:
                    where = f"store on {node_label(nodes.get(o.node_id), o.node_id)}"
                elif o.state == "ready":
                    where = "inline (this process)"
                else:
                    where = "-"
                rows.append(
                    ObjectRow(
                        o.object_id,
                        o.size,
                        o.state,
                        where,
                        o.local_refs,
                        tuple(names.get(o.object_id, ())),
                    )
                )
            self.rows = rows
            table = self._render_table(rows)
            if table != self._table_html:
                self._table_html = table
                self._html.value = table
            self._update_buttons(rows)

    def _update_buttons(self, rows: list[ObjectRow]) -> None:
        import ipywidgets

        sizes: dict[str, int] = {}
        for r in rows:
            for name in releasable(r.names):
                sizes[name] = sizes.get(name, 0) + r.size
        wanted = tuple(sizes.items())
        if wanted == self._buttons_for:
            return
        self._buttons_for = wanted
        old = self._actions.children
        buttons = []
        for name, size in wanted:
            b = ipywidgets.Button(
                description=f"release {name}",
                tooltip=f"del {name}: it holds {format_bytes(size)} of the listed objects",
                layout=ipywidgets.Layout(width="auto"),
            )
            b.on_click(lambda _b, name=name: self._release_in_background(name))
            buttons.append(b)
        self._actions.children = tuple(buttons)
        for b in old:
            b.close()

    def _namespace(self) -> MutableMapping[str, Any]:
        ns = self._user_ns if self._user_ns is not None else _user_namespace()
        if not isinstance(ns, MutableMapping):
            raise TypeError("the namespace of this widget cannot be changed")
        return ns

    def release(self, name: str) -> int:
        """Drop the notebook's reference ``name`` (a variable, or ``Out[n]``); wait until
        the cluster has freed what only it held; return the bytes freed (also shown)."""
        before = {o.object_id: o.size for o in state.owned_objects()}
        try:
            removed = release_variable(self._namespace(), name, _shell())
        except KeyError as err:
            self._set_status(f"nothing released: {err.args[0]}")
            return 0
        what = ", ".join(removed)
        self._set_status(f"released {what}: freeing ...")
        freed = freed_bytes(before)
        self._set_status(f"released {what}: {format_bytes(freed)} freed")
        self.refresh_table()
        return freed

    def _release_in_background(self, name: str) -> None:
        # A button click runs on the kernel's thread: measuring what was freed takes up to
        # a few seconds, so it goes on a thread of its own.
        threading.Thread(
            target=self.release, args=(name,), name="nbcluster-release", daemon=True
        ).start()

    def _set_status(self, text: str) -> None:
        self.last_release = text
        self._status.value = text

    def _render_table(self, rows: list[ObjectRow]) -> str:
        body = "\n".join(
            _render(
                "object_row.html",
                names=_names_text(r.names),
                object_id=r.object_id,
                size=format_bytes(r.size),
                state=r.state,
                where=r.where,
                local_refs=r.local_refs,
            )
            for r in rows
        )
        caption = (
            f"The {len(rows)} largest objects this notebook owns"
            if rows
            else "This notebook owns no objects yet"
        )
        return _render("object_table.html", raw=frozenset({"rows"}), caption=caption, rows=body)

    def _title(self) -> str:
        parts = []
        for label, series in self._series.items():
            if series:
                _, used, spilled = series[-1]
                cap = self._capacity.get(label, 0)
                extra = f", {format_bytes(spilled)} spilled" if spilled else ""
                parts.append(f"{label} {format_bytes(used)} of {format_bytes(cap)}{extra}")
        return "Object store: " + ("; ".join(parts) if parts else "no nodes")

    def close(self) -> None:
        """Stop updating and close the chart, the table and their box."""
        super().close()
        self._fig.close()
        self._html.close()
        for b in self._actions.children:
            b.close()
        self._actions.close()
        self._status.close()

    def _disconnected(self) -> None:
        with self._fig.batch_update():
            self._fig.layout.title.text = self._title() + " (disconnected)"

    def _text(self) -> str:
        with self._lock:
            lines = [
                self._title() if self._series else "Object store: waiting for the first heartbeat"
            ]
            for r in self.rows:
                held = _names_text(r.names)
                lines.append(f"  {format_bytes(r.size):>10}  {r.object_id}  {r.state:<7}  {held}")
            return "\n".join(lines)


def _names_text(names: tuple[str, ...]) -> str:
    if not names:
        return "(no variable)"
    shown = ", ".join(names[:_MAX_NAMES_SHOWN])
    return shown + (
        f" +{len(names) - _MAX_NAMES_SHOWN} more" if len(names) > _MAX_NAMES_SHOWN else ""
    )
