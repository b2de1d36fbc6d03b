"""Rich displays of runtime objects (refs, errors), drawn by renderers installed from above.

The runtime imports nothing above itself, so the Jupyter layer
(:mod:`nbcluster.jupyter.display`) installs the functions that turn an ``ObjectRef`` or a
``TaskError`` into a ``text/plain`` + ``text/html`` mimebundle and into HTML. Until one is
installed for an object's class, the object shows its plain text only. The upper layer
may instead add a *loader* (:func:`add_loader`) that installs them on the first display,
so that ``import nbcluster`` loads no Jupyter code.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, NamedTuple

__all__ = ["Renderer", "add_loader", "html", "mimebundle", "set_renderer"]


class Renderer(NamedTuple):
    """How to draw instances of one class: a mimebundle and an HTML fragment."""

    mimebundle: Callable[[Any], dict[str, str]]
    html: Callable[[Any], str]


_renderers: dict[type, Renderer] = {}
_loaders: list[Callable[[], None]] = []
_lock = threading.Lock()


def set_renderer(cls: type, renderer: Renderer | None) -> None:
    """Draw instances of ``cls`` (and of its subclasses) with ``renderer``; None removes it."""
    if renderer is None:
        _renderers.pop(cls, None)
    else:
        _renderers[cls] = renderer


def add_loader(load: Callable[[], None]) -> None:
    """Call ``load`` (once) before the first display, to install renderers lazily."""
    with _lock:
        _loaders.append(load)


def _find(obj: object) -> Renderer | None:
    if _loaders:
        with _lock:
            pending = list(_loaders)
            _loaders.clear()
        for load in pending:
            load()
    for klass in type(obj).__mro__:
        renderer = _renderers.get(klass)
        if renderer is not None:
            return renderer
    return None


def mimebundle(obj: object, text: str) -> dict[str, str]:
    """The installed renderer's bundle for ``obj``, or ``{"text/plain": text}``."""
    renderer = _find(obj)
    return renderer.mimebundle(obj) if renderer is not None else {"text/plain": text}


def html(obj: object) -> str | None:
    """The installed renderer's HTML for ``obj``, or None (the front end uses the text)."""
    renderer = _find(obj)
    return renderer.html(obj) if renderer is not None else None
