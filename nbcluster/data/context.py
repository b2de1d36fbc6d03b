"""``DataContext``: the settings of ``nbcluster.data``, one instance per process.

Names and defaults follow Ray Data's ``ray.data.DataContext``. A dataset captures a copy of
the current context when it is created, so changing the context later does not change
datasets that already exist (as in Ray). Read it with :meth:`DataContext.get_current` and
change its attributes in place::

    ctx = DataContext.get_current()
    ctx.target_max_block_size = 64 * 1024 * 1024
    ctx.execution_options.resource_limits.object_store_memory = 2 * 1024**3
"""

from __future__ import annotations

import copy
import dataclasses
import threading
from typing import ClassVar

__all__ = ["DataContext", "ExecutionOptions", "ExecutionResources"]

#: Ray's defaults (``ray/data/context.py``).
DEFAULT_TARGET_MAX_BLOCK_SIZE = 128 * 1024 * 1024
DEFAULT_TARGET_MIN_BLOCK_SIZE = 1 * 1024 * 1024
DEFAULT_READ_OP_MIN_NUM_BLOCKS = 200
#: Ray gives the streaming executor this fraction of the cluster's object store (with its
#: per-operator reservation on, which is what the budget here does as well).
DEFAULT_OBJECT_STORE_MEMORY_LIMIT_FRACTION = 0.5


@dataclasses.dataclass
class ExecutionResources:
    """Limits for one execution: CPUs, GPUs and object-store bytes (None: derive them)."""

    cpu: float | None = None
    gpu: float | None = None
    object_store_memory: int | None = None

    def __post_init__(self) -> None:
        for name in ("cpu", "gpu", "object_store_memory"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or value < 0):
                raise ValueError(f"ExecutionResources.{name} must be >= 0 or None, got {value!r}")


@dataclasses.dataclass
class ExecutionOptions:
    """How the streaming executor runs a dataset.

    ``resource_limits``: CPUs and object-store bytes the execution may use (None values are
    derived from the cluster: all CPUs, and ``object_store_memory_fraction`` of the store).
    ``preserve_order``: hand blocks downstream in the order of their source (default False,
    as in Ray: blocks come out as they finish). ``verbose_progress``: unused, for Ray
    compatibility.
    """

    resource_limits: ExecutionResources = dataclasses.field(default_factory=ExecutionResources)
    preserve_order: bool = False
    verbose_progress: bool = True


@dataclasses.dataclass
class DataContext:
    """Settings of ``nbcluster.data`` (see the module docstring).

    ``target_max_block_size``: bytes above which a map task splits its output into several
    blocks (128 MiB). ``target_min_block_size``: blocks smaller than this are bundled into
    one task's input (1 MiB). ``read_op_min_num_blocks``: reads make at least this many
    blocks when the files allow it (200, as Ray), unless ``override_num_blocks`` is given.
    ``object_store_memory_fraction``: the share of the cluster's object store an execution
    may fill with blocks in flight (0.5, as Ray) when
    ``execution_options.resource_limits.object_store_memory`` is not set.
    ``max_tasks_in_flight_per_actor``: calls queued on one actor of a pool (2).
    ``actor_pool_scale_up_queue_ratio``: a pool grows when more than this many inputs wait
    per actor (1.0). ``enable_progress_bars``: show the progress widget or bar.
    ``progress_update_interval_s``: how often the progress display is redrawn (0.3 s).
    ``max_errored_blocks``: unused, for Ray compatibility (errors always fail the dataset).
    """

    target_max_block_size: int = DEFAULT_TARGET_MAX_BLOCK_SIZE
    target_min_block_size: int = DEFAULT_TARGET_MIN_BLOCK_SIZE
    read_op_min_num_blocks: int = DEFAULT_READ_OP_MIN_NUM_BLOCKS
    object_store_memory_fraction: float = DEFAULT_OBJECT_STORE_MEMORY_LIMIT_FRACTION
    execution_options: ExecutionOptions = dataclasses.field(default_factory=ExecutionOptions)
    max_tasks_in_flight_per_actor: int = 2
    actor_pool_scale_up_queue_ratio: float = 1.0
    enable_progress_bars: bool = True
    progress_update_interval_s: float = 0.3
    max_errored_blocks: int = 0

    _current: ClassVar[DataContext | None] = None
    _lock: ClassVar[threading.Lock] = threading.Lock()

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raise ``ValueError`` naming the first setting that is out of range."""
        if not isinstance(self.target_max_block_size, int) or self.target_max_block_size <= 0:
            raise ValueError(
                f"target_max_block_size must be a positive int, got {self.target_max_block_size!r}"
            )
        if not 0 < self.object_store_memory_fraction <= 1:
            raise ValueError(
                "object_store_memory_fraction must be in (0, 1], got "
                f"{self.object_store_memory_fraction!r}"
            )
        if self.max_tasks_in_flight_per_actor < 1:
            raise ValueError(
                "max_tasks_in_flight_per_actor must be >= 1, got "
                f"{self.max_tasks_in_flight_per_actor!r}"
            )

    @staticmethod
    def get_current() -> DataContext:
        """The process's context (created with the defaults on first use)."""
        with DataContext._lock:
            if DataContext._current is None:
                DataContext._current = DataContext()
            return DataContext._current

    @staticmethod
    def _set_current(context: DataContext) -> None:
        """Replace the process's context (used by tests and by tasks on workers)."""
        with DataContext._lock:
            DataContext._current = context

    def copy(self) -> DataContext:
        """A deep copy (what a dataset keeps)."""
        return copy.deepcopy(self)

    def object_store_budget(self, store_capacity: int) -> int:
        """Bytes an execution may have in flight, given the cluster's store capacity."""
        limit = self.execution_options.resource_limits.object_store_memory
        if limit is not None:
            return int(limit)
        return max(int(store_capacity * self.object_store_memory_fraction), 1)
