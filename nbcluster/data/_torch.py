"""numpy batches to torch tensors (torch is imported only here, when it is used)."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

import nbcluster

__all__ = ["to_torch_batch", "torch_device"]


def _torch() -> Any:
    try:
        import torch
    except ImportError:
        raise ImportError(
            "iter_torch_batches needs PyTorch: pip install torch (or nbcluster[train])"
        ) from None
    return torch


def torch_device(device: Any) -> Any:
    """The torch device for ``device`` ("auto": the GPU assigned to this worker, else CPU)."""
    torch = _torch()
    if device == "auto" or device is None:
        if torch.cuda.is_available() and nbcluster.get_gpu_ids():
            return torch.device("cuda")
        return torch.device("cpu")
    return torch.device(device)


def _tensor(arr: Any, dtype: Any, device: Any, pin: bool) -> Any:
    torch = _torch()
    if isinstance(arr, np.ndarray) and arr.dtype == object:
        return [_tensor(np.asarray(a), dtype, device, pin) for a in arr]
    if isinstance(arr, np.ndarray) and not arr.flags.writeable:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            t = torch.as_tensor(arr)
        t = t.to(dtype=dtype) if dtype is not None and t.dtype != dtype else t.clone()
    else:
        t = torch.as_tensor(arr, dtype=dtype)
    if pin and t.device.type == "cpu":
        t = t.pin_memory()
    return t.to(device) if t.device != device else t


def _move(value: Any, device: Any) -> Any:
    torch = _torch()
    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, Mapping):
        return {k: _move(v, device) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_move(v, device) for v in value)
    return value


def to_torch_batch(
    batch: dict[str, np.ndarray],
    dtypes: Any,
    device: Any,
    collate_fn: Callable[[dict[str, np.ndarray]], Any] | None,
    pin_memory: bool = False,
) -> Any:
    """A dict of tensors (one per column), or ``collate_fn(batch)`` moved to ``device``."""
    if collate_fn is not None:
        return _move(collate_fn(batch), device)
    out = {}
    for name, arr in batch.items():
        dtype = dtypes.get(name) if isinstance(dtypes, Mapping) else dtypes
        out[name] = _tensor(arr, dtype, device, pin_memory)
    return out
