"""``ResultGrid`` and ``Result``: what ``Tuner.fit()`` returns (Ray's names and semantics)."""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

from nbcluster.exceptions import TaskError
from nbcluster.tune._checkpoint import Checkpoint
from nbcluster.tune._render import result_grid_html, result_grid_text
from nbcluster.tune.error import TuneError
from nbcluster.tune.experiment.trial import Trial
from nbcluster.tune.result import AUTO_RESULT_KEYS
from nbcluster.tune.search.variant_generator import flatten_dict

__all__ = ["Result", "ResultGrid"]

_SCOPES = ("all", "last", "avg", "last-5-avg", "last-10-avg")


def _trial_error(trial: Trial) -> BaseException | None:
    if trial.status != Trial.ERROR:
        return None
    err = trial.error
    if isinstance(err, TaskError):
        return err.as_instanceof_cause()
    if err is not None:
        return err
    return TuneError(trial.error_msg or f"trial {trial} failed")


class Result:
    """One trial's outcome: its last ``metrics``, latest ``checkpoint``, ``error`` and ``path``."""

    def __init__(self, trial: Trial) -> None:
        self._trial = trial
        self.metrics: dict[str, Any] | None = dict(trial.last_result) if trial.last_result else None
        self.checkpoint: Checkpoint | None = trial.checkpoint
        self.error: BaseException | None = _trial_error(trial)
        self.path: str = trial.local_path
        self.filesystem = None

    @property
    def config(self) -> dict[str, Any] | None:
        """The trial's config."""
        return self._trial.config

    @property
    def metrics_dataframe(self) -> Any:
        """Every result the trial reported, as a pandas DataFrame (one row per result)."""
        import pandas as pd

        rows = [
            flatten_dict({k: v for k, v in r.items() if k != "config"}) for r in self._trial.results
        ]
        return pd.DataFrame(rows)

    @property
    def best_checkpoints(self) -> list[tuple[Checkpoint, dict[str, Any]]]:
        """The kept checkpoints with the metrics they were reported with, oldest first."""
        return [
            (c.checkpoint, dict(c.metrics))
            for c in sorted(self._trial.checkpoints, key=lambda c: c.index)
        ]

    def get_best_checkpoint(self, metric: str, mode: str) -> Checkpoint | None:
        """The kept checkpoint whose reported ``metric`` is best under ``mode``."""
        if mode not in ("min", "max"):
            raise ValueError(f"mode must be 'min' or 'max', got {mode!r}")
        scored = [
            (c.metrics[metric], c)
            for c in self._trial.checkpoints
            if isinstance(c.metrics.get(metric), (int, float))
        ]
        if not scored:
            if not self._trial.checkpoints:
                return None
            raise RuntimeError(
                f"No checkpoint of trial {self._trial} was reported with {metric!r}; "
                f"they have: {sorted(self._trial.checkpoints[0].metrics)}"
            )
        best = (max if mode == "max" else min)(scored, key=lambda x: x[0])
        return best[1].checkpoint

    def _metrics_text(self) -> str:
        if not self.metrics:
            return "{}"
        shown = {
            k: v
            for k, v in self.metrics.items()
            if k not in AUTO_RESULT_KEYS or k == "training_iteration"
        }
        return repr(shown)

    def __repr__(self) -> str:
        parts = [f"metrics={self._metrics_text()}", f"path={self.path!r}"]
        parts.append(f"checkpoint={self.checkpoint!r}")
        if self.error is not None:
            parts.append(f"error={type(self.error).__name__}")
        return "Result(\n  " + ",\n  ".join(parts) + "\n)"


class ResultGrid:
    """The results of every trial of a ``Tuner.fit()`` (indexable, iterable).

    Use :meth:`get_best_result` for the best trial, :meth:`get_dataframe` for a table, and
    :attr:`errors` for what failed. In a notebook it renders as a table of the trials.
    """

    def __init__(
        self,
        trials: list[Trial],
        experiment_path: str,
        default_metric: str | None = None,
        default_mode: str | None = None,
        stop_reason: str = "",
    ) -> None:
        self._trials = list(trials)
        self._experiment_path = experiment_path
        self._default_metric = default_metric
        self._default_mode = default_mode
        self._results = [Result(t) for t in self._trials]
        self.stop_reason = stop_reason

    @property
    def experiment_path(self) -> str:
        """The experiment's folder (``storage_path/name``)."""
        return self._experiment_path

    @property
    def filesystem(self) -> None:
        """Always None: results live on a local or shared filesystem."""
        return None

    def __len__(self) -> int:
        return len(self._results)

    def __getitem__(self, i: int) -> Result:
        return self._results[i]

    def __iter__(self) -> Iterator[Result]:
        return iter(self._results)

    @property
    def errors(self) -> list[BaseException]:
        """The errors of the trials that failed."""
        return [r.error for r in self._results if r.error is not None]

    @property
    def num_errors(self) -> int:
        """How many trials ended in ERROR."""
        return sum(1 for t in self._trials if t.status == Trial.ERROR)

    @property
    def num_terminated(self) -> int:
        """How many trials ended TERMINATED (finished or stopped, not failed)."""
        return sum(1 for t in self._trials if t.status == Trial.TERMINATED)

    def _reported_metrics(self) -> list[str]:
        keys: dict[str, None] = {}
        for t in self._trials:
            for k in t.reported_keys():
                keys[k] = None
        return list(keys)

    def get_best_result(
        self,
        metric: str | None = None,
        mode: str | None = None,
        scope: str = "last",
        filter_nan_and_inf: bool = True,
    ) -> Result:
        """The result of the best trial by ``metric`` under ``mode`` and ``scope``.

        ``scope``: ``"last"`` compares each trial's last value, ``"all"`` its best one,
        ``"avg"``/``"last-5-avg"``/``"last-10-avg"`` averages. Defaults come from
        ``TuneConfig(metric=, mode=)``.
        """
        if len(self._trials) == 1 and metric is None and mode is None:
            return self._results[0]
        metric = metric or self._default_metric
        mode = mode or self._default_mode
        if not metric:
            raise ValueError(
                "No metric is provided. Either pass in a `metric` arg to `get_best_result` or "
                "specify a metric in the `TuneConfig` of your `Tuner`."
            )
        if mode not in ("min", "max"):
            raise ValueError(
                "No mode is provided. Either pass in a `mode` arg ('min' or 'max') to "
                "`get_best_result` or specify a mode in the `TuneConfig` of your `Tuner`."
                if not mode
                else f"mode must be 'min' or 'max', got {mode!r}"
            )
        if scope not in _SCOPES:
            raise ValueError(f"scope must be one of {_SCOPES}, got {scope!r}")
        best: tuple[float, int] | None = None
        for i, trial in enumerate(self._trials):
            value = trial.metric_summary(metric, scope=scope, mode=mode)
            if value is None:
                continue
            if filter_nan_and_inf and not math.isfinite(value):
                continue
            score = value if mode == "max" else -value
            if best is None or score > best[0]:
                best = (score, i)
        if best is None:
            reported = self._reported_metrics()
            raise RuntimeError(
                f"No best trial found for the given metric: {metric!r}. No trial reported it"
                + (" as a finite number" if filter_nan_and_inf else "")
                + f". The trials reported: {', '.join(reported) or 'no metrics at all'}."
            )
        return self._results[best[1]]

    def get_dataframe(
        self, filter_metric: str | None = None, filter_mode: str | None = None
    ) -> Any:
        """One row per trial: its last result (or its best by ``filter_metric``), config and path."""
        import pandas as pd

        if (filter_metric is None) != (filter_mode is None):
            raise ValueError("get_dataframe() needs both filter_metric and filter_mode, or neither")
        if filter_mode not in (None, "min", "max"):
            raise ValueError(f"filter_mode must be 'min' or 'max', got {filter_mode!r}")
        rows = []
        for trial in self._trials:
            result = trial.last_result
            if filter_metric is not None:
                candidates = [
                    r for r in trial.results if isinstance(r.get(filter_metric), (int, float))
                ]
                if candidates:
                    pick = max if filter_mode == "max" else min
                    result = pick(candidates, key=lambda r: r[filter_metric])
            row = flatten_dict({k: v for k, v in (result or {}).items() if k != "config"})
            row.update(flatten_dict({"config": trial.config}))
            row["trial_id"] = trial.trial_id
            row["status"] = trial.status
            row["logdir"] = trial.local_path
            rows.append(row)
        return pd.DataFrame(rows)

    # ------------------------------------------------------------------ display
    def __repr__(self) -> str:
        return result_grid_text(
            self._trials, self._default_metric, self._default_mode, self._experiment_path
        )

    def _repr_html_(self) -> str:
        return result_grid_html(
            self._trials, self._default_metric, self._default_mode, self._experiment_path
        )

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, str]:
        return {"text/plain": repr(self), "text/html": self._repr_html_()}
