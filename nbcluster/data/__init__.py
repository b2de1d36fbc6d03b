"""``nbcluster.data``: streaming datasets on the object store, with Ray Data's API.

``from nbcluster import data`` stands in for ``from ray import data``::

    from nbcluster import data

    ds = data.read_parquet("s3://bucket/table/").map_batches(preprocess, batch_size=1024)
    for batch in ds.iter_batches(batch_size=256):
        ...

A dataset is a lazy plan; consuming it optimizes the plan (maps fused into one task,
projections, filters and limits pushed into reads) and streams blocks — Arrow tables in
the object store — through tasks and actor pools, with the bytes in flight bounded by a
budget from :class:`DataContext`. See ``notebooks/09_data.ipynb``.
"""

from nbcluster.data import aggregate
from nbcluster.data._schema import Schema
from nbcluster.data.aggregate import AggregateFn
from nbcluster.data.compute import ActorPoolStrategy, ComputeStrategy, TaskPoolStrategy
from nbcluster.data.context import DataContext, ExecutionOptions, ExecutionResources
from nbcluster.data.dataset import Dataset, MaterializedDataset
from nbcluster.data.grouped_data import GroupedData
from nbcluster.data.iterator import DataIterator
from nbcluster.data.read_api import (
    from_arrow,
    from_arrow_refs,
    from_items,
    from_numpy,
    from_numpy_refs,
    from_pandas,
    from_pandas_refs,
    range,
    range_tensor,
    read_binary_files,
    read_csv,
    read_json,
    read_numpy,
    read_parquet,
    read_text,
)

__all__ = [
    "ActorPoolStrategy",
    "AggregateFn",
    "ComputeStrategy",
    "DataContext",
    "DataIterator",
    "Dataset",
    "ExecutionOptions",
    "ExecutionResources",
    "GroupedData",
    "MaterializedDataset",
    "Schema",
    "TaskPoolStrategy",
    "aggregate",
    "from_arrow",
    "from_arrow_refs",
    "from_items",
    "from_numpy",
    "from_numpy_refs",
    "from_pandas",
    "from_pandas_refs",
    "range",
    "range_tensor",
    "read_binary_files",
    "read_csv",
    "read_json",
    "read_numpy",
    "read_parquet",
    "read_text",
]
