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
``clusters/<id>/jobs``                     GET     ``JobListModel`` (issue 17, see
``clusters/<id>/jobs``                     POST    ``SubmitJobRequest`` → ``JobModel``
``clusters/<id>/jobs/<sid>``               GET     ``JobModel``     :mod:`.job_handlers`)
``clusters/<id>/jobs/<sid>``               DELETE  204 (forget a finished job)
``clusters/<id>/jobs/<sid>/stop``          POST    ``JobModel``
``clusters/<id>/jobs/<sid>/logs``          GET     ``JobLogsModel`` (``?offset=N``)
``updates?after=N&timeout=S``              GET     ``UpdatesModel`` (long poll)
=========================================  ======  ================================

``updates`` is what the lab extension listens to: it answers as soon as the list of
clusters or a load changed after version ``N`` (the heads push their changes to the
server, :mod:`.watch`), or after ``S`` seconds (default 25, at most 60) unchanged.
"""

from __future__ import annotations

from jupyter_server.auth.decorator import authorized
from tornado import web

from nbcluster.jupyter.server.base import API_PREFIX, NbclusterHandler
from nbcluster.jupyter.server.job_handlers import job_routes
from nbcluster.jupyter.server.models import (
    BadRequest,
    ClusterListModel,
    parse_address_request,
    parse_scale_request,
    parse_start_request,
    parse_updates_query,
)

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
        *job_routes(),  # the Jobs section (issue 17)
    ]
