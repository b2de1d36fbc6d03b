"""``@serve.deployment``, ``Deployment.bind()`` → ``Application``, and ``@serve.ingress``.

A :class:`Deployment` is a class or function plus its validated options
(:class:`~nbcluster.serve.config.DeploymentConfig`); ``.options(...)`` gives a copy with
some changed. ``.bind(*args, **kwargs)`` gives an :class:`Application`: the deployment
with its constructor arguments, which may be other applications (composition: each
becomes a :class:`~nbcluster.serve.DeploymentHandle` in the constructor). ``serve.run``
turns the graph into an :class:`~nbcluster.serve._spec.AppSpec` with :func:`build_app`.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from nbcluster.serve._handle import DeploymentHandle
from nbcluster.serve._replica import current_instance, make_spec
from nbcluster.serve._spec import AppSpec, DeploymentSpec, code_version
from nbcluster.serve.config import DeploymentConfig

__all__ = ["Application", "Deployment", "build_app", "deployment", "ingress"]


class Deployment:
    """A class or function deployed as replicas (``@serve.deployment``)."""

    def __init__(self, func_or_class: Any, name: str, options: dict[str, Any]) -> None:
        if not (inspect.isclass(func_or_class) or inspect.isfunction(func_or_class)):
            raise TypeError(
                "@serve.deployment must decorate a class or a function, got "
                f"{type(func_or_class).__name__}"
            )
        if not isinstance(name, str) or not name or "#" in name:
            raise ValueError(
                f"deployment name must be a non-empty string without '#', got {name!r}"
            )
        self._func_or_class = func_or_class
        self._name = name
        self._options = dict(options)
        self._config = DeploymentConfig.build(self._options)
        self.__doc__ = func_or_class.__doc__

    @property
    def name(self) -> str:
        """The deployment's name (unique within its application)."""
        return self._name

    @property
    def func_or_class(self) -> Any:
        """The class or function this deployment runs."""
        return self._func_or_class

    @property
    def num_replicas(self) -> int:
        """Target number of replicas (the autoscaler's start when autoscaling)."""
        return self._config.num_replicas

    @property
    def user_config(self) -> Any:
        """The config passed to ``reconfigure``."""
        return self._config.user_config

    @property
    def max_ongoing_requests(self) -> int:
        """Requests a replica handles at once."""
        return self._config.max_ongoing_requests

    @property
    def max_queued_requests(self) -> int:
        """Requests a handle queues before ``BackPressureError`` (-1: no limit)."""
        return self._config.max_queued_requests

    @property
    def ray_actor_options(self) -> dict[str, Any]:
        """Actor options of each replica (resources)."""
        return dict(self._config.ray_actor_options)

    @property
    def autoscaling_config(self) -> Any:
        """The autoscaling config, or None."""
        return self._config.autoscaling_config

    @property
    def config(self) -> DeploymentConfig:
        """Every option, validated."""
        return self._config

    def options(self, func_or_class: Any = None, **options: Any) -> Deployment:
        """A copy with some options changed (validated now)."""
        target = func_or_class if func_or_class is not None else self._func_or_class
        name = options.pop("name", self._name)
        return Deployment(target, name, {**self._options, **options})

    def bind(self, *args: Any, **kwargs: Any) -> Application:
        """This deployment with its constructor arguments: an application to ``serve.run``."""
        if inspect.isfunction(self._func_or_class) and (args or kwargs):
            raise TypeError(
                f"deployment {self._name!r} is a function: bind() takes no arguments "
                "(it is called with each request)"
            )
        return Application(self, args, kwargs)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(
            f"Deployments cannot be constructed directly. Use `{self._name}.bind()` and "
            "serve.run() instead."
        )

    def __repr__(self) -> str:
        return f"Deployment(name={self._name!r})"


class Application:
    """A deployment bound to its arguments: run it with ``serve.run(app)``."""

    def __init__(
        self, deployment: Deployment, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> None:
        self._deployment = deployment
        self._args = args
        self._kwargs = kwargs

    @property
    def deployment(self) -> Deployment:
        """The ingress deployment of this application."""
        return self._deployment

    def __repr__(self) -> str:
        return f"Application({self._deployment.name})"


def deployment(
    _func_or_class: Any = None,
    name: str | None = None,
    **options: Any,
) -> Any:
    """Make a class or function a deployment: ``@serve.deployment`` or ``@serve.deployment(...)``.

    Options (Ray's names and defaults): ``num_replicas=1`` (or ``"auto"``),
    ``autoscaling_config``, ``ray_actor_options={"num_cpus": 1}``, ``max_ongoing_requests=5``,
    ``max_queued_requests=-1``, ``user_config``, ``health_check_period_s=10``,
    ``health_check_timeout_s=30``, ``graceful_shutdown_wait_loop_s=2``,
    ``graceful_shutdown_timeout_s=20``. They are validated here: a bad value raises now.
    """

    def decorate(target: Any) -> Deployment:
        return Deployment(target, name if name is not None else target.__name__, options)

    if _func_or_class is not None:
        if not callable(_func_or_class):
            raise TypeError(
                "@serve.deployment takes a class or function; pass options by keyword, "
                "e.g. @serve.deployment(num_replicas=2)"
            )
        return decorate(_func_or_class)
    DeploymentConfig.build(options)  # fail at the decorator, not at serve.run
    return decorate


def ingress(app: Any) -> Callable[[type], type]:
    """Serve a class's HTTP traffic with an ASGI app (FastAPI or Starlette).

    Routes of a FastAPI app declared on the class's methods (``@app.get(...)`` inside the
    class body) run on the replica's instance.
    """
    if not callable(app):
        raise TypeError(f"@serve.ingress takes an ASGI app (FastAPI, Starlette), got {app!r}")

    def decorate(cls: type) -> type:
        if not inspect.isclass(cls):
            raise TypeError("@serve.ingress must decorate a class")
        if "__call__" in vars(cls):
            raise ValueError("Classes passed to @serve.ingress may not have __call__ method.")
        _class_based_view(app, cls)
        cls.__serve_asgi_app__ = app  # type: ignore[attr-defined]
        return cls

    return decorate


def _class_based_view(app: Any, cls: type) -> None:
    """Make the FastAPI routes declared on ``cls``'s methods call the replica's instance.

    ``@app.get(...)`` in a class body registers the plain function, whose ``self`` FastAPI
    would read as a query parameter. Each such route is rebuilt (here, in the driver,
    where the annotations resolve) around an endpoint that takes ``self`` from a
    dependency: the instance of the replica serving the request.
    """
    try:
        from fastapi import Depends
        from fastapi.routing import APIRoute
    except ImportError:  # not FastAPI (a plain Starlette app): routes are used as they are
        return
    router = getattr(app, "router", None)
    if router is None:
        return
    methods = {m: n for n, m in inspect.getmembers(cls) if inspect.isfunction(m)}
    accepted = list(inspect.signature(APIRoute.__init__).parameters)[3:]
    for i, route in enumerate(list(router.routes)):
        if not isinstance(route, APIRoute) or route.endpoint not in methods:
            continue
        endpoint = _endpoint(route.endpoint, Depends(current_instance))
        kwargs = {k: getattr(route, k) for k in accepted if hasattr(route, k)}
        router.routes[i] = APIRoute(route.path, endpoint, **kwargs)


def _endpoint(func: Callable[..., Any], instance: Any) -> Callable[..., Any]:
    try:
        sig = inspect.signature(func, eval_str=True)
    except Exception:  # noqa: BLE001 - unresolvable annotations: FastAPI resolves them later
        sig = inspect.signature(func)
    params = list(sig.parameters.values())
    if not params:
        raise TypeError(f"{func.__qualname__}: a route method must take self")
    me = params[0].replace(kind=inspect.Parameter.KEYWORD_ONLY, default=instance, annotation=Any)
    rest = params[1:]
    at = next((j for j, p in enumerate(rest) if p.kind == inspect.Parameter.VAR_KEYWORD), len(rest))
    rest.insert(at, me)
    rest.sort(key=lambda p: p.kind)  # a valid order: positional, *args, keyword-only, **kwargs

    if inspect.iscoroutinefunction(func):

        async def call(**kwargs: Any) -> Any:
            return await func(**kwargs)

    else:

        def call(**kwargs: Any) -> Any:
            return func(**kwargs)

    call.__name__ = func.__name__
    call.__qualname__ = func.__qualname__
    call.__doc__ = func.__doc__
    call.__signature__ = sig.replace(parameters=rest)  # type: ignore[attr-defined]
    return call


def build_app(app: Application, name: str, route_prefix: str | None) -> AppSpec:
    """The spec ``serve.run`` sends to the controller (every deployment of the graph)."""
    if not isinstance(app, Application):
        if isinstance(app, Deployment):
            raise TypeError(f"serve.run() takes an application: call {app.name}.bind(...) first")
        raise TypeError(
            f"serve.run() takes an application (Deployment.bind()), got {type(app).__name__}"
        )
    specs: dict[str, DeploymentSpec] = {}
    seen: dict[int, str] = {}

    def visit(node: Application) -> DeploymentHandle:
        if id(node) in seen:
            return DeploymentHandle(seen[id(node)], name)
        d = node._deployment
        if d.name in specs:
            raise ValueError(
                f"application {name!r} binds two different deployments named {d.name!r}; "
                "give one of them another name with .options(name=...)"
            )
        seen[id(node)] = d.name
        specs[d.name] = None  # type: ignore[assignment]  # reserve the name (cycles)
        args = tuple(_swap(a, visit) for a in node._args)
        kwargs = {k: _swap(v, visit) for k, v in node._kwargs.items()}
        try:
            blob = make_spec(d.func_or_class, args, kwargs)
        except Exception as e:  # noqa: BLE001 - name the deployment and the way out
            raise TypeError(
                f"deployment {d.name!r} cannot be sent to its replicas: its class or "
                f"constructor arguments cannot be pickled ({type(e).__name__}: {e}). Create "
                "such objects (locks, connections, open files) in __init__ instead of passing them."
            ) from e
        specs[d.name] = DeploymentSpec(
            name=d.name,
            blob=blob,
            config=d.config,
            version=code_version(blob, d.config),
            class_name=getattr(d.func_or_class, "__qualname__", d.name),
        )
        return DeploymentHandle(d.name, name)

    visit(app)
    return AppSpec(name, route_prefix, app._deployment.name, tuple(specs.values()))


def _swap(value: Any, visit: Callable[[Application], DeploymentHandle]) -> Any:
    if isinstance(value, Application):
        return visit(value)
    if isinstance(value, list):
        return [_swap(v, visit) for v in value]
    if isinstance(value, tuple):
        return tuple(_swap(v, visit) for v in value)
    if isinstance(value, dict):
        return {k: _swap(v, visit) for k, v in value.items()}
    return value
