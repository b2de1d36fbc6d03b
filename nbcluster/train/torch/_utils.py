"""``prepare_model``, ``prepare_data_loader``, ``get_device``: the helpers a training
function calls (``ray.train.torch``). torch is imported here, on the workers."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader, DistributedSampler, IterableDataset, RandomSampler

from nbcluster.train._session import get_context

__all__ = ["get_device", "prepare_data_loader", "prepare_model"]


def _use_gpu() -> bool:
    res = get_context().get_trial_resources()
    return bool(res.get("GPU", 0)) and torch.cuda.is_available()


def get_device() -> torch.device:
    """The device this worker trains on: its GPU when the run uses GPUs, else the CPU."""
    if _use_gpu():
        return torch.device(f"cuda:{torch.cuda.current_device()}")
    return torch.device("cpu")


def prepare_model(
    model: torch.nn.Module,
    move_to_device: bool | torch.device = True,
    parallel_strategy: str | None = "ddp",
    parallel_strategy_kwargs: dict[str, Any] | None = None,
) -> torch.nn.Module:
    """Move ``model`` to this worker's device and wrap it in ``DistributedDataParallel``
    (when there is more than one worker), so gradients are averaged across ranks."""
    if parallel_strategy not in ("ddp", None):
        raise ValueError(f"parallel_strategy must be 'ddp' or None, got {parallel_strategy!r}")
    device = move_to_device if isinstance(move_to_device, torch.device) else get_device()
    if move_to_device is not False:
        model = model.to(device)
    if parallel_strategy == "ddp" and get_context().get_world_size() > 1:
        from torch.nn.parallel import DistributedDataParallel

        kwargs = dict(parallel_strategy_kwargs or {})
        if device.type == "cuda":
            kwargs.setdefault("device_ids", [device])
            kwargs.setdefault("output_device", device)
        model = DistributedDataParallel(model, **kwargs)
    return model


class _DeviceDataLoader(DataLoader):  # type: ignore[type-arg]
    """A ``DataLoader`` whose batches are moved to ``device`` (attributes of the wrapped
    loader, such as ``sampler``, stay reachable, so ``sampler.set_epoch`` works)."""

    def __init__(self, base: DataLoader, device: torch.device) -> None:  # type: ignore[type-arg]
        self.__dict__.update(base.__dict__)
        self._base = base
        self._device = device

    def _move(self, item: Any) -> Any:
        if isinstance(item, torch.Tensor):
            return item.to(self._device, non_blocking=True)
        if isinstance(item, (list, tuple)):
            return type(item)(self._move(i) for i in item)
        if isinstance(item, dict):
            return {k: self._move(v) for k, v in item.items()}
        return item

    def __iter__(self) -> Iterator[Any]:
        for batch in iter(self._base):
            yield self._move(batch)

    def __len__(self) -> int:
        return len(self._base)


def prepare_data_loader(
    data_loader: DataLoader,  # type: ignore[type-arg]
    add_dist_sampler: bool = True,
    move_to_device: bool = True,
    auto_transfer: bool = True,
) -> DataLoader:  # type: ignore[type-arg]
    """Give each rank its own part of the data and put batches on this worker's device.

    With more than one worker (and ``add_dist_sampler``), the loader is rebuilt with a
    ``DistributedSampler`` (shuffling if the original shuffled), so call
    ``loader.sampler.set_epoch(epoch)`` each epoch to reshuffle. With
    ``move_to_device`` batches arrive on :func:`get_device` (a no-op on CPU).
    """
    if not isinstance(data_loader, DataLoader):
        raise TypeError(
            f"prepare_data_loader() expects a torch.utils.data.DataLoader, got {type(data_loader).__name__}"
        )
    world = get_context().get_world_size()
    rank = get_context().get_world_rank()
    loader = data_loader
    if (
        add_dist_sampler
        and world > 1
        and not isinstance(loader.sampler, DistributedSampler)
        and not isinstance(loader.dataset, IterableDataset)
    ):
        if loader.batch_sampler is not None and loader.batch_size is None:
            raise ValueError(
                "prepare_data_loader() cannot add a DistributedSampler to a DataLoader built "
                "with a custom batch_sampler; pass add_dist_sampler=False and shard the data "
                "yourself (get_context().get_world_rank())"
            )
        shuffle = isinstance(loader.sampler, RandomSampler)
        sampler = DistributedSampler(loader.dataset, num_replicas=world, rank=rank, shuffle=shuffle)
        loader = DataLoader(
            loader.dataset,
            batch_size=loader.batch_size,
            sampler=sampler,
            num_workers=loader.num_workers,
            collate_fn=loader.collate_fn,
            pin_memory=loader.pin_memory,
            drop_last=loader.drop_last,
            timeout=loader.timeout,
            worker_init_fn=loader.worker_init_fn,
            generator=loader.generator,
            prefetch_factor=loader.prefetch_factor if loader.num_workers else None,
            persistent_workers=loader.persistent_workers,
        )
    device = get_device()
    if move_to_device and device.type != "cpu":
        loader = _DeviceDataLoader(loader, device)
    return loader
