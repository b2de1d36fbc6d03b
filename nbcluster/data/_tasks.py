"""What runs on workers: read and map tasks, the pool actor, and small block utilities.

Every task that makes a block returns two values: the block (an Arrow table, which goes
to the object store when large) and its :class:`BlockMetadata` (small, returned inline),
so the executor learns rows and bytes by waiting on the metadata alone.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import pyarrow as pa

import nbcluster
from nbcluster.data._block import BlockMetadata, compact, concat, metadata_of, slice_block
from nbcluster.data._datasource import ReadTask
from nbcluster.data._transform import Stage, run_stages

__all__ = [
    "MapWorker",
    "concat_task",
    "map_task",
    "read_task",
    "remote_options",
    "run_map",
    "slice_task",
]


def run_map(stages: Sequence[Stage], blocks: Sequence[pa.Table]) -> tuple[pa.Table, BlockMetadata]:
    """Run ``stages`` over ``blocks``: the output block and its metadata."""
    t0 = time.perf_counter()
    out = compact(run_stages(stages, blocks))
    return out, metadata_of(out, exec_time_s=time.perf_counter() - t0)


@nbcluster.remote(num_returns=2)
def read_task(stages: Sequence[Stage], task: ReadTask) -> tuple[pa.Table, BlockMetadata]:
    """Run a read task, then the stages fused after it."""
    t0 = time.perf_counter()
    out = compact(run_stages(stages, task()))
    return out, metadata_of(out, task.input_files, time.perf_counter() - t0)


@nbcluster.remote(num_returns=2)
def map_task(stages: Sequence[Stage], *blocks: pa.Table) -> tuple[pa.Table, BlockMetadata]:
    """Run fused map stages over one bundle of input blocks."""
    return run_map(stages, blocks)


@nbcluster.remote(num_returns=2)
def slice_task(block: pa.Table, start: int, end: int) -> tuple[pa.Table, BlockMetadata]:
    """Rows ``[start, end)`` of a block (as a new, compact block)."""
    out = compact(slice_block(block, start, end))
    return out, metadata_of(out)


@nbcluster.remote(num_returns=2)
def concat_task(*blocks: pa.Table) -> tuple[pa.Table, BlockMetadata]:
    """One block from several."""
    out = concat(blocks)
    return out, metadata_of(out)


@nbcluster.remote
class MapWorker:
    """A pool actor: builds the operator's callable classes once, then maps bundles."""

    def __init__(self, stages: Sequence[Stage]) -> None:
        self._stages = list(stages)
        for stage in self._stages:
            stage.open()

    def ready(self) -> bool:
        """True once constructed (used to wait for the pool)."""
        return True

    @nbcluster.method(num_returns=2)
    def run(self, *blocks: pa.Table) -> tuple[pa.Table, BlockMetadata]:
        """Run the stages over one bundle."""
        return run_map(self._stages, blocks)

    @nbcluster.method(num_returns=2)
    def run_read(self, task: ReadTask) -> tuple[pa.Table, BlockMetadata]:
        """Run a read task, then the stages."""
        t0 = time.perf_counter()
        out = compact(run_stages(self._stages, task()))
        return out, metadata_of(out, task.input_files, time.perf_counter() - t0)


def remote_options(
    remote_args: dict[str, Any], name: str, default_cpus: float = 1.0
) -> dict[str, Any]:
    """Task options from an operator's ``ray_remote_args`` (num_cpus defaults to 1)."""
    opts = dict(remote_args)
    opts.setdefault("num_cpus", default_cpus)
    opts["name"] = name
    return opts
