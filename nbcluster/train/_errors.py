"""The errors a training run raises (Ray Train's names).

``fit()`` raises :class:`TrainingFailedError` when a run fails for good: a
:class:`WorkerGroupError` when workers failed (``worker_failures`` maps each failed rank to
its exception, and the message shows each rank's traceback), or a :class:`ControllerError`
when the coordinating side did (a bad checkpoint setting, storage that cannot be written).
"""

from __future__ import annotations

from typing import Any

__all__ = ["ControllerError", "TrainingFailedError", "WorkerFailure", "WorkerGroupError"]


class TrainingFailedError(RuntimeError):
    """A training run failed (``trainer.fit()`` raises it; ``Result.error`` holds it)."""


class WorkerFailure(RuntimeError):
    """What one rank's failure looked like: its traceback text, kept when the original
    exception could not travel (its class was unpicklable or not importable here)."""

    def __init__(self, rank: int, text: str) -> None:
        super().__init__(text)
        self.rank = rank
        self.text = text

    def __reduce__(self) -> tuple[Any, ...]:
        return (WorkerFailure, (self.rank, self.text))


class WorkerGroupError(TrainingFailedError):
    """Workers failed: ``worker_failures`` maps rank -> the exception on that rank.

    The message names each rank, where it ran, and its traceback::

        Training failed due to worker errors:
        [Rank 1] (pid 4242 on node 3f2a9c1e)
        Traceback (most recent call last):
          ...
        ValueError: bad batch
    """

    def __init__(self, error_message: str, worker_failures: dict[int, BaseException]) -> None:
        super().__init__("Training failed due to worker errors:\n" + error_message)
        self._error_message = error_message
        self.worker_failures = worker_failures

    def __reduce__(self) -> tuple[Any, ...]:
        return (self.__class__, (self._error_message, self.worker_failures))


class ControllerError(TrainingFailedError):
    """The run's coordinator failed (``controller_failure`` is the cause)."""

    def __init__(self, controller_failure: BaseException) -> None:
        super().__init__(f"Training failed due to controller error:\n{controller_failure}")
        self.controller_failure = controller_failure

    def __reduce__(self) -> tuple[Any, ...]:
        return (self.__class__, (self.controller_failure,))
