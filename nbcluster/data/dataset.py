"""``Dataset``: a lazy, distributed table of rows, with Ray Data's transformations.

A dataset is a logical plan (``_logical.py``). Transformations return a new dataset with
one more operator and run nothing; consuming a dataset (``take``, ``iter_batches``,
``materialize``, ``write_parquet``... in ``_consume.py``) optimizes the plan and streams it
through the executor. Arguments are checked when the transformation is called, so bad input
fails at once with an error naming the problem and the fix.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Literal

import pyarrow as pa

from nbcluster.data._block import BATCH_FORMATS, unify_schemas_or_raise
from nbcluster.data._consume import ConsumeAPI
from nbcluster.data._logical import (
    AllToAll,
    InputData,
    Limit,
    LogicalOp,
    MapLike,
    Union,
    known_count,
    known_schema,
)
from nbcluster.data._optimizer import filter_expression
from nbcluster.data._split import make_streaming_split, split_at, split_materialized
from nbcluster.data._transform import (
    AddColumnStage,
    FilterStage,
    FlatMapStage,
    MapBatchesStage,
    MapRowsStage,
    ProjectStage,
)
from nbcluster.data.aggregate import AggregateFn, Max, Mean, Min, Std, Sum, check_aggs
from nbcluster.data.compute import ComputeStrategy, resolve_compute
from nbcluster.data.context import DataContext
from nbcluster.data.grouped_data import GroupedData
from nbcluster.data.iterator import DataIterator

__all__ = ["Dataset", "MaterializedDataset"]

#: ``batch_size="default"`` in older Ray meant this many rows.
LEGACY_DEFAULT_BATCH_SIZE = 1024


def _fn_name(fn: Any) -> str:
    name = getattr(fn, "__name__", None) or type(fn).__name__
    return "<lambda>" if name == "<lambda>" else name


def _check_fn(fn: Any, where: str) -> None:
    if not callable(fn):
        raise TypeError(f"{where} expects a function or a callable class, got {type(fn).__name__}")
    if inspect.isclass(fn) and "__call__" not in dir(fn):
        raise TypeError(f"{where}: the class {fn.__name__} must define __call__")


def _remote_args(
    num_cpus: float | None, num_gpus: float | None, memory: float | None, extra: dict[str, Any]
) -> dict[str, Any]:
    allowed = {"resources", "scheduling_strategy", "max_retries", "retry_exceptions", "name"}
    unknown = sorted(set(extra) - allowed)
    if unknown:
        raise ValueError(
            f"unknown keyword argument(s) {unknown}; remote options accepted here are "
            f"num_cpus, num_gpus, memory, {', '.join(sorted(allowed))}"
        )
    args = dict(extra)
    args.pop("name", None)
    for key, value in (("num_cpus", num_cpus), ("num_gpus", num_gpus), ("memory", memory)):
        if value is not None:
            if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
                raise ValueError(f"{key} must be a non-negative number, got {value!r}")
            args[key] = value
    return args


def _columns_arg(cols: Any, where: str) -> tuple[str, ...]:
    if isinstance(cols, str):
        cols = [cols]
    if not isinstance(cols, Sequence) or not all(isinstance(c, str) for c in cols):
        raise TypeError(f"{where} expects a column name or a list of column names, got {cols!r}")
    if len(set(cols)) != len(cols):
        raise ValueError(f"{where}: the columns {list(cols)} contain duplicates")
    return tuple(cols)


class Dataset(ConsumeAPI):
    """A lazy dataset of rows (Ray's ``ray.data.Dataset``); see the module docstring."""

    def __init__(self, plan: LogicalOp, context: DataContext | None = None) -> None:
        self._plan = plan
        self._context = (context or DataContext.get_current()).copy()
        self._cache: dict[str, Any] = {}
        self._last_execution: Any = None
        self._name: str | None = None

    @property
    def context(self) -> DataContext:
        """The settings this dataset runs with (a copy of the context when it was made)."""
        return self._context

    def _with(self, op: LogicalOp) -> Dataset:
        return Dataset(op, self._context)

    def _known_schema(self) -> pa.Schema | None:
        return known_schema(self._plan)

    def _check_columns(self, cols: Iterable[str], where: str) -> None:
        schema = self._known_schema()
        if schema is None or (not len(schema.names)):
            return
        missing = [c for c in cols if c not in schema.names]
        if missing:
            raise KeyError(
                f"{where}: column(s) {missing} not found; the dataset has columns {list(schema.names)}"
            )

    def set_name(self, name: str | None) -> None:
        """Name the dataset (shown in the progress display)."""
        self._name = name

    @property
    def name(self) -> str | None:
        """The dataset's name, if set."""
        return self._name

    # ------------------------------------------------------------------ row and batch maps
    def _map_like(
        self,
        stage: Any,
        fn: Any,
        *,
        compute: ComputeStrategy | str | None,
        concurrency: Any,
        num_cpus: float | None,
        num_gpus: float | None,
        memory: float | None,
        ray_remote_args: dict[str, Any],
        preserves_rows: bool,
        min_rows: int = 0,
        where: str,
    ) -> Dataset:
        strategy = resolve_compute(fn, compute, concurrency, where)
        args = _remote_args(num_cpus, num_gpus, memory, ray_remote_args)
        op = MapLike(
            (self._plan,),
            stage=stage,
            compute=strategy,
            remote_args=args,
            preserves_rows=preserves_rows,
            min_rows=min_rows,
        )
        return self._with(op)

    def map(
        self,
        fn: Callable[[dict[str, Any]], dict[str, Any]] | type,
        *,
        compute: ComputeStrategy | str | None = None,
        fn_args: Iterable[Any] | None = None,
        fn_kwargs: dict[str, Any] | None = None,
        fn_constructor_args: Iterable[Any] | None = None,
        fn_constructor_kwargs: dict[str, Any] | None = None,
        num_cpus: float | None = None,
        num_gpus: float | None = None,
        memory: float | None = None,
        concurrency: int | tuple[int, int] | None = None,
        **ray_remote_args: Any,
    ) -> Dataset:
        """Apply ``fn(row) -> row`` to every row (rows are dicts of column -> value)."""
        _check_fn(fn, "map")
        stage = MapRowsStage(
            fn,
            tuple(fn_args or ()),
            dict(fn_kwargs or {}),
            tuple(fn_constructor_args or ()),
            dict(fn_constructor_kwargs or {}),
            name=f"Map({_fn_name(fn)})",
        )
        return self._map_like(
            stage,
            fn,
            compute=compute,
            concurrency=concurrency,
            num_cpus=num_cpus,
            num_gpus=num_gpus,
            memory=memory,
            ray_remote_args=ray_remote_args,
            preserves_rows=True,
            where="map",
        )

    def map_batches(
        self,
        fn: Callable[[Any], Any] | type,
        *,
        batch_size: int | None | Literal["default", "auto"] = None,
        compute: ComputeStrategy | str | None = None,
        batch_format: str | None = "default",
        zero_copy_batch: bool = True,
        fn_args: Iterable[Any] | None = None,
        fn_kwargs: dict[str, Any] | None = None,
        fn_constructor_args: Iterable[Any] | None = None,
        fn_constructor_kwargs: dict[str, Any] | None = None,
        num_cpus: float | None = None,
        num_gpus: float | None = None,
        memory: float | None = None,
        concurrency: int | tuple[int, int] | None = None,
        udf_modifying_row_count: bool = True,
        **ray_remote_args: Any,
    ) -> Dataset:
        """Apply ``fn`` to batches of rows.

        ``fn`` takes a batch in ``batch_format`` ("default"/"numpy": a dict of column ->
        numpy array; "pandas": a DataFrame; "pyarrow": a Table) and returns a batch in any
        of those formats (or yields several). ``batch_size``: rows per batch; None (the
        default, as in Ray 2.60) passes whole blocks. A callable class runs in an actor
        pool (``concurrency=n`` actors, or ``(min, max)`` autoscaled): it is constructed
        once per actor with ``fn_constructor_args``/``fn_constructor_kwargs``.
        ``zero_copy_batch=False`` gives the function writable copies.
        """
        _check_fn(fn, "map_batches")
        if batch_size == "default":
            batch_size = LEGACY_DEFAULT_BATCH_SIZE
        elif batch_size == "auto":
            batch_size = None
        if batch_size is not None and (
            not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1
        ):
            raise ValueError(
                f"map_batches: batch_size must be a positive int or None, got {batch_size!r}"
            )
        if batch_format not in BATCH_FORMATS and batch_format is not None:
            raise ValueError(
                f"map_batches: batch_format must be one of {', '.join(repr(f) for f in BATCH_FORMATS)}"
                f" or None, got {batch_format!r}"
            )
        if not inspect.isclass(fn) and (fn_constructor_args or fn_constructor_kwargs):
            raise ValueError(
                "map_batches: fn_constructor_args/fn_constructor_kwargs are only for a callable "
                f"class, but {_fn_name(fn)} is a function"
            )
        stage = MapBatchesStage(
            fn,
            batch_size,
            batch_format,
            zero_copy_batch,
            tuple(fn_args or ()),
            dict(fn_kwargs or {}),
            tuple(fn_constructor_args or ()),
            dict(fn_constructor_kwargs or {}),
            name=f"MapBatches({_fn_name(fn)})",
        )
        return self._map_like(
            stage,
            fn,
            compute=compute,
            concurrency=concurrency,
            num_cpus=num_cpus,
            num_gpus=num_gpus,
            memory=memory,
            ray_remote_args=ray_remote_args,
            preserves_rows=not udf_modifying_row_count,
            min_rows=batch_size or 0,
            where="map_batches",
        )

    def flat_map(
        self,
        fn: Callable[[dict[str, Any]], list[dict[str, Any]]] | type,
        *,
        compute: ComputeStrategy | str | None = None,
        fn_args: Iterable[Any] | None = None,
        fn_kwargs: dict[str, Any] | None = None,
        fn_constructor_args: Iterable[Any] | None = None,
        fn_constructor_kwargs: dict[str, Any] | None = None,
        num_cpus: float | None = None,
        num_gpus: float | None = None,
        memory: float | None = None,
        concurrency: int | tuple[int, int] | None = None,
        **ray_remote_args: Any,
    ) -> Dataset:
        """Apply ``fn(row) -> list of rows`` to every row and flatten the results."""
        _check_fn(fn, "flat_map")
        stage = FlatMapStage(
            fn,
            tuple(fn_args or ()),
            dict(fn_kwargs or {}),
            tuple(fn_constructor_args or ()),
            dict(fn_constructor_kwargs or {}),
            name=f"FlatMap({_fn_name(fn)})",
        )
        return self._map_like(
            stage,
            fn,
            compute=compute,
            concurrency=concurrency,
            num_cpus=num_cpus,
            num_gpus=num_gpus,
            memory=memory,
            ray_remote_args=ray_remote_args,
            preserves_rows=False,
            where="flat_map",
        )

    def filter(
        self,
        fn: Callable[[dict[str, Any]], bool] | type | None = None,
        expr: Any = None,
        *,
        compute: ComputeStrategy | str | None = None,
        fn_constructor_args: Iterable[Any] | None = None,
        fn_constructor_kwargs: dict[str, Any] | None = None,
        num_cpus: float | None = None,
        num_gpus: float | None = None,
        memory: float | None = None,
        concurrency: int | tuple[int, int] | None = None,
        **ray_remote_args: Any,
    ) -> Dataset:
        """Keep the rows where ``fn(row)`` is true, or where ``expr`` holds: a string such
        as ``"x > 5 and y == 'a'"`` (as in Ray) or a ``pyarrow.compute.Expression``. An
        ``expr`` is vectorized, and right after ``read_parquet`` it is pushed into the
        read: row groups it rules out are never read."""
        if (fn is None) == (expr is None):
            raise ValueError(
                "filter needs exactly one of fn (a row predicate) and expr (an expression)"
            )
        if fn is not None:
            _check_fn(fn, "filter")
            stage = FilterStage(
                fn=fn,
                name=f"Filter({_fn_name(fn)})",
                fn_constructor_args=tuple(fn_constructor_args or ()),
                fn_constructor_kwargs=dict(fn_constructor_kwargs or {}),
            )
        else:
            stage = FilterStage(expr=filter_expression(expr), name=f"Filter({expr})")
        return self._map_like(
            stage,
            fn,
            compute=compute,
            concurrency=concurrency,
            num_cpus=num_cpus,
            num_gpus=num_gpus,
            memory=memory,
            ray_remote_args=ray_remote_args,
            preserves_rows=False,
            where="filter",
        )

    def add_column(
        self,
        col: str,
        fn: Callable[[Any], Any],
        *,
        batch_format: str | None = "pandas",
        compute: ComputeStrategy | str | None = None,
        concurrency: int | None = None,
        **ray_remote_args: Any,
    ) -> Dataset:
        """Add (or replace) column ``col`` with ``fn(batch)``: one value per row of the batch."""
        if not isinstance(col, str) or not col:
            raise TypeError(f"add_column: col must be a non-empty string, got {col!r}")
        _check_fn(fn, "add_column")
        if batch_format not in BATCH_FORMATS and batch_format is not None:
            raise ValueError(f"add_column: unknown batch_format {batch_format!r}")
        stage = AddColumnStage(col, fn, batch_format, name=f"AddColumn({col})")
        return self._map_like(
            stage,
            fn,
            compute=compute,
            concurrency=concurrency,
            num_cpus=None,
            num_gpus=None,
            memory=None,
            ray_remote_args=ray_remote_args,
            preserves_rows=True,
            where="add_column",
        )

    def _project(self, stage: ProjectStage, **kw: Any) -> Dataset:
        return self._map_like(
            stage,
            None,
            compute=kw.pop("compute", None),
            concurrency=kw.pop("concurrency", None),
            num_cpus=None,
            num_gpus=None,
            memory=None,
            ray_remote_args=kw,
            preserves_rows=True,
            where=stage.name,
        )

    def select_columns(self, cols: str | list[str], **kw: Any) -> Dataset:
        """Keep only ``cols``, in that order (pushed into ``read_parquet``)."""
        names = _columns_arg(cols, "select_columns")
        self._check_columns(names, "select_columns")
        return self._project(ProjectStage(select=names, name=f"Project({', '.join(names)})"), **kw)

    def drop_columns(self, cols: str | list[str], **kw: Any) -> Dataset:
        """Remove ``cols`` (pushed into ``read_parquet``)."""
        names = _columns_arg(cols, "drop_columns")
        self._check_columns(names, "drop_columns")
        return self._project(
            ProjectStage(drop=names, name=f"DropColumns({', '.join(names)})"), **kw
        )

    def rename_columns(self, names: Mapping[str, str] | list[str], **kw: Any) -> Dataset:
        """Rename columns: a dict old -> new, or a list of new names for every column."""
        if isinstance(names, list):
            schema = self._known_schema()
            if schema is None:
                raise ValueError(
                    "rename_columns with a list needs the schema; pass a dict of old -> new names"
                )
            if len(names) != len(schema.names):
                raise ValueError(
                    f"rename_columns: got {len(names)} names for {len(schema.names)} columns"
                )
            mapping = dict(zip(schema.names, names, strict=True))
        elif isinstance(names, Mapping):
            mapping = dict(names)
        else:
            raise TypeError(f"rename_columns expects a dict or a list, got {type(names).__name__}")
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in mapping.items()):
            raise TypeError("rename_columns: names must be strings")
        if len(set(mapping.values())) != len(mapping):
            raise ValueError(f"rename_columns: new names {list(mapping.values())} have duplicates")
        self._check_columns(mapping, "rename_columns")
        return self._project(ProjectStage(rename=mapping, name="RenameColumns"), **kw)

    # ------------------------------------------------------------------ row count and order
    def limit(self, limit: int) -> Dataset:
        """The first ``limit`` rows (pushed before row-preserving maps and into reads)."""
        if not isinstance(limit, int) or isinstance(limit, bool) or limit < 0:
            raise ValueError(f"limit must be a non-negative int, got {limit!r}")
        return self._with(Limit((self._plan,), n=limit))

    def repartition(
        self,
        num_blocks: int | None = None,
        target_num_rows_per_block: int | None = None,
        *,
        shuffle: bool = False,
    ) -> Dataset:
        """Exactly ``num_blocks`` blocks of equal rows (or blocks of
        ``target_num_rows_per_block`` rows); ``shuffle=True`` also shuffles the rows."""
        if (num_blocks is None) == (target_num_rows_per_block is None):
            raise ValueError(
                "repartition needs exactly one of num_blocks and target_num_rows_per_block"
            )
        for name, v in (
            ("num_blocks", num_blocks),
            ("target_num_rows_per_block", target_num_rows_per_block),
        ):
            if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 1):
                raise ValueError(f"repartition: {name} must be a positive int, got {v!r}")
        params = {
            "num_blocks": num_blocks,
            "target_num_rows_per_block": target_num_rows_per_block,
            "shuffle": shuffle,
        }
        return self._with(
            AllToAll((self._plan,), kind="repartition", params=params, label="Repartition")
        )

    def random_shuffle(
        self, *, seed: int | None = None, num_blocks: int | None = None, **ray_remote_args: Any
    ) -> Dataset:
        """Shuffle the rows across blocks (map/reduce tasks); ``seed`` makes it repeatable."""
        if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool)):
            raise TypeError(f"random_shuffle: seed must be an int, got {seed!r}")
        params = {"seed": seed, "num_blocks": num_blocks}
        return self._with(
            AllToAll((self._plan,), kind="random_shuffle", params=params, label="RandomShuffle")
        )

    def randomize_block_order(self, *, seed: int | None = None) -> Dataset:
        """Shuffle the order of the blocks (not of rows within them); cheap."""
        return self._with(
            AllToAll(
                (self._plan,),
                kind="randomize_block_order",
                params={"seed": seed},
                label="RandomizeBlockOrder",
            )
        )

    def sort(self, key: str | list[str], descending: bool | list[bool] = False) -> Dataset:
        """Rows sorted by ``key`` (one column or several); nulls last."""
        keys = list(_columns_arg(key, "sort"))
        desc = (
            list(descending)
            if isinstance(descending, list | tuple)
            else [bool(descending)] * len(keys)
        )
        if len(desc) != len(keys):
            raise ValueError(f"sort: {len(keys)} keys but {len(desc)} descending flags")
        self._check_columns(keys, "sort")
        return self._with(
            AllToAll(
                (self._plan,), kind="sort", params={"keys": keys, "descending": desc}, label="Sort"
            )
        )

    def groupby(self, key: str | list[str] | None) -> GroupedData:
        """Group rows by ``key`` for ``count``/``sum``/``mean``/``map_groups``..."""
        keys = [] if key is None else list(_columns_arg(key, "groupby"))
        self._check_columns(keys, "groupby")
        return GroupedData(self, keys)

    def aggregate(self, *aggs: AggregateFn) -> Any:
        """Aggregate the whole dataset: a dict of results (the value itself for one)."""
        schema = self._known_schema()
        check_aggs(aggs, None if schema is None else schema.names, "aggregate")
        ds = self._with(
            AllToAll(
                (self._plan,),
                kind="aggregate",
                params={"keys": [], "aggs": list(aggs)},
                label="Aggregate",
            )
        )
        rows = ds.take_all()
        row = rows[0] if rows else {a.name: None for a in aggs}
        return row

    def _global(self, agg_cls: type[AggregateFn], on: str | list[str] | None, **kw: Any) -> Any:
        cols = [on] if isinstance(on, str) or on is None else list(on)
        if on is None:
            schema = self.schema()
            cols = [] if schema is None else list(schema.names)
        result = self.aggregate(*[agg_cls(c, **kw) for c in cols])
        values = list(result.values())
        return values[0] if len(values) == 1 else result

    def sum(self, on: str | list[str] | None = None, ignore_nulls: bool = True) -> Any:
        """Sum of column ``on`` (a dict for several columns)."""
        return self._global(Sum, on, ignore_nulls=ignore_nulls)

    def min(self, on: str | list[str] | None = None, ignore_nulls: bool = True) -> Any:
        """Minimum of column ``on``."""
        return self._global(Min, on, ignore_nulls=ignore_nulls)

    def max(self, on: str | list[str] | None = None, ignore_nulls: bool = True) -> Any:
        """Maximum of column ``on``."""
        return self._global(Max, on, ignore_nulls=ignore_nulls)

    def mean(self, on: str | list[str] | None = None, ignore_nulls: bool = True) -> Any:
        """Mean of column ``on``."""
        return self._global(Mean, on, ignore_nulls=ignore_nulls)

    def std(
        self, on: str | list[str] | None = None, ddof: int = 1, ignore_nulls: bool = True
    ) -> Any:
        """Standard deviation of column ``on`` (``ddof=1``: sample)."""
        return self._global(Std, on, ddof=ddof, ignore_nulls=ignore_nulls)

    def unique(self, column: str, ignore_nulls: bool = False) -> list[Any]:
        """The distinct values of ``column``."""
        values = [r[column] for r in self.groupby(column).count().take_all()]
        return [v for v in values if v is not None] if ignore_nulls else values

    # ------------------------------------------------------------------ combining datasets
    def union(self, *other: Dataset) -> Dataset:
        """The rows of this dataset and then of ``other`` (schemas must match)."""
        for o in other:
            if not isinstance(o, Dataset):
                raise TypeError(f"union expects Datasets, got {type(o).__name__}")
        schemas = [d._known_schema() for d in (self, *other)]
        if all(s is not None for s in schemas):
            unify_schemas_or_raise(schemas, "union")
        return self._with(Union((self._plan, *[o._plan for o in other])))

    def zip(self, *other: Dataset) -> Dataset:
        """The columns of this dataset and ``other`` side by side (equal row counts;
        duplicate names get a suffix ``_1``)."""
        if len(other) != 1 or not isinstance(other[0], Dataset):
            raise TypeError("zip expects one other Dataset")
        a, b = known_count(self._plan), known_count(other[0]._plan)
        if a is not None and b is not None and a != b:
            raise ValueError(
                f"zip: the datasets have different numbers of rows ({a} and {b}); zip needs "
                "equal row counts (use limit() on the longer one)"
            )
        return self._with(AllToAll((self._plan, other[0]._plan), kind="zip", label="Zip"))

    # ------------------------------------------------------------------ splitting
    def split(
        self, n: int, *, equal: bool = False, locality_hints: list[Any] | None = None
    ) -> list[MaterializedDataset]:
        """Materialize and cut into ``n`` datasets (``equal=True``: the same row count
        each, dropping at most ``n-1`` rows)."""
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise ValueError(f"split: n must be a positive int, got {n!r}")
        return split_materialized(self.materialize(), n, equal)

    def split_at_indices(self, indices: list[int]) -> list[MaterializedDataset]:
        """Materialize and cut at the given row indices (``len(indices) + 1`` pieces)."""
        if list(indices) != sorted(indices) or any(i < 0 for i in indices):
            raise ValueError(
                f"split_at_indices: indices must be sorted and non-negative, got {indices!r}"
            )
        return split_at(self._materialize_ordered(), list(indices))

    def split_proportionately(self, proportions: list[float]) -> list[MaterializedDataset]:
        """Cut by fractions (each > 0, summing to < 1; the rest is the last piece)."""
        if not proportions or any(p <= 0 for p in proportions) or sum(proportions) >= 1:
            raise ValueError(
                f"split_proportionately: proportions must be > 0 and sum to < 1, got {proportions!r}"
            )
        ds = self._materialize_ordered()
        total = ds.count()
        cuts, acc = [], 0.0
        for p in proportions:
            acc += p
            cuts.append(int(total * acc))
        return split_at(ds, cuts)

    def train_test_split(
        self,
        test_size: float | int,
        *,
        shuffle: bool = False,
        seed: int | None = None,
        stratify: str | None = None,
    ) -> tuple[MaterializedDataset, MaterializedDataset]:
        """``(train, test)``: the last ``test_size`` rows (a fraction or a count) are the
        test set; ``shuffle=True`` shuffles first."""
        if stratify is not None:
            raise NotImplementedError("train_test_split(stratify=...) is not supported yet")
        ds = self.random_shuffle(seed=seed) if shuffle else self
        mat = ds._materialize_ordered()
        total = mat.count()
        if isinstance(test_size, float):
            if not 0 < test_size < 1:
                raise ValueError(
                    f"train_test_split: a float test_size must be in (0, 1), got {test_size}"
                )
            n_test = int(total * test_size)
        elif isinstance(test_size, int) and not isinstance(test_size, bool):
            if not 0 < test_size < total:
                raise ValueError(
                    f"train_test_split: an int test_size must be in (0, {total}), got {test_size}"
                )
            n_test = test_size
        else:
            raise TypeError(
                f"train_test_split: test_size must be a float or an int, got {test_size!r}"
            )
        train, test = split_at(mat, [total - n_test])
        return train, test

    def streaming_split(
        self, n: int, *, equal: bool = False, locality_hints: list[Any] | None = None
    ) -> list[DataIterator]:
        """``n`` iterators over disjoint parts of one streaming execution (for ``n``
        training workers). They can be passed to other processes (actors, tasks). A new
        epoch starts when every iterator has started it. ``equal=True``: every iterator
        gets the same number of rows (at most ``n-1`` rows are dropped)."""
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise ValueError(f"streaming_split: n must be a positive int, got {n!r}")
        return make_streaming_split(self, n, equal)

    def _materialize_ordered(self) -> MaterializedDataset:
        if isinstance(self, MaterializedDataset):
            return self
        bundles = list(self._execute(preserve_order=True).iter_bundles())
        return MaterializedDataset(
            InputData((), bundles=bundles, label="Materialized"), self._context
        )


class MaterializedDataset(Dataset):
    """A dataset whose blocks are in the object store (``materialize()``, ``split()``)."""

    def num_blocks(self) -> int:
        """How many blocks it has."""
        assert isinstance(self._plan, InputData)
        return len(self._plan.bundles)


def _materialized(bundles: list[Any], context: DataContext, label: str) -> MaterializedDataset:
    return MaterializedDataset(InputData((), bundles=list(bundles), label=label), context)


ConsumeAPI._materializer = staticmethod(_materialized)  # type: ignore[assignment]
DataIterator._materializer = staticmethod(_materialized)  # type: ignore[attr-defined]
