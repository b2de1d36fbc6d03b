"""The REST routes under ``/nbcluster/api/``.

Every verb of every handler is decorated with ``@web.authenticated`` and ``@authorized``,
so it inherits jupyter_server's checks: the token or login cookie, XSRF for every
state-changing verb, ``Origin`` and ``Host`` (DNS rebinding). GETs have no side effects.
Errors are JSON ``{"message": ...}`` (``APIHandler.write_error``), never a traceback;
``HTTPError`` passes through untouched and only the manager's own errors are mapped.

=========================================  ======  ================================
route                                      verb    body / answer
=========================================  ======  ================================
``clusters``                               GET     ``ClusterListModel``
``clusters``                               POST    ``StartRequest`` → ``ClusterModel``
``clusters/<id>``                          GET     ``ClusterModel``
``clusters/<id>``                          PATCH   ``ScaleRequest`` → ``ClusterModel``
``clusters/<id>``                          DELETE  204 (stop, or forget an address)
``clusters/<id>/connect-code``             POST    ``ConnectCodeModel``
``clusters/<id>/load``                     GET     ``LoadModel``
``addresses``                              POST    ``AddressRequest`` → ``ClusterModel``
``updates?after=N&timeout=S``              GET     ``UpdatesModel`` (long poll)
=========================================  ======  ================================

``updates`` is what the lab extension listens to: it answers as soon as the list of
clusters or a load changed after version ``N`` (the heads push their changes to the
server, :mod:`.watch`), or after ``S`` seconds (default 25, at most 60) unchanged.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any, TypeVar

from jupyter_server.auth.decorator import authorized
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
from nbcluster.jupyter.server.models import (
    BadRequest,
    ClusterListModel,
    parse_address_request,
    parse_scale_request,
    parse_start_request,
    parse_updates_query,
    valid_cluster_id,
)
from nbcluster.jupyter.server.watch import ClusterWatcher

__all__ = [
    "API_PREFIX",
    "AddressesHandler",
    "ClusterHandler",
    "ClustersHandler",
    "ConnectCodeHandler",
    "LoadHandler",
    "NbclusterHandler",
    "UpdatesHandler",
    "routes",
]

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


class ClustersHandler(NbclusterHandler):
    """``/nbcluster/api/clusters``: list (GET) and start (POST)."""

    @web.authenticated
    @authorized
    async def get(self) -> None:
        """Every cluster this server knows."""
        clusters = await self.call(self.manager.list, self.kernel_pids())
        self.reply(ClusterListModel(clusters=clusters))

    @web.authenticated
    @authorized
    async def post(self) -> None:
        """Start a cluster: ``{"num_cpus": int, "nodes": int}``."""
        req = self.parse(parse_start_request, self.manager.limits)
        model = await self.call(self.manager.start, req["num_cpus"], req["nodes"])
        self.changed()
        self.reply(model, 201)


class ClusterHandler(NbclusterHandler):
    """``/nbcluster/api/clusters/<id>``: read (GET), scale (PATCH), stop (DELETE)."""

    @web.authenticated
    @authorized
    async def get(self, cluster_id: str) -> None:
        """One cluster."""
        cid = self.cluster_id(cluster_id)
        self.reply(await self.call(self.manager.get, cid, self.kernel_pids()))

    @web.authenticated
    @authorized
    async def patch(self, cluster_id: str) -> None:
        """Scale a cluster started from the panel: ``{"nodes": int}``."""
        cid = self.cluster_id(cluster_id)
        req = self.parse(parse_scale_request, self.manager.limits)
        model = await self.call(self.manager.scale, cid, req["nodes"])
        self.changed()
        self.reply(model)

    @web.authenticated
    @authorized
    async def delete(self, cluster_id: str) -> None:
        """Stop a cluster started from the panel, or forget an added address."""
        cid = self.cluster_id(cluster_id)
        await self.call(self.manager.stop, cid)
        self.changed()
        self.set_status(204)
        self.finish()


class ConnectCodeHandler(NbclusterHandler):
    """``/nbcluster/api/clusters/<id>/connect-code``: the cell that attaches a kernel."""

    @web.authenticated
    @authorized
    async def post(self, cluster_id: str) -> None:
        """``{"cluster_id", "address", "code"}``."""
        cid = self.cluster_id(cluster_id)
        self.reply(await self.call(self.manager.connect_code, cid))


class LoadHandler(NbclusterHandler):
    """``/nbcluster/api/clusters/<id>/load``: CPU, GPU, object store, tasks, nodes."""

    @web.authenticated
    @authorized
    async def get(self, cluster_id: str) -> None:
        """The load as of now (the lab extension polls this)."""
        cid = self.cluster_id(cluster_id)
        self.reply(await self.call(self.manager.load, cid))


class AddressesHandler(NbclusterHandler):
    """``/nbcluster/api/addresses``: add a cluster by its head's address (POST)."""

    @web.authenticated
    @authorized
    async def post(self) -> None:
        """``{"address": "host:port"}`` → the new list entry."""
        req = self.parse(parse_address_request)
        model = await self.call(self.manager.add_address, req["address"], self.kernel_pids())
        self.changed()
        self.reply(model, 201)


class UpdatesHandler(NbclusterHandler):
    """``/nbcluster/api/updates``: the list and the loads, when they change (long poll)."""

    @web.authenticated
    @authorized
    async def get(self) -> None:
        """``UpdatesModel`` once its version passes ``after`` (or at ``timeout``)."""
        try:
            after, timeout = parse_updates_query(
                self.get_query_argument("after", None), self.get_query_argument("timeout", None)
            )
        except BadRequest as err:
            raise web.HTTPError(400, str(err)) from None
        watcher = self.watcher
        if watcher is None:
            raise web.HTTPError(503, "updates are not available: the cluster watcher is off")
        self.reply(await watcher.wait(after, timeout))


def routes() -> list[tuple[str, type[NbclusterHandler]]]:
    """The URL patterns (relative to the base URL) and their handlers."""
    cluster = rf"{API_PREFIX}/clusters/([^/]+)"
    return [
        (rf"{API_PREFIX}/clusters", ClustersHandler),
        (cluster, ClusterHandler),
        (rf"{cluster}/connect-code", ConnectCodeHandler),
        (rf"{cluster}/load", LoadHandler),
        (rf"{API_PREFIX}/addresses", AddressesHandler),
        (rf"{API_PREFIX}/updates", UpdatesHandler),
    ]
