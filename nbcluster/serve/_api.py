"""``serve.run``, ``serve.start``, ``serve.delete``, ``serve.status``, ``serve.shutdown``, handles.

These run in the driver (or any process connected to the cluster) and talk to the
controller actor; none of them is on a request's path.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import sys
import threading
import time
import urllib.request
from typing import Any

import nbcluster
from nbcluster.exceptions import TaskError
from nbcluster.serve import _client
from nbcluster.serve._context import current_replica
from nbcluster.serve._controller import ServeController
from nbcluster.serve._deployment import Application, build_app
from nbcluster.serve._handle import DeploymentHandle, reset_routers
from nbcluster.serve._routing import normalize_route_prefix
from nbcluster.serve._widget import show, summary_text
from nbcluster.serve.config import HTTPOptions, ProxyLocation
from nbcluster.serve.exceptions import ServeException
from nbcluster.serve.schema import ServeStatus

__all__ = [
    "delete",
    "get_app_handle",
    "get_deployment_handle",
    "run",
    "shutdown",
    "start",
    "status",
]

DEFAULT_APP_NAME = "default"
_controller_class: Any = None
_lock = threading.Lock()


def _unwrap(err: BaseException) -> BaseException:
    """The user-facing error inside a controller call's ``TaskError``."""
    cause = getattr(err, "cause", None)
    if isinstance(err, TaskError) and isinstance(cause, (ValueError, TypeError, ServeException)):
        return cause
    return err


def _call(ref: Any, timeout: float | None = None) -> Any:
    try:
        return nbcluster.get(ref, timeout=timeout)
    except TaskError as e:
        raise _unwrap(e) from None


def start(
    http_options: HTTPOptions | dict[str, Any] | None = None,
    proxy_location: ProxyLocation | str | None = None,
    **_ignored: Any,
) -> None:
    """Start Serve on the cluster (``serve.run`` does this for you).

    ``http_options``: where proxies listen (default ``127.0.0.1:8000``; ``port=0`` picks a
    free port). ``proxy_location``: ``"EveryNode"`` (default), ``"HeadOnly"`` or
    ``"Disabled"``. If Serve is already running, its options stay as they are. Returns
    once the controller runs; the proxies start in the background (``serve.run`` waits
    for them before it prints the URL).
    """
    _start(http_options, proxy_location)


def _start(http_options: Any = None, proxy_location: Any = None) -> Any:
    global _controller_class
    opts = HTTPOptions.from_any(http_options)
    if proxy_location is not None:
        opts = dataclasses.replace(opts, location=ProxyLocation(proxy_location))
    if not nbcluster.is_initialized():
        nbcluster.init()
    handle = _client.controller_handle(required=False)
    if handle is None:
        with _lock:
            if _controller_class is None:
                _controller_class = nbcluster.remote(ServeController)
        handle = _controller_class.options(
            name=_client.CONTROLLER_NAME,
            namespace=_client.SERVE_NAMESPACE,
            lifetime="detached",
            max_restarts=-1,
            num_cpus=0,
            get_if_exists=True,
        ).remote(opts)
        _client.remember(handle)
    _call(handle.ready.remote())
    return handle


def run(
    target: Application,
    blocking: bool = False,
    name: str = DEFAULT_APP_NAME,
    route_prefix: str | None = "/",
    logging_config: Any = None,
    _local_testing_mode: bool = False,
    _display: bool | None = None,
) -> DeploymentHandle:
    """Deploy an application and return a handle to its ingress deployment.

    Returns once every deployment runs (or raises ``RuntimeError`` with the traceback of
    a constructor that failed; nothing of the failed version is left running). Running it
    again with changed code rolls the replicas over without failing a request. The app
    answers HTTP under ``route_prefix`` (``None``: handles only); the URL is printed. In a
    notebook a live widget shows the application (``_display=False`` to skip it).
    ``blocking=True`` then waits until Ctrl-C.
    """
    if not isinstance(name, str) or not name or "#" in name:
        raise ValueError(f"application name must be a non-empty string without '#', got {name!r}")
    prefix = normalize_route_prefix(route_prefix)
    spec = build_app(target, name, prefix)
    controller = _start()
    _call(controller.deploy_application.remote(spec))
    while True:  # in slices, so Ctrl-C interrupts the wait
        status, message = _call(controller.wait_for_application.remote(name, 2.0))
        if status == "RUNNING":
            break
        if status == "DEPLOY_FAILED":
            raise RuntimeError(f"Deploying application {name} failed: {message}")
        if status == "NOT_STARTED":
            raise RuntimeError(f"Deploying application {name} failed: {message}")
    handle = DeploymentHandle(spec.ingress, name)
    url = _announce(controller, name, prefix)
    if _display is None:
        _display = _in_kernel()
    if _display:
        show(name, url, status)
    if blocking:
        try:
            while True:
                time.sleep(1)
        except KeyboardInterrupt:
            pass
    return handle


def _in_kernel() -> bool:
    shell = sys.modules.get("IPython")
    if shell is None:
        return False
    get = getattr(shell, "get_ipython", None)
    ip = get() if get else None
    return ip is not None and getattr(ip, "kernel", None) is not None


def app_url(name: str, prefix: str | None, st: ServeStatus | None = None) -> str:
    """The URL of an application on this node's proxy ('' without HTTP)."""
    if prefix is None:
        return ""
    if st is None:
        st = status()
    if not st.proxy_urls:
        return ""
    here = nbcluster.get_runtime_context().get_node_id()
    base = st.proxy_urls.get(here) or next(iter(st.proxy_urls.values()))
    return base + (prefix if prefix != "/" else "/")


def jupyter_path(prefix: str | None) -> str:
    """The path of the app behind the Jupyter server's own auth (its server extension)."""
    if prefix is None:
        return ""
    session_dir = str(nbcluster.get_runtime_context().session_dir)
    # The server extension's cluster id (nbcluster.jupyter.server.manager.cluster_id_for).
    cid = hashlib.sha256(f"session:{session_dir}".encode()).hexdigest()[:12]
    base = os.environ.get("JUPYTERHUB_SERVICE_PREFIX", "/")
    return (
        f"{base.rstrip('/')}/nbcluster/api/clusters/{cid}/serve{prefix if prefix != '/' else '/'}"
    )


def _wait_for_route(st: ServeStatus, prefix: str, app: str | None, timeout_s: float = 10.0) -> None:
    """Wait until this node's proxy routes ``prefix`` to ``app`` (None: to nothing).

    Proxies learn the route table by long polling (within about 50 ms); this makes
    ``serve.run`` and ``serve.delete`` return only once a request sent right after them
    sees the change.
    """
    base = app_url("", "/", st)
    if not base:
        return
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(base + "-/routes", timeout=5) as r:
                routes = json.loads(r.read())
        except (OSError, ValueError):
            routes = None
        if routes is not None and routes.get(prefix) == app:
            return
        time.sleep(0.005)


def _announce(controller: Any, name: str, prefix: str | None) -> str:
    if prefix is not None:
        _call(controller.wait_for_proxies.remote(30.0))
    st = _call(controller.get_status.remote())
    if prefix is not None:
        _wait_for_route(st, prefix, name)
    url = app_url(name, prefix, st)
    if url:
        print(f"Application {name!r} is ready at {url}")
        if _in_kernel():
            print(f"  through the Jupyter server: {jupyter_path(prefix)}")
    else:
        print(f"Application {name!r} is ready (no HTTP route; call it with its handle)")
    if not _in_kernel():  # the text form of the notebook's widget
        print("\n".join(summary_text(name, st.applications.get(name)).splitlines()[1:]))
    sys.stdout.flush()
    return url


def delete(name: str, _blocking: bool = True) -> None:
    """Delete an application: its replicas drain and stop (waits unless ``_blocking=False``)."""
    controller = _client.controller_handle(required=False)
    if controller is None:
        return
    st = _call(controller.get_status.remote())
    app = st.applications.get(name)
    if (
        not _call(controller.delete_applications.remote([name], 60.0 if _blocking else 0.0))
        and _blocking
    ):
        raise TimeoutError(f"application {name!r} was not deleted within 60 s")
    if _blocking and app is not None and app.route_prefix is not None:
        _wait_for_route(st, app.route_prefix, None)


def status() -> ServeStatus:
    """Applications, deployments and replicas with their states, and the proxies."""
    controller = _client.controller_handle(required=False)
    if controller is None:
        return ServeStatus()
    return _call(controller.get_status.remote())  # type: ignore[no-any-return]


def shutdown() -> None:
    """Stop Serve: every application, the proxies and the controller (no actor is left)."""
    if not nbcluster.is_initialized():
        return
    controller = _client.controller_handle(required=False)
    reset_routers()
    if controller is None:
        return
    try:
        _call(controller.graceful_shutdown.remote(), timeout=90)
    finally:
        nbcluster.kill(controller)
        _client.forget()


def get_app_handle(name: str) -> DeploymentHandle:
    """A handle to the ingress deployment of application ``name``."""
    info = _call(_client.controller_handle().get_app_info.remote(name))
    if info is None:
        raise ServeException(f"Application '{name}' does not exist.")
    return DeploymentHandle(info["ingress"], name)


def get_deployment_handle(deployment_name: str, app_name: str | None = None) -> DeploymentHandle:
    """A handle to one deployment (``app_name`` defaults to the calling replica's app)."""
    if app_name is None:
        replica = current_replica()
        if replica is None:
            raise ServeException(
                "Please specify an application name when getting a deployment handle "
                "outside of a Serve application."
            )
        app_name = replica.app_name
    info = _call(_client.controller_handle().get_app_info.remote(app_name))
    if info is None:
        raise ServeException(f"Application '{app_name}' does not exist.")
    if deployment_name not in info["deployments"]:
        raise ServeException(
            f"Deployment {deployment_name!r} does not exist in application {app_name!r}; "
            f"its deployments: {', '.join(info['deployments'])}"
        )
    return DeploymentHandle(deployment_name, app_name)
