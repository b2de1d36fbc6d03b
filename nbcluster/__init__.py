"""nbcluster: the Ray programming model as a Jupyter-first cluster.

The public API is exactly the names in ``__all__``; everything under ``nbcluster._runtime``
is internal. Importing this package starts nothing and reads no configuration:
``nbcluster.init()`` (or ``%cluster start``) does that.
"""

import importlib

from nbcluster import actor, cloudpickle, dag, exceptions, runtime_context, util
from nbcluster._actor import ActorClass, ActorHandle, ActorMethod, get_actor, kill, method
from nbcluster._api import (
    ClusterInfo,
    RuntimeContext,
    available_resources,
    cancel,
    cluster_resources,
    get,
    get_gpu_ids,
    get_runtime_context,
    init,
    is_initialized,
    nodes,
    shutdown,
    wait,
)
from nbcluster._generator import DynamicObjectRefGenerator, ObjectRefGenerator
from nbcluster._named import get_named, put
from nbcluster._refs import ObjectRef
from nbcluster._remote import RemoteFunction, remote
from nbcluster._runtime import display as _display
from nbcluster._runtime.version import __version__
from nbcluster._timeline import timeline  # noqa: E402, I001
from nbcluster.cluster import LocalCluster

#: Libraries imported on first attribute access (``nbcluster.data``, ...), so that
#: ``import nbcluster`` never imports pyarrow, torch, optuna or starlette.
_LIBRARIES = frozenset({"data", "serve", "train", "tune"})


def __getattr__(name: str) -> object:
    """``nbcluster.widgets`` and ``nbcluster.progress`` load the Jupyter code on first use,
    so ``import nbcluster`` stays light in scripts and workers."""
    if name == "widgets":
        from nbcluster.jupyter import widgets

        return widgets
    if name == "progress":
        from nbcluster.jupyter.widgets import progress

        return progress
    if name in _LIBRARIES:  # the libraries load their heavy dependencies on first use
        return importlib.import_module(f"nbcluster.{name}")
    raise AttributeError(f"module 'nbcluster' has no attribute {name!r}")


def _install_rich_displays() -> None:
    """Install the ``ObjectRef`` / ``TaskError`` renderers of the Jupyter layer (run by the
    runtime's display registry on the first display, so ``import nbcluster`` loads none
    of the Jupyter code)."""
    rich = importlib.import_module("nbcluster.jupyter.display")
    for cls, (mimebundle, html) in rich.RENDERERS.items():
        _display.set_renderer(cls, _display.Renderer(mimebundle, html))


_display.add_loader(_install_rich_displays)


def load_ipython_extension(ip: object) -> None:
    """``%load_ext nbcluster``: register the ``%cluster`` magic (see ``nbcluster.jupyter``)."""
    from nbcluster.jupyter import magics

    magics.load_ipython_extension(ip)


def _jupyter_labextension_paths() -> list[dict[str, str]]:
    """Where the built JupyterLab extension lives (``jupyter labextension develop``)."""
    return [{"src": "labextension", "dest": "nbcluster"}]


def unload_ipython_extension(ip: object) -> None:
    """``%unload_ext nbcluster``: remove the hooks the extension installed."""
    from nbcluster.jupyter import magics

    magics.unload_ipython_extension(ip)


__all__ = [
    "ActorClass",
    "ActorHandle",
    "ActorMethod",
    "ClusterInfo",
    "DynamicObjectRefGenerator",
    "LocalCluster",
    "ObjectRef",
    "ObjectRefGenerator",
    "RemoteFunction",
    "RuntimeContext",
    "__version__",
    "actor",
    "available_resources",
    "cancel",
    "cloudpickle",
    "cluster_resources",
    "dag",
    "data",
    "exceptions",
    "get",
    "get_actor",
    "get_gpu_ids",
    "get_named",
    "get_runtime_context",
    "init",
    "is_initialized",
    "kill",
    "method",
    "nodes",
    "progress",
    "put",
    "remote",
    "runtime_context",
    "serve",
    "shutdown",
    "timeline",
    "train",
    "tune",
    "util",
    "wait",
    "widgets",
]
