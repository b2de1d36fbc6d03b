"""``DeploymentHandle`` and ``DeploymentResponse``: calling deployments from Python.

``handle.remote(...)`` calls ``__call__``; ``handle.method.remote(...)`` calls a method;
both return a :class:`DeploymentResponse` at once. Get its value with
``response.result(timeout_s=...)`` (sync code) or ``await response`` (async code), or pass
the response itself to another handle call: the second call starts once the first has
finished, with its value, and the caller never waits. Handles can be passed to
deployments' constructors (composition) and pickled; each process routes through its own
:class:`~nbcluster.serve._router.Router` per deployment.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from typing import Any

import nbcluster
from nbcluster.exceptions import ActorError, GetTimeoutError
from nbcluster.serve._client import controller_handle, session_key
from nbcluster.serve._context import current_replica
from nbcluster.serve._replica import Rejected
from nbcluster.serve._router import Request, Router

__all__ = ["DeploymentHandle", "DeploymentResponse", "get_router", "reset_routers"]

_routers: dict[tuple[str, str, str], Router] = {}
_routers_lock = threading.Lock()


def get_router(app: str, deployment: str) -> Router:
    """This process's router for a deployment (created on first use)."""
    key = (session_key(), app, deployment)
    router = _routers.get(key)
    if router is None:
        with _routers_lock:
            router = _routers.get(key)
            if router is None:
                router = _routers[key] = Router(app, deployment, controller_handle())
    return router


def reset_routers() -> None:
    """Forget every router (after ``serve.shutdown()`` or a new cluster)."""
    with _routers_lock:
        routers = list(_routers.values())
        _routers.clear()
    for r in routers:
        r.close()


class DeploymentResponse:
    """The future answer of one handle call (Ray's ``DeploymentResponse``)."""

    _is_deployment_response = True
    __slots__ = ("_request", "_router")

    def __init__(self, request: Request, router: Router) -> None:
        self._request = request
        self._router = router

    @property
    def request_id(self) -> str:
        """The request's id."""
        return self._request.request_id

    def result(self, *, timeout_s: float | None = None, _skip_asyncio_check: bool = False) -> Any:
        """Wait for the value (raises the deployment's exception, ``TimeoutError`` on timeout).

        Not from a replica's event loop (an ``async def`` method): use ``await response``
        there. (A notebook cell runs inside the kernel's event loop; there it is fine, since
        answers are delivered by another thread.)
        """
        if not _skip_asyncio_check and current_replica() is not None and _in_event_loop():
            raise RuntimeError(
                "Sync methods should not be called from within an `asyncio` event loop. "
                "Use `await response` instead."
            )
        req = self._request
        sent = req.sent
        if sent is not None and not req.result.done() and current_replica() is None:
            # Wait on the ref itself (the core wakes us the moment it is answered) rather than
            # for the watcher thread to notice; the watcher still does the router's accounting.
            try:
                value = nbcluster.get(sent, timeout=timeout_s)
            except GetTimeoutError:
                raise TimeoutError(
                    f"Timed out waiting for the result of request {self.request_id} after {timeout_s}s"
                ) from None
            except ActorError:
                pass  # the router decides (the replica died): wait for its verdict below
            else:
                if type(value) is not Rejected:
                    return value
        try:
            return req.result.result(timeout=timeout_s)
        except concurrent.futures.TimeoutError:
            raise TimeoutError(
                f"Timed out waiting for the result of request {self.request_id} after {timeout_s}s"
            ) from None

    def __await__(self) -> Any:
        return asyncio.wrap_future(self._request.result).__await__()

    def cancel(self) -> None:
        """Cancel the request if it has not reached a replica yet (then it raises
        ``RequestCancelledError``); a request already running finishes."""
        self._router.cancel(self._request)

    def done(self) -> bool:
        """True once the value (or an error) is there."""
        return self._request.result.done()

    def _to_object_ref_sync(self, timeout_s: float | None = None) -> Any:
        """The ``ObjectRef`` of the answer (waits for it)."""
        self.result(timeout_s=timeout_s, _skip_asyncio_check=True)
        return self._request.ref

    async def _to_object_ref(self) -> Any:
        """The ``ObjectRef`` of the answer (awaits it)."""
        await self
        return self._request.ref

    def __reduce__(self) -> Any:
        raise TypeError(
            "A DeploymentResponse cannot be pickled; pass it directly as an argument of "
            "another handle call, or pass its value (response.result() / await response)"
        )

    def __repr__(self) -> str:
        state = "done" if self.done() else "pending"
        return f"DeploymentResponse({self._router.app}#{self._router.deployment}, {state})"


def _in_event_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


class DeploymentHandle:
    """Calls one deployment: ``handle.remote(...)``, ``handle.method.remote(...)``."""

    __slots__ = ("deployment_name", "app_name", "_method", "_model_id", "_stream", "_router")

    def __init__(
        self,
        deployment_name: str,
        app_name: str,
        *,
        method_name: str = "__call__",
        multiplexed_model_id: str = "",
        stream: bool = False,
    ) -> None:
        self.deployment_name = deployment_name
        self.app_name = app_name
        self._method = method_name
        self._model_id = multiplexed_model_id
        self._stream = stream
        self._router: Router | None = None

    def options(
        self,
        *,
        method_name: str | None = None,
        multiplexed_model_id: str | None = None,
        stream: bool | None = None,
        use_new_handle_api: bool | None = None,
    ) -> DeploymentHandle:
        """A copy of this handle with some options changed."""
        if stream:
            raise NotImplementedError(
                "stream=True (streaming responses through handles) is not supported yet; "
                "return the whole value, or stream over HTTP with a StreamingResponse"
            )
        handle = DeploymentHandle(
            self.deployment_name,
            self.app_name,
            method_name=self._method if method_name is None else method_name,
            multiplexed_model_id=self._model_id
            if multiplexed_model_id is None
            else multiplexed_model_id,
        )
        handle._router = self._router
        return handle

    def __getattr__(self, name: str) -> DeploymentHandle:
        if name.startswith("_"):
            raise AttributeError(name)
        return self.options(method_name=name)

    def remote(self, *args: Any, **kwargs: Any) -> DeploymentResponse:
        """Call the deployment; returns a :class:`DeploymentResponse` at once."""
        router = self._router
        if router is None:
            router = self._router = get_router(self.app_name, self.deployment_name)
        req = Request("call", self._method, args, kwargs, self._model_id)
        router.submit(req)
        return DeploymentResponse(req, router)

    def __reduce__(self) -> Any:
        return (_rebuild, (self.deployment_name, self.app_name, self._method, self._model_id))

    def __repr__(self) -> str:
        method = "" if self._method == "__call__" else f", method={self._method!r}"
        return (
            f"DeploymentHandle(deployment={self.deployment_name!r}, app={self.app_name!r}{method})"
        )


def _rebuild(deployment: str, app: str, method: str, model_id: str) -> DeploymentHandle:
    return DeploymentHandle(deployment, app, method_name=method, multiplexed_model_id=model_id)
