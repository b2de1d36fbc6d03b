"""The cluster config file: what ``nbcluster up config.yaml`` reads, validated with clear errors.

The keys are Ray's cluster-launcher keys where Ray has one (``cluster_name``,
``max_workers``, ``upscaling_speed``, ``idle_timeout_minutes``, ``provider``, ``auth``,
``available_node_types`` with ``resources``/``min_workers``/``max_workers``/``node_config``,
``head_node_type``, ``setup_commands``, ``worker_setup_commands``), so a Ray config needs
few changes. A minimal file::

    cluster_name: demo
    max_workers: 4
    idle_timeout_minutes: 1
    provider: {type: local}
    available_node_types:
      cpu2: {resources: {CPU: 2}, min_workers: 0, max_workers: 4}

Provider types: ``local`` (node managers as processes on this host), ``hosts`` (a fixed
list of machines reached over SSH; ``provider.worker_ips``) and ``kubernetes`` (pods from a
template; ``provider.namespace``). :func:`load_config` reads YAML or JSON; every error is a
:class:`ConfigError` naming the key path, what was wrong, and what to write instead.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = [
    "ClusterConfig",
    "ConfigError",
    "NodeTypeConfig",
    "PROVIDER_TYPES",
    "load_config",
    "parse_config",
]

#: The node providers nbcluster ships.
PROVIDER_TYPES = ("local", "hosts", "kubernetes")

_NAME_RE = re.compile(r"[a-z0-9]([-a-z0-9]{0,38}[a-z0-9])?")
_TYPE_NAME_RE = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,50}[A-Za-z0-9])?")

_TOP_KEYS = {
    "cluster_name": "a name: lowercase letters, digits and '-' (it names pods and tags)",
    "max_workers": "the most worker nodes the cluster may have (the head not counted)",
    "upscaling_speed": "pending launches allowed as a multiple of the running workers (>= 0)",
    "idle_timeout_minutes": "minutes a worker must be idle before it is removed",
    "provider": "where nodes come from: {type: local | hosts | kubernetes, ...}",
    "auth": "how to reach hosts: {ssh_user, ssh_private_key} (hosts provider)",
    "available_node_types": "node types: {name: {resources, min_workers, max_workers, node_config}}",
    "head_node_type": "which node type the head's own node manager is",
    "setup_commands": "shell commands run on every node before nbcluster starts",
    "head_setup_commands": "commands run on the head only",
    "worker_setup_commands": "commands run on workers only",
    "head": "where the head listens: {host, port}",
    "update_interval_s": "seconds between autoscaler decisions",
    "launch_timeout_s": "seconds a launched node has to join before it counts as failed",
    "launch_backoff_s": "first wait after a failed launch (doubles per failure)",
    "launch_backoff_max_s": "longest wait between launch retries",
}
_NODE_TYPE_KEYS = {
    "resources": "what one node offers, e.g. {CPU: 2, GPU: 1, my_resource: 4}",
    "min_workers": "nodes of this type kept running even when idle",
    "max_workers": "the most nodes of this type",
    "node_config": "provider settings for this type (kubernetes: a pod template)",
    "object_store_memory": "bytes of object store per node",
}
_PROVIDER_KEYS: dict[str, dict[str, str]] = {
    "local": {"type": "local"},
    "hosts": {
        "type": "hosts",
        "head_ip": "address of the head machine (the head listens there)",
        "worker_ips": "addresses of the worker machines, e.g. [10.0.0.2, 10.0.0.3]",
        "python": "the interpreter that runs nbcluster on the hosts (default: python3)",
        "command_prefix": "run host commands with this argv prefix instead of SSH: a list "
        "with {host} in it (e.g. [docker, exec, '{host}']) or a mapping address -> list",
    },
    "kubernetes": {
        "type": "kubernetes",
        "namespace": "the namespace of the worker pods (default: the head pod's own)",
        "head_service": "the Service in front of the head (default: <cluster_name>-head)",
        "head_port": "the head's port on that Service (default: 6380)",
        "token_secret": "the Secret holding the cluster token (default: <cluster_name>-token)",
        "tls_secret": "a Secret with ca.pem, cert.pem, key.pem (`nbcluster tls-certs`): worker "
        "pods mount it and use mutual TLS (default: $NBCLUSTER_TLS_SECRET, else no TLS)",
        "image": "container image of the workers (default: the head pod's own image)",
        "service_account": "service account of the worker pods (default: none)",
        "in_cluster": "load the pod's service-account credentials (default: true)",
    },
}
_AUTH_KEYS = {
    "ssh_user": "the user to log in as",
    "ssh_private_key": "path of the private key file",
    "ssh_port": "SSH port (default 22)",
}
_HEAD_KEYS = {
    "host": "address the head listens on (default 127.0.0.1)",
    "port": "port of the head (default: any free port)",
}


class ConfigError(ValueError):
    """The cluster config is invalid; the message names the key and the fix."""


@dataclasses.dataclass(frozen=True)
class NodeTypeConfig:
    """One kind of worker node the autoscaler can launch."""

    name: str
    resources: Mapping[str, float]
    min_workers: int = 0
    max_workers: int = 2
    node_config: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    object_store_memory: int | None = None


@dataclasses.dataclass(frozen=True)
class ClusterConfig:
    """A validated cluster config (see the module docstring for the file format)."""

    cluster_name: str
    provider: Mapping[str, Any]
    available_node_types: Mapping[str, NodeTypeConfig]
    max_workers: int = 2
    upscaling_speed: float = 1.0
    idle_timeout_minutes: float = 5.0
    auth: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    head_node_type: str | None = None
    setup_commands: tuple[str, ...] = ()
    head_setup_commands: tuple[str, ...] = ()
    worker_setup_commands: tuple[str, ...] = ()
    head_host: str = "127.0.0.1"
    head_port: int = 0
    update_interval_s: float = 1.0
    launch_timeout_s: float = 120.0
    launch_backoff_s: float = 5.0
    launch_backoff_max_s: float = 300.0

    @property
    def provider_type(self) -> str:
        """``local``, ``hosts`` or ``kubernetes``."""
        return str(self.provider["type"])

    @property
    def idle_timeout_s(self) -> float:
        """The idle timeout in seconds."""
        return self.idle_timeout_minutes * 60.0

    def worker_types(self) -> dict[str, NodeTypeConfig]:
        """Node types the autoscaler may launch (all but the head's type)."""
        return {k: v for k, v in self.available_node_types.items() if k != self.head_node_type}

    def to_dict(self) -> dict[str, Any]:
        """The config as plain data (``parse_config(cfg.to_dict()) == cfg``)."""
        out: dict[str, Any] = {
            "cluster_name": self.cluster_name,
            "max_workers": self.max_workers,
            "upscaling_speed": self.upscaling_speed,
            "idle_timeout_minutes": self.idle_timeout_minutes,
            "provider": dict(self.provider),
            "available_node_types": {
                name: {
                    "resources": dict(t.resources),
                    "min_workers": t.min_workers,
                    "max_workers": t.max_workers,
                    "node_config": dict(t.node_config),
                    **(
                        {"object_store_memory": t.object_store_memory}
                        if t.object_store_memory
                        else {}
                    ),
                }
                for name, t in self.available_node_types.items()
            },
            "setup_commands": list(self.setup_commands),
            "head_setup_commands": list(self.head_setup_commands),
            "worker_setup_commands": list(self.worker_setup_commands),
            "head": {"host": self.head_host, "port": self.head_port},
            "update_interval_s": self.update_interval_s,
            "launch_timeout_s": self.launch_timeout_s,
            "launch_backoff_s": self.launch_backoff_s,
            "launch_backoff_max_s": self.launch_backoff_max_s,
        }
        if self.auth:
            out["auth"] = dict(self.auth)
        if self.head_node_type is not None:
            out["head_node_type"] = self.head_node_type
        return out


# -- loading ----------------------------------------------------------------------------------
def load_config(path: str | Path) -> ClusterConfig:
    """Read and validate a cluster config file (YAML, or JSON when it ends in ``.json``)."""
    p = Path(path)
    try:
        text = p.read_text()
    except FileNotFoundError:
        raise ConfigError(f"cluster config {str(p)!r} does not exist") from None
    except OSError as err:
        raise ConfigError(f"cannot read cluster config {str(p)!r}: {err.strerror}") from None
    if p.suffix == ".json":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as err:
            raise ConfigError(f"{p.name}: not valid JSON: {err}") from None
    else:
        try:
            import yaml
        except ImportError:  # pragma: no cover - pyyaml is in the k8s extra
            raise ConfigError(
                "reading YAML configs needs PyYAML: pip install 'nbcluster[k8s]' "
                "(or write the config as JSON)"
            ) from None
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as err:
            raise ConfigError(f"{p.name}: not valid YAML: {err}") from None
    return parse_config(data, source=p.name)


def parse_config(data: Any, *, source: str = "config") -> ClusterConfig:
    """Validate plain data (what YAML or JSON gives) into a :class:`ClusterConfig`."""
    if not isinstance(data, Mapping):
        raise ConfigError(
            f"{source}: the config must be a mapping of keys to values, got {_kind(data)}; "
            "start from the example in nbcluster.autoscaler.config's docstring"
        )
    _check_keys(data, _TOP_KEYS, "")
    for key in ("cluster_name", "provider", "available_node_types"):
        if key not in data:
            raise ConfigError(f"missing {key!r}: {_TOP_KEYS[key]}")
    name = data["cluster_name"]
    if not isinstance(name, str) or not _NAME_RE.fullmatch(name):
        raise ConfigError(
            f"'cluster_name' must be 1-40 lowercase letters, digits or '-' (starting and ending "
            f"with a letter or digit), got {name!r}"
        )
    max_workers = _int(data, "max_workers", "", default=2)
    provider = _provider(data["provider"])
    types = _node_types(data["available_node_types"], max_workers)
    head_type = data.get("head_node_type")
    if head_type is not None and head_type not in types:
        raise ConfigError(
            f"'head_node_type' is {head_type!r}, which is not in available_node_types "
            f"({', '.join(sorted(types))})"
        )
    workers = {k: v for k, v in types.items() if k != head_type}
    for tname, t in workers.items():
        if not t.resources:
            raise ConfigError(
                f"available_node_types.{tname}.resources offers nothing: give at least one "
                "amount > 0, e.g. {CPU: 1} (only the head's type may offer nothing)"
            )
    if not workers:
        raise ConfigError(
            "available_node_types has no worker type (only the head's): add one, e.g. "
            "cpu2: {resources: {CPU: 2}, max_workers: 2}"
        )
    if provider["type"] == "hosts" and max_workers > len(provider["worker_ips"]):
        raise ConfigError(
            f"max_workers is {max_workers} but provider.worker_ips lists only "
            f"{len(provider['worker_ips'])} machine(s): lower max_workers or add worker_ips"
        )
    min_total = sum(t.min_workers for t in workers.values())
    if min_total > max_workers:
        raise ConfigError(
            f"the node types' min_workers add up to {min_total}, more than max_workers "
            f"({max_workers}); raise max_workers or lower a min_workers"
        )
    head = data.get("head", {})
    if not isinstance(head, Mapping):
        raise ConfigError(
            f"'head' must be a mapping like {{host: 127.0.0.1, port: 6380}}, got {_kind(head)}"
        )
    _check_keys(head, _HEAD_KEYS, "head.")
    host = head.get("host", provider.get("head_ip", "127.0.0.1"))
    if not isinstance(host, str) or not host:
        raise ConfigError(f"'head.host' must be an address, got {host!r}")
    auth = data.get("auth", {})
    if not isinstance(auth, Mapping):
        raise ConfigError(f"'auth' must be a mapping like {{ssh_user: me}}, got {_kind(auth)}")
    _check_keys(auth, _AUTH_KEYS, "auth.")
    cfg = ClusterConfig(
        cluster_name=name,
        provider=provider,
        available_node_types=types,
        max_workers=max_workers,
        upscaling_speed=_num(data, "upscaling_speed", "", default=1.0),
        idle_timeout_minutes=_num(data, "idle_timeout_minutes", "", default=5.0),
        auth=dict(auth),
        head_node_type=head_type,
        setup_commands=_commands(data, "setup_commands"),
        head_setup_commands=_commands(data, "head_setup_commands"),
        worker_setup_commands=_commands(data, "worker_setup_commands"),
        head_host=host,
        head_port=_int(head, "port", "head.", default=0, high=65535),
        update_interval_s=_num(data, "update_interval_s", "", default=1.0, positive=True),
        launch_timeout_s=_num(data, "launch_timeout_s", "", default=120.0, positive=True),
        launch_backoff_s=_num(data, "launch_backoff_s", "", default=5.0),
        launch_backoff_max_s=_num(data, "launch_backoff_max_s", "", default=300.0),
    )
    if cfg.launch_backoff_max_s < cfg.launch_backoff_s:
        raise ConfigError(
            f"'launch_backoff_max_s' ({cfg.launch_backoff_max_s:g}) must be at least "
            f"'launch_backoff_s' ({cfg.launch_backoff_s:g})"
        )
    return cfg


# -- pieces ---------------------------------------------------------------------------------------
def _kind(value: Any) -> str:
    if value is None:
        return "nothing (null)"
    return f"{type(value).__name__} {value!r:.60}"


def _check_keys(data: Mapping[str, Any], known: Mapping[str, str], prefix: str) -> None:
    for key in data:
        if not isinstance(key, str):
            raise ConfigError(
                f"keys must be strings, got {key!r} under {prefix or 'the top level'}"
            )
        if key not in known:
            close = difflib.get_close_matches(key, list(known), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            valid = ", ".join(sorted(known))
            raise ConfigError(f"unknown key {prefix + key!r}{hint} (valid keys: {valid})")


def _int(
    data: Mapping[str, Any],
    key: str,
    prefix: str,
    *,
    default: int,
    low: int = 0,
    high: int | None = None,
) -> int:
    value = data.get(key, default)
    if type(value) is not int or value < low or (high is not None and value > high):
        bound = f"from {low} to {high}" if high is not None else f">= {low}"
        raise ConfigError(f"{prefix + key!r} must be a whole number {bound}, got {_kind(value)}")
    return value


def _num(
    data: Mapping[str, Any], key: str, prefix: str, *, default: float, positive: bool = False
) -> float:
    value = data.get(key, default)
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    if not ok or not math.isfinite(value) or value < 0 or (positive and value == 0):
        rule = "> 0" if positive else ">= 0"
        raise ConfigError(f"{prefix + key!r} must be a number {rule}, got {_kind(value)}")
    return float(value)


def _commands(data: Mapping[str, Any], key: str) -> tuple[str, ...]:
    value = data.get(key, [])
    if isinstance(value, str) or not isinstance(value, Sequence):
        raise ConfigError(f"{key!r} must be a list of shell commands, got {_kind(value)}")
    for i, cmd in enumerate(value):
        if not isinstance(cmd, str) or not cmd.strip():
            raise ConfigError(f"{key}[{i}] must be a non-empty command string, got {_kind(cmd)}")
    return tuple(value)


def _resources(value: Any, where: str) -> dict[str, float]:
    if not isinstance(value, Mapping):
        raise ConfigError(
            f"{where!r} must be a mapping of resource name to amount, e.g. {{CPU: 2}}, got "
            f"{_kind(value)}"
        )
    out: dict[str, float] = {}
    for name, amount in value.items():
        if not isinstance(name, str) or not name:
            raise ConfigError(f"{where!r}: resource names must be strings, got {name!r}")
        if "_group_" in name:
            raise ConfigError(f"{where}.{name}: names containing '_group_' are reserved")
        ok = isinstance(amount, int | float) and not isinstance(amount, bool)
        if not ok or not math.isfinite(amount) or amount < 0:
            raise ConfigError(f"{where}.{name} must be a number >= 0, got {_kind(amount)}")
        if amount > 0:
            out[name] = float(amount)
    return out


def _node_types(value: Any, max_workers: int) -> dict[str, NodeTypeConfig]:
    if not isinstance(value, Mapping) or not value:
        raise ConfigError(
            "'available_node_types' must be a non-empty mapping of type name to settings, e.g. "
            f"{{cpu2: {{resources: {{CPU: 2}}, max_workers: 2}}}}, got {_kind(value)}"
        )
    out: dict[str, NodeTypeConfig] = {}
    for name, spec in value.items():
        where = f"available_node_types.{name}"
        if not isinstance(name, str) or not _TYPE_NAME_RE.fullmatch(name):
            raise ConfigError(
                f"node type name {name!r} must be letters, digits, '-', '_' or '.' "
                "(starting and ending with a letter or digit)"
            )
        if not isinstance(spec, Mapping):
            raise ConfigError(f"{where!r} must be a mapping, got {_kind(spec)}")
        _check_keys(spec, _NODE_TYPE_KEYS, where + ".")
        if "resources" not in spec:
            raise ConfigError(f"{where}: missing 'resources' ({_NODE_TYPE_KEYS['resources']})")
        resources = _resources(spec["resources"], where + ".resources")
        lo = _int(spec, "min_workers", where + ".", default=0)
        hi = _int(spec, "max_workers", where + ".", default=max_workers)
        if lo > hi:
            raise ConfigError(f"{where}: min_workers ({lo}) is larger than max_workers ({hi})")
        node_config = spec.get("node_config", {})
        if not isinstance(node_config, Mapping):
            raise ConfigError(f"{where}.node_config must be a mapping, got {_kind(node_config)}")
        store = spec.get("object_store_memory")
        if store is not None and (type(store) is not int or store <= 0):
            raise ConfigError(
                f"{where}.object_store_memory must be a whole number of bytes > 0, got "
                f"{_kind(store)}"
            )
        out[name] = NodeTypeConfig(name, resources, lo, hi, dict(node_config), store)
    return out


def _provider(value: Any) -> dict[str, Any]:
    if not isinstance(value, Mapping) or "type" not in value:
        raise ConfigError(
            f"'provider' must be a mapping with a 'type' ({' | '.join(PROVIDER_TYPES)}), got "
            f"{_kind(value)}"
        )
    ptype = value["type"]
    if ptype not in PROVIDER_TYPES:
        close = difflib.get_close_matches(str(ptype), PROVIDER_TYPES, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise ConfigError(
            f"'provider.type' is {ptype!r}{hint}; nbcluster has: {', '.join(PROVIDER_TYPES)}"
        )
    _check_keys(value, _PROVIDER_KEYS[ptype], "provider.")
    out = dict(value)
    if ptype == "hosts":
        for key in ("head_ip", "worker_ips"):
            if key not in value:
                raise ConfigError(
                    f"provider type 'hosts' needs 'provider.{key}': {_PROVIDER_KEYS['hosts'][key]}"
                )
        ips = value["worker_ips"]
        if isinstance(ips, str) or not isinstance(ips, Sequence) or not ips:
            raise ConfigError(
                f"'provider.worker_ips' must be a non-empty list of addresses, got {_kind(ips)}"
            )
        for i, ip in enumerate(ips):
            if not isinstance(ip, str) or not ip or any(c.isspace() for c in ip):
                raise ConfigError(f"provider.worker_ips[{i}] must be an address, got {_kind(ip)}")
        if len(set(ips)) != len(ips):
            raise ConfigError("'provider.worker_ips' lists an address twice")
        out["worker_ips"] = list(ips)
        prefix = value.get("command_prefix")
        if prefix is not None:
            lists = list(prefix.values()) if isinstance(prefix, Mapping) else [prefix]
            for argv in lists:
                if isinstance(argv, str) or not isinstance(argv, Sequence) or not argv:
                    raise ConfigError(
                        "'provider.command_prefix' must be a non-empty list of words (or a "
                        f"mapping of address to such lists), got {_kind(prefix)}"
                    )
                if not all(isinstance(w, str) for w in argv):
                    raise ConfigError("'provider.command_prefix' words must be strings")
            if isinstance(prefix, Mapping):
                missing = [ip for ip in ips if ip not in prefix]
                if missing:
                    raise ConfigError(f"'provider.command_prefix' has no entry for {missing[0]}")
    if ptype == "kubernetes" and "namespace" in value:
        ns = value["namespace"]
        if not isinstance(ns, str) or not _NAME_RE.fullmatch(ns):
            raise ConfigError(
                f"'provider.namespace' must be a Kubernetes namespace name, got {ns!r}"
            )
    return out
