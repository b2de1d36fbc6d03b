"""Aggregations: ``Count``, ``Sum``, ``Min``, ``Max``, ``Mean``, ``Std`` and ``AggregateFn``.

Names and output columns follow Ray (``count()``, ``sum(x)``, ``mean(x)``...; nulls are
ignored unless ``ignore_nulls=False``). An aggregation runs in three steps, so that the
data is reduced where it lies and only small partial results move:

1. ``partial``: each block is grouped (Arrow's hash ``group_by``) into partial states —
   sums, counts, minima, or for ``Std`` the count, mean and sum of squared deviations;
2. ``combine``: the partial states of one group, from every block, are merged;
3. ``finalize``: the merged state becomes the result (a mean is sum / count; a standard
   deviation uses Chan's parallel formula).

:class:`AggregateFn` takes Python functions (``init``, ``accumulate_block`` or
``accumulate_row``, ``merge``, ``finalize``) for anything else; its states are pickled.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from nbcluster.data._block import iter_rows

__all__ = ["AggregateFn", "Count", "Max", "Mean", "Min", "Std", "Sum", "aggregate_block", "combine"]


class AggregateFn:
    """A user-defined aggregation (Ray's ``AggregateFn``).

    ``init(key) -> state``; ``accumulate_block(state, block) -> state`` (the block is a
    ``pyarrow.Table`` of one group's rows) or ``accumulate_row(state, row) -> state``;
    ``merge(state, state) -> state``; ``finalize(state) -> value`` (default: the state).
    ``name`` is the output column.
    """

    def __init__(
        self,
        init: Callable[[Any], Any],
        merge: Callable[[Any, Any], Any],
        accumulate_row: Callable[[Any, Any], Any] | None = None,
        accumulate_block: Callable[[Any, pa.Table], Any] | None = None,
        finalize: Callable[[Any], Any] | None = None,
        name: str | None = None,
    ) -> None:
        if (accumulate_row is None) == (accumulate_block is None):
            raise ValueError("AggregateFn needs exactly one of accumulate_row and accumulate_block")
        self.init = init
        self.merge = merge
        self.accumulate_row = accumulate_row
        self.accumulate_block = accumulate_block
        self.finalize = finalize or (lambda s: s)
        self.name = name or "agg"

    def _columns(self) -> list[str]:
        return []

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"


class _Builtin(AggregateFn):
    """An aggregation computed with Arrow kernels."""

    kind = ""

    def __init__(
        self, on: str | None, ignore_nulls: bool = True, alias_name: str | None = None
    ) -> None:
        if on is not None and not isinstance(on, str):
            raise TypeError(f"{type(self).__name__}(on=...) takes a column name, got {on!r}")
        self.on = on
        self.ignore_nulls = ignore_nulls
        self.name = alias_name or f"{self.kind}({on or ''})"

    def _columns(self) -> list[str]:
        return [self.on] if self.on else []


class Count(_Builtin):
    """Rows per group (``on=col``: rows where ``col`` is not null)."""

    kind = "count"

    def __init__(
        self, on: str | None = None, ignore_nulls: bool = False, alias_name: str | None = None
    ) -> None:
        super().__init__(on, ignore_nulls, alias_name)


class Sum(_Builtin):
    """Sum of ``on`` (nulls ignored)."""

    kind = "sum"


class Min(_Builtin):
    """Minimum of ``on``."""

    kind = "min"


class Max(_Builtin):
    """Maximum of ``on``."""

    kind = "max"


class Mean(_Builtin):
    """Mean of ``on``."""

    kind = "mean"


class Std(_Builtin):
    """Standard deviation of ``on`` with ``ddof`` (1: the sample standard deviation)."""

    kind = "std"

    def __init__(
        self,
        on: str | None = None,
        ddof: int = 1,
        ignore_nulls: bool = True,
        alias_name: str | None = None,
    ) -> None:
        super().__init__(on, ignore_nulls, alias_name)
        self.ddof = ddof


def check_aggs(aggs: Sequence[AggregateFn], names: Sequence[str] | None, where: str) -> None:
    """Raise at once for a non-aggregation or an unknown column (when the schema is known)."""
    if not aggs:
        raise ValueError(f"{where} needs at least one aggregation, e.g. Count() or Sum('x')")
    for a in aggs:
        if not isinstance(a, AggregateFn):
            raise TypeError(
                f"{where}: {a!r} is not an aggregation (Count, Sum, Mean, AggregateFn...)"
            )
        if names is not None:
            for c in a._columns():
                if c not in names:
                    raise KeyError(
                        f"{where}: column {c!r} not found; the dataset has columns {list(names)}"
                    )


# ----------------------------------------------------------------------- the three steps

_PARTIALS = {
    "count": lambda a: [("n", [] if not a.on else a.on, "count_all" if not a.on else "count")],
    "sum": lambda a: [("s", a.on, "sum"), ("c", a.on, "count")],
    "min": lambda a: [("m", a.on, "min")],
    "max": lambda a: [("m", a.on, "max")],
    "mean": lambda a: [("s", a.on, "sum"), ("c", a.on, "count")],
    "std": lambda a: [("c", a.on, "count"), ("mu", a.on, "mean"), ("v", a.on, "variance")],
}


def aggregate_block(block: pa.Table, keys: Sequence[str], aggs: Sequence[AggregateFn]) -> pa.Table:
    """Step 1: the partial states of ``block``'s groups (keys + one column per state)."""
    keys = list(keys)
    for c in keys + [c for a in aggs for c in a._columns()]:
        if c not in block.column_names:
            if block.num_rows == 0 and not block.num_columns:
                return pa.table({})
            raise KeyError(
                f"aggregate: column {c!r} not found; the dataset has columns {block.column_names}"
            )
    requests: list[tuple[Any, str, Any]] = []
    names: list[str] = []
    custom: list[tuple[int, AggregateFn]] = []
    for i, a in enumerate(aggs):
        if isinstance(a, _Builtin):
            for tag, col, fn in _PARTIALS[a.kind](a):
                opts = pc.VarianceOptions(ddof=0) if fn == "variance" else None
                if fn == "count" and not a.ignore_nulls and a.kind == "count":
                    opts = pc.CountOptions(mode="all")
                requests.append((col, fn, opts) if opts is not None else (col, fn))
                names.append(f"__a{i}_{tag}")
        else:
            custom.append((i, a))
    if requests:
        out = block.group_by(keys, use_threads=False).aggregate(requests)
        # Arrow puts the keys first (recent versions) or last; aggregates keep request order.
        k = len(keys)
        keys_first = out.column_names[:k] == keys
        agg_idx = range(k, k + len(names)) if keys_first else range(len(names))
        key_idx = range(k) if keys_first else range(len(names), len(names) + k)
        arrays = [out.column(i) for i in key_idx] + [out.column(i) for i in agg_idx]
        out = pa.Table.from_arrays(arrays, names=keys + names)
    else:
        out = block.group_by(keys, use_threads=False).aggregate([([], "count_all")]).select(keys)
    for i, a in custom:
        out = out.append_column(f"__a{i}_state", _custom_states(block, keys, out, a))
    return out


def _custom_states(block: pa.Table, keys: list[str], groups: pa.Table, a: AggregateFn) -> pa.Array:
    states = []
    for g in range(groups.num_rows):
        key_vals = [groups.column(k)[g].as_py() for k in keys]
        mask = None
        for k, v in zip(keys, key_vals, strict=True):
            m = pc.is_null(block.column(k)) if v is None else pc.equal(block.column(k), v)
            mask = m if mask is None else pc.and_(mask, m)
        part = block.filter(mask) if mask is not None else block
        key = key_vals[0] if len(key_vals) == 1 else (tuple(key_vals) if key_vals else None)
        state = a.init(key)
        if a.accumulate_block is not None:
            state = a.accumulate_block(state, part)
        else:
            assert a.accumulate_row is not None
            for row in iter_rows(part):
                state = a.accumulate_row(state, row)
        states.append(pickle.dumps(state))
    return pa.array(states, pa.binary())


def combine(partials: pa.Table, keys: Sequence[str], aggs: Sequence[AggregateFn]) -> pa.Table:
    """Steps 2 and 3: merge the partial states of each group and finalize them.

    Vectorized over groups (pandas ``groupby`` sums of the partial columns); the result is
    sorted by the keys, nulls last (as Ray's groupby output is).
    """
    import pandas as pd

    keys = list(keys)
    df = partials.to_pandas() if partials.num_columns else pd.DataFrame()
    if keys:
        if not len(df):
            empty = {
                k: pa.array(
                    [], partials.schema.field(k).type if k in partials.column_names else pa.null()
                )
                for k in keys
            }
            empty.update({a.name: pa.array([]) for a in aggs})
            return pa.table(empty)
        grouped = df.groupby(keys, sort=False, dropna=False)
        out = grouped.size().reset_index()[keys]
    else:
        df["__all"] = 0
        grouped = df.groupby("__all", sort=False)
        out = pd.DataFrame(index=[0])
    columns = {k: pa.array(out[k], from_pandas=True) for k in keys}
    for i, a in enumerate(aggs):
        values = _finish(df, grouped, i, a, len(out))
        # NaN is a value for Std (as Ray and pandas); elsewhere it means "no value" (null).
        columns[a.name] = pa.array(values, from_pandas=not isinstance(a, Std))
    table = pa.table(columns)
    if keys and table.num_rows:
        table = table.sort_by([(k, "ascending", "at_end") for k in keys])
    return table


def _sum(df: Any, grouped: Any, col: str) -> np.ndarray:
    if col not in df:
        return np.zeros(grouped.ngroups)
    return grouped[col].sum(min_count=1).to_numpy()


def _finish(df: Any, grouped: Any, i: int, a: AggregateFn, n_groups: int) -> Any:
    p = f"__a{i}_"
    if not isinstance(a, _Builtin):
        values = []
        codes = grouped.ngroup().to_numpy()
        for g in range(n_groups):
            idx = np.nonzero(codes == g)[0]
            states = [pickle.loads(s) for s in df[p + "state"].iloc[idx]]
            acc = states[0]
            for st in states[1:]:
                acc = a.merge(acc, st)
            values.append(a.finalize(acc))
        out = np.empty(len(values), dtype=object)
        out[:] = values
        return out
    kind = a.kind
    if p + ("n" if kind == "count" else "c" if kind != "min" and kind != "max" else "m") not in df:
        return [None] * n_groups if kind != "count" else np.zeros(n_groups, dtype=np.int64)
    if kind == "count":
        return np.nan_to_num(_sum(df, grouped, p + "n")).astype(np.int64)
    if kind in ("sum", "mean"):
        s = grouped[p + "s"].sum(min_count=1)
        c = np.nan_to_num(_sum(df, grouped, p + "c"))
        if kind == "sum":
            vals = s.to_numpy()
            if (c > 0).all():
                return vals
            obj = vals.astype(object)
            obj[c <= 0] = None
            return obj
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(c > 0, s.to_numpy(dtype=float) / np.where(c > 0, c, 1), np.nan)
    if kind in ("min", "max"):
        g = grouped[p + "m"]
        return (g.min() if kind == "min" else g.max()).to_numpy()
    if kind == "std":
        assert isinstance(a, Std)
        c = df[p + "c"].astype(float).fillna(0.0)
        mu = df[p + "mu"].astype(float).fillna(0.0)
        v = df[p + "v"].astype(float).fillna(0.0)
        frame = df[[]].copy()
        frame["n"], frame["cm"], frame["cv"], frame["cmm"] = c, c * mu, c * v, c * mu * mu
        sums = frame.groupby(grouped.ngroup(), sort=True).sum()
        n = sums["n"].to_numpy()
        with np.errstate(invalid="ignore", divide="ignore"):
            mean = sums["cm"].to_numpy() / n
            m2 = sums["cv"].to_numpy() + sums["cmm"].to_numpy() - n * mean * mean
            denom = n - a.ddof
            return np.where(
                denom > 0, np.sqrt(np.maximum(m2, 0.0) / np.where(denom > 0, denom, 1)), np.nan
            )
    raise AssertionError(kind)
