"""The replica actor: one instance of a deployment's class (or its function), serving requests.

The controller creates each replica as a detached, named async actor and calls
:meth:`Replica.ready` (which applies ``user_config`` through the user's ``reconfigure``).
Routers call :meth:`Replica.handle_request` (handle calls) and :meth:`Replica.handle_http`
(requests from an HTTP proxy). A replica:

- runs at most ``max_ongoing_requests`` requests at once (later ones wait in it);
- counts ongoing requests, completions, errors and latencies, which the controller pulls
  with :meth:`Replica.get_metrics` (autoscaling, the widget);
- answers a request that reaches it after it began to drain with :data:`REJECTED`, which
  tells the router to send it elsewhere, so draining never fails a request;
- answers a handler's exception over HTTP with a bare 500 and writes the traceback to its
  own log (stderr); handle callers get the exception itself (as ``TaskError``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import copyreg
import functools
import inspect
import os
import sys
import time
import traceback
from typing import Any

import cloudpickle

import nbcluster
from nbcluster.serve import _http
from nbcluster.serve._context import (
    DeploymentID,
    ReplicaContext,
    ReplicaID,
    RequestContext,
    current_replica,
    request_context,
    set_replica,
)
from nbcluster.serve._multiplex import loaded_model_ids

__all__ = ["REJECTED", "Rejected", "Replica", "current_instance", "make_spec"]

_MAX_SAMPLES = 4096
_PROPAGATION_S = 0.2


class Rejected:
    """The answer of a draining replica: the router sends the request to another replica."""

    _instance: Rejected | None = None

    def __new__(cls) -> Rejected:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __reduce__(self) -> tuple[Any, ...]:
        return (Rejected, ())

    def __repr__(self) -> str:
        return "REJECTED"


REJECTED = Rejected()


def make_spec(target: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bytes:
    """The bytes a replica is built from: the class or function and its bound arguments."""
    datastructures = sys.modules.get("starlette.datastructures")
    if datastructures is not None:
        # A FastAPI/Starlette app holds a ``State`` whose __getattr__ recurses when pickle
        # rebuilds it without __init__; rebuild it from its dict instead.
        state_cls = datastructures.State
        copyreg.pickle(state_cls, lambda s: (state_cls, (dict(s._state),)))
    return cloudpickle.dumps((target, args, kwargs))


def current_instance() -> Any:
    """The replica's instance of the deployment class (a FastAPI dependency; see ingress)."""
    ctx = current_replica()
    if ctx is None:
        raise RuntimeError("not inside a Serve replica")
    return ctx.servable_object


class Replica:
    """One replica of a deployment (see the module docstring)."""

    def __init__(
        self, app: str, deployment: str, replica_id: str, spec: bytes, light: dict[str, Any]
    ) -> None:
        self._app = app
        self._deployment = deployment
        self._replica_id = replica_id
        target, args, kwargs = cloudpickle.loads(spec)
        context = ReplicaContext(ReplicaID(replica_id, DeploymentID(deployment, app)), None)
        set_replica(context)
        self._is_function = inspect.isfunction(target) or not inspect.isclass(target)
        if self._is_function:
            self._callable: Any = target
            self._instance: Any = None
        else:
            self._instance = target(*args, **kwargs)
            self._callable = self._instance
        context.servable_object = self._callable
        self._asgi: Any = None
        self._asgi = getattr(target, "__serve_asgi_app__", None)
        self._light = dict(light)
        self._limit = asyncio.Semaphore(int(light["max_ongoing_requests"]))
        # Sync methods run in threads, as Ray Serve runs them (RAY_SERVE_RUN_SYNC_IN_THREADPOOL=1).
        self._pool = concurrent.futures.ThreadPoolExecutor(
            int(light["max_ongoing_requests"]), thread_name_prefix="serve-sync"
        )
        self._ongoing = 0
        self._draining = False
        self._requests = 0
        self._errors = 0
        self._latencies: list[float] = []
        self._stopped: asyncio.Event | None = None
        self._methods: dict[str, Any] = {}

    # -- control (called by the controller) --------------------------------------------------
    async def ready(self) -> dict[str, Any]:
        """Apply ``user_config`` (the user's ``reconfigure``) and say where this replica runs."""
        if self._light.get("user_config") is not None:
            await self._call_reconfigure(self._light["user_config"])
        return await self.info()

    async def info(self) -> dict[str, Any]:
        """Where this replica runs: process id and node id."""
        return {"pid": os.getpid(), "node_id": nbcluster.get_runtime_context().get_node_id()}

    async def reconfigure(self, light: dict[str, Any]) -> None:
        """A lightweight update: new ``user_config`` and/or ``max_ongoing_requests``."""
        old = self._light
        self._light = dict(light)
        if light["max_ongoing_requests"] != old.get("max_ongoing_requests"):
            self._limit = asyncio.Semaphore(int(light["max_ongoing_requests"]))
            old_pool, self._pool = (
                self._pool,
                concurrent.futures.ThreadPoolExecutor(
                    int(light["max_ongoing_requests"]), thread_name_prefix="serve-sync"
                ),
            )
            old_pool.shutdown(wait=False)
        if (
            light.get("user_config") != old.get("user_config")
            and light.get("user_config") is not None
        ):
            await self._call_reconfigure(light["user_config"])

    async def _call_reconfigure(self, user_config: Any) -> None:
        fn = getattr(self._instance, "reconfigure", None)
        if fn is None:
            raise ValueError(
                f"user_config was given but deployment {self._deployment!r} has no "
                "reconfigure(self, config) method to receive it"
            )
        result = fn(user_config)
        if inspect.isawaitable(result):
            await result

    async def check_health(self) -> None:
        """The user's ``check_health`` (if any); raising means unhealthy."""
        fn = getattr(self._instance, "check_health", None)
        if fn is not None:
            result = fn()
            if inspect.isawaitable(result):
                await result

    async def get_metrics(self) -> dict[str, Any]:
        """Ongoing requests, totals, and the latencies recorded since the last call."""
        samples, self._latencies = self._latencies, []
        return {
            "ongoing": self._ongoing,
            "requests": self._requests,
            "errors": self._errors,
            "latencies": samples,
            "models": sorted(loaded_model_ids()),
        }

    async def wait_until_stopped(self) -> None:
        """Returns only when the replica is stopped: the controller's death watch."""
        if self._stopped is None:
            self._stopped = asyncio.Event()
        await self._stopped.wait()

    async def prepare_for_shutdown(self) -> None:
        """Drain: refuse new requests (routers re-route them), wait for ongoing ones.

        Waits 0.2 s for requests already on their way (they are sent back to their router),
        then until none is ongoing (checking every 10 ms rather than every
        ``graceful_shutdown_wait_loop_s``), for at most ``graceful_shutdown_timeout_s``;
        then runs the user's ``__del__``.
        """
        self._draining = True
        loop = asyncio.get_running_loop()
        deadline = loop.time() + float(self._light["graceful_shutdown_timeout_s"])
        # Routers learn of the drain within ~50 ms (their long poll); until then a request that
        # still arrives is sent back (REJECTED) and goes elsewhere. Wait that out first.
        await asyncio.sleep(_PROPAGATION_S)
        while self._ongoing > 0 and loop.time() < deadline:
            await asyncio.sleep(0.01)
        delete = getattr(self._instance, "__del__", None)
        if delete is not None:
            try:
                result = delete()
                if inspect.isawaitable(result):
                    await result
            except Exception:  # noqa: BLE001 - shutting down anyway; leave a trace
                traceback.print_exc()

    # -- requests ----------------------------------------------------------------------------
    def _method(self, name: str) -> tuple[Any, bool]:
        entry = self._methods.get(name)
        if entry is None:
            if self._is_function:
                if name != "__call__":
                    raise AttributeError(
                        f"deployment {self._deployment!r} is a function; call the handle "
                        f"itself (handle.remote()), not handle.{name}"
                    )
                fn = self._callable
            else:
                fn = getattr(self._instance, name, None)
                if fn is None or name.startswith("_") and name != "__call__":
                    raise AttributeError(f"deployment {self._deployment!r} has no method {name!r}")
            is_async = inspect.iscoroutinefunction(fn) or (
                not inspect.isroutine(fn) and inspect.iscoroutinefunction(type(fn).__call__)
            )
            entry = self._methods[name] = (fn, is_async)
        return entry  # type: ignore[no-any-return]

    async def _invoke(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Call a user method: ``async def`` on the loop, plain ``def`` in a thread."""
        fn, is_async = self._method(name)
        if is_async:
            result = fn(*args, **kwargs)
        else:
            call = functools.partial(contextvars.copy_context().run, fn, *args, **kwargs)
            result = await asyncio.get_running_loop().run_in_executor(self._pool, call)
        if inspect.isawaitable(result):
            result = await result
        return result

    async def handle_request(self, meta: tuple[str, str, str], *args: Any, **kwargs: Any) -> Any:
        """A handle call: ``meta`` is ``(method, multiplexed_model_id, request_id)``."""
        if self._draining:
            return REJECTED
        method, model_id, request_id = meta
        start = time.perf_counter()
        self._ongoing += 1
        ok = False
        try:
            async with self._limit:
                token = request_context.set(RequestContext(request_id, "", self._app, model_id))
                try:
                    result = await self._invoke(method, args, kwargs)
                finally:
                    request_context.reset(token)
            ok = True
            return result
        finally:
            self._ongoing -= 1
            self._record(time.perf_counter() - start, ok)

    async def handle_http(self, meta: tuple[str, str, str], req: _http.HTTPRequest) -> Any:
        """A request from an HTTP proxy; answers ``(status, headers, body)``."""
        if self._draining:
            return REJECTED
        route, model_id, request_id = meta
        start = time.perf_counter()
        self._ongoing += 1
        ok = False
        try:
            async with self._limit:
                token = request_context.set(RequestContext(request_id, route, self._app, model_id))
                try:
                    answer = await self._serve_http(req)
                finally:
                    request_context.reset(token)
            ok = answer[0] < 500
            return answer
        except Exception:  # noqa: BLE001 - a 500 for the client, the traceback for the log
            print(
                f"[serve] {self._app}#{self._deployment} replica {self._replica_id}: "
                f"request {request_id} failed:\n{traceback.format_exc()}",
                file=sys.stderr,
                flush=True,
            )
            return _http.error_answer(500)
        finally:
            self._ongoing -= 1
            self._record(time.perf_counter() - start, ok)

    async def _serve_http(self, req: _http.HTTPRequest) -> _http.HTTPAnswer:
        scope = _http.make_scope(req)
        if self._asgi is not None:
            return await _http.run_asgi(self._asgi, scope, req[5])
        from starlette.exceptions import HTTPException
        from starlette.requests import Request
        from starlette.responses import Response

        body = req[5]

        async def receive() -> dict[str, Any]:
            return {"type": "http.request", "body": body, "more_body": False}

        request = Request(scope, receive)
        try:
            result = await self._invoke("__call__", (request,), {})
        except HTTPException as e:
            return _http.text_answer(e.status_code, str(e.detail))
        if isinstance(result, Response):
            return await _http.run_asgi(result, scope, body)
        return _http.answer_from_value(result)

    def _record(self, seconds: float, ok: bool) -> None:
        self._requests += 1
        if not ok:
            self._errors += 1
        if len(self._latencies) < _MAX_SAMPLES:
            self._latencies.append(seconds)
