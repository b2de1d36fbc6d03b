"""``nbcluster.train``: distributed training with Ray Train's names and semantics.

A trainer runs a training function on a group of workers (actors placed by one placement
group) and returns a :class:`Result`::

    from nbcluster import train
    from nbcluster.train.torch import TorchTrainer

    def train_func(config):
        ...
        train.report({"loss": loss}, checkpoint=train.Checkpoint.from_directory(tmpdir))

    result = TorchTrainer(train_func, scaling_config=train.ScalingConfig(num_workers=2)).fit()

Inside the function: :func:`report`, :func:`get_checkpoint`, :func:`get_context`,
:func:`get_dataset_shard`. Around it: :class:`ScalingConfig`, :class:`RunConfig` (with
:class:`CheckpointConfig` and :class:`FailureConfig`), :class:`DataConfig`. In a notebook
``fit()`` shows a live widget (each metric against the iteration, the workers, the kept
checkpoints); interrupting the kernel stops the run and keeps its checkpoints.
Frameworks: :mod:`nbcluster.train.torch`. Libraries built on Train (Tune) run a trainer
through :mod:`nbcluster.train.trainer`. Importing this package imports neither torch nor
the widget libraries.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# Every public name, and the module that defines it. ``import nbcluster.train`` imports none
# of them: a name is imported on first use. A process that needs only ``report`` and
# ``Checkpoint`` (a worker, a Tune trial runner) does not load the driver's controller,
# worker-group and display modules.
_EXPORTS: dict[str, str] = {
    "BackendConfig": "nbcluster.train._backend",
    "Checkpoint": "nbcluster.train._checkpoint",
    "CheckpointConfig": "nbcluster.train._config",
    "ControllerError": "nbcluster.train._errors",
    "DataConfig": "nbcluster.train._config",
    "DataParallelTrainer": "nbcluster.train._trainer",
    "FailureConfig": "nbcluster.train._config",
    "Result": "nbcluster.train._result",
    "RunConfig": "nbcluster.train._config",
    "ScalingConfig": "nbcluster.train._config",
    "StorageContext": "nbcluster.train._session",
    "TrainContext": "nbcluster.train._session",
    "TrainingFailedError": "nbcluster.train._errors",
    "WorkerGroupError": "nbcluster.train._errors",
    "get_checkpoint": "nbcluster.train._session",
    "get_context": "nbcluster.train._session",
    "get_dataset_shard": "nbcluster.train._session",
    "release_warm_groups": "nbcluster.train._group",
    "report": "nbcluster.train._session",
}

__all__ = [
    "BackendConfig",
    "Checkpoint",
    "CheckpointConfig",
    "ControllerError",
    "DataConfig",
    "DataParallelTrainer",
    "FailureConfig",
    "Result",
    "RunConfig",
    "ScalingConfig",
    "StorageContext",
    "TrainContext",
    "TrainingFailedError",
    "WorkerGroupError",
    "get_checkpoint",
    "get_context",
    "get_dataset_shard",
    "release_warm_groups",
    "report",
]


def __getattr__(name: str) -> Any:
    """Import a public name on first use (see ``_EXPORTS``)."""
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'nbcluster.train' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


if TYPE_CHECKING:  # what static tools see: the same names, imported eagerly
    from nbcluster.train._backend import BackendConfig
    from nbcluster.train._checkpoint import Checkpoint
    from nbcluster.train._config import (
        CheckpointConfig,
        DataConfig,
        FailureConfig,
        RunConfig,
        ScalingConfig,
    )
    from nbcluster.train._errors import ControllerError, TrainingFailedError, WorkerGroupError
    from nbcluster.train._group import release_warm_groups
    from nbcluster.train._result import Result
    from nbcluster.train._session import (
        StorageContext,
        TrainContext,
        get_checkpoint,
        get_context,
        get_dataset_shard,
        report,
    )
    from nbcluster.train._trainer import DataParallelTrainer
