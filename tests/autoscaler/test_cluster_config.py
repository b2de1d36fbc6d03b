"""Cluster config files: what is accepted, and the message for each mistake."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from nbcluster.autoscaler.config import ConfigError, load_config, parse_config

EXAMPLE = """
cluster_name: demo
max_workers: 4
upscaling_speed: 2.0
idle_timeout_minutes: 0.5
provider:
  type: hosts
  head_ip: 10.0.0.1
  worker_ips: [10.0.0.2, 10.0.0.3, 10.0.0.4, 10.0.0.5]
auth:
  ssh_user: ubuntu
  ssh_private_key: ~/.ssh/id_ed25519
head_node_type: head
available_node_types:
  head:
    resources: {CPU: 0}
    max_workers: 0
  cpu4:
    resources: {CPU: 4, memory: 8000000000}
    min_workers: 1
    max_workers: 4
setup_commands:
  - pip install nbcluster
worker_setup_commands: ["echo worker"]
"""


def base(**over: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "cluster_name": "demo",
        "provider": {"type": "local"},
        "available_node_types": {"cpu2": {"resources": {"CPU": 2}}},
    }
    data.update(over)
    return data


def test_a_full_yaml_file_is_read(tmp_path: Path) -> None:
    path = tmp_path / "cluster.yaml"
    path.write_text(EXAMPLE)
    cfg = load_config(path)
    assert cfg.cluster_name == "demo" and cfg.provider_type == "hosts"
    assert cfg.idle_timeout_s == 30.0 and cfg.upscaling_speed == 2.0
    assert cfg.head_host == "10.0.0.1"  # the head listens on head_ip
    assert list(cfg.worker_types()) == ["cpu4"]
    assert cfg.available_node_types["head"].resources == {}
    cpu4 = cfg.available_node_types["cpu4"]
    assert (cpu4.min_workers, cpu4.max_workers) == (1, 4)
    assert cfg.setup_commands == ("pip install nbcluster",)
    assert parse_config(cfg.to_dict()) == cfg


def test_json_files_and_defaults(tmp_path: Path) -> None:
    path = tmp_path / "c.json"
    path.write_text(json.dumps(base()))
    cfg = load_config(path)
    assert (cfg.max_workers, cfg.upscaling_speed, cfg.idle_timeout_minutes) == (2, 1.0, 5.0)
    assert cfg.available_node_types["cpu2"].max_workers == 2  # defaults to the cluster's
    assert cfg.head_host == "127.0.0.1"


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ([], r"^config: the config must be a mapping"),
        (
            base(max_worker=3),
            r"^unknown key 'max_worker'; did you mean 'max_workers'\? \(valid keys: ",
        ),
        ({"cluster_name": "x", "provider": {"type": "local"}}, r"^missing 'available_node_types'"),
        (base(cluster_name="My Cluster"), r"^'cluster_name' must be 1-40 lowercase letters"),
        (
            base(provider={"type": "aws"}),
            r"^'provider.type' is 'aws'; nbcluster has: local, hosts, kubernetes$",
        ),
        (base(provider={"type": "host"}), r"did you mean 'hosts'\?"),
        (base(provider={"type": "local", "region": "x"}), r"^unknown key 'provider.region'"),
        (
            base(provider={"type": "hosts", "head_ip": "h"}),
            r"^provider type 'hosts' needs 'provider.worker_ips'",
        ),
        (
            base(provider={"type": "hosts", "head_ip": "h", "worker_ips": "a,b"}),
            r"^'provider.worker_ips' must be a non-empty list",
        ),
        (
            base(max_workers=3, provider={"type": "hosts", "head_ip": "h", "worker_ips": ["a"]}),
            r"^max_workers is 3 but provider.worker_ips lists only 1 machine\(s\)",
        ),
        (base(max_workers=-1), r"^'max_workers' must be a whole number >= 0, got int -1$"),
        (base(max_workers=2.5), r"whole number"),
        (
            base(idle_timeout_minutes="5"),
            r"^'idle_timeout_minutes' must be a number >= 0, got str '5'$",
        ),
        (base(update_interval_s=0), r"^'update_interval_s' must be a number > 0"),
        (base(available_node_types={}), r"^'available_node_types' must be a non-empty mapping"),
        (
            base(available_node_types={"cpu2": {"resources": {"CPU": -1}}}),
            r"^available_node_types.cpu2.resources.CPU must be a number >= 0, got int -1$",
        ),
        (
            base(available_node_types={"cpu2": {"resources": {"CPU": 0}}}),
            r"offers nothing: give at least one amount > 0",
        ),
        (
            base(available_node_types={"cpu2": {}}),
            r"^available_node_types.cpu2: missing 'resources'",
        ),
        (
            base(available_node_types={"cpu2": {"resources": {"CPU": 1}, "max_worker": 1}}),
            r"^unknown key 'available_node_types.cpu2.max_worker'; did you mean 'max_workers'\?",
        ),
        (
            base(
                available_node_types={
                    "cpu2": {"resources": {"CPU": 1}, "min_workers": 3, "max_workers": 2}
                }
            ),
            r"^available_node_types.cpu2: min_workers \(3\) is larger than max_workers \(2\)$",
        ),
        (
            base(
                max_workers=1,
                available_node_types={
                    "a": {"resources": {"CPU": 1}, "min_workers": 1},
                    "b": {"resources": {"CPU": 1}, "min_workers": 1},
                },
            ),
            r"^the node types' min_workers add up to 2, more than max_workers \(1\)",
        ),
        (
            base(head_node_type="gpu"),
            r"^'head_node_type' is 'gpu', which is not in available_node_types \(cpu2\)$",
        ),
        (base(head_node_type="cpu2"), r"has no worker type \(only the head's\)"),
        (
            base(setup_commands="pip install x"),
            r"^'setup_commands' must be a list of shell commands",
        ),
        (base(setup_commands=[""]), r"^setup_commands\[0\] must be a non-empty command string"),
        (base(launch_backoff_s=10, launch_backoff_max_s=5), r"must be at least 'launch_backoff_s'"),
        (
            base(provider={"type": "kubernetes", "namespace": "Bad_NS"}),
            r"^'provider.namespace' must be a Kubernetes namespace name",
        ),
        (base(head={"port": 70000}), r"^'head.port' must be a whole number from 0 to 65535"),
    ],
)
def test_mistakes_are_named_with_the_fix(data: Any, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_config(data)


def test_unreadable_files_say_so(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"^cluster config '.*nope.yaml' does not exist$"):
        load_config(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("cluster_name: [unclosed\n")
    with pytest.raises(ConfigError, match=r"^bad.yaml: not valid YAML"):
        load_config(bad)
    badj = tmp_path / "bad.json"
    badj.write_text("{")
    with pytest.raises(ConfigError, match=r"^bad.json: not valid JSON"):
        load_config(badj)


@pytest.mark.parametrize(
    "path",
    ["deploy/examples/local.yaml", "deploy/examples/hosts.yaml", "deploy/kubernetes/cluster.yaml"],
)
def test_the_shipped_configs_are_valid(path: str) -> None:
    cfg = load_config(Path(__file__).resolve().parents[2] / path)
    assert cfg.worker_types() and cfg.head_node_type == "head"
