"""How a dataset shows itself: text, and HTML from the templates in ``templates/``.

Neither runs the plan: they show what is known (schema from the plan or a cached fetch,
row count from metadata, blocks and size of a materialized dataset) and ``?`` for the
rest. Every value put into the HTML is escaped, since column names and operator names
come from user code.
"""

from __future__ import annotations

import functools
import html
import string
from importlib import resources
from typing import Any

from nbcluster.data._logical import (
    AllToAll,
    InputData,
    LogicalOp,
    MapLike,
    Read,
    known_count,
    known_schema,
    walk,
)
from nbcluster.data._stats import format_bytes
from nbcluster.data.compute import ActorPoolStrategy

__all__ = ["Markup", "dataset_html", "dataset_text", "op_colors", "render"]

#: Fill and stroke per operator family.
_COLORS = {
    "source": ("#e8f0fe", "#4a78c2"),
    "map": ("#e9f5e9", "#3a8a3a"),
    "actors": ("#fdf0e0", "#c77a1a"),
    "all_to_all": ("#f1eaf8", "#7a4fb0"),
    "other": ("#f4f4f4", "#666666"),
}


class Markup(str):
    """HTML built here from escaped parts: inserted into a template as it is."""


@functools.cache
def _template(name: str) -> string.Template:
    text = resources.files("nbcluster.data").joinpath("templates", name).read_text("utf-8")
    return string.Template(text)


def render(name: str, /, **values: object) -> str:
    """Fill ``templates/<name>``; every value not wrapped in :class:`Markup` is escaped."""
    escaped = {
        k: str(v) if isinstance(v, Markup) else html.escape(str(v), quote=True)
        for k, v in values.items()
    }
    return _template(name).substitute(escaped)


def op_colors(op: LogicalOp) -> tuple[str, str]:
    """(fill, stroke) of an operator's box."""
    if isinstance(op, InputData | Read):
        return _COLORS["source"]
    if isinstance(op, MapLike):
        return _COLORS["actors" if isinstance(op.compute, ActorPoolStrategy) else "map"]
    if isinstance(op, AllToAll):
        return _COLORS["all_to_all"]
    return _COLORS["other"]


def _facts(ds: Any) -> tuple[str, int | None, Any, int | None, int | None]:
    plan = ds._plan
    kind = type(ds).__name__
    rows = known_count(plan)
    if rows is None:
        rows = ds._cache.get("count")
    schema = known_schema(plan) or ds._cache.get("schema")
    blocks = size = None
    if isinstance(plan, InputData):
        blocks = len(plan.bundles)
        size = sum(b.meta.size_bytes for b in plan.bundles)
    return kind, rows, schema, blocks, size


def dataset_text(ds: Any) -> str:
    """``Dataset(num_rows=..., schema={...})`` and the plan on a second line."""
    kind, rows, schema, blocks, size = _facts(ds)
    cols = (
        "?"
        if schema is None
        else "{"
        + ", ".join(f"{n}: {t}" for n, t in zip(schema.names, schema.types, strict=True))
        + "}"
    )
    parts = []
    if blocks is not None:
        parts.append(f"num_blocks={blocks}")
    parts.append(f"num_rows={'?' if rows is None else rows}")
    parts.append(f"schema={cols}")
    head = f"{kind}({', '.join(parts)})"
    ops = walk(ds._plan)
    if len(ops) > 1 or not isinstance(ds._plan, InputData):
        head += "\n  plan: " + " -> ".join(op.name for op in ops)
    return head


def _plan_html(plan: LogicalOp) -> str:
    boxes = []
    for op in walk(plan):
        fill, stroke = op_colors(op)
        boxes.append(
            render(
                "plan_box.html", name=op.name, tooltip=type(op).__name__, fill=fill, stroke=stroke
            )
        )
    return " → ".join(boxes)


def dataset_html(ds: Any) -> str:
    """The dataset card: kind, rows, blocks, size, the plan as boxes, the schema."""
    kind, rows, schema, blocks, size = _facts(ds)
    facts = [f"{'?' if rows is None else f'{rows:,}'} rows"]
    if blocks is not None:
        facts.append(f"{blocks} blocks")
    if size is not None:
        facts.append(format_bytes(size))
    if schema is None:
        schema_rows = "<tr><td colspan='2'>unknown until it runs (ds.schema() fetches it)</td></tr>"
        ncols: object = "?"
    else:
        schema_rows = "".join(
            f"<tr><td>{html.escape(n)}</td><td><code>{html.escape(str(t))}</code></td></tr>"
            for n, t in zip(schema.names, schema.types, strict=True)
        )
        ncols = len(schema.names)
    return render(
        "dataset.html",
        kind=kind,
        summary=" · ".join(facts),
        plan=Markup(_plan_html(ds._plan)),
        schema_rows=Markup(schema_rows),
        ncols=ncols,
        open_schema=Markup("open" if schema is not None and len(schema.names) <= 12 else ""),
    )
