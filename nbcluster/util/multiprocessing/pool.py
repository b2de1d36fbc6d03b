"""``Pool``: the standard library's ``multiprocessing.Pool`` API on the cluster's processes
(Ray's ``ray.util.multiprocessing.Pool``).

Each pool process is an actor; work is cut into chunks, and each chunk is one actor call
that runs its calls one after the other and returns their results (see ``_worker``).
Chunks go to the processes in turn. The processes are spread over the cluster's nodes in
proportion to their CPUs, and hold no CPU of their own (as in Ray), so a pool never
blocks the cluster's other work.
"""

from __future__ import annotations

import itertools
import logging
import os
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import nbcluster
from nbcluster.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from ._results import AsyncResult, IMapIterator
from ._worker import Call, PoolActor

__all__ = ["Pool"]

logger = logging.getLogger(__name__)


def _check_chunksize(chunksize: int | None) -> None:
    if chunksize is None:
        return
    if isinstance(chunksize, bool) or not isinstance(chunksize, int):
        raise TypeError(f"chunksize must be an int >= 1 or None, got {chunksize!r}")
    if chunksize < 1:
        raise ValueError(f"Chunksize must be 1+, not {chunksize}")


def _chunks(iterable: Iterable[Any], size: int, star: bool) -> Iterator[list[Call]]:
    it = iter(iterable)
    while True:
        chunk = list(itertools.islice(it, size))
        if not chunk:
            return
        yield [(tuple(a), {}) if star else ((a,), {}) for a in chunk]


class _Process:
    """One pool process: its actor, the batches sent to it, and its last call's ref."""

    __slots__ = ("actor", "batches", "last")

    def __init__(self, actor: Any) -> None:
        self.actor = actor
        self.batches = 0
        self.last: nbcluster.ObjectRef | None = None


class Pool:
    """A pool of worker processes on the cluster, with ``multiprocessing.Pool``'s API.

    Args:
        processes: how many processes; by default the cluster's CPU count. It may not
            exceed the cluster's CPUs.
        initializer: called as ``initializer(*initargs)`` in each process when it starts.
        initargs: the arguments of ``initializer``.
        maxtasksperchild: replace a process after it ran this many chunks (None: never).
        context: accepted for compatibility with ``multiprocessing.Pool`` and ignored.
        ray_address: the cluster to connect to when this process is not connected yet;
            ``"local"`` or None (and no ``NBCLUSTER_ADDRESS``) start a local cluster with
            ``processes`` CPUs.
        ray_remote_args: options for the pool's actors (``num_cpus``, ``resources``,
            ``scheduling_strategy``...). By default they hold no CPU and are spread over
            the nodes in proportion to their CPUs.

    Use it as a context manager (leaving the block terminates it), or call ``close()``
    then ``join()``. A pool cannot be pickled or passed to tasks.
    """

    def __init__(
        self,
        processes: int | None = None,
        initializer: Callable[..., Any] | None = None,
        initargs: Iterable[Any] | None = None,
        maxtasksperchild: int | None = None,
        context: Any = None,
        ray_address: str | None = None,
        ray_remote_args: dict[str, Any] | None = None,
    ) -> None:
        if processes is not None and (
            isinstance(processes, bool) or not isinstance(processes, int)
        ):
            raise TypeError(f"processes must be an int or None, got {processes!r}")
        if initializer is not None and not callable(initializer):
            raise TypeError("initializer must be a callable")
        if maxtasksperchild is not None and (
            isinstance(maxtasksperchild, bool)
            or not isinstance(maxtasksperchild, int)
            or maxtasksperchild < 1
        ):
            raise ValueError("maxtasksperchild must be a positive int or None")
        if ray_remote_args is not None and not isinstance(ray_remote_args, dict):
            raise TypeError(
                f"ray_remote_args must be a dict of actor options, got {ray_remote_args!r}"
            )
        if context is not None:
            logger.warning(
                "Pool(context=...) is ignored: the pool's processes are actors started by "
                "the cluster"
            )
        self._closed = False
        self._initializer = initializer
        self._initargs = tuple(initargs) if initargs is not None else None
        self._maxtasks = maxtasksperchild
        self._remote_args = dict(ray_remote_args or {})
        self._next = 0
        self._retiring: list[_Process] = []
        self._processes: list[_Process] = []
        self._actor_class = nbcluster.remote(PoolActor)
        count = self._connect(processes, ray_address)
        self._placements = self._spread(count)
        self._processes = [_Process(self._new_actor(i)) for i in range(count)]
        try:
            nbcluster.get([p.actor.ping.remote() for p in self._processes])
        except BaseException:
            self.terminate()
            raise

    # -- set-up ------------------------------------------------------------------------------
    @staticmethod
    def _connect(processes: int | None, address: str | None) -> int:
        if not nbcluster.is_initialized():
            if address == "local" or (address is None and "NBCLUSTER_ADDRESS" not in os.environ):
                nbcluster.init(num_cpus=processes)
            else:
                nbcluster.init(address=address)
        cpus = int(nbcluster.cluster_resources().get("CPU", 0))
        if processes is None:
            processes = cpus
        if processes <= 0:
            raise ValueError(
                f"Processes in the pool must be >0, got {processes}"
                + (" (the cluster has no CPU)" if cpus == 0 else "")
            )
        if processes > cpus:
            raise ValueError(
                f"Tried to start a pool with {processes} processes on a cluster with only "
                f"{cpus} CPUs; ask for at most {cpus} processes, or add nodes"
            )
        return processes

    def _spread(self, count: int) -> list[Any]:
        """Scheduling strategy of each process: node affinity (soft), nodes taken in turn
        in proportion to their CPUs, unless the caller gave a strategy."""
        if "scheduling_strategy" in self._remote_args:
            return [self._remote_args["scheduling_strategy"]] * count
        slots: list[list[str]] = []
        for node in nbcluster.nodes():
            cpus = int(node["Resources"].get("CPU", 0)) if node["Alive"] else 0
            slots.append([node["NodeID"]] * cpus)
        order = [n for group in itertools.zip_longest(*slots) for n in group if n is not None]
        if not order:
            return ["DEFAULT"] * count
        return [
            NodeAffinitySchedulingStrategy(order[i % len(order)], soft=True) for i in range(count)
        ]

    def _new_actor(self, index: int) -> Any:
        options = {"num_cpus": 0, **self._remote_args}
        options["scheduling_strategy"] = self._placements[index]
        return self._actor_class.options(**options).remote(self._initializer, self._initargs)

    # -- submission ------------------------------------------------------------------------------
    def _check_running(self) -> None:
        if self._closed:
            raise ValueError("Pool not running")

    def _reap(self) -> None:
        """Kill retired processes whose last chunk has finished."""
        if not self._retiring:
            return
        done, _ = nbcluster.wait(
            [p.last for p in self._retiring if p.last is not None],
            num_returns=len(self._retiring),
            timeout=0,
        )
        finished = {ref for ref in done}
        keep = []
        for p in self._retiring:
            if p.last in finished:
                nbcluster.kill(p.actor)
            else:
                keep.append(p)
        self._retiring = keep

    def _submit(self, func: Callable[..., Any], chunk: list[Call]) -> nbcluster.ObjectRef:
        """Send one chunk to the next process in turn; return the ref of its results."""
        index = self._next
        self._next = (index + 1) % len(self._processes)
        proc = self._processes[index]
        ref = proc.actor.run_batch.remote(func, chunk)
        proc.batches += 1
        proc.last = ref
        if self._maxtasks is not None and proc.batches >= self._maxtasks:
            self._retiring.append(proc)
            self._processes[index] = _Process(self._new_actor(index))
        self._reap()
        return ref

    def _default_chunksize(self, n: int) -> int:
        chunksize, extra = divmod(n, len(self._processes) * 4)
        return chunksize + 1 if extra else chunksize

    def _map_async(
        self,
        func: Callable[..., Any],
        iterable: Iterable[Any],
        chunksize: int | None,
        star: bool,
        callback: Callable[[Any], object] | None = None,
        error_callback: Callable[[BaseException], object] | None = None,
    ) -> AsyncResult:
        self._check_running()
        _check_chunksize(chunksize)
        items = iterable if hasattr(iterable, "__len__") else list(iterable)
        size = chunksize or max(self._default_chunksize(len(items)), 1)  # type: ignore[arg-type]
        refs = [self._submit(func, chunk) for chunk in _chunks(items, size, star)]
        return AsyncResult(refs, single=False, callback=callback, error_callback=error_callback)

    # -- the multiprocessing.Pool API ------------------------------------------------------------
    def apply(
        self,
        func: Callable[..., Any],
        args: Iterable[Any] = (),
        kwds: dict[str, Any] | None = None,
        *,
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        """``func(*args, **kwds)`` in a pool process; waits for and returns the result."""
        return self.apply_async(func, args, kwds, kwargs=kwargs).get()

    def apply_async(
        self,
        func: Callable[..., Any],
        args: Iterable[Any] = (),
        kwds: dict[str, Any] | None = None,
        callback: Callable[[Any], object] | None = None,
        error_callback: Callable[[BaseException], object] | None = None,
        *,
        kwargs: dict[str, Any] | None = None,
    ) -> AsyncResult:
        """``func(*args, **kwds)`` in a pool process; returns an :class:`AsyncResult` at once.

        ``kwargs=`` is Ray's name for ``kwds=`` (give one of them).
        """
        self._check_running()
        if kwds is not None and kwargs is not None:
            raise TypeError("give the keyword arguments as kwds= or kwargs=, not both")
        if not callable(func):
            raise TypeError(f"func must be callable, got {func!r}")
        call: Call = (tuple(args or ()), dict(kwds or kwargs or {}))
        ref = self._submit(func, [call])
        return AsyncResult([ref], single=True, callback=callback, error_callback=error_callback)

    def map(
        self, func: Callable[..., Any], iterable: Iterable[Any], chunksize: int | None = None
    ) -> list[Any]:
        """``[func(x) for x in iterable]``, run in chunks over the processes."""
        return self._map_async(func, iterable, chunksize, star=False).get()

    def map_async(
        self,
        func: Callable[..., Any],
        iterable: Iterable[Any],
        chunksize: int | None = None,
        callback: Callable[[Any], object] | None = None,
        error_callback: Callable[[BaseException], object] | None = None,
    ) -> AsyncResult:
        """:meth:`map` returning an :class:`AsyncResult` at once; ``callback`` gets the
        list of results, ``error_callback`` the first exception."""
        return self._map_async(func, iterable, chunksize, False, callback, error_callback)

    def starmap(
        self,
        func: Callable[..., Any],
        iterable: Iterable[Iterable[Any]],
        chunksize: int | None = None,
    ) -> list[Any]:
        """``[func(*args) for args in iterable]``, run in chunks over the processes."""
        return self._map_async(func, iterable, chunksize, star=True).get()

    def starmap_async(
        self,
        func: Callable[..., Any],
        iterable: Iterable[Iterable[Any]],
        chunksize: int | None = None,
        callback: Callable[[Any], object] | None = None,
        error_callback: Callable[[BaseException], object] | None = None,
    ) -> AsyncResult:
        """:meth:`starmap` returning an :class:`AsyncResult` at once."""
        return self._map_async(func, iterable, chunksize, True, callback, error_callback)

    def imap(
        self, func: Callable[..., Any], iterable: Iterable[Any], chunksize: int | None = 1
    ) -> IMapIterator:
        """Lazy :meth:`map`: an iterator of the results, in order. The input is read as
        results are taken, a few chunks per process ahead."""
        return self._imap(func, iterable, chunksize, ordered=True)

    def imap_unordered(
        self, func: Callable[..., Any], iterable: Iterable[Any], chunksize: int | None = 1
    ) -> IMapIterator:
        """Like :meth:`imap`, but results come in the order they finish."""
        return self._imap(func, iterable, chunksize, ordered=False)

    def _imap(
        self,
        func: Callable[..., Any],
        iterable: Iterable[Any],
        chunksize: int | None,
        ordered: bool,
    ) -> IMapIterator:
        self._check_running()
        _check_chunksize(chunksize)
        chunks = _chunks(iterable, chunksize or 1, star=False)
        window = 2 * len(self._processes)
        return IMapIterator(self._submit, func, chunks, ordered=ordered, window=window)

    def close(self) -> None:
        """Accept no more work; the processes exit once the work already given is done
        (:meth:`join` waits for that)."""
        self._closed = True

    def terminate(self) -> None:
        """Stop the processes now; unfinished results raise ``ActorDiedError``."""
        self._closed = True
        for p in [*self._processes, *self._retiring]:
            nbcluster.kill(p.actor)
        self._retiring = []

    def join(self) -> None:
        """Wait for the work given to a closed pool to finish, then end its processes."""
        if not self._closed:
            raise ValueError("Pool is still running")
        procs = [*self._processes, *self._retiring]
        pending = [p.last for p in procs if p.last is not None]
        if pending:
            nbcluster.wait(pending, num_returns=len(pending))
        for p in procs:
            nbcluster.kill(p.actor)
        self._retiring = []

    def __enter__(self) -> Pool:
        self._check_running()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.terminate()

    def __reduce__(self) -> Any:
        raise NotImplementedError(
            "pool objects cannot be passed between processes or pickled; create the Pool "
            "where it is used"
        )

    def __repr__(self) -> str:
        state = "CLOSE" if self._closed else "RUN"
        return (
            f"<nbcluster.util.multiprocessing.Pool state={state} pool_size={len(self._processes)}>"
        )
