"""The server extension as a jupyter_server ``ExtensionApp``.

An ``ExtensionApp`` (rather than a bare ``_load_jupyter_server_extension`` function) is
what gives the extension a shutdown hook: :meth:`NbclusterServerApp.stop_extension`
stops the clusters started from the panel when the server stops. If the server is
killed instead, those clusters end on their own (``LocalCluster``'s parent-death watch).

Options (``jupyter lab --NbclusterServerApp.max_clusters=4`` or a config file)::

    NbclusterServerApp.temp_dir       where cluster sessions live (default: nbcluster's
                                      temp_dir, i.e. NBCLUSTER_TEMP_DIR or /tmp/nbcluster)
    NbclusterServerApp.max_clusters   clusters the panel may run at once (8)
    NbclusterServerApp.max_nodes      nodes per cluster (16)
    NbclusterServerApp.max_cpus       CPUs per node (256)
    NbclusterServerApp.scan_interval  seconds between rescans of this host's clusters (2)
"""

from __future__ import annotations

import asyncio

from jupyter_server.extension.application import ExtensionApp
from traitlets import Float, Integer, Unicode

from nbcluster.jupyter.server.handlers import routes
from nbcluster.jupyter.server.manager import ClusterManager
from nbcluster.jupyter.server.models import Limits
from nbcluster.jupyter.server.serve_proxy import serve_routes
from nbcluster.jupyter.server.watch import ClusterWatcher

__all__ = ["NbclusterServerApp", "all_routes"]


def all_routes() -> list[tuple[str, type]]:
    """Every route the extension registers: the cluster API and the Serve forwarding route."""
    return [*routes(), *serve_routes()]


class NbclusterServerApp(ExtensionApp):
    """Routes under ``/nbcluster/api/`` and the :class:`ClusterManager` behind them."""

    name = "nbcluster"
    description = "nbcluster: start, list, scale and stop clusters from JupyterLab"
    load_other_extensions = True

    temp_dir = Unicode(
        "", config=True, help="Root of the cluster session directories ('' = nbcluster's)."
    )
    max_clusters = Integer(8, config=True, help="Clusters the panel may run at once.")
    max_nodes = Integer(16, config=True, help="Most node managers per cluster.")
    max_cpus = Integer(256, config=True, help="Most CPUs per node.")

    scan_interval = Float(
        2.0, config=True, help="Seconds between rescans of the clusters on this host."
    )

    manager: ClusterManager
    watcher: ClusterWatcher

    def initialize_settings(self) -> None:
        """Create the manager (config is read here, not at import)."""
        from nbcluster.config import Config

        self.manager = ClusterManager(
            self.temp_dir or Config.from_env().temp_dir,
            limits=Limits(max_cpus=self.max_cpus, max_nodes=self.max_nodes),
            max_clusters=self.max_clusters,
        )
        self.settings["nbcluster_manager"] = self.manager
        self.watcher = ClusterWatcher(
            self.manager, self._kernel_pids, scan_interval=self.scan_interval
        )
        self.settings["nbcluster_watcher"] = self.watcher

    def _kernel_pids(self) -> dict[int, str]:
        """PID -> kernel id of this server's kernels (read by the watcher's thread)."""
        km = getattr(self.serverapp, "kernel_manager", None)
        out: dict[int, str] = {}
        if km is None:
            return out
        for kid in list(km.list_kernel_ids()):
            try:
                pid = getattr(getattr(km.get_kernel(kid), "provisioner", None), "pid", None)
            except KeyError:
                continue
            if isinstance(pid, int):
                out[pid] = kid
        return out

    def initialize_handlers(self) -> None:
        """Add the REST routes (the base URL is prepended by ``ExtensionApp``)."""
        self.handlers.extend(all_routes())

    async def stop_extension(self) -> None:
        """Stop the clusters started from the panel (the server is stopping)."""
        watcher = getattr(self, "watcher", None)
        if watcher is not None:
            await asyncio.get_running_loop().run_in_executor(None, watcher.close)
        manager = getattr(self, "manager", None)
        if manager is not None:
            await asyncio.get_running_loop().run_in_executor(None, manager.shutdown)
