"""Rich displays of runtime objects (refs, errors), drawn by renderers installed from above.

The runtime imports nothing above itself, so the Jupyter layer
(:mod:`nbcluster.jupyter.display`) installs the functions that turn an ``ObjectRef`` or a
``TaskError`` into a ``text/plain`` + ``text/html`` mimebundle and into HTML. Until one is
installed for an object's class, the object shows its plain text only.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

__all__ = ["Renderer", "html", "mimebundle", "set_renderer"]


class Renderer(NamedTuple):
    """How to draw instances of one class: a mimebundle and an HTML fragment."""

    mimebundle: Callable[[Any], dict[str, str]]
    html: Callable[[Any], str]


_renderers: dict[type, Renderer] = {}


def set_renderer(cls: type, renderer: Renderer | None) -> None:
    """Draw instances of ``cls`` (and of its subclasses) with ``renderer``; None removes it."""
    if renderer is None:
        _renderers.pop(cls, None)
    else:
        _renderers[cls] = renderer


def _find(obj: object) -> Renderer | None:
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
