"""``DataParallelTrainer``: run a training function on a group of workers
(``ray.train.DataParallelTrainer``); framework trainers such as ``TorchTrainer`` are
this plus a backend config."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any

import cloudpickle

from nbcluster.exceptions import SerializationError
from nbcluster.train._backend import BackendConfig
from nbcluster.train._checkpoint import Checkpoint
from nbcluster.train._config import DataConfig, RunConfig, ScalingConfig
from nbcluster.train._controller import run_trainer
from nbcluster.train._result import Result

__all__ = ["DataParallelTrainer", "find_unpicklable"]


def find_unpicklable(value: Any, path: str, depth: int = 0) -> tuple[str, str] | None:
    """The path of the innermost part of ``value`` that cannot be pickled, and why."""
    try:
        cloudpickle.dumps(value)
        return None
    except Exception as err:  # noqa: BLE001 - any pickling failure
        reason = f"{type(err).__name__}: {err}"
    if depth < 8:
        children: list[tuple[str, Any]] = []
        if isinstance(value, Mapping):
            children = [(f"{path}[{k!r}]", v) for k, v in value.items()]
        elif isinstance(value, (list, tuple, set, frozenset)):
            children = [(f"{path}[{i}]", v) for i, v in enumerate(value)]
        elif hasattr(value, "__dict__") and not isinstance(value, type):
            children = [(f"{path}.{k}", v) for k, v in vars(value).items()]
        for child_path, child in children:
            found = find_unpicklable(child, child_path, depth + 1)
            if found is not None:
                return found
    return path, reason


class DataParallelTrainer:
    """Run ``train_loop_per_worker`` on ``scaling_config.num_workers`` workers.

    ``train_loop_per_worker`` takes no argument or one (``train_loop_config`` is passed).
    ``backend_config`` sets up a framework on each worker (none by default; see
    ``TorchTrainer``). ``datasets``: name -> ``nbcluster.data`` dataset, split across the
    workers per ``dataset_config`` and read with ``get_dataset_shard(name)``.
    ``resume_from_checkpoint``: what ``get_checkpoint()`` returns when the run has no
    checkpoint of its own. ``metadata``: returned by ``get_context().get_metadata()``.
    """

    def __init__(
        self,
        train_loop_per_worker: Callable[..., Any],
        *,
        train_loop_config: dict[str, Any] | None = None,
        backend_config: BackendConfig | None = None,
        scaling_config: ScalingConfig | None = None,
        run_config: RunConfig | None = None,
        datasets: dict[str, Any] | None = None,
        dataset_config: DataConfig | None = None,
        resume_from_checkpoint: Checkpoint | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> None:
        name = type(self).__name__
        if not callable(train_loop_per_worker):
            raise TypeError(
                f"{name}: train_loop_per_worker must be a function, got "
                f"{type(train_loop_per_worker).__name__}"
            )
        try:
            params = [
                p
                for p in inspect.signature(train_loop_per_worker).parameters.values()
                if p.default is inspect.Parameter.empty
                and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
            ]
        except (TypeError, ValueError):
            params = []
        if len(params) > 1:
            raise ValueError(
                f"{name}: train_loop_per_worker should take in 0 or 1 arguments (the "
                f"train_loop_config dict), but it takes {len(params)}: "
                f"{', '.join(p.name for p in params)}"
            )
        if train_loop_config is not None and not isinstance(train_loop_config, Mapping):
            raise TypeError(
                f"{name}: train_loop_config must be a dict, got {type(train_loop_config).__name__}"
            )
        if backend_config is not None and not isinstance(backend_config, BackendConfig):
            raise TypeError(f"{name}: backend_config must be a BackendConfig")
        scaling_config = scaling_config if scaling_config is not None else ScalingConfig()
        if not isinstance(scaling_config, ScalingConfig):
            raise TypeError(
                f"{name}: scaling_config must be a nbcluster.train.ScalingConfig, "
                f"got {type(scaling_config).__name__}"
            )
        run_config = run_config if run_config is not None else RunConfig()
        if not isinstance(run_config, RunConfig):
            raise TypeError(
                f"{name}: run_config must be a nbcluster.train.RunConfig, got {type(run_config).__name__}"
            )
        if datasets is not None:
            if not isinstance(datasets, Mapping) or not all(isinstance(k, str) for k in datasets):
                raise TypeError(f"{name}: datasets must be a dict of name -> dataset")
            for key, ds in datasets.items():
                if not hasattr(ds, "streaming_split"):
                    raise TypeError(
                        f"{name}: datasets[{key!r}] is a {type(ds).__name__}, not a dataset; "
                        "make one with nbcluster.data (e.g. data.from_items([...]))"
                    )
        if dataset_config is not None and not isinstance(dataset_config, DataConfig):
            raise TypeError(f"{name}: dataset_config must be a nbcluster.train.DataConfig")
        if resume_from_checkpoint is not None and not isinstance(
            resume_from_checkpoint, Checkpoint
        ):
            raise TypeError(
                f"{name}: resume_from_checkpoint must be a Checkpoint (e.g. result.checkpoint), "
                f"got {type(resume_from_checkpoint).__name__}"
            )
        if metadata is not None and not isinstance(metadata, Mapping):
            raise TypeError(f"{name}: metadata must be a dict")
        self.train_loop_per_worker = train_loop_per_worker
        self.train_loop_config = dict(train_loop_config) if train_loop_config is not None else None
        self.backend_config = backend_config
        self.scaling_config = scaling_config
        self.run_config = run_config
        self.datasets = dict(datasets or {})
        self.dataset_config = dataset_config or DataConfig()
        self.resume_from_checkpoint = resume_from_checkpoint
        self.metadata = dict(metadata or {})

    def _backend_config(self) -> BackendConfig | None:
        return self.backend_config

    def _check_picklable(self, config: Any) -> None:
        """Raise ``SerializationError`` (a ``TypeError``) naming what cannot be sent."""
        name = type(self).__name__
        for what, value, path in (
            ("train_loop_per_worker", self.train_loop_per_worker, "train_loop_per_worker"),
            ("train_loop_config", config, "train_loop_config"),
            ("datasets", self.datasets, "datasets"),
        ):
            found = find_unpicklable(value, path)
            if found is not None:
                where, reason = found
                raise SerializationError(
                    f"{name}.fit(): {what} cannot be sent to the workers ({reason}). Create "
                    "such objects inside the training function instead (from plain settings "
                    "in train_loop_config)",
                    object_path=where,
                )

    def _dataset_shards(self, num_workers: int) -> list[dict[str, Any]]:
        """Each rank's datasets: split ones via ``streaming_split(n, equal=True)``."""
        shards: list[dict[str, Any]] = [{} for _ in range(num_workers)]
        for key, ds in self.datasets.items():
            if self.dataset_config.splits(key):
                parts = ds.streaming_split(num_workers, equal=True)
            else:
                whole = ds.iterator() if hasattr(ds, "iterator") else ds
                parts = [whole] * num_workers
            for rank in range(num_workers):
                shards[rank][key] = parts[rank]
        return shards

    def fit(self) -> Result:
        """Run the training and return its :class:`Result`.

        Raises :class:`~nbcluster.train.TrainingFailedError` when the run fails (a rank
        raised or died more often than ``FailureConfig(max_failures)`` allows); the error
        names each failed rank with its traceback. Interrupting the kernel stops the
        workers within seconds and returns a ``Result`` with ``interrupted=True`` (the
        checkpoints are kept). A second ``fit()`` with the same scaling config reuses
        the warm worker group.
        """
        result = run_trainer(self)
        if result.error is not None:
            raise result.error
        return result

    def __repr__(self) -> str:
        return f"<{type(self).__name__} num_workers={self.scaling_config.num_workers}>"
