"""``Dataset.preview()``: one block through every operator, with a sample after each.

The first block of the source (the first read task, or the first block in the store) is
pushed through the operators of the plan in one task on the cluster: map-like operators
run their functions (a callable class is built once), all-to-all operators are applied to
that one block (a sort sorts it, a groupby aggregates it), a limit slices it. After each
operator the task keeps the row count, the schema and the first rows. An operator that
raises ends the preview there, with its error shown, which is a quick way to find the
step that breaks before running the whole dataset.
"""

from __future__ import annotations

import dataclasses
import html
import traceback
from typing import Any

import numpy as np
import pyarrow as pa

import nbcluster
from nbcluster.data._all_to_all import _group_bounds
from nbcluster.data._block import concat
from nbcluster.data._datasource import ReadTask
from nbcluster.data._display import Markup, render
from nbcluster.data._logical import AllToAll, InputData, Limit, LogicalOp, MapLike, Read, Union
from nbcluster.data._optimizer import optimize
from nbcluster.data.aggregate import aggregate_block, combine

__all__ = ["Preview", "PreviewStep", "preview"]


@dataclasses.dataclass
class PreviewStep:
    """What one operator made of the block."""

    name: str
    rows: int
    schema: str
    sample: pa.Table | None
    note: str = ""


def _chain(plan: LogicalOp) -> list[LogicalOp]:
    chain = [plan]
    while chain[-1].inputs:
        chain.append(chain[-1].inputs[0])
    return chain[::-1]


def _apply(op: LogicalOp, table: pa.Table) -> tuple[pa.Table, str]:
    if isinstance(op, MapLike):
        op.stage.open()
        return concat(list(op.stage.apply(iter([table])))), ""
    if isinstance(op, Limit):
        return table.slice(0, op.n), ""
    if isinstance(op, Union):
        return table, "the other inputs of the union are not shown"
    if isinstance(op, AllToAll):
        p = op.params
        if op.kind == "sort":
            keys = [
                (k, "descending" if d else "ascending", "at_end")
                for k, d in zip(p["keys"], p["descending"], strict=True)
            ]
            return table.sort_by(keys), "sorted within this block only"
        if op.kind == "aggregate":
            return combine(
                aggregate_block(table, p["keys"], p["aggs"]), p["keys"], p["aggs"]
            ), "groups of this block only"
        if op.kind == "random_shuffle":
            rng = np.random.default_rng(p.get("seed"))
            return table.take(
                pa.array(rng.permutation(table.num_rows))
            ), "shuffled within this block only"
        if op.kind == "map_groups":
            stage = p["stage"]
            stage.open()
            keys = p["keys"]
            out = []
            if table.num_rows:
                t = table.sort_by([(k, "ascending", "at_end") for k in keys]) if keys else table
                bounds = _group_bounds(t, keys) if keys else [0, t.num_rows]
                for s, e in zip(bounds[:-1], bounds[1:], strict=True):
                    out.extend(stage.apply(iter([t.slice(s, e - s)])))
            return concat(out), "groups of this block only"
        return table, f"{op.name}: shown unchanged (it needs every block)"
    return table, ""


@nbcluster.remote
def _preview_task(source: Any, ops: list[LogicalOp], names: list[str], n: int) -> list[PreviewStep]:
    table = concat(list(source())) if isinstance(source, ReadTask) else source
    steps = [PreviewStep(names[0], table.num_rows, _schema_text(table.schema), table.slice(0, n))]
    for op, name in zip(ops, names[1:], strict=True):
        try:
            table, note = _apply(op, table)
        except Exception as err:  # noqa: BLE001 - shown as the preview's result
            tb = "".join(traceback.format_exception_only(type(err), err)).strip()
            steps.append(PreviewStep(name, 0, "", None, f"raised {tb}"))
            break
        steps.append(
            PreviewStep(name, table.num_rows, _schema_text(table.schema), table.slice(0, n), note)
        )
    return steps


def _schema_text(schema: pa.Schema) -> str:
    return ", ".join(f"{f.name}: {f.type}" for f in schema) or "(no columns)"


class Preview:
    """The result of ``Dataset.preview()``: a step per operator (rich display in Jupyter)."""

    def __init__(self, steps: list[PreviewStep]) -> None:
        self.steps = steps

    def __repr__(self) -> str:
        lines = []
        for i, s in enumerate(self.steps):
            lines.append(
                f"{i}. {s.name} -> {s.rows} rows; {s.schema}" + (f"  [{s.note}]" if s.note else "")
            )
            if s.sample is not None:
                for row in s.sample.to_pylist():
                    lines.append(f"     {row}")
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        parts = []
        for i, s in enumerate(self.steps):
            sample = ""
            if s.sample is not None and s.sample.num_columns:
                head = "".join(f"<th>{html.escape(c)}</th>" for c in s.sample.column_names)
                body = "".join(
                    "<tr>"
                    + "".join(f"<td>{html.escape(_short(v))}</td>" for v in row.values())
                    + "</tr>"
                    for row in s.sample.to_pylist()
                )
                sample = render("sample_table.html", head=Markup(head), body=Markup(body))
            parts.append(
                render(
                    "preview_step.html",
                    index=i,
                    name=s.name,
                    rows=s.rows,
                    schema=s.schema,
                    note=s.note,
                    sample=Markup(sample),
                )
            )
        return render(
            "preview.html",
            source_rows=self.steps[0].rows if self.steps else 0,
            steps=Markup("".join(parts)),
        )


def _short(v: Any, n: int = 60) -> str:
    text = repr(v) if not isinstance(v, str) else v
    return text if len(text) <= n else text[: n - 1] + "…"


def preview(plan: LogicalOp, n: int = 5, tries: int = 4) -> Preview:
    """Run the first block of ``plan``'s source through its operators (one task).

    The optimized plan is previewed (what actually runs: filters and projections pushed
    into the read show as part of it). When nothing comes out of the last operator (a
    filter dropped every row of that block), the next source blocks are tried, up to
    ``tries`` in all.
    """
    chain = _chain(optimize(plan))
    source_op = chain[0]
    if isinstance(source_op, InputData):
        sources: list[Any] = [b.block for b in source_op.bundles[:tries]]
    elif isinstance(source_op, Read):
        sources = list(source_op.tasks[:tries])
    else:  # pragma: no cover - every plan starts at a source
        raise TypeError(f"cannot preview from {source_op.name}")
    if not sources:
        return Preview([PreviewStep(source_op.name, 0, "", None, "the dataset is empty")])
    names = [op.name for op in chain]
    steps: list[PreviewStep] = []
    for source in sources:
        steps = nbcluster.get(_preview_task.remote(source, chain[1:], names, n))
        if steps[-1].rows or steps[-1].note.startswith("raised"):
            break
    return Preview(steps)
