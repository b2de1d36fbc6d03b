"""What a training function calls on its worker: ``report``, ``get_checkpoint``,
``get_context``, ``get_dataset_shard`` (Ray Train's names).

Each worker process runs one training function at a time, in a thread of the worker
actor (``_worker.py``), with a :class:`Session` set for that thread (:func:`use_session`).
``report`` checks the metrics, copies a checkpoint into the run's storage (a staging
directory the driver renames to ``storage_path/name/checkpoint_NNNNNN`` when every rank
has reported; the copy is done before ``report`` returns, so the loop may delete its
temporary directory right after) and hands the report to the worker's outbox, which the
driver drains. In a Tune trial (outside a Train worker) ``report`` and
``get_checkpoint`` go to the trial's session, which Tune's runner sets around each
trial's function (:func:`trial_session`). Outside a training function
these raise ``RuntimeError`` saying where they belong.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import os
import threading
from collections.abc import Iterator, Mapping
from typing import Any, Generic, TypeVar

from nbcluster.train._checkpoint import METADATA_FILE, Checkpoint
from nbcluster.train._fileio import atomic_copy_tree
from nbcluster.train._state import checkpoint_dir_name as _default_dir_name
from nbcluster.train._storage import staging_name

__all__ = [
    "Outbox",
    "Session",
    "SessionSlot",
    "StopTraining",
    "StorageContext",
    "TrainContext",
    "check_metrics",
    "current_trial_session",
    "get_checkpoint",
    "get_context",
    "get_dataset_shard",
    "report",
    "trial_session",
    "use_session",
]

#: Reports a worker may have in flight before ``report`` waits for the driver.
MAX_UNACKED_REPORTS = 2


class StopTraining(BaseException):  # noqa: N818 - not an error: the run was asked to stop
    """Raised by ``report`` when the run was asked to stop (interrupt, or a callback).

    A ``BaseException``, so that ``except Exception`` in a training loop lets it through.
    """


@dataclasses.dataclass(frozen=True)
class StorageContext:
    """Where a run writes (``get_context().get_storage()``)."""

    storage_path: str
    experiment_dir_name: str
    trial_dir_name: str = ""

    @property
    def experiment_fs_path(self) -> str:
        """``storage_path/name``: the run's directory."""
        return os.path.join(self.storage_path, self.experiment_dir_name)

    @property
    def trial_fs_path(self) -> str:
        """The run's directory (a trainer's run has one trial: the run itself)."""
        return self.experiment_fs_path


@dataclasses.dataclass(frozen=True)
class TrainContext:
    """Who this worker is in the run (``ray.train.get_context()``)."""

    world_size: int
    world_rank: int
    local_rank: int
    local_world_size: int
    node_rank: int
    experiment_name: str
    trial_id: str
    storage: StorageContext
    trial_resources: Mapping[str, float]
    metadata: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def get_world_size(self) -> int:
        """Number of workers in the run."""
        return self.world_size

    def get_world_rank(self) -> int:
        """This worker's rank, 0..world_size-1."""
        return self.world_rank

    def get_local_rank(self) -> int:
        """This worker's rank among the workers on its node."""
        return self.local_rank

    def get_local_world_size(self) -> int:
        """Number of workers on this worker's node."""
        return self.local_world_size

    def get_node_rank(self) -> int:
        """The rank of this worker's node among the run's nodes."""
        return self.node_rank

    def get_experiment_name(self) -> str:
        """The run's name (``RunConfig.name``)."""
        return self.experiment_name

    def get_trial_name(self) -> str:
        """The trial's name: the run's name (a trainer's run is one trial)."""
        return self.experiment_name

    def get_trial_id(self) -> str:
        """An id for this run."""
        return self.trial_id

    def get_trial_dir(self) -> str:
        """The run's directory, ``storage_path/name``."""
        return self.storage.trial_fs_path

    def get_trial_resources(self) -> Mapping[str, float]:
        """What each worker reserves."""
        return self.trial_resources

    def get_storage(self) -> StorageContext:
        """Where the run writes."""
        return self.storage

    def get_metadata(self) -> Mapping[str, Any]:
        """User metadata of the trainer (``metadata=`` of the trainer)."""
        return self.metadata


class Outbox:
    """A worker's events (reports, end of the loop) until the driver acknowledges them.

    Events get increasing sequence numbers; :meth:`take` returns every event after the
    driver's acknowledgement (so an event is never lost when a poll is cancelled) and
    drops the acknowledged ones. ``put`` of a report waits while
    :data:`MAX_UNACKED_REPORTS` are unacknowledged, so a loop cannot run far ahead of
    the driver.
    """

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.items: list[tuple[int, tuple[Any, ...]]] = []
        self.seq = 0
        self.stop = threading.Event()

    def put(self, event: tuple[Any, ...], wait_for_room: bool = False) -> None:
        """Queue ``event``; with ``wait_for_room`` wait while too many are unacknowledged."""
        with self.cond:
            self.seq += 1
            self.items.append((self.seq, event))
            self.cond.notify_all()
            if wait_for_room:
                while len(self.items) >= MAX_UNACKED_REPORTS and not self.stop.is_set():
                    self.cond.wait(0.5)

    def take(self, ack: int, timeout: float) -> list[tuple[int, tuple[Any, ...]]]:
        """Drop events up to ``ack``; wait up to ``timeout`` s for one; return the rest."""
        with self.cond:
            if self.items and self.items[0][0] <= ack:
                self.items = [item for item in self.items if item[0] > ack]
                self.cond.notify_all()
            if not self.items and timeout > 0:
                self.cond.wait(timeout)
            return list(self.items)

    def request_stop(self) -> None:
        """Make the next ``report`` raise :class:`StopTraining`, and wake a waiting one."""
        self.stop.set()
        with self.cond:
            self.cond.notify_all()


@dataclasses.dataclass
class Session:
    """The state of the training function running on this worker."""

    context: TrainContext
    outbox: Outbox
    next_index: int
    checkpoint: Checkpoint | None
    dataset_shards: Mapping[str, Any]
    #: Names this attempt's staging directories (see ``_storage``): the driver registers a
    #: checkpoint by renaming ``.staging-<attempt>-<name>`` to ``<name>``.
    attempt: str = "0"


_T = TypeVar("_T")


class SessionSlot(Generic[_T]):
    """Which session the calls of a thread go to, set around one execution of a function.

    :meth:`use` sets the session for the calling thread (a ``ContextVar``) for the length
    of a ``with`` block, and also as the process's current one, so that threads the
    function starts itself find it too. Leaving the block clears the process's session
    only if it is still this one: an execution that ends never clears the session of one
    that began meanwhile, and a thread always sees its own execution's session first.
    """

    def __init__(self, name: str) -> None:
        self._var: contextvars.ContextVar[_T | None] = contextvars.ContextVar(name, default=None)
        self._process: _T | None = None
        self._lock = threading.Lock()

    def get(self) -> _T | None:
        """The session of the calling thread, else the process's latest, else None."""
        session = self._var.get()
        return session if session is not None else self._process

    @contextlib.contextmanager
    def use(self, session: _T) -> Iterator[_T]:
        """Route this thread's calls (and, as a fallback, the process's) to ``session``."""
        token = self._var.set(session)
        with self._lock:
            self._process = session
        try:
            yield session
        finally:
            self._var.reset(token)
            with self._lock:
                if self._process is session:
                    self._process = None


#: The training function's session on a Train worker (set by ``_worker.TrainWorker``).
_worker_sessions: SessionSlot[Session] = SessionSlot("nbcluster_train_session")
#: The Tune trial a runner executes (set by ``nbcluster.tune``'s runner through
#: :func:`trial_session`): ``report`` and ``get_checkpoint`` called in a Tune trial,
#: outside a Train worker, go to it.
_trial_sessions: SessionSlot[Any] = SessionSlot("nbcluster_trial_session")


def use_session(session: Session) -> contextlib.AbstractContextManager[Session]:
    """``with use_session(s):`` runs a training function with ``s`` as its session."""
    return _worker_sessions.use(session)


def trial_session(session: Any) -> contextlib.AbstractContextManager[Any]:
    """``with trial_session(s):`` routes ``report``/``get_checkpoint`` of the calling thread
    (and of threads it starts) to the Tune trial session ``s`` (an object with
    ``report(metrics, checkpoint=)`` and ``loaded_checkpoint``) while the block runs."""
    return _trial_sessions.use(session)


def current_trial_session() -> Any:
    """The trial session in force for the calling thread (see :func:`trial_session`)."""
    return _trial_sessions.get()


def _require(fn: str) -> Session:
    session = _worker_sessions.get()
    if session is None:
        raise RuntimeError(
            f"nbcluster.train.{fn}() can only be called inside a training function: "
            "the train_loop_per_worker a trainer's fit() runs on each worker (or in a "
            "trial that Tuner.fit() runs)"
        )
    return session


def _scalar(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    item = getattr(value, "item", None)
    ndim = getattr(value, "ndim", None)
    if callable(item) and ndim == 0:
        out = item()  # numpy scalars, 0-d arrays and 0-d torch tensors
        if out is None or isinstance(out, (bool, int, float, str)):
            return out
    raise TypeError(type(value).__name__)


def check_metrics(metrics: Any) -> dict[str, Any]:
    """``metrics`` as a dict of str -> plain scalar; ``TypeError`` naming a bad entry.

    Numbers, booleans, strings and None are kept; numpy scalars and 0-d arrays or
    tensors become Python numbers. Anything else (lists, arrays, dicts, tensors with
    more than one element) is refused: metrics are plotted and compared, so each must be
    one value.
    """
    if not isinstance(metrics, Mapping):
        raise TypeError(
            f"report(metrics) expects a dict of metric name -> value, got {type(metrics).__name__}"
        )
    out: dict[str, Any] = {}
    for key, value in metrics.items():
        if not isinstance(key, str):
            raise TypeError(f"report(): metric names must be strings, got {key!r}")
        try:
            out[key] = _scalar(value)
        except TypeError:
            shape = getattr(value, "shape", None)
            what = type(value).__name__ + (f" of shape {tuple(shape)}" if shape is not None else "")
            raise TypeError(
                f"report(): metric {key!r} is a {what}, not a scalar. Each metric must be "
                "one number, bool or string: report e.g. float(loss.item()) or "
                f"{key}_mean=float(values.mean()), one entry per value"
            ) from None
    return out


def report(
    metrics: dict[str, Any],
    checkpoint: Checkpoint | None = None,
    checkpoint_dir_name: str | None = None,
) -> None:
    """Report ``metrics`` (and optionally a checkpoint) from the training function.

    Every rank must call ``report`` the same number of times: the driver completes a
    report when all ranks made it, and rank 0's metrics are the run's. A checkpoint from
    any rank is copied into ``storage_path/name/checkpoint_NNNNNN`` (files from several
    ranks are merged into one directory) before ``report`` returns; its metrics are
    rank 0's. Metrics must be scalars (numbers, bools, strings).
    """
    trial = _trial_sessions.get() if _worker_sessions.get() is None else None
    if trial is not None:
        trial.report(metrics, checkpoint=checkpoint)
        return
    session = _require("report")
    outbox = session.outbox
    if outbox.stop.is_set():
        raise StopTraining
    clean = check_metrics(metrics)
    index = session.next_index
    name = None
    if checkpoint is not None:
        if not isinstance(checkpoint, Checkpoint):
            raise TypeError(
                "report(checkpoint=...) expects a nbcluster.train.Checkpoint, e.g. "
                f"Checkpoint.from_directory(tmpdir); got {type(checkpoint).__name__}"
            )
        name = checkpoint_dir_name or _default_dir_name(index)
        if not isinstance(name, str) or not name or os.sep in name or name in (".", ".."):
            raise ValueError(
                f"report(checkpoint_dir_name=...) must be a directory name, got {name!r}"
            )
        trial_dir = session.context.get_trial_dir()
        _persist(
            checkpoint,
            os.path.join(trial_dir, name),
            os.path.join(trial_dir, staging_name(session.attempt, name)),
        )
    outbox.put(("report", index, clean, name), wait_for_room=True)
    session.next_index = index + 1


def _persist(checkpoint: Checkpoint, final: str, staging: str) -> None:
    """Copy the checkpoint's files into this attempt's ``staging`` directory.

    Every file is written atomically, and metadata from several ranks is merged under a
    lock, so ranks may persist into the same checkpoint at once. The driver renames the
    staging directory to ``final`` once every rank has reported. A checkpoint that already
    is ``final`` (the loop wrote into the run's directory) is left in place.
    """
    src = checkpoint.path
    if not os.path.isdir(src):
        what = "is not a directory" if os.path.exists(src) else "no longer exists"
        raise FileNotFoundError(
            f"report(): the checkpoint directory {src} {what}. Keep the directory until "
            "report() returns, e.g. write the files and call report() inside the same "
            "`with tempfile.TemporaryDirectory() as tmpdir:` block"
        )
    if os.path.abspath(final) == os.path.abspath(src):
        return
    atomic_copy_tree(src, staging, skip=frozenset({METADATA_FILE}))
    if os.path.exists(os.path.join(src, METADATA_FILE)):
        Checkpoint(staging).update_metadata(Checkpoint(src).get_metadata())


def get_checkpoint() -> Checkpoint | None:
    """The checkpoint to resume from: the run's latest (after a restart, or when a run
    with the same name is started again), else the trainer's ``resume_from_checkpoint``,
    else None."""
    trial = _trial_sessions.get() if _worker_sessions.get() is None else None
    if trial is not None:
        return trial.loaded_checkpoint  # type: ignore[no-any-return]
    return _require("get_checkpoint").checkpoint


def get_context() -> TrainContext:
    """This worker's place in the run: world size and rank, local and node rank, names."""
    return _require("get_context").context


def get_dataset_shard(dataset_name: str | None = None) -> Any:
    """This rank's part of the dataset passed as ``datasets={name: ...}`` to the trainer.

    Split datasets (all of them by default; see ``DataConfig``) give each rank an equal
    share through ``streaming_split``; iterate it with ``iter_torch_batches`` or
    ``iter_batches``.
    """
    session = _require("get_dataset_shard")
    shards = session.dataset_shards
    if dataset_name is None:
        if len(shards) == 1:
            return next(iter(shards.values()))
        raise ValueError(
            "get_dataset_shard() needs a name when the trainer has several datasets: "
            f"{', '.join(sorted(shards)) or 'none'}"
        )
    if dataset_name not in shards:
        raise KeyError(
            f"get_dataset_shard({dataset_name!r}): the trainer has no dataset of that name; "
            f"its datasets: {', '.join(sorted(shards)) or 'none (pass datasets={...} to the trainer)'}"
        )
    return shards[dataset_name]
