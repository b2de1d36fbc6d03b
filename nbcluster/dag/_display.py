"""Drawings of a DAG: an SVG in HTML (the notebook display) and a static plotly figure.

Both lay the graph out left to right by depth (the longest path from a source), one
column per depth, nodes of a column in execution order. The HTML comes from the
``string.Template`` files in ``templates/``; every value put into them is HTML-escaped,
since labels come from user code. plotly is imported only by :func:`to_figure`.
"""

from __future__ import annotations

import dataclasses
import functools
import html
import string
from importlib import resources
from typing import Any

from nbcluster.dag._dag_node import DAGNode, Edge, collect, depths, graph_edges
from nbcluster.dag._format import call_text, listing, option_text

__all__ = ["Layout", "layout", "to_figure", "to_html"]

#: Graphs with more nodes are shown as text, not drawn.
MAX_DRAWN = 300
_W, _H, _GAP_X, _GAP_Y, _PAD = 150, 40, 56, 14, 12
_LABEL_CHARS = 22
#: Fill and stroke per node kind.
KIND_COLORS = {
    "InputNode": ("#e8f0fe", "#4a78c2"),
    "InputAttributeNode": ("#e8f0fe", "#4a78c2"),
    "FunctionNode": ("#e9f5e9", "#3a8a3a"),
    "ClassNode": ("#fdf0e0", "#c77a1a"),
    "ClassMethodNode": ("#fff8ea", "#c77a1a"),
    "MultiOutputNode": ("#f1eaf8", "#7a4fb0"),
}
_EDGE_COLORS = {"actor": "#c77a1a", "order": "#c77a1a"}


@dataclasses.dataclass
class Layout:
    """Where each node goes: ``column`` (its depth) and ``row`` (centred on 0)."""

    nodes: list[DAGNode]
    edges: list[Edge]
    column: dict[int, int]
    row: dict[int, float]

    @property
    def columns(self) -> int:
        """Number of columns."""
        return max(self.column.values(), default=-1) + 1

    @property
    def rows(self) -> int:
        """Nodes in the fullest column."""
        counts: dict[int, int] = {}
        for c in self.column.values():
            counts[c] = counts.get(c, 0) + 1
        return max(counts.values(), default=0)


def layout(root: DAGNode) -> Layout:
    """Columns by depth, rows by execution order within a column."""
    nodes = collect(root)
    edges = graph_edges(nodes)
    column = depths(nodes, edges)
    by_column: dict[int, list[DAGNode]] = {}
    for node in nodes:
        by_column.setdefault(column[id(node)], []).append(node)
    row: dict[int, float] = {}
    for members in by_column.values():
        for i, node in enumerate(members):
            row[id(node)] = i - (len(members) - 1) / 2
    return Layout(nodes, edges, column, row)


def _tooltip(node: DAGNode) -> str:
    opts = node._display_options()
    text = f"{type(node).__name__} {node.get_id()}\n{call_text(node)}"
    return text + (f"\noptions={option_text(opts)}" if opts else "")


def _cut(text: str, n: int = _LABEL_CHARS) -> str:
    return text if len(text) <= n else text[: n - 1] + "…"


# ------------------------------------------------------------------------------ HTML


@dataclasses.dataclass(frozen=True)
class _Markup:
    """Markup built here from escaped parts: inserted into a template as it is."""

    html: str


@functools.cache
def _template(name: str) -> string.Template:
    text = resources.files("nbcluster.dag").joinpath("templates", name).read_text("utf-8")
    return string.Template(text)


def _render(name: str, /, **values: object) -> str:
    escaped = {
        k: v.html if isinstance(v, _Markup) else html.escape(str(v), quote=True)
        for k, v in values.items()
    }
    return _template(name).substitute(escaped)


def _title(root: DAGNode, lay_nodes: int, edges: int) -> str:
    return f"DAG: {lay_nodes} node(s), {edges} edge(s); output {root!r}"


def to_html(root: DAGNode) -> str:
    """The graph as an SVG drawing (text for graphs of more than 300 nodes)."""
    lay = layout(root)
    title = _title(root, len(lay.nodes), len(lay.edges))
    if len(lay.nodes) > MAX_DRAWN:
        return _render("dag_large.html", title=title + " (too large to draw)", text=listing(root))
    height = _PAD * 2 + lay.rows * _H + max(lay.rows - 1, 0) * _GAP_Y
    width = _PAD * 2 + lay.columns * _W + max(lay.columns - 1, 0) * _GAP_X
    mid = height / 2

    def xy(node: DAGNode) -> tuple[float, float]:
        x = _PAD + lay.column[id(node)] * (_W + _GAP_X)
        y = mid - _H / 2 + lay.row[id(node)] * (_H + _GAP_Y)
        return x, y

    edges = []
    for a, b, kind in lay.edges:
        (ax, ay), (bx, by) = xy(a), xy(b)
        x1, y1, x2, y2 = ax + _W, ay + _H / 2, bx, by + _H / 2
        cx = (x1 + x2) / 2
        edges.append(
            _render(
                "dag_edge.svg",
                d=f"M {x1:.1f} {y1:.1f} C {cx:.1f} {y1:.1f}, {cx:.1f} {y2:.1f}, {x2:.1f} {y2:.1f}",
                stroke=_EDGE_COLORS.get(kind, "#888"),
                dash="4 3" if kind == "order" else "none",
                tooltip=f"{a.get_id()} → {b.get_id()} ({kind})",
            )
        )
    nodes = []
    for node in lay.nodes:
        x, y = xy(node)
        fill, stroke = KIND_COLORS.get(type(node).__name__, ("#f4f4f4", "#666"))
        nodes.append(
            _render(
                "dag_node.svg",
                id=node.get_id(),
                tooltip=_tooltip(node),
                x=f"{x:.1f}",
                y=f"{y:.1f}",
                w=_W,
                h=_H,
                fill=fill,
                stroke=stroke,
                stroke_width=2.5 if node is root else 1,
                tx=f"{x + _W / 2:.1f}",
                ty1=f"{y + 17:.1f}",
                ty2=f"{y + 32:.1f}",
                label=_cut(node._body()),
                sublabel=f"{type(node).__name__} {node.get_id()}",
            )
        )
    return _render(
        "dag.html",
        title=title,
        width=width,
        height=height,
        edges=_Markup("\n".join(edges)),
        nodes=_Markup("\n".join(nodes)),
    )


# ------------------------------------------------------------------------------ plotly


def to_figure(root: DAGNode) -> Any:
    """A static plotly ``Figure``: one marker trace per node kind, lines for edges."""
    import plotly.graph_objects as go

    lay = layout(root)
    traces: list[Any] = []
    for dashed in (False, True):
        xs: list[float | None] = []
        ys: list[float | None] = []
        for a, b, kind in lay.edges:
            if (kind == "order") != dashed:
                continue
            xs += [lay.column[id(a)], lay.column[id(b)], None]
            ys += [-lay.row[id(a)], -lay.row[id(b)], None]
        traces.append(
            go.Scatter(
                x=xs,
                y=ys,
                mode="lines",
                name="call order" if dashed else "dependency",
                line={
                    "color": "#c77a1a" if dashed else "#999",
                    "width": 1,
                    "dash": "dash" if dashed else "solid",
                },
                hoverinfo="skip",
                showlegend=dashed and bool(xs),
            )
        )
    for kind, (fill, stroke) in KIND_COLORS.items():
        members = [n for n in lay.nodes if type(n).__name__ == kind]
        if not members:
            continue
        traces.append(
            go.Scatter(
                name=kind,
                x=[lay.column[id(n)] for n in members],
                y=[-lay.row[id(n)] for n in members],
                mode="markers+text",
                text=[_cut(n._body()) for n in members],
                textposition="top center",
                hovertext=[html.escape(_tooltip(n)).replace("\n", "<br>") for n in members],
                hoverinfo="text",
                marker={
                    "size": [18 if n is root else 13 for n in members],
                    "color": fill,
                    "line": {"color": stroke, "width": 2},
                },
            )
        )
    return go.Figure(
        data=traces,
        layout=go.Layout(
            title={
                "text": html.escape(_title(root, len(lay.nodes), len(lay.edges))),
                "font": {"size": 13},
            },
            height=min(900, 180 + 50 * max(lay.rows, 1)),
            margin={"l": 10, "r": 10, "t": 50, "b": 30},
            xaxis={"title": {"text": "depth"}, "dtick": 1, "zeroline": False},
            yaxis={"visible": False},
            legend={"orientation": "h", "y": -0.15},
        ),
    )
