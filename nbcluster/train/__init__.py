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
Frameworks: :mod:`nbcluster.train.torch`. Importing this package imports neither torch
nor the widget libraries.
"""

from nbcluster.train._backend import BackendConfig
from nbcluster.train._checkpoint import Checkpoint
from nbcluster.train._config import (
    CheckpointConfig,
    DataConfig,
    FailureConfig,
    RunConfig,
    ScalingConfig,
)
from nbcluster.train._errors import (
    ControllerError,
    TrainingFailedError,
    WorkerGroupError,
)
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
