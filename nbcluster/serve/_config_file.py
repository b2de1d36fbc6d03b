"""Serve config files (``nbcluster serve deploy config.yaml``): Ray Serve's schema, checked.

::

    proxy_location: EveryNode          # or HeadOnly, Disabled
    http_options: {host: 127.0.0.1, port: 8000}
    applications:
      - name: app1                     # default "default"
        route_prefix: /                # default "/"; null: handles only
        import_path: my_module:app     # an Application, or a builder called with `args`
        args: {}
        deployments:                   # per-deployment overrides of @serve.deployment options
          - name: Model
            num_replicas: 2
            user_config: {threshold: 0.5}

:func:`parse_config` validates the dict (no I/O) and names the first problem with its
path in the file; :func:`load_target` imports an ``import_path`` and builds the app.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import sys
from collections.abc import Mapping
from typing import Any

from nbcluster.serve._deployment import Application, Deployment
from nbcluster.serve._routing import normalize_route_prefix
from nbcluster.serve.config import (
    DEPLOYMENT_OPTION_NAMES,
    DeploymentConfig,
    HTTPOptions,
    ProxyLocation,
)

__all__ = ["AppConfig", "ServeConfig", "apply_overrides", "load_target", "parse_config"]

_APP_KEYS = {"name", "route_prefix", "import_path", "args", "deployments", "runtime_env"}
_TOP_KEYS = {"proxy_location", "http_options", "applications", "grpc_options", "logging_config"}


class ConfigError(ValueError):
    """A config file that does not follow the schema."""


@dataclasses.dataclass(frozen=True)
class AppConfig:
    """One application of a config file."""

    name: str
    route_prefix: str | None
    import_path: str
    args: dict[str, Any]
    deployments: dict[str, dict[str, Any]]


@dataclasses.dataclass(frozen=True)
class ServeConfig:
    """A whole config file."""

    applications: tuple[AppConfig, ...]
    http_options: HTTPOptions
    proxy_location: ProxyLocation | None


def _unknown(where: str, keys: Any, allowed: set[str] | frozenset[str]) -> None:
    bad = sorted(set(keys) - set(allowed))
    if bad:
        raise ConfigError(
            f"{where}: unknown field(s) {', '.join(map(repr, bad))}; valid: {', '.join(sorted(allowed))}"
        )


def parse_config(data: Any) -> ServeConfig:
    """Check a config file's contents (a dict, as loaded from YAML)."""
    if not isinstance(data, Mapping):
        raise ConfigError("the config must be a mapping with an 'applications' list")
    _unknown("config", data, _TOP_KEYS)
    apps_data = data.get("applications")
    if not isinstance(apps_data, list) or not apps_data:
        raise ConfigError("applications: a non-empty list of applications is required")
    try:
        http = HTTPOptions.from_any(data.get("http_options"))
        location = data.get("proxy_location")
        proxy_location = ProxyLocation(location) if location is not None else None
    except (TypeError, ValueError) as e:
        raise ConfigError(f"http_options/proxy_location: {e}") from None
    apps: list[AppConfig] = []
    names: set[str] = set()
    prefixes: set[str] = set()
    for i, a in enumerate(apps_data):
        where = f"applications[{i}]"
        if not isinstance(a, Mapping):
            raise ConfigError(f"{where}: must be a mapping")
        _unknown(where, a, _APP_KEYS)
        name = a.get("name", "default")
        if not isinstance(name, str) or not name or "#" in name:
            raise ConfigError(f"{where}.name: a non-empty string without '#', got {name!r}")
        if name in names:
            raise ConfigError(f"{where}.name: {name!r} appears twice")
        names.add(name)
        path = a.get("import_path")
        if not isinstance(path, str) or not (":" in path or "." in path):
            raise ConfigError(f"{where}.import_path: 'module:attribute' is required, got {path!r}")
        try:
            prefix = normalize_route_prefix(a.get("route_prefix", "/"))
        except (TypeError, ValueError) as e:
            raise ConfigError(f"{where}.route_prefix: {e}") from None
        if prefix is not None:
            if prefix in prefixes:
                raise ConfigError(f"{where}.route_prefix: {prefix!r} is used by two applications")
            prefixes.add(prefix)
        args = a.get("args") or {}
        if not isinstance(args, Mapping):
            raise ConfigError(f"{where}.args: must be a mapping")
        overrides: dict[str, dict[str, Any]] = {}
        for j, d in enumerate(a.get("deployments") or []):
            dwhere = f"{where}.deployments[{j}]"
            if not isinstance(d, Mapping) or not isinstance(d.get("name"), str):
                raise ConfigError(f"{dwhere}: a mapping with a 'name' is required")
            _unknown(dwhere, d, DEPLOYMENT_OPTION_NAMES)
            opts = {k: v for k, v in d.items() if k != "name"}
            try:
                DeploymentConfig.build(opts)
            except (TypeError, ValueError) as e:
                raise ConfigError(f"{dwhere}: {e}") from None
            overrides[d["name"]] = opts
        apps.append(AppConfig(name, prefix, path, dict(args), overrides))
    return ServeConfig(tuple(apps), http, proxy_location)


def load_target(import_path: str, args: Mapping[str, Any] | None = None, app_dir: str = ".") -> Any:
    """Import ``module:attribute`` (or ``module.attribute``) and return the Application.

    A builder function is called with ``args``; a Deployment is bound without arguments
    (Ray does the same for ``serve run module:Deployment``).
    """
    module_name, sep, attr = import_path.partition(":")
    if not sep:
        module_name, _, attr = import_path.rpartition(".")
    if app_dir and app_dir not in sys.path:
        sys.path.insert(0, app_dir)
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise ConfigError(f"cannot import {module_name!r} (from {import_path!r}): {e}") from None
    target: Any = module
    for part in attr.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise ConfigError(f"module {module_name!r} has no attribute {attr!r}") from None
    if isinstance(target, Deployment):
        target = target.bind()
    elif not isinstance(target, Application) and callable(target):
        params = inspect.signature(target).parameters
        target = target(dict(args or {})) if params else target()
    if not isinstance(target, Application):
        raise ConfigError(
            f"{import_path!r} is a {type(target).__name__}, not an application: point it at "
            "`Deployment.bind(...)` or a function that returns one"
        )
    return target


def apply_overrides(app: Any, overrides: Mapping[str, Mapping[str, Any]]) -> Any:
    """The application with each named deployment's options replaced (``.options()``)."""
    seen: set[str] = set()
    done: dict[int, Any] = {}  # a node bound in two places stays one deployment

    def rebuild(node: Any) -> Any:
        if isinstance(node, Application):
            if id(node) in done:
                return done[id(node)]
            d = node.deployment
            if d.name in overrides:
                seen.add(d.name)
                d = d.options(**overrides[d.name])
            args = tuple(rebuild(a) for a in node._args)
            kwargs = {k: rebuild(v) for k, v in node._kwargs.items()}
            done[id(node)] = Application(d, args, kwargs)
            return done[id(node)]
        if isinstance(node, list):
            return [rebuild(v) for v in node]
        if isinstance(node, tuple):
            return tuple(rebuild(v) for v in node)
        if isinstance(node, dict):
            return {k: rebuild(v) for k, v in node.items()}
        return node

    out = rebuild(app)
    missing = sorted(set(overrides) - seen)
    if missing:
        raise ConfigError(
            f"the config names deployment(s) the application does not have: {missing}"
        )
    return out
