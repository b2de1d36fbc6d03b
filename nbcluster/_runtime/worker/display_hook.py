"""Rich ``display()`` from tasks and actors: a mime bundle travels to the submitting cell.

On a worker there is no kernel: ``IPython.display.display(obj)`` only prints ``obj``
there. :func:`install` (called by :func:`nbcluster._runtime.worker.output.install`) makes
it do what it does in a kernel instead: while a task or actor call runs, ``display(obj)``
formats ``obj`` into a mime bundle (``text/html``, ``image/png``, ``text/plain``, ...)
and hands it, as JSON text, to the worker's output capture, which sends it to the task's
owner as a record of the ``display`` stream, in order with the call's stdout and stderr.
The notebook shows it in the submitting cell's log area.

- IPython is never imported here. If it is already imported, it is patched at once;
  otherwise a meta-path hook patches ``IPython.core.display_functions`` when something
  imports it (the task's own code, or unpickling a function that refers to ``display``).
  Inside a call, ``display``, ``update_display`` and ``publish_display_data`` send
  bundles (an update is shown as a new output: a log area only grows) and
  ``clear_output`` does nothing; outside a call they are IPython's own.
- :func:`display` (``nbcluster.util.display``) does the same without IPython, for
  workers where IPython is not installed; in a notebook it is IPython's ``display``.
- A nested task's display output, received by the worker that submitted it, is passed on
  to that worker's own caller (:func:`forward`), so it still lands in the cell.
- Objects are formatted by IPython's ``DisplayFormatter`` when IPython is loaded in the
  worker, else by their ``_repr_mimebundle_`` and ``_repr_*_`` methods (binary data is
  base64-encoded, as in Jupyter messages). A bundle over :data:`MAX_BUNDLE_CHARS` is
  replaced by its ``text/plain`` with a note.
"""

from __future__ import annotations

import base64
import functools
import importlib
import importlib.abc
import json
import pprint
import sys
import uuid
from collections.abc import Callable, Collection, Sequence
from typing import Any, Protocol

__all__ = ["MAX_BUNDLE_CHARS", "display", "encode_bundle", "forward", "install", "mime_bundle"]

#: A display output larger than this (as JSON) is sent as its text/plain form only.
MAX_BUNDLE_CHARS = 8 * 2**20
#: The IPython module whose functions are patched on workers.
TARGET = "IPython.core.display_functions"
#: Modules that copy the patched names (``from ... import *``) and get the patched ones too.
_COPIES = ("IPython.display", "IPython.core.display", "IPython")
_PATCHED = "__nbcluster_display_hook__"

#: ``_repr_*_`` methods in IPython's order, and their mime types.
_REPR_METHODS = (
    ("text/html", "_repr_html_"),
    ("text/markdown", "_repr_markdown_"),
    ("image/svg+xml", "_repr_svg_"),
    ("image/png", "_repr_png_"),
    ("application/pdf", "_repr_pdf_"),
    ("image/jpeg", "_repr_jpeg_"),
    ("text/latex", "_repr_latex_"),
    ("application/json", "_repr_json_"),
    ("application/javascript", "_repr_javascript_"),
)
_BINARY = frozenset({"image/png", "image/jpeg", "image/gif", "application/pdf"})


class _Capture(Protocol):
    def running(self) -> bool: ...

    def display(self, text: str) -> bool: ...


_capture: _Capture | None = None


# -- formatting --------------------------------------------------------------------------------
def _split(got: Any) -> tuple[Any, dict[str, Any]]:
    """A ``_repr_*_`` result: a value, or ``(value, metadata)``."""
    if isinstance(got, tuple) and len(got) == 2 and isinstance(got[1], dict):
        return got[0], got[1]
    return got, {}


def _wanted(mime: str, include: Collection[str] | None, exclude: Collection[str] | None) -> bool:
    return (include is None or mime in include) and (exclude is None or mime not in exclude)


def _fallback_bundle(
    obj: Any, include: Collection[str] | None = None, exclude: Collection[str] | None = None
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Format ``obj`` without IPython: ``_repr_mimebundle_``, then each ``_repr_*_``, then
    ``text/plain`` from :func:`pprint.pformat` (as IPython does it, roughly)."""
    data: dict[str, Any] = {}
    metadata: dict[str, Any] = {}
    bundle = getattr(obj, "_repr_mimebundle_", None)
    if callable(bundle) and not isinstance(obj, type):
        try:
            got, md = _split(bundle(include=include, exclude=exclude))
        except Exception:  # noqa: BLE001 - a broken repr must not fail the task
            got, md = None, {}
        if isinstance(got, dict):
            data.update(got)
            metadata.update(md)
    for mime, name in _REPR_METHODS:
        if mime in data or not _wanted(mime, include, exclude):
            continue
        method = getattr(obj, name, None)
        if not callable(method) or isinstance(obj, type):
            continue
        try:
            value, md = _split(method())
        except Exception:  # noqa: BLE001 - as IPython: a failing repr is left out
            continue
        if value is not None:
            data[mime] = value
            if md:
                metadata[mime] = md
    if "text/plain" not in data:
        try:
            data["text/plain"] = pprint.pformat(obj)
        except Exception:  # noqa: BLE001 - a broken __repr__
            data["text/plain"] = f"<{type(obj).__name__} object>"
    return {m: v for m, v in data.items() if _wanted(m, include, exclude)}, metadata


@functools.cache
def _ipython_formatter() -> Any:
    from IPython.core.formatters import DisplayFormatter

    return DisplayFormatter()


def mime_bundle(
    obj: Any, include: Collection[str] | None = None, exclude: Collection[str] | None = None
) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """``(data, metadata)`` for ``obj``, or None when it displayed itself
    (``_ipython_display_``). IPython's formatter when IPython is loaded, else the
    ``_repr_*_`` methods."""
    if "IPython.core.formatters" in sys.modules:
        data, metadata = _ipython_formatter().format(obj, include=include, exclude=exclude)
        return (data, metadata) if data else None
    return _fallback_bundle(obj, include, exclude)


def _jsonable(mime: str, value: Any) -> Any:
    if isinstance(value, bytes | bytearray | memoryview):
        raw = bytes(value)
        if mime in _BINARY:
            return base64.b64encode(raw).decode("ascii")
        return raw.decode("utf-8", "replace")
    json.dumps(value)  # raises for what JSON cannot carry
    return value


def encode_bundle(data: dict[str, Any], metadata: dict[str, Any] | None = None) -> str:
    """The JSON text of a display output: ``{"data": {...}, "metadata": {...}}``.

    Binary values become base64; values JSON cannot carry are left out; a ``text/plain``
    is always there; a bundle over :data:`MAX_BUNDLE_CHARS` keeps only its text.
    """
    clean: dict[str, Any] = {}
    for mime, value in data.items():
        if not isinstance(mime, str):
            continue
        try:
            clean[mime] = _jsonable(mime, value)
        except (TypeError, ValueError):
            continue
    if not isinstance(clean.get("text/plain"), str):
        clean["text/plain"] = "<display output>"
    try:
        md = json.loads(json.dumps(metadata or {}))
    except (TypeError, ValueError):
        md = {}
    text = json.dumps({"data": clean, "metadata": md})
    if len(text) > MAX_BUNDLE_CHARS:
        note = (
            f"\n[display output of {len(text):,} characters is over the "
            f"{MAX_BUNDLE_CHARS:,}-character limit: only its text is shown]"
        )
        text = json.dumps(
            {"data": {"text/plain": clean["text/plain"][:2000] + note}, "metadata": {}}
        )
    return text


# -- publishing --------------------------------------------------------------------------------
def _in_task() -> _Capture | None:
    capture = _capture
    return capture if capture is not None and capture.running() else None


def _publish(
    capture: _Capture,
    obj: Any,
    *,
    raw: bool = False,
    include: Collection[str] | None = None,
    exclude: Collection[str] | None = None,
    metadata: dict[str, Any] | None = None,
) -> None:
    if raw:
        if not isinstance(obj, dict):
            raise TypeError(f"display(raw=True) expects a dict of mime type -> data, got {obj!r}")
        data, md = dict(obj), {}
    else:
        got = mime_bundle(obj, include, exclude)
        if got is None:
            return
        data, md = got
    if metadata:
        md = {**md, **metadata}
    capture.display(encode_bundle(data, md))


def display(
    *objs: Any,
    include: Collection[str] | None = None,
    exclude: Collection[str] | None = None,
    metadata: dict[str, Any] | None = None,
    raw: bool = False,
) -> None:
    """Show ``objs`` as rich output under the cell that submitted the running task.

    Works on workers with or without IPython installed (``IPython.display.display`` works
    there too when it is). Outside a task it is IPython's ``display`` in a notebook, and
    ``print`` elsewhere. ``include``/``exclude``: mime types to keep or leave out;
    ``metadata``: per-mime metadata; ``raw``: each obj is already a ``{mime: data}`` dict.
    """
    capture = _in_task()
    if capture is not None:
        for obj in objs:
            _publish(capture, obj, raw=raw, include=include, exclude=exclude, metadata=metadata)
        return
    shell_module = sys.modules.get("IPython.core.interactiveshell")
    if shell_module is not None and shell_module.InteractiveShell.initialized():
        ipython_display = importlib.import_module(TARGET).display
        ipython_display(*objs, include=include, exclude=exclude, metadata=metadata, raw=raw)
        return
    print(*objs)


def forward(text: str) -> bool:
    """Pass on a display output (JSON) that a nested task sent to this worker, as if a
    call running here showed it; False when this process runs no call (or is no worker)."""
    capture = _capture
    return capture is not None and capture.display(text)


# -- patching IPython --------------------------------------------------------------------------
def _patched_display(original: Callable[..., Any], module: Any) -> Callable[..., Any]:
    @functools.wraps(original)
    def patched(
        *objs: Any,
        include: Any = None,
        exclude: Any = None,
        metadata: Any = None,
        transient: Any = None,
        display_id: Any = None,
        raw: bool = False,
        clear: bool = False,
        **kwargs: Any,
    ) -> Any:
        capture = _in_task()
        if capture is None:
            return original(
                *objs,
                include=include,
                exclude=exclude,
                metadata=metadata,
                transient=transient,
                display_id=display_id,
                raw=raw,
                clear=clear,
                **kwargs,
            )
        for obj in objs:
            _publish(capture, obj, raw=raw, include=include, exclude=exclude, metadata=metadata)
        if display_id:
            if display_id is True:
                display_id = uuid.uuid4().hex
            return module.DisplayHandle(display_id)
        return None

    return patched


def _patched_update(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def patched(obj: Any, *, display_id: Any, **kwargs: Any) -> Any:
        capture = _in_task()
        if capture is None:
            return original(obj, display_id=display_id, **kwargs)
        _publish(
            capture,
            obj,
            raw=bool(kwargs.get("raw")),
            include=kwargs.get("include"),
            exclude=kwargs.get("exclude"),
            metadata=kwargs.get("metadata"),
        )
        return None

    return patched


def _patched_publish(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def patched(data: Any, metadata: Any = None, *, transient: Any = None, **kwargs: Any) -> Any:
        capture = _in_task()
        if capture is None:
            return original(data, metadata, transient=transient, **kwargs)
        capture.display(encode_bundle(dict(data), metadata))
        return None

    return patched


def _patched_clear(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def patched(wait: bool = False) -> Any:
        if _in_task() is None:
            return original(wait)
        return None  # a log area only grows

    return patched


def _patch(module: Any) -> None:
    """Replace the display functions of ``IPython.core.display_functions`` (once)."""
    if getattr(getattr(module, "display", None), _PATCHED, False):
        return
    makers: dict[str, Callable[[Callable[..., Any]], Callable[..., Any]]] = {
        "display": lambda f: _patched_display(f, module),
        "update_display": _patched_update,
        "publish_display_data": _patched_publish,
        "clear_output": _patched_clear,
    }
    swapped: list[tuple[Any, Any]] = []
    for name, make in makers.items():
        original = getattr(module, name, None)
        if not callable(original):
            continue
        patched = make(original)
        setattr(patched, _PATCHED, True)
        setattr(module, name, patched)
        swapped.append((original, patched))
    for copy_name in _COPIES:
        copy = sys.modules.get(copy_name)
        if copy is None:
            continue
        for name in makers:
            current = getattr(copy, name, None)
            for original, patched in swapped:
                if current is original:
                    setattr(copy, name, patched)


class _PatchingLoader(importlib.abc.Loader):
    """Runs the real loader, then patches the module."""

    def __init__(self, loader: Any) -> None:
        self._loader = loader

    def create_module(self, spec: Any) -> Any:
        return self._loader.create_module(spec)

    def exec_module(self, module: Any) -> None:
        self._loader.exec_module(module)
        _patch(module)

    def __getattr__(self, name: str) -> Any:  # get_source, get_code, is_package, ...
        return getattr(self._loader, name)


class _PatchOnImport(importlib.abc.MetaPathFinder):
    """Patches :data:`TARGET` when it is first imported."""

    def find_spec(self, fullname: str, path: Sequence[str] | None, target: Any = None) -> Any:
        if fullname != TARGET:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _PatchingLoader(spec.loader)
                return spec
        return None


def install(capture: _Capture) -> None:
    """Send ``display()`` output of the calls ``capture`` tracks to their owners (this
    process, a worker, from now on)."""
    global _capture
    _capture = capture
    module = sys.modules.get(TARGET)
    if module is not None:
        _patch(module)
    elif not any(isinstance(f, _PatchOnImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _PatchOnImport())
