"""``TorchConfig``: join a ``torch.distributed`` process group on every worker."""

from __future__ import annotations

import dataclasses
import datetime
import os
from typing import Any

from nbcluster.train._backend import BackendConfig

__all__ = ["TorchConfig"]


@dataclasses.dataclass
class TorchConfig(BackendConfig):
    """How the workers form a ``torch.distributed`` process group (``ray.train.torch.TorchConfig``).

    ``backend``: ``"gloo"`` on CPU, ``"nccl"`` when the workers use GPUs (the default
    picks); ``init_method``: ``"env"`` (``MASTER_ADDR``/``MASTER_PORT``, chosen by rank 0)
    or ``"tcp"``; ``timeout_s``: how long collective operations may wait (default 1800).
    Each worker also sets ``torch.set_num_threads`` to its CPUs (unless
    ``OMP_NUM_THREADS`` is set), so workers on one machine do not oversubscribe it.
    """

    backend: str | None = None
    init_method: str = "env"
    timeout_s: int = 1800

    preload = ("torch",)

    def __post_init__(self) -> None:
        if self.backend is not None and self.backend not in ("gloo", "nccl", "mpi", "ucc"):
            raise ValueError(
                f"TorchConfig(backend=...) must be None, 'gloo' or 'nccl', got {self.backend!r}"
            )
        if self.init_method not in ("env", "tcp"):
            raise ValueError(
                f"TorchConfig(init_method=...) must be 'env' or 'tcp', got {self.init_method!r}"
            )
        t = self.timeout_s
        if isinstance(t, bool) or not isinstance(t, (int, float)) or t <= 0:
            raise ValueError(f"TorchConfig(timeout_s=...) must be a positive number, got {t!r}")

    def on_worker_setup(self, setup: Any) -> Any:
        """Join the process group (all workers call this at the same time)."""
        import torch
        import torch.distributed as dist

        if "OMP_NUM_THREADS" not in os.environ and setup.num_cpus >= 1:
            torch.set_num_threads(int(setup.num_cpus))
        backend = self.backend or ("nccl" if setup.use_gpu else "gloo")
        if setup.use_gpu and torch.cuda.is_available():
            torch.cuda.set_device(0)
        if dist.is_initialized():
            dist.destroy_process_group()
        if self.init_method == "env":
            init = "env://"
        else:
            init = f"tcp://{setup.master_addr}:{setup.master_port}"
        dist.init_process_group(
            backend=backend,
            init_method=init,
            rank=setup.world_rank,
            world_size=setup.world_size,
            timeout=datetime.timedelta(seconds=self.timeout_s),
        )
        return backend

    def on_worker_shutdown(self, state: Any) -> None:
        """Leave the process group."""
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()
