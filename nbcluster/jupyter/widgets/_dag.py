"""``DAGView``: the tasks behind some refs as a graph, coloured live by state."""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Iterable
from typing import Any

from nbcluster import state
from nbcluster._refs import ObjectRef
from nbcluster.jupyter.widgets._base import LiveWidget, format_seconds
from nbcluster.jupyter.widgets._feed import Feed, FeedUpdate

__all__ = ["DAGView", "DagNode"]

#: Node states in legend order, with their colours. ``running`` is drawn once
#: ``nbcluster.state`` can tell a running task from a queued one (see ``DAGView``).
STATE_COLORS = {
    "pending": "#bbbbbb",
    "running": "#ff7f0e",
    "finished": "#2ca02c",
    "failed": "#d62728",
}
MAX_NODES = 5000

Endpoint = ObjectRef | str


def task_key(x: Endpoint) -> str:
    """The task id (hex) behind a ref, an object id (40 hex digits) or a task id."""
    if isinstance(x, ObjectRef):
        return x.task_id().hex()
    if not isinstance(x, str):
        raise TypeError(f"DAG nodes are ObjectRefs or hex ids, got {type(x).__name__}")
    return x[:32] if len(x) == 40 else x


@dataclasses.dataclass
class DagNode:
    """One task in the graph."""

    key: str
    refs: list[ObjectRef]
    name: str = ""
    state: str = "pending"
    duration: float | None = None
    depth: int = 0
    row: float = 0.0


def layout_depths(keys: list[str], edges: list[tuple[str, str]]) -> dict[str, int]:
    """Depth of each node: the longest dependency path that leads to it (roots are 0).

    Nodes on a cycle (which a real lineage cannot have) go one column after the rest.
    """
    children: dict[str, list[str]] = collections.defaultdict(list)
    indeg = dict.fromkeys(keys, 0)
    for a, b in edges:
        children[a].append(b)
        indeg[b] += 1
    depth = dict.fromkeys(keys, 0)
    queue = collections.deque(k for k in keys if indeg[k] == 0)
    seen = 0
    while queue:
        k = queue.popleft()
        seen += 1
        for c in children[k]:
            depth[c] = max(depth[c], depth[k] + 1)
            indeg[c] -= 1
            if indeg[c] == 0:
                queue.append(c)
    if seen < len(keys):
        last = max(depth.values(), default=0) + 1
        for k in keys:
            if indeg[k] > 0:
                depth[k] = last
    return depth


class DAGView(LiveWidget):
    """The graph of the tasks behind ``refs`` (plotly ``FigureWidget``), live.

    Nodes are tasks (a task with several return refs is one node; a ``put`` is a node of
    its own), laid out left to right by dependency depth and coloured by state: pending,
    finished, failed (``running`` is in the legend for when the runtime reports it). The
    state of a node that is a ref comes from ``nbcluster.state.ref_info``; names and run
    times come from the task events of the feed.

    The runtime does not expose lineage yet, so dependencies are not discovered: pass
    ``edges`` as ``(upstream, downstream)`` pairs of refs (or hex object/task ids) to draw
    them; their endpoints become nodes too. Without edges every node is at depth 0.
    At most 5,000 nodes are drawn.
    """

    _wants_nodes = False
    _wants_ticks = True  # node states come from this process's refs

    def __init__(
        self,
        refs: Iterable[ObjectRef] = (),
        edges: Iterable[tuple[Endpoint, Endpoint]] | None = None,
        *,
        feed: Feed | None = None,
    ) -> None:
        self.nodes: dict[str, DagNode] = {}
        for r in refs:
            if not isinstance(r, ObjectRef):
                raise TypeError(f"DAGView expects ObjectRefs, got {type(r).__name__}")
            self._node(r).refs.append(r)
        self.edges: list[tuple[str, str]] = []
        for a, b in edges or ():
            ka, kb = task_key(a), task_key(b)
            for end in (a, b):
                node = self._node(end)
                if isinstance(end, ObjectRef) and end not in node.refs:
                    node.refs.append(end)
            if (ka, kb) not in self.edges and ka != kb:
                self.edges.append((ka, kb))
        if len(self.nodes) > MAX_NODES:
            raise ValueError(
                f"DAGView draws at most {MAX_NODES} tasks, got {len(self.nodes)}; "
                "pass a subset of the refs, or use Timeline() for large runs"
            )
        depths = layout_depths(list(self.nodes), self.edges)
        columns: dict[int, list[DagNode]] = collections.defaultdict(list)
        for key, node in self.nodes.items():
            node.depth = depths[key]
            columns[node.depth].append(node)
        for col in columns.values():
            for i, node in enumerate(col):
                node.row = i - (len(col) - 1) / 2
        super().__init__(feed)

    def _node(self, x: Endpoint) -> DagNode:
        key = task_key(x)
        node = self.nodes.get(key)
        if node is None:
            node = self.nodes[key] = DagNode(key, [])
        return node

    def _build(self) -> Any:
        import plotly.graph_objects as go

        ex, ey = [], []
        for a, b in self.edges:
            na, nb = self.nodes[a], self.nodes[b]
            ex += [na.depth, nb.depth, None]
            ey += [na.row, nb.row, None]
        traces = [
            go.Scatter(
                x=ex,
                y=ey,
                mode="lines",
                name="dependency",
                line={"color": "#999", "width": 1},
                hoverinfo="skip",
                showlegend=False,
            )
        ]
        for st, color in STATE_COLORS.items():
            traces.append(
                go.Scatter(
                    name=st,
                    mode="markers+text",
                    textposition="top center",
                    marker={"color": color, "size": 14, "line": {"width": 1, "color": "#444"}},
                    hovertemplate="%{customdata}<extra></extra>",
                    x=[],
                    y=[],
                )
            )
        rows = max(
            (sum(1 for n in self.nodes.values() if n.depth == d) for d in self._depths()), default=1
        )
        fig = go.FigureWidget(
            data=traces,
            layout=go.Layout(
                title={"text": self._title(), "font": {"size": 13}},
                height=min(900, 160 + 32 * rows),
                margin={"l": 10, "r": 10, "t": 50, "b": 30},
                xaxis={
                    "title": {"text": "dependency depth"},
                    "dtick": 1,
                    "zeroline": False,
                    "range": [-0.5, max(self._depths(), default=0) + 0.5],
                },
                # Room above the top row for its labels.
                yaxis={"visible": False, "range": [-(rows - 1) / 2 - 0.6, (rows - 1) / 2 + 0.9]},
                legend={"orientation": "h", "y": -0.15},
            ),
        )
        self._draw(fig)
        return fig

    def _depths(self) -> set[int]:
        return {n.depth for n in self.nodes.values()}

    @property
    def figure(self) -> Any:
        """The plotly ``FigureWidget``."""
        return self.widget

    def refresh_states(self) -> bool:
        """Re-read each node's state from its refs; return whether any changed."""
        changed = False
        for node in self.nodes.values():
            known = [i for i in (state.ref_info(r) for r in node.refs) if i is not None]
            if not known:
                continue
            if any(i.state == "failed" for i in known):
                new = "failed"
            elif all(i.state == "ready" for i in known):
                new = "finished"
            else:
                new = "pending"
            if new != node.state:
                node.state = new
                changed = True
        return changed

    def _apply(self, update: FeedUpdate) -> None:
        changed = False
        for e in update.events:
            node = self.nodes.get(e.task_id)
            if node is None:
                continue
            node.name = e.name
            node.duration = e.end_time - e.start_time
            if not node.refs:  # a node known only by id: its state comes from its events
                node.state = "failed" if e.state == "FAILED" else "finished"
            changed = True
        if self.refresh_states() or changed:
            self._draw(self.widget)

    def _draw(self, fig: Any) -> None:
        by_state: dict[str, list[DagNode]] = {s: [] for s in STATE_COLORS}
        for node in self.nodes.values():
            by_state.setdefault(node.state, []).append(node)
        with fig.batch_update():
            for trace in fig.data[1:]:
                nodes = by_state.get(trace.name, [])
                trace.x = [n.depth for n in nodes]
                trace.y = [n.row for n in nodes]
                trace.text = [n.name or n.key[-8:] for n in nodes]
                trace.customdata = [self._hover(n) for n in nodes]
            fig.layout.title.text = self._title()

    @staticmethod
    def _hover(n: DagNode) -> str:
        parts = [f"<b>{n.name or 'task'}</b>", f"task {n.key}", n.state]
        if n.duration is not None:
            parts.append(f"ran {format_seconds(n.duration)}")
        if n.refs:
            parts.append(f"{len(n.refs)} ref(s): " + ", ".join(r.hex() for r in n.refs[:3]))
        return "<br>".join(parts)

    def counts(self) -> dict[str, int]:
        """How many nodes are in each state."""
        out = dict.fromkeys(STATE_COLORS, 0)
        for n in self.nodes.values():
            out[n.state] = out.get(n.state, 0) + 1
        return out

    def _title(self) -> str:
        c = self.counts()
        parts = [f"{v} {k}" for k, v in c.items() if v]
        return f"Task graph: {len(self.nodes)} tasks, {len(self.edges)} dependencies" + (
            " (" + ", ".join(parts) + ")" if parts else ""
        )

    def _disconnected(self) -> None:
        with self.widget.batch_update():
            self.widget.layout.title.text = self._title() + " (disconnected)"

    def _text(self) -> str:
        lines = [self._title().replace("Task graph", "DAGView")]
        for depth in sorted(self._depths())[:20]:
            col = [n for n in self.nodes.values() if n.depth == depth]
            cells = ", ".join(f"{n.name or n.key[-8:]}={n.state}" for n in col[:8])
            more = f" +{len(col) - 8} more" if len(col) > 8 else ""
            lines.append(f"  depth {depth}: {cells}{more}")
        return "\n".join(lines)
