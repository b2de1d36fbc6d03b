"""The configuration objects of a training run, with Ray Train's names and defaults.

``ScalingConfig`` says how many workers and what each one reserves; ``RunConfig`` says
where results go (``storage_path/name``), how checkpoints are kept (``CheckpointConfig``)
and how failures are handled (``FailureConfig``). ``DataConfig`` says which datasets are
split across the workers. Every field is checked when the object is made, so a mistake
is reported at the line that made it, not minutes later on a worker.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Sequence
from typing import Any, Literal

__all__ = [
    "CheckpointConfig",
    "DataConfig",
    "FailureConfig",
    "RunConfig",
    "ScalingConfig",
    "default_storage_path",
]

PLACEMENT_STRATEGIES = ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")

#: Where results go when ``RunConfig.storage_path`` is not given (Ray: ``~/ray_results``).
DEFAULT_STORAGE_PATH = "~/nbcluster_results"
#: Overrides :data:`DEFAULT_STORAGE_PATH` (Ray reads ``RAY_STORAGE``).
STORAGE_PATH_ENV = "NBCLUSTER_TRAIN_STORAGE_PATH"


def default_storage_path() -> str:
    """``$NBCLUSTER_TRAIN_STORAGE_PATH``, else ``~/nbcluster_results`` (expanded)."""
    return os.path.expanduser(os.environ.get(STORAGE_PATH_ENV) or DEFAULT_STORAGE_PATH)


def _check_resources(value: Any, field: str) -> dict[str, float] | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise TypeError(f"{field} must be a dict of resource name -> amount, e.g. {{'CPU': 1}}")
    out: dict[str, float] = {}
    for key, amount in value.items():
        if not isinstance(key, str) or not key:
            raise TypeError(f"{field}: resource names must be non-empty strings, got {key!r}")
        if (
            isinstance(amount, bool)
            or not isinstance(amount, (int, float))
            or amount < 0
            or not math.isfinite(amount)
        ):
            raise ValueError(f"{field}[{key!r}] must be a non-negative number, got {amount!r}")
        out[key] = float(amount)
    return out


@dataclasses.dataclass
class ScalingConfig:
    """How many workers to start and what each one reserves (``ray.train.ScalingConfig``).

    ``num_workers`` actors run the training function, one per bundle of a placement group
    made with ``placement_strategy`` (default ``"PACK"``). Each reserves
    ``resources_per_worker`` (default ``{"CPU": 1}``, plus ``{"GPU": 1}`` with
    ``use_gpu=True``). ``trainer_resources``: the coordinator of a run lives in the driver
    (the notebook), so it reserves nothing by default; a non-empty dict is reserved as one
    more bundle of the group for the length of the run.
    """

    trainer_resources: dict[str, float] | None = None
    num_workers: int = 1
    use_gpu: bool = False
    resources_per_worker: dict[str, float] | None = None
    placement_strategy: str = "PACK"

    def __post_init__(self) -> None:
        n = self.num_workers
        if isinstance(n, bool) or not isinstance(n, int):
            raise TypeError(f"ScalingConfig(num_workers=...) must be an int, got {n!r}")
        if n < 1:
            raise ValueError(f"ScalingConfig(num_workers=...) must be at least 1, got {n}")
        if not isinstance(self.use_gpu, bool):
            raise TypeError(
                f"ScalingConfig(use_gpu=...) must be True or False, got {self.use_gpu!r}"
            )
        if self.placement_strategy not in PLACEMENT_STRATEGIES:
            raise ValueError(
                f"ScalingConfig(placement_strategy=...) must be one of "
                f"{', '.join(PLACEMENT_STRATEGIES)}, got {self.placement_strategy!r}"
            )
        self.resources_per_worker = _check_resources(
            self.resources_per_worker, "ScalingConfig(resources_per_worker=...)"
        )
        self.trainer_resources = _check_resources(
            self.trainer_resources, "ScalingConfig(trainer_resources=...)"
        )
        per = self.resources_per_worker
        if per is not None:
            if self.use_gpu and per.get("GPU", 0) == 0 and "GPU" in per:
                raise ValueError(
                    "ScalingConfig: use_gpu=True but resources_per_worker has GPU=0; "
                    "drop use_gpu or reserve at least a fraction of a GPU per worker"
                )
            if not any(per.values()):
                raise ValueError(
                    "ScalingConfig(resources_per_worker=...) reserves nothing; give each "
                    "worker at least some CPU, e.g. {'CPU': 1}"
                )

    @property
    def num_cpus_per_worker(self) -> float:
        """CPUs each worker reserves."""
        return self._worker_resources().get("CPU", 0.0)

    @property
    def num_gpus_per_worker(self) -> float:
        """GPUs each worker reserves."""
        return self._worker_resources().get("GPU", 0.0)

    @property
    def additional_resources_per_worker(self) -> dict[str, float]:
        """Custom resources (not CPU/GPU/memory) each worker reserves."""
        return {
            k: v for k, v in self._worker_resources().items() if k not in ("CPU", "GPU", "memory")
        }

    def _worker_resources(self) -> dict[str, float]:
        if self.resources_per_worker is not None:
            res = dict(self.resources_per_worker)
            if self.use_gpu:
                res.setdefault("GPU", 1.0)
            return res
        res = {"CPU": 1.0}
        if self.use_gpu:
            res["GPU"] = 1.0
        return res

    def bundles(self) -> list[dict[str, float]]:
        """The placement group's bundles: one per worker, then the trainer's if it has one."""
        per = {k: v for k, v in self._worker_resources().items() if v > 0}
        out = [dict(per) for _ in range(self.num_workers)]
        trainer = {k: v for k, v in (self.trainer_resources or {}).items() if v > 0}
        if trainer:
            out.append(trainer)
        return out

    @property
    def total_resources(self) -> dict[str, float]:
        """Everything the run reserves, summed."""
        total: dict[str, float] = {}
        for bundle in self.bundles():
            for k, v in bundle.items():
                total[k] = total.get(k, 0.0) + v
        return total


@dataclasses.dataclass
class CheckpointConfig:
    """Which checkpoints to keep (``ray.train.CheckpointConfig``).

    ``num_to_keep``: how many to keep (None: all). With ``checkpoint_score_attribute``
    the best by that metric are kept (``checkpoint_score_order`` ``"max"`` or ``"min"``),
    otherwise the most recent. The latest checkpoint is always kept as well, since a
    restart after a failure resumes from it.
    """

    num_to_keep: int | None = None
    checkpoint_score_attribute: str | None = None
    checkpoint_score_order: Literal["max", "min"] = "max"
    # Tune's fields (ray.tune.CheckpointConfig): a class Trainable saves every
    # checkpoint_frequency iterations (0: never) and at its end (checkpoint_at_end).
    checkpoint_frequency: int = 0
    checkpoint_at_end: bool | None = None

    def __post_init__(self) -> None:
        freq = self.checkpoint_frequency
        if isinstance(freq, bool) or not isinstance(freq, int) or freq < 0:
            raise ValueError(
                f"CheckpointConfig(checkpoint_frequency=...) must be an integer >= 0, got {freq!r}"
            )
        n = self.num_to_keep
        if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
            raise ValueError(
                f"CheckpointConfig(num_to_keep=...) must be None or a positive integer, got {n!r}"
            )
        attr = self.checkpoint_score_attribute
        if attr is not None and (not isinstance(attr, str) or not attr):
            raise TypeError(
                f"CheckpointConfig(checkpoint_score_attribute=...) must be a metric name, got {attr!r}"
            )
        if self.checkpoint_score_order not in ("max", "min"):
            raise ValueError(
                "CheckpointConfig(checkpoint_score_order=...) must be 'max' or 'min', "
                f"got {self.checkpoint_score_order!r}"
            )


@dataclasses.dataclass
class FailureConfig:
    """How often a run restarts after a failure (``ray.train.FailureConfig``).

    A failure is a worker that dies or a training function that raises on any rank. The
    whole worker group is then started again from the latest checkpoint, up to
    ``max_failures`` times (0, the default: never; -1: always).
    """

    max_failures: int = 0
    # Tune's field (ray.tune.FailureConfig): stop the experiment at the first trial error
    # (True), and also raise that error from Tuner.fit() ("raise").
    fail_fast: bool | str = False

    def __post_init__(self) -> None:
        if self.fail_fast not in (True, False, "raise"):
            raise ValueError(
                f"FailureConfig(fail_fast=...) must be True, False or 'raise', got {self.fail_fast!r}"
            )
        n = self.max_failures
        if isinstance(n, bool) or not isinstance(n, int) or n < -1:
            raise ValueError(
                f"FailureConfig(max_failures=...) must be an integer >= -1 (-1: no limit), got {n!r}"
            )


@dataclasses.dataclass
class RunConfig:
    """Where a run writes and how it behaves (``ray.train.RunConfig``).

    Results go to ``storage_path/name`` (default storage: ``~/nbcluster_results``, or
    ``$NBCLUSTER_TRAIN_STORAGE_PATH``; default name: the trainer's class and the time).
    ``storage_path`` must be a directory every worker can write: a local directory on a
    one-host cluster, a shared one (NFS) across hosts. A run started again with the same
    explicit ``name`` and ``storage_path`` carries on from that run's latest checkpoint.
    ``callbacks`` get every report (see :mod:`nbcluster.train` for their methods).
    """

    name: str | None = None
    storage_path: str | os.PathLike[str] | None = None
    checkpoint_config: CheckpointConfig | None = None
    failure_config: FailureConfig | None = None
    callbacks: Sequence[Any] | None = None
    verbose: int | None = None
    # Tune's fields (ray.tune.RunConfig; a training run ignores them): ``stop`` is a dict
    # {result key: threshold}, a function (trial_id, result) -> bool, or a tune.Stopper.
    stop: Any = None
    sync_config: Any = None
    storage_filesystem: Any = None
    progress_reporter: Any = None
    log_to_file: bool | str | tuple[str, str] = False

    def __post_init__(self) -> None:
        if self.storage_filesystem is not None:
            raise ValueError(
                "RunConfig(storage_filesystem=...) is not supported: pass a local or mounted "
                "shared directory as storage_path"
            )
        if self.name is not None:
            if not isinstance(self.name, str) or not self.name.strip():
                raise TypeError(
                    f"RunConfig(name=...) must be a non-empty string, got {self.name!r}"
                )
            if os.sep in self.name or self.name in (".", ".."):
                raise ValueError(
                    f"RunConfig(name=...) is a directory name under storage_path and cannot "
                    f"contain {os.sep!r}: {self.name!r}"
                )
        if self.storage_path is not None:
            if not isinstance(self.storage_path, (str, os.PathLike)):
                raise TypeError(
                    f"RunConfig(storage_path=...) must be a path, got {type(self.storage_path).__name__}"
                )
            text = os.fspath(self.storage_path)
            if "://" in text:
                raise ValueError(
                    f"RunConfig(storage_path={text!r}): only local or mounted shared directories "
                    "are supported (no URIs); mount the bucket (e.g. s3fs) and pass its path"
                )
        if self.checkpoint_config is None:
            self.checkpoint_config = CheckpointConfig()
        elif not isinstance(self.checkpoint_config, CheckpointConfig):
            raise TypeError("RunConfig(checkpoint_config=...) must be a CheckpointConfig")
        if self.failure_config is None:
            self.failure_config = FailureConfig()
        elif not isinstance(self.failure_config, FailureConfig):
            raise TypeError("RunConfig(failure_config=...) must be a FailureConfig")
        if self.callbacks is not None:
            if not isinstance(self.callbacks, (list, tuple)):
                raise TypeError("RunConfig(callbacks=...) must be a list of callback objects")
            self.callbacks = list(self.callbacks)
        if self.verbose is not None and (
            isinstance(self.verbose, bool) or self.verbose not in (0, 1, 2)
        ):
            raise ValueError(f"RunConfig(verbose=...) must be 0, 1 or 2, got {self.verbose!r}")

    def resolved_storage_path(self) -> str:
        """The storage directory as an absolute path."""
        if self.storage_path is None:
            return default_storage_path()
        return os.path.abspath(os.path.expanduser(os.fspath(self.storage_path)))


@dataclasses.dataclass
class DataConfig:
    """How ``datasets=`` reach the workers (``ray.train.DataConfig``).

    ``datasets_to_split``: ``"all"`` (default) or a list of names. Each of those is split
    into ``num_workers`` equal shards with ``streaming_split``; every other dataset is
    given whole to every worker. ``get_dataset_shard(name)`` returns a rank's part.
    """

    datasets_to_split: str | list[str] = "all"
    execution_options: Any = None

    def __post_init__(self) -> None:
        d = self.datasets_to_split
        if d != "all" and not (isinstance(d, (list, tuple)) and all(isinstance(x, str) for x in d)):
            raise TypeError(
                f"DataConfig(datasets_to_split=...) must be 'all' or a list of dataset names, got {d!r}"
            )
        if isinstance(d, tuple):
            self.datasets_to_split = list(d)

    def splits(self, name: str) -> bool:
        """Whether the dataset called ``name`` is split across workers."""
        return self.datasets_to_split == "all" or name in self.datasets_to_split
