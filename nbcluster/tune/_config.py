"""``TuneConfig``, ``RunConfig``, ``CheckpointConfig``, ``FailureConfig``: Ray's names and defaults.

Each config checks its own fields in ``__post_init__`` and raises ``ValueError``/``TypeError``
naming the field and what it accepts, so a typo fails where the config is written.
"""

from __future__ import annotations

import dataclasses
import datetime
import os
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["CheckpointConfig", "FailureConfig", "RunConfig", "TuneConfig", "default_storage_path"]


def default_storage_path() -> str:
    """``$NBCLUSTER_RESULTS_DIR`` or ``~/nbcluster_results`` (Ray: ``~/ray_results``)."""
    return os.environ.get("NBCLUSTER_RESULTS_DIR") or os.path.expanduser("~/nbcluster_results")


def _check_mode(mode: Any, field: str = "mode") -> None:
    if mode is not None and mode not in ("min", "max"):
        raise ValueError(f"{field} must be 'min' or 'max' (or None), got {mode!r}")


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


@dataclasses.dataclass
class CheckpointConfig:
    """Which checkpoints a trial keeps, and when class trainables save them.

    ``num_to_keep``: keep this many (None: all), ranked by ``checkpoint_score_attribute``
    in ``checkpoint_score_order`` (``"max"``/``"min"``) or, without an attribute, the newest.
    ``checkpoint_frequency``: a class ``Trainable`` saves every N iterations (0: never);
    ``checkpoint_at_end``: and once more when it ends.
    """

    num_to_keep: int | None = None
    checkpoint_score_attribute: str | None = None
    checkpoint_score_order: str | None = "max"
    checkpoint_frequency: int | None = 0
    checkpoint_at_end: bool | None = None

    def __post_init__(self) -> None:
        if self.num_to_keep is not None and (not _is_int(self.num_to_keep) or self.num_to_keep < 1):
            raise ValueError(
                f"CheckpointConfig(num_to_keep=) must be None or an integer >= 1, got {self.num_to_keep!r}"
            )
        _check_mode(self.checkpoint_score_order, "CheckpointConfig(checkpoint_score_order=)")
        freq = self.checkpoint_frequency or 0
        if not _is_int(freq) or freq < 0:
            raise ValueError(
                f"CheckpointConfig(checkpoint_frequency=) must be an integer >= 0, got {self.checkpoint_frequency!r}"
            )


@dataclasses.dataclass
class FailureConfig:
    """How trial failures are handled.

    ``max_failures``: retry a failed trial this many times, from its latest checkpoint
    (-1: forever; 0: never). ``fail_fast``: ``True`` stops the whole experiment at the first
    error; ``"raise"`` also raises that error from ``fit()``.
    """

    max_failures: int = 0
    fail_fast: bool | str = False

    def __post_init__(self) -> None:
        if not _is_int(self.max_failures) or self.max_failures < -1:
            raise ValueError(
                f"FailureConfig(max_failures=) must be an integer >= -1 (-1 retries forever), got {self.max_failures!r}"
            )
        if self.fail_fast not in (True, False, "raise"):
            raise ValueError(
                f"FailureConfig(fail_fast=) must be True, False or 'raise', got {self.fail_fast!r}"
            )


@dataclasses.dataclass
class RunConfig:
    """Where results go and how the run behaves: ``name``, ``storage_path``, ``stop``...

    The experiment's files are written to ``storage_path/name/``: one folder per trial
    (``result.json``, ``params.json``, ``checkpoint_*``) and the experiment state that
    ``Tuner.restore`` reads. ``stop`` is a dict of ``{metric: threshold}``, a function
    ``(trial_id, result) -> bool``, or a :class:`~nbcluster.tune.Stopper`. ``verbose``:
    0 = silent, 1 = the live table / status lines (default), 2 = also each trial's result.
    """

    name: str | None = None
    storage_path: str | None = None
    storage_filesystem: Any = None
    failure_config: FailureConfig | None = None
    checkpoint_config: CheckpointConfig | None = None
    sync_config: Any = None
    verbose: int | None = None
    stop: Mapping[str, Any] | Callable[[str, Mapping[str, Any]], bool] | Any | None = None
    callbacks: list[Any] | None = None
    progress_reporter: Any = None
    log_to_file: bool | str | tuple[str, str] = False

    def __post_init__(self) -> None:
        self.failure_config = self.failure_config or FailureConfig()
        self.checkpoint_config = self.checkpoint_config or CheckpointConfig()
        if not isinstance(self.failure_config, FailureConfig):
            raise TypeError(
                f"RunConfig(failure_config=) must be a FailureConfig, got {type(self.failure_config).__name__}"
            )
        if not isinstance(self.checkpoint_config, CheckpointConfig):
            raise TypeError(
                f"RunConfig(checkpoint_config=) must be a CheckpointConfig, got {type(self.checkpoint_config).__name__}"
            )
        if self.storage_filesystem is not None:
            raise NotImplementedError(
                "RunConfig(storage_filesystem=) is not supported: use a local or shared path"
            )
        if self.name is not None and (
            not isinstance(self.name, str) or not self.name or os.sep in self.name
        ):
            raise ValueError(
                f"RunConfig(name=) must be a non-empty folder name without '{os.sep}', got {self.name!r}"
            )
        if self.storage_path is not None:
            self.storage_path = os.path.abspath(os.path.expanduser(os.fspath(self.storage_path)))
        if self.verbose is not None and (not _is_int(self.verbose) or not 0 <= self.verbose <= 3):
            raise ValueError(f"RunConfig(verbose=) must be 0, 1, 2 or 3, got {self.verbose!r}")


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
