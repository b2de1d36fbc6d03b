"""The joblib backend: each batch of joblib calls is one cluster task.

Large arguments (over :data:`STORE_THRESHOLD` bytes, such as the ``X`` and ``y`` that
scikit-learn passes to every fit) are put in the object store once per ``Parallel`` call
and read by the tasks from there, instead of being pickled into every batch.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import sys
import threading
from collections.abc import Callable
from typing import Any

from joblib._parallel_backends import (
    AutoBatchingMixin,
    FallbackToBackend,
    ParallelBackendBase,
    SequentialBackend,
)
from joblib.parallel import BatchedCalls

import nbcluster

__all__ = ["NbclusterBackend", "STORE_THRESHOLD"]

#: Arguments at least this big (``sys.getsizeof``) go through the object store once.
STORE_THRESHOLD = 100 * 1024


def joblib_batch(batch: Callable[[], list[Any]]) -> list[Any]:
    """The task: run one joblib batch (a ``BatchedCalls``) and return its results."""
    return batch()


class _Stored:
    """An argument that the task reads from the object store."""

    __slots__ = ("ref",)

    def __init__(self, ref: nbcluster.ObjectRef) -> None:
        self.ref = ref


class _Resolving:
    """Calls ``func`` after replacing :class:`_Stored` arguments by their values."""

    __slots__ = ("func",)

    def __init__(self, func: Callable[..., Any]) -> None:
        self.func = func

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        args = tuple(nbcluster.get(a.ref) if isinstance(a, _Stored) else a for a in args)
        kwargs = {
            k: nbcluster.get(v.ref) if isinstance(v, _Stored) else v for k, v in kwargs.items()
        }
        return self.func(*args, **kwargs)


class NbclusterBackend(AutoBatchingMixin, ParallelBackendBase):
    """Run joblib's batches as nbcluster tasks (``parallel_backend("nbcluster")``).

    ``n_jobs=-1`` (the default while this backend is active) means every CPU of the
    cluster. ``ray_remote_args`` (given to ``parallel_backend`` or ``Parallel``) are the
    task options of each batch, such as ``{"num_cpus": 2}``. ``n_jobs=1`` runs in this
    process, as joblib's process backends do.
    """

    supports_retrieve_callback = True
    supports_inner_max_num_threads = False
    supports_sharedmem = False
    uses_threads = False
    default_n_jobs = -1

    def __init__(
        self,
        nesting_level: int | None = None,
        inner_max_num_threads: int | None = None,
        ray_remote_args: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(
            nesting_level=nesting_level, inner_max_num_threads=inner_max_num_threads, **kwargs
        )
        self.ray_remote_args = ray_remote_args
        self._task: Any = None
        self._lock = threading.Lock()
        self._pending: dict[concurrent.futures.Future[Any], nbcluster.ObjectRef] = {}
        self._stored: dict[int, tuple[Any, _Stored]] = {}

    # -- sizing -----------------------------------------------------------------------------
    @staticmethod
    def _cluster_cpus() -> int:
        if not nbcluster.is_initialized():
            nbcluster.init()
        return max(int(nbcluster.cluster_resources().get("CPU", 1)), 1)

    def effective_n_jobs(self, n_jobs: int | None) -> int:
        """``n_jobs`` with negative values counted from the cluster's CPUs (-1: all)."""
        if n_jobs == 0:
            raise ValueError("n_jobs == 0 in Parallel has no meaning")
        if n_jobs is None:
            return 1
        if n_jobs < 0:
            return max(self._cluster_cpus() + 1 + n_jobs, 1)
        return n_jobs

    def configure(
        self,
        n_jobs: int = 1,
        parallel: Any = None,
        prefer: str | None = None,
        require: str | None = None,
        ray_remote_args: dict[str, Any] | None = None,
        **backend_kwargs: Any,
    ) -> int:
        """Check the options and size the backend for one ``Parallel`` call."""
        n_jobs = self.effective_n_jobs(n_jobs)
        if n_jobs == 1:
            raise FallbackToBackend(SequentialBackend(nesting_level=self.nesting_level))
        args = ray_remote_args if ray_remote_args is not None else self.ray_remote_args
        if args is not None and not isinstance(args, dict):
            raise TypeError(f"ray_remote_args must be a dict of task options, got {args!r}")
        task = nbcluster.remote(joblib_batch)
        self._task = task.options(**args) if args else task
        self.parallel = parallel
        return n_jobs

    # -- running ------------------------------------------------------------------------------
    def _store(self, value: Any) -> Any:
        try:
            big = sys.getsizeof(value) >= STORE_THRESHOLD
        except TypeError:
            big = False
        if not big:
            return value
        with self._lock:
            entry = self._stored.get(id(value))
            if entry is None or entry[0] is not value:
                entry = (value, _Stored(nbcluster.put(value)))
                self._stored[id(value)] = entry
        return entry[1]

    def _with_stored_args(self, func: Any) -> Any:
        """The batch, with its large arguments replaced by object-store refs."""
        if not isinstance(func, BatchedCalls):
            return func
        items = []
        changed = False
        for f, args, kwargs in func.items:
            new_args = [self._store(a) for a in args]
            new_kwargs = {k: self._store(v) for k, v in kwargs.items()}
            stored = any(isinstance(a, _Stored) for a in (*new_args, *new_kwargs.values()))
            changed = changed or stored
            items.append((_Resolving(f) if stored else f, new_args, new_kwargs))
        if not changed:
            return func
        return BatchedCalls(items, (func._backend, func._n_jobs), None, func._pickle_cache)

    def submit(
        self, func: Callable[[], Any], callback: Callable[[Any], None] | None = None
    ) -> concurrent.futures.Future[Any]:
        """Run one batch as a task; ``callback`` gets the future when it is done."""
        if self._task is None:
            raise RuntimeError("the nbcluster joblib backend was not configured")
        ref = self._task.remote(self._with_stored_args(func))
        future = ref.future()
        with self._lock:
            self._pending[future] = ref
        future.add_done_callback(self._forget)
        if callback is not None:
            future.add_done_callback(callback)
        return future

    def _forget(self, future: concurrent.futures.Future[Any]) -> None:
        with self._lock:
            self._pending.pop(future, None)

    def retrieve_result_callback(self, out: concurrent.futures.Future[Any]) -> Any:
        """The batch's results, or its exception (a ``TaskError`` that is also an
        instance of the exception the call raised)."""
        return out.result()

    def abort_everything(self, ensure_ready: bool = True) -> None:
        """Cancel the batches still running (a call failed, joblib will raise it)."""
        with self._lock:
            refs = list(self._pending.values())
            self._pending.clear()
        for ref in refs:
            # A batch that already finished, or whose worker is gone, has nothing to cancel.
            with contextlib.suppress(Exception):
                nbcluster.cancel(ref)
        self._stored.clear()

    def stop_call(self) -> None:
        """End of a ``Parallel`` call: let the stored arguments go."""
        with self._lock:
            self._stored.clear()

    def terminate(self) -> None:
        """Free what this backend holds (its tasks end on their own)."""
        with self._lock:
            self._stored.clear()
        self.reset_batch_stats()
