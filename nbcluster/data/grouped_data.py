"""``GroupedData``: what ``Dataset.groupby(key)`` returns (Ray's names and outputs)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from nbcluster.data._dataset_like import DatasetLike
from nbcluster.data._logical import AllToAll
from nbcluster.data._transform import MapBatchesStage
from nbcluster.data.aggregate import AggregateFn, Count, Max, Mean, Min, Std, Sum, check_aggs

__all__ = ["GroupedData"]


class GroupedData:
    """Rows grouped by ``key``; each method returns a dataset with one row per group,
    sorted by the key (nulls last)."""

    def __init__(self, dataset: DatasetLike, keys: list[str]) -> None:
        self._dataset = dataset
        self._keys = keys

    def __repr__(self) -> str:
        return f"GroupedData(keys={self._keys})"

    def aggregate(self, *aggs: AggregateFn) -> DatasetLike:
        """One row per group with a column per aggregation."""
        schema = self._dataset._known_schema()
        check_aggs(aggs, None if schema is None else schema.names, "groupby().aggregate")
        op = AllToAll(
            (self._dataset._plan,),
            kind="aggregate",
            params={"keys": list(self._keys), "aggs": list(aggs)},
            preserves_rows=False,
            label=f"Aggregate({', '.join(a.name for a in aggs)})",
        )
        return self._dataset._with(op)

    def _each(self, cls: type[AggregateFn], on: str | list[str] | None, **kw: Any) -> DatasetLike:
        if on is None:
            schema = self._dataset.schema()
            cols = [c for c in (schema.names if schema else []) if c not in self._keys]
        elif isinstance(on, str):
            cols = [on]
        else:
            cols = list(on)
        return self.aggregate(*[cls(c, **kw) for c in cols])

    def count(self) -> DatasetLike:
        """Rows per group: column ``count()``."""
        return self.aggregate(Count())

    def sum(self, on: str | list[str] | None = None, ignore_nulls: bool = True) -> DatasetLike:
        """Sum per group: column ``sum(on)``."""
        return self._each(Sum, on, ignore_nulls=ignore_nulls)

    def min(self, on: str | list[str] | None = None, ignore_nulls: bool = True) -> DatasetLike:
        """Minimum per group: column ``min(on)``."""
        return self._each(Min, on, ignore_nulls=ignore_nulls)

    def max(self, on: str | list[str] | None = None, ignore_nulls: bool = True) -> DatasetLike:
        """Maximum per group: column ``max(on)``."""
        return self._each(Max, on, ignore_nulls=ignore_nulls)

    def mean(self, on: str | list[str] | None = None, ignore_nulls: bool = True) -> DatasetLike:
        """Mean per group: column ``mean(on)``."""
        return self._each(Mean, on, ignore_nulls=ignore_nulls)

    def std(
        self, on: str | list[str] | None = None, ddof: int = 1, ignore_nulls: bool = True
    ) -> DatasetLike:
        """Standard deviation per group: column ``std(on)``."""
        return self._each(Std, on, ddof=ddof, ignore_nulls=ignore_nulls)

    def map_groups(
        self,
        fn: Callable[[Any], Any],
        *,
        batch_format: str | None = "default",
        fn_args: Iterable[Any] | None = None,
        fn_kwargs: dict[str, Any] | None = None,
        num_cpus: float | None = None,
        num_gpus: float | None = None,
        **ray_remote_args: Any,
    ) -> DatasetLike:
        """Call ``fn(batch)`` once per group (the group's rows in ``batch_format``); the
        results, concatenated, are the new dataset."""
        if not callable(fn) or isinstance(fn, type):
            raise TypeError("map_groups expects a function of one batch")
        name = getattr(fn, "__name__", type(fn).__name__)
        stage = MapBatchesStage(
            fn,
            None,
            batch_format,
            True,
            tuple(fn_args or ()),
            dict(fn_kwargs or {}),
            name=f"MapGroups({name})",
            where="map_groups",
        )
        remote = dict(ray_remote_args)
        if num_cpus is not None:
            remote["num_cpus"] = num_cpus
        if num_gpus is not None:
            remote["num_gpus"] = num_gpus
        op = AllToAll(
            (self._dataset._plan,),
            kind="map_groups",
            params={"keys": list(self._keys), "stage": stage, "remote_args": remote},
            preserves_rows=False,
            label=f"MapGroups({name})",
        )
        return self._dataset._with(op)
