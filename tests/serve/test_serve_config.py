"""Deployment options, autoscaling config and HTTP options: Ray's defaults, clear errors."""

from __future__ import annotations

import pytest

from nbcluster import serve
from nbcluster.serve.config import AutoscalingConfig, DeploymentConfig, HTTPOptions


def test_ray_defaults() -> None:
    c = DeploymentConfig.build({})
    assert c.num_replicas == 1
    assert c.max_ongoing_requests == 5
    assert c.max_queued_requests == -1
    assert c.health_check_period_s == 10.0 and c.health_check_timeout_s == 30.0
    assert c.graceful_shutdown_wait_loop_s == 2.0 and c.graceful_shutdown_timeout_s == 20.0
    assert dict(c.ray_actor_options) == {"num_cpus": 1}
    a = AutoscalingConfig()
    assert (a.min_replicas, a.max_replicas, a.target_ongoing_requests) == (1, 1, 2.0)
    assert (a.upscale_delay_s, a.downscale_delay_s, a.look_back_period_s) == (30.0, 600.0, 30.0)
    h = HTTPOptions()
    assert (h.host, h.port) == ("127.0.0.1", 8000)


def test_num_replicas_auto_and_autoscaling() -> None:
    c = DeploymentConfig.build({"num_replicas": "auto"})
    assert c.autoscaling_config == AutoscalingConfig.default()
    assert c.num_replicas == 1
    c = DeploymentConfig.build(
        {"autoscaling_config": {"min_replicas": 2, "max_replicas": 5, "initial_replicas": 3}}
    )
    assert c.num_replicas == 3
    c = DeploymentConfig.build({"num_replicas": "auto", "autoscaling_config": {"max_replicas": 7}})
    assert c.autoscaling_config is not None and c.autoscaling_config.max_replicas == 7


@pytest.mark.parametrize(
    ("config", "error", "match"),
    [
        ({"min_replicas": 3, "max_replicas": 2}, ValueError, r"max_replicas \(2\) must be greater"),
        ({"min_replicas": -1}, ValueError, r"min_replicas must be >= 0"),
        ({"max_replicas": 0}, ValueError, r"max_replicas must be >= 1"),
        ({"target_ongoing_requests": 0}, ValueError, r"target_ongoing_requests must be > 0"),
        ({"target_ongoing_requests": "x"}, TypeError, r"must be a number"),
        ({"upscale_delay_s": -1}, ValueError, r"upscale_delay_s must be >= 0"),
        ({"initial_replicas": 9, "max_replicas": 3}, ValueError, r"initial_replicas \(9\)"),
        ({"max_replica": 3}, ValueError, r"unknown key\(s\) 'max_replica'; valid keys:"),
    ],
)
def test_bad_autoscaling_config_fails_at_the_decorator(
    config: dict[str, object], error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):

        @serve.deployment(autoscaling_config=config)
        class Model:
            pass


@pytest.mark.parametrize(
    ("options", "error", "match"),
    [
        ({"num_replicas": -1}, ValueError, r"num_replicas must be >= 0"),
        (
            {"num_replicas": 2, "autoscaling_config": {}},
            ValueError,
            r"not allowed when autoscaling",
        ),
        ({"max_ongoing_requests": 0}, ValueError, r"max_ongoing_requests must be >= 1"),
        ({"max_queued_requests": 0}, ValueError, r"max_queued_requests must be -1"),
        ({"ray_actor_options": {"num_cpu": 1}}, ValueError, r"unsupported key\(s\) 'num_cpu'"),
        ({"ray_actor_options": {"num_cpus": -1}}, ValueError, r"num_cpus'\] must be >= 0"),
        ({"health_check_period_s": 0}, ValueError, r"health_check_period_s must be > 0"),
        ({"num_replica": 2}, TypeError, r"unexpected option\(s\) 'num_replica'"),
        ({"autoscaling_config": 3}, TypeError, r"must be a dict or an AutoscalingConfig"),
    ],
)
def test_bad_deployment_options(
    options: dict[str, object], error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        serve.deployment(**options)

    # .options() validates at once, too
    @serve.deployment
    def f(request: object) -> str:
        return "x"

    with pytest.raises(error, match=match):
        f.options(**options)


def test_http_options() -> None:
    assert HTTPOptions.from_any({"port": 0}).port == 0
    with pytest.raises(ValueError, match=r"unknown key\(s\) 'prot'"):
        HTTPOptions.from_any({"prot": 1})
    with pytest.raises(ValueError, match=r"port must be <= 65535"):
        HTTPOptions(port=70000)
    with pytest.raises(ValueError, match=r"root_path must start with '/'"):
        HTTPOptions(root_path="api")
    with pytest.raises(ValueError, match=r"location must be one of"):
        HTTPOptions(location="Nowhere")


def test_deployment_api_surface() -> None:
    @serve.deployment(num_replicas=2, user_config={"a": 1}, ray_actor_options={"num_cpus": 0.5})
    class Model:
        """A model."""

        def __init__(self, x: int) -> None:
            self.x = x

    assert Model.name == "Model" and Model.num_replicas == 2 and Model.user_config == {"a": 1}
    assert Model.ray_actor_options == {"num_cpus": 0.5}
    assert Model.__doc__ == "A model."
    renamed = Model.options(name="M2", num_replicas=3)
    assert renamed.name == "M2" and renamed.num_replicas == 3 and Model.num_replicas == 2
    with pytest.raises(RuntimeError, match=r"Use `Model.bind\(\)`"):
        Model(1)
    app = Model.bind(3)
    assert isinstance(app, serve.Application)

    @serve.deployment
    def fn(request: object) -> str:
        return "ok"

    with pytest.raises(TypeError, match="bind\\(\\) takes no arguments"):
        fn.bind(1)
    with pytest.raises(TypeError, match=r"call Model.bind\(...\) first"):
        serve.run(Model)  # type: ignore[arg-type]


def test_build_app_composition() -> None:
    from nbcluster.serve._deployment import build_app
    from nbcluster.serve._handle import DeploymentHandle

    @serve.deployment
    class Leaf:
        pass

    @serve.deployment
    class Root:
        def __init__(self, a: object, b: object, c: object) -> None:
            pass

    leaf = Leaf.bind()
    spec = build_app(Root.bind(leaf, [leaf], {"x": Leaf.options(name="Other").bind()}), "app", "/")
    assert spec.ingress == "Root"
    assert sorted(d.name for d in spec.deployments) == ["Leaf", "Other", "Root"]
    import cloudpickle

    root = next(d for d in spec.deployments if d.name == "Root")
    _, args, _ = cloudpickle.loads(root.blob)
    assert isinstance(args[0], DeploymentHandle) and args[0].deployment_name == "Leaf"
    assert args[1][0].deployment_name == "Leaf" and args[2]["x"].deployment_name == "Other"
    with pytest.raises(ValueError, match="two different deployments named 'Leaf'"):
        build_app(Root.bind(Leaf.bind(), Leaf.bind(), None), "app", "/")


def test_route_prefix_validation() -> None:
    from nbcluster.serve._routing import normalize_route_prefix

    assert normalize_route_prefix("/api/") == "/api"
    assert normalize_route_prefix("/") == "/"
    assert normalize_route_prefix(None) is None
    with pytest.raises(ValueError, match="must start with '/'"):
        normalize_route_prefix("api")
    with pytest.raises(ValueError, match="wildcards"):
        normalize_route_prefix("/{x}")


def test_config_file_schema() -> None:
    from nbcluster.serve._config_file import ConfigError, parse_config

    cfg = parse_config(
        {
            "proxy_location": "HeadOnly",
            "http_options": {"port": 0},
            "applications": [
                {
                    "name": "a",
                    "import_path": "m:app",
                    "deployments": [{"name": "D", "num_replicas": 2}],
                },
                {"name": "b", "route_prefix": "/b/", "import_path": "m.app", "args": {"x": 1}},
            ],
        }
    )
    assert [a.name for a in cfg.applications] == ["a", "b"]
    assert cfg.applications[0].deployments == {"D": {"num_replicas": 2}}
    assert cfg.applications[1].route_prefix == "/b" and cfg.http_options.port == 0
    cases = [
        ({}, "applications: a non-empty list"),
        ({"applications": [{"import_path": "m:a"}], "extra": 1}, "unknown field(s) 'extra'"),
        ({"applications": [{"import_path": "nocolon"}]}, "'module:attribute' is required"),
        (
            {"applications": [{"import_path": "m:a"}, {"import_path": "m:b"}]},
            "'default' appears twice",
        ),
        (
            {
                "applications": [
                    {"name": "x", "import_path": "m:a"},
                    {"name": "y", "import_path": "m:b"},
                ]
            },
            "'/' is used by two applications",
        ),
        (
            {
                "applications": [
                    {"import_path": "m:a", "deployments": [{"name": "D", "num_replicas": -1}]}
                ]
            },
            "deployments[0]: num_replicas must be >= 0",
        ),
        (
            {"applications": [{"import_path": "m:a", "deployments": [{"name": "D", "bogus": 1}]}]},
            "unknown field(s) 'bogus'",
        ),
        ({"applications": [{"import_path": "m:a"}], "proxy_location": "Moon"}, "proxy_location"),
    ]
    for data, message in cases:
        with pytest.raises(ConfigError) as info:
            parse_config(data)
        assert message in str(info.value), (data, str(info.value))


def test_config_overrides_apply_by_deployment_name() -> None:
    from nbcluster.serve._config_file import ConfigError, apply_overrides
    from nbcluster.serve._deployment import build_app

    @serve.deployment
    class Leaf:
        pass

    @serve.deployment
    class Root:
        def __init__(self, a: object, b: object) -> None:
            pass

    leaf = Leaf.bind()
    app = apply_overrides(Root.bind(leaf, leaf), {"Leaf": {"num_replicas": 3}})
    spec = build_app(app, "x", "/")
    assert {d.name: d.config.num_replicas for d in spec.deployments} == {"Leaf": 3, "Root": 1}
    with pytest.raises(ConfigError, match="does not have"):
        apply_overrides(Root.bind(leaf, leaf), {"Nope": {}})


def test_unpicklable_constructor_argument_fails_at_serve_run() -> None:
    import threading

    from nbcluster.serve._deployment import build_app

    @serve.deployment
    class Holder:
        def __init__(self, lock: object) -> None:
            self.lock = lock

    with pytest.raises(
        TypeError, match=r"deployment 'Holder' cannot be sent to its replicas.*lock"
    ):
        build_app(Holder.bind(threading.Lock()), "app", "/")
