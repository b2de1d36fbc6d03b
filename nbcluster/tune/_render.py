"""Text and HTML tables of trials: shared by the live widget, the text reporter and
``ResultGrid``'s rich repr. Every value that reaches HTML is escaped (configs and metric
names come from user code)."""

from __future__ import annotations

import html
import math
import string
from collections import Counter
from importlib import resources
from typing import Any

from nbcluster.tune.experiment.trial import Trial
from nbcluster.tune.search.variant_generator import flatten_dict

__all__ = [
    "STATUS_COLORS",
    "best_trial",
    "format_value",
    "result_grid_html",
    "result_grid_text",
    "status_summary",
    "trial_params",
    "trial_rows",
    "trials_table_html",
]

STATUS_COLORS = {
    Trial.PENDING: "#999999",
    Trial.RUNNING: "#1f77b4",
    Trial.PAUSED: "#ff7f0e",
    Trial.TERMINATED: "#2ca02c",
    Trial.ERROR: "#d62728",
}
_STATUS_ORDER = {
    Trial.RUNNING: 0,
    Trial.PAUSED: 1,
    Trial.PENDING: 2,
    Trial.ERROR: 3,
    Trial.TERMINATED: 4,
}


def format_value(value: Any) -> str:
    """A short text for a table cell."""
    if isinstance(value, bool) or value is None:
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        return f"{value:.4g}"
    text = str(value)
    return text if len(text) <= 24 else text[:23] + "…"


def trial_params(trial: Trial, limit: int = 6) -> dict[str, Any]:
    """The searched parameters of a trial (else its scalar config values)."""
    params = dict(trial.evaluated_params)
    if not params:
        params = {
            k: v
            for k, v in flatten_dict(trial.config).items()
            if isinstance(v, (int, float, str, bool)) or v is None
        }
    return dict(list(params.items())[:limit])


def best_trial(
    trials: list[Trial], metric: str | None, mode: str | None
) -> tuple[Trial, float] | None:
    """The trial with the best value of ``metric`` seen so far, and that value."""
    if not metric or mode not in ("min", "max"):
        return None
    best: tuple[Trial, float] | None = None
    for t in trials:
        value = t.metric_summary(metric, scope="all", mode=mode)
        if value is None or not math.isfinite(value):
            continue
        if best is None or (value > best[1] if mode == "max" else value < best[1]):
            best = (t, value)
    return best


def status_summary(trials: list[Trial]) -> str:
    """``'3 RUNNING, 7 TERMINATED'``."""
    counts = Counter(t.status for t in trials)
    return ", ".join(f"{counts[s]} {s}" for s in sorted(counts, key=lambda s: _STATUS_ORDER[s]))


def trial_rows(
    trials: list[Trial], metric: str | None, mode: str | None, limit: int = 50
) -> tuple[list[dict[str, Any]], int]:
    """Rows for a table (running first, then the best), and how many were left out."""

    def key(t: Trial) -> tuple[int, float]:
        value = t.metric_summary(metric, scope="all", mode=mode or "max") if metric else None
        score = 0.0 if value is None or not math.isfinite(value) else value
        return (_STATUS_ORDER[t.status], -score if mode == "max" else score)

    ordered = sorted(trials, key=key) if len(trials) > limit else list(trials)
    rows = []
    for t in ordered[:limit]:
        last = t.last_result.get(metric) if metric else None
        best = t.metric_summary(metric, scope="all", mode=mode or "max") if metric else None
        rows.append(
            {
                "name": str(t),
                "status": t.status,
                "params": trial_params(t),
                "iter": t.iteration,
                "last": last,
                "best": best,
                "error": (t.error_msg or "").strip().splitlines()[-1:]
                if t.status == Trial.ERROR
                else [],
            }
        )
    return rows, max(0, len(trials) - limit)


def result_grid_text(
    trials: list[Trial], metric: str | None, mode: str | None, experiment_path: str, limit: int = 20
) -> str:
    """The text/plain rendering of a ``ResultGrid``."""
    lines = [
        f"ResultGrid<{len(trials)} trials: {status_summary(trials) or 'none'}> at {experiment_path}"
    ]
    best = best_trial(trials, metric, mode)
    if best is not None:
        lines.append(f"best {metric} ({mode}): {format_value(best[1])} in {best[0]}")
    rows, more = trial_rows(trials, metric, mode, limit)
    for r in rows:
        params = ", ".join(f"{k}={format_value(v)}" for k, v in r["params"].items())
        value = f" {metric}={format_value(r['last'])}" if metric and r["last"] is not None else ""
        err = f"  ! {r['error'][0]}" if r["error"] else ""
        lines.append(
            f"  {r['name']:<28} {r['status']:<10} iter={r['iter']:<5}{value}  {params}{err}"
        )
    if more:
        lines.append(f"  ... {more} more trials")
    return "\n".join(lines)


def _template() -> string.Template:
    text = resources.files("nbcluster.tune").joinpath("templates", "trials.html").read_text("utf-8")
    return string.Template(text)


def trials_table_html(
    trials: list[Trial], metric: str | None, mode: str | None, limit: int = 50
) -> str:
    """An HTML table of the trials (status, parameters, iterations, latest and best metric)."""
    rows, more = trial_rows(trials, metric, mode, limit)
    param_keys: list[str] = []
    for r in rows:
        for k in r["params"]:
            if k not in param_keys:
                param_keys.append(k)
    esc = html.escape
    head = "".join(f"<th>{esc(k)}</th>" for k in ["trial", "status", *param_keys, "iter"])
    if metric:
        head += f"<th>{esc(metric)} (last)</th><th>{esc(metric)} (best)</th>"
    body = []
    for r in rows:
        color = STATUS_COLORS[r["status"]]
        cells = [
            f"<td>{esc(r['name'])}</td>",
            f'<td style="color:{color};font-weight:bold">{esc(r["status"])}</td>',
        ]
        cells += [f"<td>{esc(format_value(r['params'].get(k, '')))}</td>" for k in param_keys]
        cells.append(f"<td>{r['iter']}</td>")
        if metric:
            cells.append(
                f"<td>{esc(format_value(r['last']) if r['last'] is not None else '')}</td>"
            )
            cells.append(
                f"<td>{esc(format_value(r['best']) if r['best'] is not None else '')}</td>"
            )
        title = f' title="{esc(r["error"][0])}"' if r["error"] else ""
        body.append(f"<tr{title}>{''.join(cells)}</tr>")
    if more:
        span = len(param_keys) + 3 + (2 if metric else 0)
        body.append(f'<tr><td colspan="{span}" style="color:#666">… {more} more trials</td></tr>')
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def result_grid_html(
    trials: list[Trial], metric: str | None, mode: str | None, experiment_path: str
) -> str:
    """The text/html rendering of a ``ResultGrid``."""
    best = best_trial(trials, metric, mode)
    best_text = ""
    if best is not None:
        best_text = f"best {metric} ({mode}): {format_value(best[1])} in {best[0]}"
    return _template().substitute(
        title=html.escape(f"ResultGrid: {len(trials)} trials"),
        summary=html.escape(status_summary(trials) or "no trials"),
        best=html.escape(best_text),
        path=html.escape(experiment_path),
        table=trials_table_html(trials, metric, mode),
    )
