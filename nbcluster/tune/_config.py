"""``TuneConfig``, and the configs Tune shares with Train (Ray's names and defaults).

``RunConfig``, ``CheckpointConfig`` and ``FailureConfig`` are Train's classes
(``nbcluster.train``), which carry Tune's fields too (``stop``, ``checkpoint_frequency``,
``checkpoint_at_end``, ``fail_fast``): one implementation for both libraries. Each config
checks its fields in ``__post_init__`` and names the field and what it accepts.
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Callable
from typing import Any

from nbcluster.train import CheckpointConfig, FailureConfig, RunConfig

__all__ = ["CheckpointConfig", "FailureConfig", "RunConfig", "TuneConfig"]


def _check_mode(mode: Any, field: str = "mode") -> None:
    if mode is not None and mode not in ("min", "max"):
        raise ValueError(f"{field} must be 'min' or 'max' (or None), got {mode!r}")


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


@dataclasses.dataclass
class TuneConfig:
    """What to search and how (Ray's ``TuneConfig``).

    ``metric``/``mode``: what to optimize (passed to the search algorithm and the
    scheduler, and the default of ``ResultGrid.get_best_result``). ``num_samples``: how
    many times to sample the param space (each grid is repeated that many times; -1: until
    stopped). ``max_concurrent_trials``: at most this many trials run at once (None/0: as
    many as resources allow). ``time_budget_s``: stop every trial after this long.
    ``reuse_actors``: run several trials one after another in the same worker process
    (None: yes for function trainables, no for ``Trainable`` classes, as Ray did before
    2.7; a class is reused only if its ``reset_config`` returns True).
    """

    mode: str | None = None
    metric: str | None = None
    search_alg: Any = None
    scheduler: Any = None
    num_samples: int = 1
    max_concurrent_trials: int | None = None
    time_budget_s: float | datetime.timedelta | None = None
    reuse_actors: bool | None = None
    trial_name_creator: Callable[[Any], str] | None = None
    trial_dirname_creator: Callable[[Any], str] | None = None
    chdir_to_trial_dir: bool = False

    def __post_init__(self) -> None:
        _check_mode(self.mode, "TuneConfig(mode=)")
        if self.metric is not None and not isinstance(self.metric, str):
            raise TypeError(f"TuneConfig(metric=) must be a string, got {self.metric!r}")
        if not _is_int(self.num_samples) or self.num_samples == 0 or self.num_samples < -1:
            raise ValueError(
                f"TuneConfig(num_samples=) must be an integer >= 1 (or -1: until stopped), got {self.num_samples!r}"
            )
        mct = self.max_concurrent_trials
        if mct is not None and (not _is_int(mct) or mct < 0):
            raise ValueError(
                f"TuneConfig(max_concurrent_trials=) must be None or an integer >= 0, got {mct!r}"
            )
        if isinstance(self.time_budget_s, datetime.timedelta):
            self.time_budget_s = self.time_budget_s.total_seconds()
        if self.time_budget_s is not None and (
            isinstance(self.time_budget_s, bool)
            or not isinstance(self.time_budget_s, (int, float))
            or self.time_budget_s <= 0
        ):
            raise ValueError(
                f"TuneConfig(time_budget_s=) must be a number of seconds > 0, got {self.time_budget_s!r}"
            )
        if self.reuse_actors not in (None, True, False):
            raise TypeError(
                f"TuneConfig(reuse_actors=) must be True, False or None, got {self.reuse_actors!r}"
            )
