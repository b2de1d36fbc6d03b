"""The live widget ``serve.run`` shows in a notebook: one application, updated in place.

A table of the application's deployments (status, replicas by state, requests/s,
p50/p99 latency, errors; hover a replica count for the replicas' ids, states and pids)
above a plotly ``FigureWidget`` of requests/s and p50/p99 over the last minute. A
background thread reads ``serve.status()`` twice a second while the widget is shown;
it stops when the widget is closed, when its view goes away, or when the same
application is run again (each ``serve.run`` gets its own widget). ``text/plain`` is a
summary of the same numbers, for front ends without widgets.

ipywidgets and plotly are imported when a widget is created, never by ``import
nbcluster.serve``.
"""

from __future__ import annotations

import html
import string
import threading
import time
from collections import deque
from collections.abc import Callable
from importlib import resources
from typing import Any

from nbcluster.serve.schema import ApplicationStatusOverview, ServeStatus

__all__ = ["ServeWidget", "render_app", "show", "summary_text"]

PERIOD_S = 0.5
HISTORY = 120
_COLORS = {
    "RUNNING": "#2ca02c",
    "DEPLOYING": "#1f77b4",
    "UNHEALTHY": "#ff7f0e",
    "DEPLOY_FAILED": "#d62728",
    "DELETING": "#7f7f7f",
    "NOT_STARTED": "#7f7f7f",
}
_live: dict[str, ServeWidget] = {}
_live_lock = threading.Lock()


def _render(template: str, /, safe: tuple[str, ...] = (), **values: object) -> str:
    text = resources.files("nbcluster.serve").joinpath("templates", template).read_text("utf-8")
    escaped = {k: (str(v) if k in safe else html.escape(str(v))) for k, v in values.items()}
    return string.Template(text).substitute(escaped)


def _ms(value: float | None) -> str:
    return "–" if value is None else f"{value:.1f} ms"


def _replicas(d: Any) -> str:
    parts = [
        f"{n} {s.value.lower()}"
        for s, n in sorted(d.replica_states.items(), key=lambda x: x[0].value)
    ]
    return (", ".join(parts) or "none") + f" (target {d.target_replicas})"


def render_app(app: str, overview: ApplicationStatusOverview | None, url: str = "") -> str:
    """The HTML table of one application (every value escaped)."""
    if overview is None:
        return _render(
            "app.html",
            safe=("url_html", "rows"),
            app=app,
            status="NOT RUNNING",
            color=_COLORS["NOT_STARTED"],
            url_html="",
            message="the application was deleted (or Serve shut down)",
            rows="",
        )
    rows = "".join(
        _render(
            "deployment_row.html",
            name=name,
            status=d.status.value,
            replicas=_replicas(d),
            replica_detail="; ".join(
                f"{r.replica_id} {r.state.value} pid {r.pid or '?'} ongoing {r.ongoing_requests:g}"
                for r in d.replicas
            ),
            rps=f"{d.requests_per_s:.1f}",
            p50=_ms(d.p50_ms),
            p99=_ms(d.p99_ms),
            errors=d.errors,
        )
        for name, d in overview.deployments.items()
    )
    status = overview.status.value
    return _render(
        "app.html",
        safe=("url_html", "rows"),
        app=app,
        status=status,
        color=_COLORS.get(status, "#7f7f7f"),
        url_html=_render("url_link.html", url=url) if url else "",
        message=overview.message.splitlines()[0] if overview.message else "",
        rows=rows,
    )


def summary_text(app: str, overview: ApplicationStatusOverview | None, url: str = "") -> str:
    """The text/plain form of the widget."""
    if overview is None:
        return f"Serve application {app!r}: not running"
    lines = [f"Serve application {app!r}: {overview.status.value}" + (f" at {url}" if url else "")]
    for name, d in overview.deployments.items():
        lines.append(
            f"  {name}: {d.status.value}, replicas {_replicas(d)}, {d.requests_per_s:.1f} req/s, "
            f"p50 {_ms(d.p50_ms)}, p99 {_ms(d.p99_ms)}, {d.errors} errors"
        )
    return "\n".join(lines)


class ServeWidget:
    """Live view of one Serve application (see the module docstring)."""

    def __init__(
        self,
        app: str,
        url: str = "",
        *,
        fetch: Callable[[], ServeStatus] | None = None,
        autostart: bool = True,
    ) -> None:
        import ipywidgets

        self.app = app
        self.url = url
        self._fetch = fetch
        self.overview: ApplicationStatusOverview | None = None
        self._history: deque[tuple[float, float, float | None, float | None]] = deque(
            maxlen=HISTORY
        )
        self._t0 = time.monotonic()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self.table = ipywidgets.HTML(render_app(app, None, url))
        self.figure: Any = None
        self.widget = ipywidgets.VBox([self.table])
        self.widget.observe(self._on_comm, names="comm")
        self._thread: threading.Thread | None = None
        if autostart:
            # The first plotly FigureWidget of a process takes seconds to build (plotly loads
            # its validators): the table shows at once, the chart joins when it is ready.
            self._thread = threading.Thread(
                target=self._run, name=f"serve-widget-{app}", daemon=True
            )
            self._thread.start()
        else:
            self._add_figure()

    def _add_figure(self) -> None:
        import plotly.graph_objects as go

        figure = go.FigureWidget(
            data=[
                go.Scatter(name="requests/s", mode="lines", line={"color": "#1f77b4"}),
                go.Scatter(name="p50 ms", mode="lines", yaxis="y2", line={"color": "#2ca02c"}),
                go.Scatter(
                    name="p99 ms",
                    mode="lines",
                    yaxis="y2",
                    line={"color": "#d62728", "dash": "dot"},
                ),
            ],
            layout=go.Layout(
                height=220,
                margin={"l": 40, "r": 40, "t": 20, "b": 30},
                xaxis={"title": {"text": "seconds"}},
                yaxis={"title": {"text": "req/s"}, "rangemode": "tozero"},
                yaxis2={
                    "title": {"text": "ms"},
                    "overlaying": "y",
                    "side": "right",
                    "rangemode": "tozero",
                },
                legend={"orientation": "h", "y": 1.15},
            ),
        )
        with self._lock:
            self.figure = figure
            self.widget.children = (self.table, figure)

    @property
    def live(self) -> bool:
        """True while the widget updates itself."""
        return not self._stop.is_set()

    def _on_comm(self, change: dict[str, Any]) -> None:
        if change.get("new") is None and change.get("old") is not None:
            self._stop.set()

    def _run(self) -> None:
        try:
            self.refresh()
            if not self._stop.is_set():
                self._add_figure()
        except Exception:  # noqa: BLE001 - the cluster went away: stop quietly
            self._stop.set()
        while not self._stop.wait(PERIOD_S):
            try:
                self.refresh()
            except Exception:  # noqa: BLE001 - the cluster went away: stop quietly
                self._stop.set()

    def refresh(self) -> None:
        """Read the status once (``fetch``, i.e. ``serve.status``) and redraw; the thread does
        this twice a second."""
        if self._fetch is None:
            raise RuntimeError("this widget has no status source: pass fetch=serve.status")
        self.update(self._fetch())

    def update(self, st: ServeStatus) -> None:
        """Redraw from a status snapshot."""
        with self._lock:
            overview = st.applications.get(self.app)
            self.overview = overview
            self.table.value = render_app(self.app, overview, self.url)
            if overview is None:
                return
            rps = sum(d.requests_per_s for d in overview.deployments.values())
            ingress = overview.deployments.get(overview.ingress_deployment)
            p50 = ingress.p50_ms if ingress else None
            p99 = ingress.p99_ms if ingress else None
            self._history.append((time.monotonic() - self._t0, rps, p50, p99))
            xs = [h[0] for h in self._history]
            fig = self.figure
            if fig is None:
                return
            with fig.batch_update():
                fig.data[0].x, fig.data[0].y = xs, [h[1] for h in self._history]
                fig.data[1].x, fig.data[1].y = xs, [h[2] for h in self._history]
                fig.data[2].x, fig.data[2].y = xs, [h[3] for h in self._history]

    def close(self) -> None:
        """Stop updating and close the ipywidgets."""
        self._stop.set()
        self.widget.close()

    def stop(self, note: str = "") -> None:
        """Stop updating, keeping the last view (with ``note`` under it)."""
        self._stop.set()
        if note:
            with self._lock:
                self.table.value += (
                    f"<div style='color: #666; font-size: 11px;'>{html.escape(note)}</div>"
                )

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, Any]:
        data: dict[str, Any] = {}
        bundle = getattr(self.widget, "_repr_mimebundle_", None)
        if callable(bundle):
            data.update(bundle(include=include, exclude=exclude) or {})
        data["text/plain"] = summary_text(self.app, self.overview, self.url)
        return data

    def __repr__(self) -> str:
        return summary_text(self.app, self.overview, self.url)


def show(app: str, url: str, fetch: Callable[[], ServeStatus]) -> ServeWidget | None:
    """Display a new live widget for ``app`` under the current cell (the previous one for
    the same app stops updating)."""
    try:
        from IPython.display import display
    except ImportError:
        return None
    widget = ServeWidget(app, url, fetch=fetch)
    with _live_lock:
        old = _live.get(app)
        _live[app] = widget
    if old is not None:
        old.stop("superseded by a later serve.run of this application")
    display(widget)
    return widget
