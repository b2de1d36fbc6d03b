"""Stoppers: when a trial, or the whole experiment, should stop (Ray's ``ray.tune.stopper``).

``RunConfig(stop=...)`` takes a dict ``{result_key: threshold}`` (a trial stops once any key
reaches its threshold), a function ``(trial_id, result) -> bool``, or a :class:`Stopper`.
"""

from __future__ import annotations

import abc
import datetime
import time
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from nbcluster.tune.error import TuneError

__all__ = [
    "CombinedStopper",
    "FunctionStopper",
    "MaximumIterationStopper",
    "NoopStopper",
    "Stopper",
    "TimeoutStopper",
    "TrialPlateauStopper",
    "make_stopper",
]


class Stopper(abc.ABC):  # noqa: B024 - subclasses override what they need, as in Ray
    """Base class: ``__call__`` decides for one trial, ``stop_all`` for the experiment."""

    def __call__(self, trial_id: str, result: dict[str, Any]) -> bool:
        """True if the trial should stop after ``result``."""
        raise NotImplementedError

    def stop_all(self) -> bool:
        """True if the whole experiment should stop."""
        raise NotImplementedError


class NoopStopper(Stopper):
    """Never stops anything."""

    def __call__(self, trial_id: str, result: dict[str, Any]) -> bool:
        return False

    def stop_all(self) -> bool:
        return False


class CombinedStopper(Stopper):
    """Stops when any of ``stoppers`` does."""

    def __init__(self, *stoppers: Stopper) -> None:
        self._stoppers = stoppers

    def __call__(self, trial_id: str, result: dict[str, Any]) -> bool:
        return any([s(trial_id, result) for s in self._stoppers])

    def stop_all(self) -> bool:
        return any(s.stop_all() for s in self._stoppers)


class FunctionStopper(Stopper):
    """Stops a trial when ``function(trial_id, result)`` returns True."""

    def __init__(self, function: Callable[[str, dict[str, Any]], bool]) -> None:
        self._fn = function

    def __call__(self, trial_id: str, result: dict[str, Any]) -> bool:
        return bool(self._fn(trial_id, result))

    def stop_all(self) -> bool:
        return False

    @classmethod
    def is_valid_function(cls, fn: Any) -> bool:
        """True for a plain callable that is not a Stopper."""
        is_function = callable(fn) and not isinstance(fn, Stopper)
        if is_function and hasattr(fn, "stop_all"):
            raise ValueError("a stop object with stop_all() must subclass tune.Stopper")
        return is_function


class MaximumIterationStopper(Stopper):
    """Stops each trial after ``max_iter`` results."""

    def __init__(self, max_iter: int) -> None:
        if not isinstance(max_iter, int) or isinstance(max_iter, bool) or max_iter < 1:
            raise ValueError(f"max_iter must be an integer >= 1, got {max_iter!r}")
        self._max_iter = max_iter
        self._iter: dict[str, int] = {}

    def __call__(self, trial_id: str, result: dict[str, Any]) -> bool:
        self._iter[trial_id] = self._iter.get(trial_id, 0) + 1
        return self._iter[trial_id] >= self._max_iter

    def stop_all(self) -> bool:
        return False


class TimeoutStopper(Stopper):
    """Stops the whole experiment after ``timeout`` seconds (or a ``timedelta``)."""

    def __init__(self, timeout: float | datetime.timedelta) -> None:
        if isinstance(timeout, datetime.timedelta):
            timeout = timeout.total_seconds()
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
            raise ValueError(f"timeout must be a number of seconds or a timedelta, got {timeout!r}")
        self._timeout_seconds = float(timeout)
        self._budget = self._timeout_seconds
        self._last_check: float | None = None

    def __call__(self, trial_id: str, result: dict[str, Any]) -> bool:
        return False

    def stop_all(self) -> bool:
        now = time.time()
        if self._last_check is not None:
            self._budget -= now - self._last_check
        self._last_check = now
        return self._budget <= 0

    def __setstate__(self, state: dict[str, Any]) -> None:
        state["_last_check"] = None  # the clock restarts after a restore
        self.__dict__.update(state)


class TrialPlateauStopper(Stopper):
    """Stops a trial whose last ``num_results`` values of ``metric`` vary less than ``std``."""

    def __init__(
        self,
        metric: str,
        std: float = 0.01,
        num_results: int = 4,
        grace_period: int = 4,
        metric_threshold: float | None = None,
        mode: str | None = None,
    ) -> None:
        if metric_threshold is not None and mode not in ("min", "max"):
            raise ValueError(f"with metric_threshold, mode must be 'min' or 'max', got {mode!r}")
        self._metric = metric
        self._mode = mode
        self._std = std
        self._num_results = num_results
        self._grace_period = grace_period
        self._metric_threshold = metric_threshold
        self._iter: dict[str, int] = {}
        self._trial_results: dict[str, deque[Any]] = {}

    def __call__(self, trial_id: str, result: dict[str, Any]) -> bool:
        value = result.get(self._metric)
        window = self._trial_results.setdefault(trial_id, deque(maxlen=self._num_results))
        window.append(value)
        self._iter[trial_id] = self._iter.get(trial_id, 0) + 1
        if self._iter[trial_id] < self._grace_period or len(window) < self._num_results:
            return False
        if self._metric_threshold is not None and value is not None:
            if self._mode == "min" and value > self._metric_threshold:
                return False
            if self._mode == "max" and value < self._metric_threshold:
                return False
        try:
            current = float(np.std(list(window)))
        except (TypeError, ValueError):
            current = float("inf")
        return current < self._std

    def stop_all(self) -> bool:
        return False


class _DictStopper(Stopper):
    """``{key: threshold}``: stop a trial once ``result[key] >= threshold`` for any key."""

    def __init__(self, criteria: Mapping[str, Any]) -> None:
        self._criteria = dict(criteria)

    def __call__(self, trial_id: str, result: dict[str, Any]) -> bool:
        for key, threshold in self._criteria.items():
            if key not in result:
                raise TuneError(
                    f"RunConfig(stop={self._criteria!r}): the result of trial {trial_id} has no "
                    f"{key!r}. It reported: {sorted(result)}. Report {key!r} with tune.report(), "
                    "or stop on one of those keys."
                )
            if result[key] >= threshold:
                return True
        return False

    def stop_all(self) -> bool:
        return False

    def __repr__(self) -> str:
        return f"stop={self._criteria!r}"


def make_stopper(stop: Any) -> Stopper | None:
    """Turn ``RunConfig(stop=...)`` into a :class:`Stopper` (None when not given)."""
    if stop is None:
        return None
    if isinstance(stop, Stopper):
        return stop
    if isinstance(stop, Mapping):
        for key, value in stop.items():
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ValueError(
                    f"RunConfig(stop=): the threshold of {key!r} must be a number, got {value!r}"
                )
        return _DictStopper(stop)
    if FunctionStopper.is_valid_function(stop):
        return FunctionStopper(stop)
    raise TypeError(
        "RunConfig(stop=) must be a dict of {result key: threshold}, a function "
        f"(trial_id, result) -> bool, or a tune.Stopper; got {type(stop).__name__}"
    )
