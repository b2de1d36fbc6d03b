"""Serve applications through the Jupyter server: ``/nbcluster/api/clusters/<id>/serve/...``.

Where a notebook reaches only the Jupyter server (Binder, JupyterHub), the HTTP proxy of
a cluster's Serve (on 127.0.0.1 of the same host) is not reachable from the browser.
This route forwards requests to it behind the server's own authentication: the token or
login cookie, XSRF for state-changing verbs, Origin and Host checks (inherited from
:class:`~nbcluster.jupyter.server.handlers.NbclusterHandler`).

``/nbcluster/api/clusters/<id>/serve/<path>`` becomes ``http://127.0.0.1:<port>/<path>``
on the cluster's Serve proxy, whose address the Serve controller writes to
``<session dir>/serve/proxies.json``. The server never forwards to another host: the
address comes from that file, not from the request, and must be a loopback address.
The Jupyter credentials (``Authorization``, ``Cookie``, the XSRF header) are not passed
on to the application.
"""

from __future__ import annotations

import json
from pathlib import Path
from urllib.parse import urlsplit

from jupyter_server.auth.decorator import authorized
from tornado import httpclient, web

from nbcluster.jupyter.server.handlers import API_PREFIX, NbclusterHandler

__all__ = ["ServeProxyHandler", "serve_routes"]

_LOOPBACK = {"127.0.0.1", "::1", "localhost", "0.0.0.0", "::"}
_DROP_REQUEST = {
    "authorization",
    "cookie",
    "host",
    "x-xsrftoken",
    "x-csrftoken",
    "connection",
    "keep-alive",
    "transfer-encoding",
    "te",
    "upgrade",
    "proxy-authorization",
    "content-length",
}
_DROP_RESPONSE = {
    "connection",
    "keep-alive",
    "transfer-encoding",
    "content-length",
    "server",
    "date",
    "set-cookie",
}
_TIMEOUT_S = 300.0


def proxy_base(session_dir: str) -> str | None:
    """``http://127.0.0.1:<port>`` of the cluster's Serve proxy, or None (Serve not running)."""
    try:
        entries = json.loads((Path(session_dir) / "serve" / "proxies.json").read_text())
    except (OSError, ValueError):
        return None
    for entry in entries if isinstance(entries, list) else []:
        url = entry.get("url", "") if isinstance(entry, dict) else ""
        parts = urlsplit(url)
        if parts.scheme != "http" or parts.hostname not in _LOOPBACK or not parts.port:
            continue
        host = "[::1]" if parts.hostname in ("::1", "::") else "127.0.0.1"
        return f"http://{host}:{parts.port}"
    return None


class ServeProxyHandler(NbclusterHandler):
    """Forward a request to the cluster's Serve proxy (see the module docstring)."""

    async def _forward(self, cluster_id: str, path: str | None) -> None:
        cid = self.cluster_id(cluster_id)
        model = await self.call(self.manager.get, cid, self.kernel_pids())
        session_dir = model.get("session_dir")
        base = proxy_base(session_dir) if session_dir else None
        if base is None:
            raise web.HTTPError(
                404, "Serve is not running on this cluster: deploy an app with serve.run() first"
            )
        target = base + "/" + (path or "").lstrip("/")
        if self.request.query:
            target += "?" + self.request.query
        headers = {
            k: v for k, v in self.request.headers.get_all() if k.lower() not in _DROP_REQUEST
        }
        method = self.request.method or "GET"
        body = self.request.body if method not in ("GET", "HEAD", "DELETE") else None
        request = httpclient.HTTPRequest(
            target,
            method=method,
            headers=headers,
            body=body,
            allow_nonstandard_methods=True,
            follow_redirects=False,
            request_timeout=_TIMEOUT_S,
            decompress_response=False,
        )
        try:
            response = await httpclient.AsyncHTTPClient().fetch(request, raise_error=False)
        except OSError:
            raise web.HTTPError(
                502, "the cluster's Serve proxy did not answer; check serve.status()"
            ) from None
        if response.code == 599:  # tornado: no HTTP answer at all
            raise web.HTTPError(
                502, "the cluster's Serve proxy did not answer; check serve.status()"
            )
        self.set_status(response.code, response.reason)
        self.clear_header("Content-Type")
        for k, v in response.headers.get_all():
            if k.lower() not in _DROP_RESPONSE:
                self.add_header(k, v)
        self.finish(response.body or b"")

    @web.authenticated
    @authorized
    async def get(self, cluster_id: str, path: str | None = None) -> None:
        """Forward a GET."""
        await self._forward(cluster_id, path)

    @web.authenticated
    @authorized
    async def post(self, cluster_id: str, path: str | None = None) -> None:
        """Forward a POST (XSRF-checked for cookie logins)."""
        await self._forward(cluster_id, path)

    @web.authenticated
    @authorized
    async def put(self, cluster_id: str, path: str | None = None) -> None:
        """Forward a PUT."""
        await self._forward(cluster_id, path)

    @web.authenticated
    @authorized
    async def patch(self, cluster_id: str, path: str | None = None) -> None:
        """Forward a PATCH."""
        await self._forward(cluster_id, path)

    @web.authenticated
    @authorized
    async def delete(self, cluster_id: str, path: str | None = None) -> None:
        """Forward a DELETE."""
        await self._forward(cluster_id, path)


def serve_routes() -> list[tuple[str, type[NbclusterHandler]]]:
    """The URL patterns of the Serve forwarding route."""
    cluster = rf"{API_PREFIX}/clusters/([^/]+)"
    return [
        (rf"{cluster}/serve", ServeProxyHandler),
        (rf"{cluster}/serve/(.*)", ServeProxyHandler),
    ]
