"""``RunConfig(callbacks=[...])``: objects told about a run as it goes.

A callback may define any of these methods (the others are skipped), with Ray Tune's
callback names, so a ``ray.tune.Callback``-style object works as it is:

- ``on_trial_start(iteration, trials, trial, **info)``
- ``on_trial_result(iteration, trials, trial, result, **info)`` — every report
- ``on_checkpoint(iteration, trials, trial, checkpoint, **info)`` — a checkpoint was kept
- ``on_trial_complete(iteration, trials, trial, **info)``
- ``on_trial_error(iteration, trials, trial, **info)``

``trial`` describes the run (:class:`RunInfo`: ``trial_id``, ``trial_name``, ``config``,
``path``, ``status``); ``trials`` is ``[trial]``. An exception raised by a callback fails
the run (``ControllerError``), as in Ray.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from nbcluster.train._checkpoint import Checkpoint

__all__ = ["CallbackRunner", "RunInfo"]


@dataclasses.dataclass
class RunInfo:
    """The run, as callbacks see it (Tune calls this a trial)."""

    trial_id: str
    trial_name: str
    config: Mapping[str, Any]
    path: str
    status: str = "PENDING"
    last_result: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def __str__(self) -> str:
        return self.trial_name


class CallbackRunner:
    """Calls each callback's methods that exist."""

    def __init__(self, callbacks: Sequence[Any], run: RunInfo) -> None:
        self.callbacks = list(callbacks)
        self.run = run
        self.iteration = 0

    def _call(self, method: str, **kwargs: Any) -> None:
        for cb in self.callbacks:
            fn = getattr(cb, method, None)
            if callable(fn):
                fn(iteration=self.iteration, trials=[self.run], trial=self.run, **kwargs)

    def start(self) -> None:
        """The run starts."""
        self.run.status = "RUNNING"
        self._call("on_trial_start")

    def result(self, metrics: Mapping[str, Any], checkpoint: Checkpoint | None) -> None:
        """A report completed (and maybe a checkpoint was kept)."""
        self.iteration += 1
        self.run.last_result = dict(metrics)
        self._call("on_trial_result", result=dict(metrics))
        if checkpoint is not None:
            self._call("on_checkpoint", checkpoint=checkpoint)

    def complete(self) -> None:
        """The run ended without error."""
        self.run.status = "TERMINATED"
        self._call("on_trial_complete")

    def error(self) -> None:
        """The run failed."""
        self.run.status = "ERROR"
        self._call("on_trial_error")
