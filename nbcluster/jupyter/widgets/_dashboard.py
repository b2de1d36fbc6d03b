"""``dashboard()``: the Timeline, Resources and ObjectStore widgets in one set of tabs."""

from __future__ import annotations

from typing import Any

from nbcluster.jupyter.widgets._autoscaler import Autoscaler, has_autoscaler
from nbcluster.jupyter.widgets._feed import Feed
from nbcluster.jupyter.widgets._objects import ObjectStore
from nbcluster.jupyter.widgets._resources import Resources
from nbcluster.jupyter.widgets._timeline import Timeline

__all__ = ["Dashboard", "dashboard"]


class Dashboard:
    """Tabs with a :class:`Timeline`, :class:`Resources`, :class:`ObjectStore` and, when the
    cluster autoscales, an :class:`Autoscaler`.

    ``.widget`` is the ``ipywidgets.Tab``; the three live widgets are the attributes
    ``timeline``, ``resources`` and ``objects``. ``close()`` closes all of them.
    """

    def __init__(self, *, feed: Feed | None = None) -> None:
        import ipywidgets

        self._closed = False
        self.timeline = Timeline(feed=feed)
        self.resources = Resources(feed=feed)
        self.objects = ObjectStore(feed=feed)
        parts: list[Any] = [self.timeline, self.resources, self.objects]
        titles = ["Timeline", "Resources", "Object store"]
        self.autoscaler: Autoscaler | None = None
        if has_autoscaler():
            self.autoscaler = Autoscaler(feed=feed)
            parts.append(self.autoscaler)
            titles.append("Autoscaler")
        self._parts = parts
        self.widget: Any = ipywidgets.Tab(children=[p.widget for p in parts], titles=tuple(titles))
        self.widget.observe(self._on_comm_change, names="comm")

    def _on_comm_change(self, change: dict[str, Any]) -> None:
        if change.get("new") is None and change.get("old") is not None:
            self.close()

    def close(self) -> None:
        """Stop updating and close every widget."""
        if self._closed:
            return
        self._closed = True
        for part in self._parts:
            part.close()
        self.widget.close()

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, Any]:
        data: dict[str, Any] = {}
        bundle = getattr(self.widget, "_repr_mimebundle_", None)
        if callable(bundle):
            data.update(bundle(include=include, exclude=exclude) or {})
        data["text/plain"] = repr(self)
        return data

    def __repr__(self) -> str:
        return "\n".join(repr(p) for p in self._parts)


def dashboard(*, feed: Feed | None = None) -> Dashboard:
    """The cluster dashboard (what ``%cluster widgets`` shows): timeline, resources, store."""
    return Dashboard(feed=feed)
