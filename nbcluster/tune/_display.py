"""What ``Tuner.fit()`` shows while it runs: one live widget in a notebook, status lines elsewhere.

The widget (ipywidgets + a plotly ``FigureWidget``, imported only when a notebook shows it)
has a header (counts by status, elapsed time, the best value so far), a chart of the metric
against ``training_iteration`` with one line per trial coloured by its status, and a table
of the trials. The controller's loop calls :meth:`Reporter.update` as often as it likes;
the display redraws at most ``REFRESH_S`` apart, in one ``batch_update``, so the front end
gets a few messages a second whatever the rate of results.

Trials' prints arrive already limited per trial by the runners; :meth:`Reporter.output`
prefixes them with the trial's name and folds what exceeds ``OUTPUT_LINES_PER_S`` in all.
"""

from __future__ import annotations

import html
import sys
import time
from typing import IO, Any

from nbcluster.tune._render import (
    STATUS_COLORS,
    best_trial,
    format_value,
    result_grid_text,
    status_summary,
    trials_table_html,
)
from nbcluster.tune.experiment.trial import Trial
from nbcluster.tune.result import AUTO_RESULT_KEYS

__all__ = ["OUTPUT_LINES_PER_S", "REFRESH_S", "Reporter", "WidgetReporter", "make_reporter"]

REFRESH_S = 0.3
OUTPUT_LINES_PER_S = 50
_TEXT_EVERY_S = 5.0
_MAX_LINES = 60


def _in_notebook() -> bool:
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    ip = get_ipython()
    return ip is not None and getattr(ip, "kernel", None) is not None


def _elapsed(seconds: float) -> str:
    m, s = divmod(int(seconds), 60)
    h, m = divmod(m, 60)
    return f"{h}:{m:02d}:{s:02d}"


class Reporter:
    """Text reporting: a status line every few seconds, trial output, a final summary."""

    def __init__(
        self,
        metric: str | None,
        mode: str | None,
        verbose: int = 1,
        experiment_path: str = "",
        file: IO[str] | None = None,
    ) -> None:
        self.metric = metric
        self.mode = mode
        self.verbose = verbose
        self.experiment_path = experiment_path
        self._file = file
        self._start = time.monotonic()
        self._last_draw = 0.0
        self._note = ""
        self._out_window = time.monotonic()
        self._out_lines = 0
        self._out_folded = 0

    @property
    def file(self) -> IO[str]:
        return self._file or sys.stdout

    def chart_metric(self, trials: list[Trial]) -> str | None:
        """The metric to plot: the configured one, else the first one reported."""
        if self.metric:
            return self.metric
        for t in trials:
            for k, v in t.last_result.items():
                if (
                    k not in AUTO_RESULT_KEYS
                    and isinstance(v, (int, float))
                    and not isinstance(v, bool)
                ):
                    return k
        return None

    def header(self, trials: list[Trial]) -> str:
        """``'0:00:12 · 20 trials: 2 RUNNING, 18 TERMINATED · best loss 0.1 (trial)'``."""
        parts = [
            _elapsed(time.monotonic() - self._start),
            f"{len(trials)} trials: {status_summary(trials) or 'starting'}",
        ]
        best = best_trial(trials, self.metric, self.mode)
        if best is not None:
            parts.append(f"best {self.metric} {format_value(best[1])} ({best[0]})")
        if self._note:
            parts.append(self._note)
        return " · ".join(parts)

    def start(self, trials: list[Trial]) -> None:
        """The run starts."""
        self._start = time.monotonic()

    def note(self, text: str) -> None:
        """A message about the run (interrupted, stopping...), shown with the status."""
        self._note = text
        if self.verbose:
            print(f"[tune] {text}", file=self.file, flush=True)

    def update(self, trials: list[Trial], force: bool = False) -> None:
        """Redraw if enough time passed (or ``force``)."""
        now = time.monotonic()
        if not self.verbose or (not force and now - self._last_draw < _TEXT_EVERY_S):
            return
        self._last_draw = now
        print(f"[tune] {self.header(trials)}", file=self.file, flush=True)

    def trial_ended(self, trial: Trial) -> None:
        """A trial finished (a line at ``verbose >= 2``)."""
        if self.verbose >= 2 and self.metric:
            value = trial.last_result.get(self.metric)
            print(
                f"[tune] {trial} {trial.status}: {self.metric}={format_value(value)}",
                file=self.file,
                flush=True,
            )

    def trial_failed(self, trial: Trial, retrying: bool) -> None:
        """A trial raised (or its process died): one line, with what happens next."""
        last = (trial.error_msg or "error").strip().splitlines()[-1][:300]
        if retrying:
            ckpt = trial.latest_checkpoint
            where = f"from {ckpt.path.rsplit('/', 1)[-1]}" if ckpt else "from the start"
            then = f"retrying {where} (failure {trial.num_failures})"
        else:
            then = f"ERROR (traceback in {trial.local_path}/error.txt)"
        print(f"[tune] {trial} failed: {last}; {then}", file=self.file, flush=True)

    def output(self, trial: Trial, text: str) -> None:
        """Print a trial's output, prefixed by its name, folding what exceeds the rate."""
        now = time.monotonic()
        if now - self._out_window >= 1.0:
            if self._out_folded:
                print(
                    f"[tune] {self._out_folded} line(s) of trial output folded "
                    "(each trial's output.log has all of it)",
                    file=self.file,
                )
            self._out_window, self._out_lines, self._out_folded = now, 0, 0
        lines = text.splitlines()
        room = max(0, OUTPUT_LINES_PER_S - self._out_lines)
        shown, folded = lines[:room], lines[room:]
        self._out_lines += len(shown)
        self._out_folded += len(folded)
        if shown:
            prefix = f"({trial}) "
            print("\n".join(prefix + line for line in shown), file=self.file, flush=True)

    def finish(self, trials: list[Trial]) -> None:
        """The run ended: a final status and the table of trials."""
        if self._out_folded:
            print(f"[tune] {self._out_folded} line(s) of trial output folded", file=self.file)
            self._out_folded = 0
        if not self.verbose:
            return
        self.update(trials, force=True)
        text = result_grid_text(trials, self.metric, self.mode, self.experiment_path, limit=20)
        print(text, file=self.file, flush=True)


class WidgetReporter(Reporter):
    """The live widget: header, plotly chart (a line per trial, coloured by status), table."""

    MAX_TRACES = 100

    def __init__(
        self, metric: str | None, mode: str | None, verbose: int = 1, experiment_path: str = ""
    ) -> None:
        super().__init__(metric, mode, verbose, experiment_path)
        import ipywidgets
        import plotly.graph_objects as go

        self._header = ipywidgets.HTML()
        self._table = ipywidgets.HTML()
        self.figure = go.FigureWidget(
            layout={
                "height": 300,
                "margin": {"l": 50, "r": 10, "t": 30, "b": 40},
                "xaxis": {"title": {"text": "training_iteration"}},
                "yaxis": {"title": {"text": metric or ""}},
                "showlegend": False,
                "template": "plotly_white",
            }
        )
        self.widget = ipywidgets.VBox([self._header, self.figure, self._table])
        self._traces: dict[str, int] = {}
        self._drawn: dict[str, tuple[int, str]] = {}

    def start(self, trials: list[Trial]) -> None:
        super().start(trials)
        from IPython.display import display

        display(self)
        self.update(trials, force=True)

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, Any]:
        data = dict(self.widget._repr_mimebundle_(include=include, exclude=exclude) or {})
        data["text/plain"] = f"<Tune live widget: trial table, {self.metric or 'metric'} per trial>"
        return data

    def note(self, text: str) -> None:
        self._note = text

    def update(self, trials: list[Trial], force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._last_draw < REFRESH_S:
            return
        self._last_draw = now
        metric = self.chart_metric(trials)
        self._header.value = f"<b>Tune</b> · {_html(self.header(trials))}"
        self._table.value = (
            '<div style="max-height:320px;overflow:auto;font-size:12px">'
            + trials_table_html(trials, self.metric or metric, self.mode, limit=_MAX_LINES)
            + "</div>"
        )
        if metric is None:
            return
        with self.figure.batch_update():
            if self.figure.layout.yaxis.title.text != metric:
                self.figure.layout.yaxis.title.text = metric
            for t in self._chart_trials(trials, metric):
                self._draw_trial(t, metric)

    def _chart_trials(self, trials: list[Trial], metric: str) -> list[Trial]:
        if len(trials) <= self.MAX_TRACES:
            return trials
        keep = [t for t in trials if t.trial_id in self._traces]
        room = self.MAX_TRACES - len(self._traces)
        if room > 0:
            fresh = [
                t for t in trials if t.trial_id not in self._traces and t.status == Trial.RUNNING
            ]
            keep += fresh[:room]
        return keep

    def _draw_trial(self, trial: Trial, metric: str) -> None:
        state = (len(trial.results), trial.status)
        if self._drawn.get(trial.trial_id) == state:
            return
        self._drawn[trial.trial_id] = state
        xs, ys = [], []
        for r in trial.results:
            v = r.get(metric)
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                xs.append(r.get("training_iteration", len(xs) + 1))
                ys.append(v)
        color = STATUS_COLORS[trial.status]
        idx = self._traces.get(trial.trial_id)
        if idx is None:
            self.figure.add_scatter(
                x=xs,
                y=ys,
                mode="lines+markers",
                name=str(trial),
                line={"color": color, "width": 1.5},
                marker={"size": 4},
            )
            self._traces[trial.trial_id] = len(self.figure.data) - 1
            return
        trace = self.figure.data[idx]
        trace.x, trace.y = xs, ys
        trace.line.color = color

    def finish(self, trials: list[Trial]) -> None:
        self.update(trials, force=True)
        if self._out_folded:
            print(f"[tune] {self._out_folded} line(s) of trial output folded", file=self.file)
            self._out_folded = 0

    def __repr__(self) -> str:
        return "<tune live widget>"


def _html(text: str) -> str:
    return html.escape(text)


def make_reporter(
    verbose: int, metric: str | None, mode: str | None, experiment_path: str
) -> Reporter:
    """The widget in a Jupyter kernel (``verbose >= 1``), else text reporting."""
    if verbose >= 1 and _in_notebook():
        try:
            return WidgetReporter(metric, mode, verbose, experiment_path)
        except ImportError:
            pass
    return Reporter(metric, mode, verbose, experiment_path)
