"""``TuneError``: an experiment-level failure (Ray's ``ray.tune.error.TuneError``)."""

from __future__ import annotations

from typing import Any

__all__ = ["TuneError"]


class TuneError(Exception):
    """The experiment could not go on: bad setup, every trial failed, or ``fail_fast``.

    When raised by ``Tuner.fit()`` after trials ran, ``result_grid`` holds what they did
    (finished trials, errors, checkpoints), so nothing is lost with the exception.
    """

    def __init__(self, message: str, *, result_grid: Any = None) -> None:
        super().__init__(message)
        self.result_grid = result_grid
