"""The HTTP proxy: a uvicorn server in an actor, one per node, routing requests to replicas.

It listens on ``http_options.host`` (127.0.0.1 unless told otherwise) with HTTP/1.1
keep-alive, matches each request's path to an application by longest route prefix, and
sends it through the same :class:`~nbcluster.serve._router.Router` that handles use. The
route table comes from the controller by long polling. Besides the applications it
answers ``/-/routes`` (the route table as JSON) and ``/-/healthz``.

Errors never carry a traceback: 404 for an unknown route, 413 for a body over
``max_request_body_bytes``, 408 after ``request_timeout_s``, 503 when the deployment is
unavailable or its queue is full, 500 when the handler raised (the traceback is in the
replica's log) or the replica died while handling the request.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import traceback
from typing import Any

from nbcluster.exceptions import ActorError
from nbcluster.serve import _http
from nbcluster.serve._client import controller_handle
from nbcluster.serve._handle import get_router
from nbcluster.serve._router import Request, Router
from nbcluster.serve._routing import match_route
from nbcluster.serve.config import HTTPOptions
from nbcluster.serve.exceptions import BackPressureError, DeploymentUnavailableError

__all__ = ["ProxyActor", "bind_socket"]


def bind_socket(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host:port``, or on a free port when ``port`` is taken."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP explicitly: asyncio sets TCP_NODELAY on accepted sockets only when the
    # listening socket says so (proto 0 leaves Nagle on: 40 ms stalls with delayed ACKs).
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError:
        if port == 0:
            sock.close()
            raise
        sock.bind((host, 0))
    sock.listen(2048)
    sock.setblocking(False)
    return sock


class ProxyActor:
    """One node's HTTP proxy (see the module docstring)."""

    def __init__(self, http_options: HTTPOptions) -> None:
        self._options = http_options
        self._routes: dict[str, str] = {}
        self._ingress: dict[str, str] = {}
        self._server: Any = None
        self._url = ""
        self._known: Any = None
        self._stopped: asyncio.Event | None = None
        self._tasks: list[asyncio.Task[Any]] = []
        self._routers: dict[tuple[str, str], Router] = {}

    async def ready(self) -> dict[str, Any]:
        """Start serving (once); the URL this proxy answers on, and its process id."""
        if self._server is not None:
            return {"url": self._url, "pid": os.getpid()}
        import uvicorn

        host = self._options.host or "127.0.0.1"
        sock = bind_socket(host, self._options.port)
        port = sock.getsockname()[1]
        try:
            import httptools  # noqa: F401 - the fast parser, when installed

            http = "httptools"
        except ImportError:
            http = "h11"
        config = uvicorn.Config(
            self._asgi,
            host=host,
            port=port,
            http=http,
            interface="asgi3",
            proxy_headers=False,
            server_header=False,
            lifespan="off",
            access_log=False,
            log_level="warning",
            timeout_keep_alive=self._options.keep_alive_timeout_s,
            backlog=2048,
        )
        self._server = uvicorn.Server(config)
        loop = asyncio.get_running_loop()
        self._tasks.append(loop.create_task(self._server.serve(sockets=[sock])))
        self._tasks.append(loop.create_task(self._listen_routes()))
        for _ in range(500):
            if self._server.started:
                break
            await asyncio.sleep(0.005)
        shown = f"[{host}]" if ":" in host else host
        self._url = f"http://{shown}:{port}{self._options.root_path}"
        return {"url": self._url, "pid": os.getpid()}

    async def wait_until_stopped(self) -> None:
        """Returns only when the proxy stops (the controller's death watch)."""
        if self._stopped is None:
            self._stopped = asyncio.Event()
        await self._stopped.wait()

    async def prepare_for_shutdown(self) -> None:
        """Stop accepting connections and finish the requests in flight."""
        if self._server is not None:
            self._server.should_exit = True
            with contextlib.suppress(Exception):
                await asyncio.wait_for(asyncio.shield(self._tasks[0]), 5)

    async def _listen_routes(self) -> None:
        failures = 0
        while True:
            try:
                controller = controller_handle()
                ref = controller.listen_for_change.remote({"routes": self._known})
                updates = await ref
            except Exception:  # noqa: BLE001 - the controller is restarting
                failures += 1
                await asyncio.sleep(min(0.05 * failures, 1.0))
                continue
            failures = 0
            if "routes" in updates:
                self._known, snapshot = updates["routes"]
                if snapshot is not None:
                    self._routes = dict(snapshot["routes"])
                    self._ingress = dict(snapshot["ingress"])
                    for app, deployment in self._ingress.items():
                        self._router(app, deployment)  # ready before the first request

    def _router(self, app: str, deployment: str) -> Router:
        router = self._routers.get((app, deployment))
        if router is None:
            router = self._routers[(app, deployment)] = get_router(app, deployment)
        return router

    # -- ASGI ------------------------------------------------------------------------------------
    async def _asgi(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            if scope["type"] == "websocket":
                await send({"type": "websocket.close", "code": 1003})
            return
        try:
            answer = await self._handle(scope, receive)
        except Exception:  # noqa: BLE001 - a proxy bug: 500, and a trace in the proxy's log
            traceback.print_exc()
            answer = _http.error_answer(500)
        status, headers, body = answer
        if not any(k.lower() in (b"content-length", b"transfer-encoding") for k, _ in headers):
            headers = [*headers, (b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    async def _handle(self, scope: dict[str, Any], receive: Any) -> _http.HTTPAnswer:
        path = scope["path"]
        root = self._options.root_path
        if root and path.startswith(root):
            path = path[len(root) :] or "/"
        if path.startswith("/-/"):
            if path == "/-/routes":
                return _http.json_answer(200, self._routes)
            if path == "/-/healthz":
                return _http.text_answer(200, "success")
        match = match_route(path, self._routes)
        if match is None:
            return _http.text_answer(
                404,
                f"Path '{path}' not found. Ping http://.../-/routes for available routes.",
            )
        prefix, app = match
        limit = self._options.max_request_body_bytes
        model_id = ""
        for name, value in scope["headers"]:
            if name == b"content-length":
                try:
                    if int(value) > limit:
                        return _http.error_answer(413)
                except ValueError:
                    return _http.text_answer(400, "Bad Request: invalid Content-Length")
            elif name == _http.MODEL_ID_HEADER:
                model_id = value.decode("latin-1")
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return _http.error_answer(400)
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                return _http.error_answer(413)
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        ingress = self._ingress.get(app)
        if ingress is None:
            return _http.error_answer(404)
        root_path = root + (prefix if prefix != "/" else "")
        client = scope.get("client")
        req: _http.HTTPRequest = (
            scope["method"],
            scope.get("scheme", "http"),
            root + path,
            scope.get("query_string", b""),
            list(scope["headers"]),
            b"".join(chunks),
            tuple(client) if client else None,
            root_path,
            scope.get("http_version", "1.1"),
        )
        request = Request("http", prefix, (req,), {}, model_id)
        self._router(app, ingress).submit(request)
        try:
            fut = asyncio.wrap_future(request.result)
            timeout = self._options.request_timeout_s
            return await (asyncio.wait_for(fut, timeout) if timeout else fut)  # type: ignore[no-any-return]
        except TimeoutError:
            return _http.error_answer(408)
        except BackPressureError as e:
            return _http.text_answer(503, e.message)
        except DeploymentUnavailableError as e:
            return _http.text_answer(503, e.message)
        except ActorError:
            return _http.text_answer(
                500,
                "Internal Server Error: the replica handling this request died; it is being "
                "replaced. Retry the request.",
            )
        except Exception:  # noqa: BLE001 - no traceback for the client
            return _http.error_answer(500)
