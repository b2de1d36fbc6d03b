"""``nbcluster.train.torch``: distributed PyTorch training (``ray.train.torch``).

``TorchTrainer`` runs a training function on ``ScalingConfig.num_workers`` workers
joined in a ``torch.distributed`` process group (gloo on CPU, nccl on GPUs). Inside the
function, ``prepare_model`` wraps the model in ``DistributedDataParallel`` and
``prepare_data_loader`` shards a ``DataLoader`` with a ``DistributedSampler``.

Importing this module does not import torch: the driver (a notebook) can build and run a
trainer without torch installed; the workers import it. ``prepare_model``,
``prepare_data_loader`` and ``get_device`` load torch on first use.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from nbcluster.train._checkpoint import Checkpoint
from nbcluster.train._config import DataConfig, RunConfig, ScalingConfig
from nbcluster.train._trainer import DataParallelTrainer
from nbcluster.train.torch._config import TorchConfig

__all__ = ["TorchConfig", "TorchTrainer", "get_device", "prepare_data_loader", "prepare_model"]


class TorchTrainer(DataParallelTrainer):
    """Data-parallel PyTorch training (``ray.train.torch.TorchTrainer``).

    ``train_loop_per_worker(config)`` runs on every worker after the process group is
    formed (``torch_config``, default ``TorchConfig()``). See
    :class:`~nbcluster.train.DataParallelTrainer` for the other arguments.
    """

    def __init__(
        self,
        train_loop_per_worker: Callable[..., Any],
        *,
        train_loop_config: dict[str, Any] | None = None,
        torch_config: TorchConfig | None = None,
        scaling_config: ScalingConfig | None = None,
        run_config: RunConfig | None = None,
        datasets: dict[str, Any] | None = None,
        dataset_config: DataConfig | None = None,
        resume_from_checkpoint: Checkpoint | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> None:
        if torch_config is not None and not isinstance(torch_config, TorchConfig):
            raise TypeError(
                f"TorchTrainer: torch_config must be a TorchConfig, got {type(torch_config).__name__}"
            )
        super().__init__(
            train_loop_per_worker,
            train_loop_config=train_loop_config,
            backend_config=torch_config or TorchConfig(),
            scaling_config=scaling_config,
            run_config=run_config,
            datasets=datasets,
            dataset_config=dataset_config,
            resume_from_checkpoint=resume_from_checkpoint,
            metadata=metadata,
        )

    @property
    def torch_config(self) -> TorchConfig:
        """The process-group settings."""
        config = self.backend_config
        assert isinstance(config, TorchConfig)
        return config


def get_device() -> Any:
    """This worker's device: its GPU when the run uses GPUs, else the CPU."""
    from nbcluster.train.torch import _utils

    return _utils.get_device()


def prepare_model(
    model: Any,
    move_to_device: Any = True,
    parallel_strategy: str | None = "ddp",
    parallel_strategy_kwargs: dict[str, Any] | None = None,
) -> Any:
    """Move the model to this worker's device and wrap it in ``DistributedDataParallel``
    (with more than one worker)."""
    from nbcluster.train.torch import _utils

    return _utils.prepare_model(model, move_to_device, parallel_strategy, parallel_strategy_kwargs)


def prepare_data_loader(
    data_loader: Any,
    add_dist_sampler: bool = True,
    move_to_device: bool = True,
    auto_transfer: bool = True,
) -> Any:
    """Shard a ``DataLoader`` across ranks (``DistributedSampler``; call
    ``loader.sampler.set_epoch(epoch)`` each epoch) and move batches to the device."""
    from nbcluster.train.torch import _utils

    return _utils.prepare_data_loader(data_loader, add_dist_sampler, move_to_device, auto_transfer)
