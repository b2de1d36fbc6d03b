"""The Jupyter server extension: REST routes under ``/nbcluster/api/`` for the lab panel.

Enabled on install by ``jupyter-config/server-config/nbcluster.json`` (installed as
``etc/jupyter/jupyter_server_config.d/nbcluster.json``). It uses only the public API
(:class:`nbcluster.LocalCluster`, :mod:`nbcluster.state`), never ``nbcluster._runtime``.
See :mod:`.handlers` for the routes and :mod:`.manager` for what the list contains.
"""

from __future__ import annotations

from typing import Any

__all__ = ["_jupyter_server_extension_points"]


def _jupyter_server_extension_points() -> list[dict[str, Any]]:
    """Where jupyter_server finds the extension: :class:`.app.NbclusterServerApp`.

    The app class provides ``_load_jupyter_server_extension`` (and a stop hook, which a
    module-level loader function would not have).
    """
    from nbcluster.jupyter.server.app import NbclusterServerApp

    return [{"module": "nbcluster.jupyter.server", "app": NbclusterServerApp}]
