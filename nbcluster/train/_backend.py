"""``BackendConfig``: what a framework needs on each worker (``ray.train.backend``).

:class:`~nbcluster.train.DataParallelTrainer` starts the worker group, sets the usual
environment (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``,
``NODE_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``: rank 0 picked the port) and then calls
the backend config's :meth:`BackendConfig.on_worker_setup` on every worker at the same
time, e.g. to join a ``torch.distributed`` process group. A backend for another
framework subclasses it (it must be picklable and importable on the workers).
"""

from __future__ import annotations

from typing import Any

__all__ = ["BackendConfig"]


class BackendConfig:
    """Per-worker set-up of a framework; the base class does nothing.

    ``preload``: modules the workers import as soon as they start (in the background, so
    the import overlaps with the rest of the start-up).
    """

    preload: tuple[str, ...] = ()

    def on_worker_setup(self, setup: Any) -> Any:
        """Run on each worker (all at once) after the environment is set; return any
        state :meth:`on_worker_shutdown` needs. ``setup`` has ``world_rank``,
        ``world_size``, ``local_rank``, ``local_world_size``, ``node_rank``,
        ``master_addr``, ``master_port``, ``use_gpu``, ``num_cpus``."""
        return None

    def on_worker_shutdown(self, state: Any) -> None:
        """Undo :meth:`on_worker_setup` (called before a worker is set up again)."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"
