"""The base of every route handler of the server extension: auth, JSON bodies, errors.

(Split from :mod:`.handlers` so that the job routes in :mod:`.job_handlers` share it
without an import cycle.)
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any, TypeVar

from jupyter_server.base.handlers import APIHandler
from tornado import web

from nbcluster.jupyter.server.manager import (
    ClusterManager,
    ClusterManagerError,
    ClusterNotFound,
    LimitReached,
    NotOwned,
    OperationFailed,
)
from nbcluster.jupyter.server.models import BadRequest, valid_cluster_id
from nbcluster.jupyter.server.watch import ClusterWatcher

__all__ = ["API_PREFIX", "NbclusterHandler"]

#: Every route lives under this path (after the server's base URL).
API_PREFIX = "/nbcluster/api"
_MAX_BODY = 4096
_STATUS: dict[type[ClusterManagerError], int] = {
    ClusterNotFound: 404,
    NotOwned: 409,
    LimitReached: 409,
    OperationFailed: 503,
}
T = TypeVar("T")


class NbclusterHandler(APIHandler):
    """Base of the nbcluster handlers: the manager, strict JSON bodies, error mapping."""

    auth_resource = "nbcluster"

    @property
    def manager(self) -> ClusterManager:
        """The server's :class:`ClusterManager` (set up by the extension app)."""
        return self.settings["nbcluster_manager"]

    @property
    def watcher(self) -> ClusterWatcher | None:
        """The server's :class:`ClusterWatcher` (None when the app made none)."""
        return self.settings.get("nbcluster_watcher")

    def changed(self) -> None:
        """The panel changed a cluster: the watcher rescans at once."""
        if self.watcher is not None:
            self.watcher.poke()

    def kernel_pids(self) -> dict[int, str]:
        """PID → kernel id of this server's kernels (read on the event loop thread)."""
        km = self.settings.get("kernel_manager")
        if km is None:
            return {}
        out: dict[int, str] = {}
        for kid in list(km.list_kernel_ids()):
            try:
                kernel = km.get_kernel(kid)
            except KeyError:
                continue
            pid = getattr(getattr(kernel, "provisioner", None), "pid", None)
            if isinstance(pid, int):
                out[pid] = kid
        return out

    def cluster_id(self, cluster_id: str) -> str:
        """``cluster_id`` if it has the shape of an id (fullmatch), else 404."""
        if not valid_cluster_id(cluster_id):
            raise web.HTTPError(
                404, "no cluster with this id; GET /nbcluster/api/clusters lists them"
            )
        return cluster_id

    def json_body(self) -> Any:
        """The request body parsed as JSON (400 when it is not JSON or too large)."""
        body = self.request.body
        if len(body) > _MAX_BODY:
            raise web.HTTPError(400, f"the request body is larger than {_MAX_BODY} bytes")
        try:
            return json.loads(body.decode("utf-8"))
        except (UnicodeDecodeError, ValueError):
            raise web.HTTPError(400, "the request body must be JSON") from None

    def parse(self, parser: Callable[..., T], *args: Any) -> T:
        """Run a ``models.parse_*`` function on the body; its message becomes the 400's."""
        try:
            return parser(self.json_body(), *args)
        except BadRequest as err:
            raise web.HTTPError(400, str(err)) from None

    async def call(self, fn: Callable[..., T], *args: Any) -> T:
        """Run a blocking manager method on its executor; map its errors to HTTP statuses."""
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self.manager.executor, fn, *args)
        except ClusterManagerError as err:
            raise web.HTTPError(_STATUS.get(type(err), 500), str(err)) from None

    def reply(self, model: Any, status: int = 200) -> None:
        """Finish with ``model`` as JSON."""
        self.set_status(status)
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps(model))
