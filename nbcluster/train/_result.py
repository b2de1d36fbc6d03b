"""``Result``: what ``fit()`` returns (``ray.train.Result``), with a rich display."""

from __future__ import annotations

import dataclasses
import html
import math
import os
import string
from collections.abc import Mapping, Sequence
from functools import cache
from importlib import resources
from typing import Any

from nbcluster.train._checkpoint import Checkpoint
from nbcluster.train._config import CheckpointConfig
from nbcluster.train._state import CheckpointBook, CheckpointRecord
from nbcluster.train._storage import RunDir

__all__ = ["Result"]


@dataclasses.dataclass
class Result:
    """The outcome of a training run (``ray.train.Result``).

    ``metrics``: the last report's metrics (rank 0's, with ``training_iteration`` and
    timing fields). ``checkpoint``: the latest checkpoint. ``error``: the
    :class:`~nbcluster.train.TrainingFailedError` when the run failed. ``path``: the run's
    directory (``storage_path/name``). ``metrics_dataframe``: every report, one row each
    (pandas). ``best_checkpoints``: the kept checkpoints with their metrics, oldest
    first. ``return_value``: what rank 0's training function returned.

    Beyond Ray: ``interrupted`` is True when the run was stopped by a kernel interrupt
    (its checkpoints are kept; pass ``result.checkpoint`` as ``resume_from_checkpoint``,
    or run again with the same ``RunConfig(name=...)``, to carry on); ``stopped`` names
    why a run stopped early; ``resumed_from`` is the checkpoint the run started from;
    ``num_failures`` counts the restarts after failures.
    """

    metrics: dict[str, Any] | None
    checkpoint: Checkpoint | None
    error: BaseException | None
    path: str
    best_checkpoints: list[tuple[Checkpoint, dict[str, Any]]] | None = None
    return_value: Any = None
    interrupted: bool = False
    stopped: str | None = None
    resumed_from: Checkpoint | None = None
    num_failures: int = 0
    metrics_history: list[dict[str, Any]] = dataclasses.field(default_factory=list, repr=False)

    @property
    def metrics_dataframe(self) -> Any:
        """Every report of the run as a ``pandas.DataFrame`` (one row per report)."""
        try:
            import pandas as pd
        except ImportError:
            raise ImportError(
                "Result.metrics_dataframe needs pandas: pip install 'nbcluster[train]'"
            ) from None
        return pd.DataFrame(self.metrics_history)

    @property
    def filesystem(self) -> str:
        """Always ``"local"``: results live in a local or mounted directory."""
        return "local"

    def get_best_checkpoint(self, metric: str, mode: str) -> Checkpoint | None:
        """The kept checkpoint with the best ``metric`` (``mode`` ``"max"`` or ``"min"``)."""
        if mode not in ("max", "min"):
            raise ValueError(f"mode must be 'max' or 'min', got {mode!r}")
        scored = []
        for ckpt, metrics in self.best_checkpoints or []:
            value = metrics.get(metric)
            number = isinstance(value, (int, float)) and not isinstance(value, bool)
            if number and not math.isnan(value):
                scored.append((value if mode == "max" else -value, ckpt))
        if not scored and self.best_checkpoints:
            raise ValueError(
                f"no kept checkpoint has the metric {metric!r}; reported metrics: "
                f"{', '.join(sorted(self.best_checkpoints[-1][1]))}"
            )
        return max(scored, key=lambda p: p[0])[1] if scored else None

    @classmethod
    def from_path(cls, path: str | os.PathLike[str]) -> Result:
        """The result of the run saved in ``path`` (a run directory)."""
        path = os.path.abspath(os.fspath(path))
        run = RunDir(os.path.dirname(path), os.path.basename(path))
        state = run.load_state()
        if state is None:
            raise FileNotFoundError(
                f"{path} holds no nbcluster training run (no train_state.json); pass the "
                "directory a run wrote (Result.path)"
            )
        records = [CheckpointRecord.from_json(r) for r in state.get("checkpoints", [])]
        book = CheckpointBook(CheckpointConfig(), records)
        history = list(state.get("history", []))
        return cls(
            metrics=dict(history[-1]) if history else None,
            checkpoint=Checkpoint(run.checkpoint_path(book.latest.name)) if book.latest else None,
            error=None,
            path=path,
            best_checkpoints=[
                (Checkpoint(run.checkpoint_path(r.name)), dict(r.metrics)) for r in records
            ],
            num_failures=int(state.get("failures", 0)),
            metrics_history=history,
        )

    # -- display ----------------------------------------------------------------------------
    def _status(self) -> str:
        if self.error is not None:
            return "failed"
        if self.interrupted:
            return "interrupted"
        if self.stopped:
            return f"stopped ({self.stopped})"
        return "finished"

    def __repr__(self) -> str:
        lines = [f"  metrics={self.metrics!r},", f"  path={self.path!r},", "  filesystem='local',"]
        lines.append(f"  checkpoint={self.checkpoint!r},")
        if self.error is not None:
            first = str(self.error).splitlines()[:3]
            lines.append(f"  error={type(self.error).__name__}({' '.join(first)!r}),")
        if self.interrupted:
            lines.append("  interrupted=True,")
        if self.stopped and not self.interrupted:
            lines.append(f"  stopped={self.stopped!r},")
        if self.resumed_from is not None:
            lines.append(f"  resumed_from={self.resumed_from!r},")
        if self.num_failures:
            lines.append(f"  num_failures={self.num_failures},")
        return "Result(\n" + "\n".join(lines) + "\n)"

    def _repr_html_(self) -> str:
        return _render(self)

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, str]:
        return {"text/plain": repr(self), "text/html": _render(self)}


@cache
def _template(name: str) -> string.Template:
    text = resources.files("nbcluster.train").joinpath("templates", name).read_text("utf-8")
    return string.Template(text)


def render_template(name: str, /, raw: Sequence[str] = (), **values: object) -> str:
    """Fill ``templates/<name>``, HTML-escaping every value except those named in ``raw``
    (markup this package built from escaped parts)."""
    escaped = {
        k: (str(v) if k in raw else html.escape(str(v), quote=True)) for k, v in values.items()
    }
    return _template(name).substitute(escaped)


def format_value(value: Any) -> str:
    """A metric value, short: floats with 4 significant digits."""
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def metrics_rows(metrics: Mapping[str, Any] | None) -> str:
    """HTML table rows (escaped) for a metrics dict."""
    if not metrics:
        return "<tr><td colspan='2' style='color:#666'>no reports</td></tr>"
    return "".join(
        f"<tr><th style='text-align:left;padding-right:1em'>{html.escape(str(k))}</th>"
        f"<td style='text-align:left'>{html.escape(format_value(v))}</td></tr>"
        for k, v in metrics.items()
    )


_STATUS_COLORS = {"failed": "#b22", "interrupted": "#b80", "finished": "#292"}


def _render(result: Result) -> str:
    status = result._status()
    color = _STATUS_COLORS.get(status.split(" ")[0], "#b80")
    error = ""
    if result.error is not None:
        error = f"<pre style='white-space:pre-wrap;color:#b22;margin:4px 0'>{html.escape(str(result.error))}</pre>"
    kept = result.best_checkpoints or []
    checkpoints = (
        "".join(
            f"<li><code>{html.escape(os.path.basename(c.path))}</code> "
            f"(iteration {html.escape(str(m.get('training_iteration', '?')))})</li>"
            for c, m in kept
        )
        or "<li style='color:#666'>none</li>"
    )
    notes = []
    if result.resumed_from is not None:
        notes.append(f"resumed from {result.resumed_from.path}")
    if result.num_failures:
        notes.append(f"restarted {result.num_failures} time(s) after failures")
    if result.interrupted:
        notes.append(
            "interrupted: the checkpoints are kept; pass result.checkpoint as "
            "resume_from_checkpoint (or run again with the same RunConfig(name=...)) to carry on"
        )
    return render_template(
        "result.html",
        raw=("metrics", "checkpoints", "error"),
        status=status,
        color=color,
        path=result.path,
        iterations=len(result.metrics_history),
        metrics=metrics_rows(result.metrics),
        checkpoints=checkpoints,
        error=error,
        notes="; ".join(notes),
    )
