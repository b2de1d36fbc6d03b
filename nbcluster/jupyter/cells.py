"""Cells own their work: which cell submitted each task, and what re-running a cell does.

:class:`CellTracker` is told of every task and actor call the kernel submits
(:func:`nbcluster.state.set_task_observer`) with the submitting cell's header, and keeps
``task id → cell`` for the last :data:`MAX_TASKS` submissions (the Timeline's cell
filter reads it through :func:`cell_of`; a cell's ``In [n]`` is known when it finishes,
and listeners (:meth:`CellTracker.add_listener`) are told then). It also remembers which run of which notebook
cell each message was (``cellId``, which JupyterLab and nbclient send with every execute
request), so that **re-running a cell** cancels the tasks of its previous run that are
still pending and whose results nothing refers to any more (``%cluster rerun cancel``,
the default; ``%cluster rerun keep`` turns it off). Tasks whose results a variable still
holds are left alone, since re-running the cell is then not the end of their use.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import sys
import threading
from collections.abc import Callable
from typing import Any, Literal

from nbcluster import state

log = logging.getLogger(__name__)

__all__ = [
    "MAX_TASKS",
    "RERUN_CHOICES",
    "CellTracker",
    "cell_of",
    "cell_pending",
    "current_tracker",
]

#: Submissions remembered (task id → cell).
MAX_TASKS = 200_000
RERUN_CHOICES: tuple[Literal["cancel", "keep"], ...] = ("cancel", "keep")

_current: CellTracker | None = None


def current_tracker() -> CellTracker | None:
    """The tracker of this kernel's ``%load_ext nbcluster`` (None without one)."""
    return _current


def cell_of(task_id: str) -> int | None:
    """The execution count (``In [n]``) of the cell that submitted ``task_id`` (hex), or None."""
    tracker = _current
    return None if tracker is None else tracker.cell_of(task_id)


def cell_pending(task_id: str) -> bool:
    """True when ``task_id`` (hex) was submitted by a cell that has not finished yet (its
    ``In [n]`` is not known yet)."""
    tracker = _current
    return tracker is not None and tracker.pending(task_id)


class CellTracker:
    """Task → cell, and cells → their runs (see the module docstring)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._tasks: collections.OrderedDict[str, str] = collections.OrderedDict()
        self._counts: dict[str, int | None] = {}  # msg_id -> execution count (None: none)
        self._runs: dict[str, str] = {}  # notebook cell id -> msg_id of its latest run
        self._pending_rerun: str | None = None  # previous run of the cell running now
        self._running: str | None = None
        self.on_rerun: Literal["cancel", "keep"] = "cancel"
        self._listeners: list[Callable[[int | None], None]] = []

    def activate(self) -> None:
        """Make this the tracker :func:`cell_of` reads."""
        global _current
        _current = self

    # -- the driver tells us (submitting thread) -------------------------------------------------
    def observe(self, task_id: str, name: str, context: Any) -> None:
        """A task or actor call was submitted by the cell whose header is ``context``."""
        msg_id = context.get("msg_id") if isinstance(context, dict) else None
        if not msg_id:
            return
        with self._lock:
            self._tasks[task_id] = msg_id
            if len(self._tasks) > MAX_TASKS:
                self._tasks.popitem(last=False)

    def cell_of(self, task_id: str) -> int | None:
        """The execution count of the cell that submitted ``task_id``, or None."""
        with self._lock:
            msg_id = self._tasks.get(task_id)
            return None if msg_id is None else self._counts.get(msg_id)

    def pending(self, task_id: str) -> bool:
        """True when the cell that submitted ``task_id`` has not finished yet."""
        with self._lock:
            msg_id = self._tasks.get(task_id)
            return msg_id is not None and msg_id not in self._counts

    def add_listener(self, listener: Callable[[int | None], None]) -> None:
        """Call ``listener(execution_count)`` on the main thread whenever a cell finishes
        (None: a cell without ``In [n]``)."""
        self._listeners.append(listener)

    def remove_listener(self, listener: Callable[[int | None], None]) -> None:
        """Stop calling ``listener``."""
        with contextlib.suppress(ValueError):
            self._listeners.remove(listener)

    def tasks_of(self, execution_count: int) -> list[str]:
        """The task ids (hex) submitted by the cell ``In [execution_count]``."""
        with self._lock:
            ids = {m for m, n in self._counts.items() if n == execution_count}
            return [t for t, m in self._tasks.items() if m in ids]

    # -- cells (main thread) -----------------------------------------------------------------
    def cell_started(self, header: dict[str, Any] | None, cell_id: Any) -> None:
        """A cell starts: remember its previous run if it is a re-run."""
        msg_id = header.get("msg_id") if header else None
        self._running = msg_id
        if not msg_id:
            return
        with self._lock:
            if isinstance(cell_id, str) and cell_id:
                previous = self._runs.get(cell_id)
                self._runs[cell_id] = msg_id
                self._pending_rerun = previous if previous != msg_id else None
            else:
                self._pending_rerun = None

    def cell_finished(self, execution_count: int | None = None) -> int:
        """A cell ended (as ``In [execution_count]``; None: it has no number): tell the
        listeners; if it was a re-run, cancel its previous run's pending tasks whose results
        are no longer referenced (unless ``on_rerun`` is ``"keep"``); say how many."""
        with self._lock:
            if self._running:
                self._counts[self._running] = execution_count
            self._running = None
            previous, self._pending_rerun = self._pending_rerun, None
        for listener in list(self._listeners):
            try:
                listener(execution_count)
            except Exception:  # noqa: BLE001 - never break the cell that just ran
                log.debug("a cell listener failed", exc_info=True)
        if previous is None or self.on_rerun != "cancel" or not state.is_connected():
            return 0

        def earlier_run(ctx: Any) -> bool:
            return isinstance(ctx, dict) and ctx.get("msg_id") == previous

        try:
            n = state.cancel_unreferenced_tasks(earlier_run)
        except Exception:  # noqa: BLE001 - never break the cell that just ran
            return 0
        if n:
            print(
                f"nbcluster: cancelled {n} pending task(s) of this cell's previous run (their "
                "results are no longer referenced; %cluster rerun keep turns this off)",
                file=sys.stderr,
                flush=True,
            )
        return n
