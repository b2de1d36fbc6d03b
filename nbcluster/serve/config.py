"""Serve's configuration objects, with Ray Serve's names and defaults (Ray 2.60).

- :class:`AutoscalingConfig`: the ``autoscaling_config=`` of a deployment.
- :class:`HTTPOptions`: where the HTTP proxies listen (``serve.start(http_options=...)``).
- :class:`DeploymentConfig`: every option of ``@serve.deployment`` in one frozen record,
  validated once (when the decorator or ``.options()`` is applied) with messages that name
  the option and the fix.

Pure data: nothing here starts a process or reads the environment.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from enum import StrEnum
from typing import Any

__all__ = [
    "AutoscalingConfig",
    "DeploymentConfig",
    "HTTPOptions",
    "ProxyLocation",
    "DEFAULT_ACTOR_OPTIONS",
    "ACTOR_OPTION_NAMES",
]

#: Ray Serve: "By default, each replica reserves one CPU".
DEFAULT_ACTOR_OPTIONS: Mapping[str, Any] = {"num_cpus": 1}
#: What ``ray_actor_options`` may hold (Ray's list; ``accelerator_type`` and
#: ``object_store_memory`` are accepted and ignored, as on a cluster without accelerators).
ACTOR_OPTION_NAMES = frozenset(
    {
        "num_cpus",
        "num_gpus",
        "memory",
        "resources",
        "runtime_env",
        "accelerator_type",
        "object_store_memory",
    }
)


def _number(name: str, value: Any, *, positive: bool = False, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
        raise TypeError(f"{name} must be a number, got {value!r}")
    if positive and value <= 0:
        raise ValueError(f"{name} must be > 0, got {value!r}")
    if value < 0:
        raise ValueError(f"{name} must be >= 0, got {value!r}")


def _integer(name: str, value: Any, minimum: int, *, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an integer, got {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value!r}")


@dataclasses.dataclass(frozen=True)
class AutoscalingConfig:
    """How a deployment's replica count follows its load (Ray Serve's defaults).

    The autoscaler keeps ``ongoing requests / replicas`` near ``target_ongoing_requests``,
    between ``min_replicas`` and ``max_replicas``; it waits ``upscale_delay_s`` before
    adding replicas and ``downscale_delay_s`` before removing them. Ongoing requests are
    averaged over ``look_back_period_s``.
    """

    min_replicas: int = 1
    initial_replicas: int | None = None
    max_replicas: int = 1
    target_ongoing_requests: float = 2.0
    metrics_interval_s: float = 10.0
    look_back_period_s: float = 30.0
    smoothing_factor: float = 1.0
    upscaling_factor: float | None = None
    downscaling_factor: float | None = None
    downscale_delay_s: float = 600.0
    downscale_to_zero_delay_s: float | None = None
    upscale_delay_s: float = 30.0

    def __post_init__(self) -> None:
        _integer("autoscaling_config.min_replicas", self.min_replicas, 0)
        _integer("autoscaling_config.max_replicas", self.max_replicas, 1)
        _integer("autoscaling_config.initial_replicas", self.initial_replicas, 0, allow_none=True)
        for name in ("target_ongoing_requests", "metrics_interval_s", "look_back_period_s"):
            _number(f"autoscaling_config.{name}", getattr(self, name), positive=True)
        _number("autoscaling_config.smoothing_factor", self.smoothing_factor, positive=True)
        for name in ("upscaling_factor", "downscaling_factor"):
            _number(
                f"autoscaling_config.{name}", getattr(self, name), positive=True, allow_none=True
            )
        for name in ("downscale_delay_s", "upscale_delay_s"):
            _number(f"autoscaling_config.{name}", getattr(self, name))
        _number(
            "autoscaling_config.downscale_to_zero_delay_s",
            self.downscale_to_zero_delay_s,
            allow_none=True,
        )
        if self.max_replicas < self.min_replicas:
            raise ValueError(
                f"autoscaling_config: max_replicas ({self.max_replicas}) must be greater than "
                f"or equal to min_replicas ({self.min_replicas})"
            )
        if self.initial_replicas is not None and not (
            self.min_replicas <= self.initial_replicas <= self.max_replicas
        ):
            raise ValueError(
                f"autoscaling_config: initial_replicas ({self.initial_replicas}) must be between "
                f"min_replicas ({self.min_replicas}) and max_replicas ({self.max_replicas})"
            )

    @classmethod
    def default(cls) -> AutoscalingConfig:
        """What ``num_replicas="auto"`` uses (Ray: 1 to 100 replicas, 2 ongoing each)."""
        return cls(min_replicas=1, max_replicas=100, target_ongoing_requests=2.0)

    @classmethod
    def from_any(cls, value: Any) -> AutoscalingConfig:
        """An :class:`AutoscalingConfig` from itself or a dict (unknown keys are an error)."""
        if isinstance(value, AutoscalingConfig):
            return value
        if not isinstance(value, Mapping):
            raise TypeError(
                f"autoscaling_config must be a dict or an AutoscalingConfig, got {type(value).__name__}"
            )
        fields = {f.name for f in dataclasses.fields(cls)}
        # Ray's older spelling, still accepted by Ray with a deprecation warning.
        value = dict(value)
        if "target_num_ongoing_requests_per_replica" in value:
            value.setdefault(
                "target_ongoing_requests", value.pop("target_num_ongoing_requests_per_replica")
            )
        unknown = sorted(set(value) - fields)
        if unknown:
            raise ValueError(
                f"autoscaling_config has unknown key(s) {', '.join(map(repr, unknown))}; "
                f"valid keys: {', '.join(sorted(fields))}"
            )
        return cls(**value)

    def get_upscaling_factor(self) -> float:
        """The gain applied when scaling up."""
        return self.upscaling_factor or self.smoothing_factor

    def get_downscaling_factor(self) -> float:
        """The gain applied when scaling down."""
        return self.downscaling_factor or self.smoothing_factor

    def start_replicas(self) -> int:
        """Replicas when the deployment is first deployed."""
        return self.initial_replicas if self.initial_replicas is not None else self.min_replicas


class ProxyLocation(StrEnum):
    """Where the HTTP proxies run (Ray's names)."""

    Disabled = "Disabled"
    HeadOnly = "HeadOnly"
    EveryNode = "EveryNode"


@dataclasses.dataclass(frozen=True)
class HTTPOptions:
    """Where the HTTP proxies listen.

    ``host`` is 127.0.0.1 unless told otherwise; binding another address exposes the
    applications to the network without authentication (as Ray Serve does), so it is an
    explicit choice. ``port`` 8000 is Ray's default; ``0`` picks a free port. When the
    port is taken the proxy picks a free one and says so (Ray fails instead).
    ``max_request_body_bytes`` answers larger bodies with 413 (nbcluster's addition).
    """

    host: str | None = "127.0.0.1"
    port: int = 8000
    root_path: str = ""
    request_timeout_s: float | None = None
    keep_alive_timeout_s: int = 90
    max_request_body_bytes: int = 32 * 1024 * 1024
    location: ProxyLocation | str | None = None

    def __post_init__(self) -> None:
        if self.host is not None and not isinstance(self.host, str):
            raise TypeError(f"http_options.host must be a string, got {self.host!r}")
        _integer("http_options.port", self.port, 0)
        if self.port > 65535:
            raise ValueError(f"http_options.port must be <= 65535, got {self.port}")
        if self.root_path and (not self.root_path.startswith("/") or self.root_path.endswith("/")):
            raise ValueError(
                f"http_options.root_path must start with '/' and not end with one, got {self.root_path!r}"
            )
        _number(
            "http_options.request_timeout_s", self.request_timeout_s, positive=True, allow_none=True
        )
        _integer("http_options.keep_alive_timeout_s", self.keep_alive_timeout_s, 0)
        _integer("http_options.max_request_body_bytes", self.max_request_body_bytes, 1)
        if self.location is not None:
            try:
                object.__setattr__(self, "location", ProxyLocation(self.location))
            except ValueError:
                raise ValueError(
                    f"http_options.location must be one of {[p.value for p in ProxyLocation]}, "
                    f"got {self.location!r}"
                ) from None

    @classmethod
    def from_any(cls, value: Any) -> HTTPOptions:
        """An :class:`HTTPOptions` from itself, a dict, or None (the defaults)."""
        if value is None:
            return cls()
        if isinstance(value, HTTPOptions):
            return value
        if not isinstance(value, Mapping):
            raise TypeError(
                f"http_options must be a dict or HTTPOptions, got {type(value).__name__}"
            )
        fields = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(value) - fields)
        if unknown:
            raise ValueError(
                f"http_options has unknown key(s) {', '.join(map(repr, unknown))}; "
                f"valid keys: {', '.join(sorted(fields))}"
            )
        return cls(**dict(value))


#: ``@serve.deployment`` options, in Ray's order, with Ray Serve 2.60's defaults.
_DEPLOYMENT_DEFAULTS: dict[str, Any] = {
    "num_replicas": None,  # 1, or autoscaling_config's initial/min replicas
    "ray_actor_options": None,
    "user_config": None,
    "max_ongoing_requests": 5,
    "max_queued_requests": -1,
    "autoscaling_config": None,
    "graceful_shutdown_wait_loop_s": 2.0,
    "graceful_shutdown_timeout_s": 20.0,
    "health_check_period_s": 10.0,
    "health_check_timeout_s": 30.0,
    "max_constructor_retry_count": 20,
}
#: Options Ray accepts that have no effect here (one placement per replica, one logger).
_ACCEPTED_IGNORED = frozenset(
    {
        "version",
        "route_prefix",
        "placement_group_bundles",
        "placement_group_strategy",
        "max_replicas_per_node",
        "logging_config",
        "request_router_config",
    }
)
DEPLOYMENT_OPTION_NAMES = frozenset(_DEPLOYMENT_DEFAULTS) | {"name"} | _ACCEPTED_IGNORED


@dataclasses.dataclass(frozen=True)
class DeploymentConfig:
    """Every option of one deployment, validated. Build it with :meth:`build`."""

    num_replicas: int = 1
    autoscaling_config: AutoscalingConfig | None = None
    ray_actor_options: Mapping[str, Any] = dataclasses.field(
        default_factory=lambda: dict(DEFAULT_ACTOR_OPTIONS)
    )
    user_config: Any = None
    max_ongoing_requests: int = 5
    max_queued_requests: int = -1
    graceful_shutdown_wait_loop_s: float = 2.0
    graceful_shutdown_timeout_s: float = 20.0
    health_check_period_s: float = 10.0
    health_check_timeout_s: float = 30.0
    max_constructor_retry_count: int = 20

    @classmethod
    def build(cls, options: Mapping[str, Any]) -> DeploymentConfig:
        """Validate ``options`` (what the user passed; missing keys take the defaults)."""
        unknown = sorted(set(options) - DEPLOYMENT_OPTION_NAMES)
        if unknown:
            raise TypeError(
                f"@serve.deployment got unexpected option(s) {', '.join(map(repr, unknown))}; "
                f"valid options: {', '.join(sorted(DEPLOYMENT_OPTION_NAMES))}"
            )
        o = {
            **_DEPLOYMENT_DEFAULTS,
            **{k: v for k, v in options.items() if k in _DEPLOYMENT_DEFAULTS},
        }
        num_replicas = o["num_replicas"]
        autoscaling = o["autoscaling_config"]
        if num_replicas == "auto":
            base = AutoscalingConfig.default()
            if autoscaling is not None:
                merged = {**dataclasses.asdict(base), **_as_dict(autoscaling)}
                autoscaling = AutoscalingConfig.from_any(merged)
            else:
                autoscaling = base
            num_replicas = None
        elif autoscaling is not None:
            autoscaling = AutoscalingConfig.from_any(autoscaling)
        if num_replicas is not None and autoscaling is not None:
            raise ValueError(
                "Manually setting num_replicas is not allowed when autoscaling_config is "
                "provided; remove num_replicas, or use num_replicas='auto'"
            )
        if num_replicas is None:
            num_replicas = autoscaling.start_replicas() if autoscaling is not None else 1
        else:
            _integer("num_replicas", num_replicas, 0)
        _integer("max_ongoing_requests", o["max_ongoing_requests"], 1)
        mq = o["max_queued_requests"]
        _integer("max_queued_requests", mq, -1)
        if mq == 0:
            raise ValueError("max_queued_requests must be -1 (no limit) or > 0, got 0")
        for name in (
            "graceful_shutdown_wait_loop_s",
            "graceful_shutdown_timeout_s",
            "health_check_period_s",
            "health_check_timeout_s",
        ):
            _number(name, o[name], positive=name.startswith("health"))
        _integer("max_constructor_retry_count", o["max_constructor_retry_count"], 1)
        return cls(
            num_replicas=num_replicas,
            autoscaling_config=autoscaling,
            ray_actor_options=_actor_options(o["ray_actor_options"]),
            user_config=o["user_config"],
            max_ongoing_requests=o["max_ongoing_requests"],
            max_queued_requests=mq,
            graceful_shutdown_wait_loop_s=float(o["graceful_shutdown_wait_loop_s"]),
            graceful_shutdown_timeout_s=float(o["graceful_shutdown_timeout_s"]),
            health_check_period_s=float(o["health_check_period_s"]),
            health_check_timeout_s=float(o["health_check_timeout_s"]),
            max_constructor_retry_count=o["max_constructor_retry_count"],
        )

    def actor_options(self) -> dict[str, Any]:
        """The nbcluster actor options of a replica (from ``ray_actor_options``)."""
        out: dict[str, Any] = {}
        for key in ("num_cpus", "num_gpus", "memory", "resources", "runtime_env"):
            if key in self.ray_actor_options:
                out[key] = self.ray_actor_options[key]
        return out


def _as_dict(value: Any) -> dict[str, Any]:
    if isinstance(value, AutoscalingConfig):
        return dataclasses.asdict(value)
    if isinstance(value, Mapping):
        return dict(value)
    raise TypeError(
        f"autoscaling_config must be a dict or an AutoscalingConfig, got {type(value).__name__}"
    )


def _actor_options(value: Any) -> dict[str, Any]:
    if value is None:
        return dict(DEFAULT_ACTOR_OPTIONS)
    if not isinstance(value, Mapping):
        raise TypeError(f"ray_actor_options must be a dict, got {type(value).__name__}")
    unknown = sorted(set(value) - ACTOR_OPTION_NAMES)
    if unknown:
        raise ValueError(
            f"ray_actor_options has unsupported key(s) {', '.join(map(repr, unknown))}; "
            f"valid keys: {', '.join(sorted(ACTOR_OPTION_NAMES))}"
        )
    out = dict(value)
    for key in ("num_cpus", "num_gpus", "memory"):
        if key in out:
            _number(f"ray_actor_options[{key!r}]", out[key])
    if "resources" in out and not isinstance(out["resources"], Mapping):
        raise TypeError("ray_actor_options['resources'] must be a dict of name -> amount")
    if "num_cpus" not in out:
        out["num_cpus"] = DEFAULT_ACTOR_OPTIONS["num_cpus"]
    return out
