"""``hosts``: a fixed list of machines reached over SSH.

``provider: {type: hosts, head_ip: 10.0.0.1, worker_ips: [10.0.0.2, 10.0.0.3]}`` plus
``auth: {ssh_user: me, ssh_private_key: ~/.ssh/id_ed25519}``. One node per machine; the
instance id is the machine's address. Launching a node on a machine means: run the setup
commands there, copy the cluster token into a private file there (over stdin, never on a
command line), then ``python3 -m nbcluster.cli start --address HEAD --node-name IP --host IP
--token-file FILE``, which returns once the node has registered with the head. Terminating
it runs ``python3 -m nbcluster.autoscaler.hostcmd stop --node-name IP`` there.

Commands go through a :class:`CommandRunner`: :class:`SSHCommandRunner` in production,
or ``provider.command_prefix`` (an argv prefix such as ``docker exec {host}``; the tests use
``ip netns exec <namespace>`` for the network-namespace hosts of ``tests/multinode``). Which machines are in use, and their tags, is kept in
``<session>/autoscaler/hosts-nodes.json`` on the head's machine.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import shlex
import subprocess
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from nbcluster.autoscaler.providers.base import NodeProvider, ProviderError, matches
from nbcluster.autoscaler.providers.local import node_args

__all__ = ["CommandRunner", "HostsNodeProvider", "PrefixCommandRunner", "SSHCommandRunner"]

STATE_FILE = "hosts-nodes.json"


class CommandRunner:
    """Runs an argv on a host and returns the completed process."""

    def run(
        self, host: str, argv: Sequence[str], *, input: str | None = None, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` on ``host`` (blocking)."""
        raise NotImplementedError


class PrefixCommandRunner(CommandRunner):
    """Runs ``prefix(host) + argv`` locally, e.g. ``["ip", "netns", "exec", ns]``."""

    def __init__(
        self, prefix: Callable[[str], Sequence[str]], env: Mapping[str, str] | None = None
    ) -> None:
        self.prefix = prefix
        self.env = dict(env) if env is not None else None

    def run(
        self, host: str, argv: Sequence[str], *, input: str | None = None, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*self.prefix(host), *argv],
            input=input,
            capture_output=True,
            text=True,
            timeout=timeout,
            env=self.env,
            stdin=None if input is not None else subprocess.DEVNULL,
        )


class SSHCommandRunner(CommandRunner):
    """Runs commands over ``ssh`` (BatchMode: keys only, no password prompts)."""

    def __init__(self, user: str = "", key: str = "", port: int = 22) -> None:
        self.user = user
        self.key = os.path.expanduser(key) if key else ""
        self.port = port

    def ssh_argv(self, host: str) -> list[str]:
        """The ``ssh ... host --`` prefix."""
        argv = ["ssh", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=accept-new"]
        argv += ["-o", "ConnectTimeout=10", "-p", str(self.port)]
        if self.key:
            argv += ["-i", self.key]
        return [*argv, f"{self.user}@{host}" if self.user else host, "--"]

    def run(
        self, host: str, argv: Sequence[str], *, input: str | None = None, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*self.ssh_argv(host), shlex.join(argv)],
            input=input,
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=None if input is not None else subprocess.DEVNULL,
        )


def _prefix(spec: Any) -> Callable[[str], list[str]]:
    """``provider.command_prefix`` as a function of the host."""
    if isinstance(spec, Mapping):
        return lambda host: list(spec[host])
    return lambda host: [w.replace("{host}", host) for w in spec]


class HostsNodeProvider(NodeProvider):
    """One node manager per machine of ``provider.worker_ips`` (see the module docstring)."""

    provider_type = "hosts"

    def __init__(
        self,
        provider_config: Mapping[str, Any],
        cluster_name: str,
        *,
        session_dir: str | os.PathLike[str],
        token: str,
        head_address: str,
        runner: CommandRunner | None = None,
        auth: Mapping[str, Any] | None = None,
        setup_commands: tuple[str, ...] = (),
        start_timeout_s: float = 90.0,
    ) -> None:
        super().__init__(provider_config, cluster_name)
        auth = auth or {}
        if runner is None and provider_config.get("command_prefix"):
            runner = PrefixCommandRunner(_prefix(provider_config["command_prefix"]))
        self.runner = runner or SSHCommandRunner(
            str(auth.get("ssh_user", "")),
            str(auth.get("ssh_private_key", "")),
            int(auth.get("ssh_port", 22)),
        )
        self.token = token
        self.head_address = head_address
        self.worker_ips = list(provider_config["worker_ips"])
        self.python = str(provider_config.get("python", "python3"))
        self.setup_commands = setup_commands
        self.start_timeout_s = start_timeout_s
        self.dir = Path(session_dir) / "autoscaler"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.path = self.dir / STATE_FILE
        self.lock = threading.Lock()
        self.reserved: set[str] = set()

    def _load(self) -> dict[str, dict[str, Any]]:
        try:
            data = json.loads(self.path.read_text())
        except (FileNotFoundError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def _save(self, nodes: Mapping[str, Any]) -> None:
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(nodes, indent=1, sort_keys=True))
        os.replace(tmp, self.path)

    def _token_path(self) -> str:
        return f"~/.nbcluster/{self.cluster_name}.token"

    # -- NodeProvider ------------------------------------------------------------------------
    def create_node(
        self, node_config: Mapping[str, Any], tags: Mapping[str, str], count: int
    ) -> list[str]:
        with self.lock:
            used = set(self._load()) | self.reserved
            free = [ip for ip in self.worker_ips if ip not in used][:count]
            self.reserved |= set(free)
        if not free:
            raise ProviderError(
                f"all {len(self.worker_ips)} machines of provider.worker_ips are in use"
            )
        ids: list[str] = []
        errors: list[str] = []

        def start(ip: str) -> None:
            try:
                self._start(ip, node_config, tags)
                ids.append(ip)
            except ProviderError as err:
                errors.append(str(err))

        try:  # the machines start in parallel (each waits until its node has joined)
            with concurrent.futures.ThreadPoolExecutor(min(len(free), 16)) as pool:
                list(pool.map(start, free))
        finally:
            with self.lock:
                self.reserved -= set(free)
        if not ids:
            raise ProviderError(errors[0] if errors else "no machine could be started")
        return sorted(ids)

    def _run(self, ip: str, argv: Sequence[str], what: str, **kw: Any) -> str:
        try:
            r = self.runner.run(ip, argv, **kw)
        except subprocess.TimeoutExpired:
            raise ProviderError(f"{ip}: {what} timed out") from None
        except OSError as err:
            raise ProviderError(f"{ip}: {what} could not run: {err}") from None
        if r.returncode != 0:
            tail = (r.stderr or r.stdout or "").strip()[-400:]
            raise ProviderError(f"{ip}: {what} failed (exit {r.returncode}): {tail}")
        return r.stdout

    def _start(self, ip: str, node_config: Mapping[str, Any], tags: Mapping[str, str]) -> None:
        for cmd in self.setup_commands:
            self._run(ip, ["sh", "-c", cmd], f"setup command {cmd!r}", timeout=600)
        path = self._token_path()
        self._run(
            ip,
            ["sh", "-c", f"umask 077 && mkdir -p ~/.nbcluster && cat > {path}"],
            "copying the cluster token",
            input=self.token,
            timeout=30,
        )
        argv = [
            self.python,
            "-m",
            "nbcluster.cli",
            "start",
            "--address",
            self.head_address,
            "--node-name",
            ip,
            "--host",
            ip,
            "--token-file",
            path.replace("~", "$HOME", 1),
            *node_args(node_config.get("resources", {}), node_config.get("object_store_memory")),
        ]
        # `sh -c` so that $HOME expands on the host; every other word is quoted.
        words = [shlex.quote(a) if not a.startswith("$HOME") else f'"{a}"' for a in argv]
        out = self._run(
            ip, ["sh", "-c", " ".join(words)], "starting nbcluster", timeout=self.start_timeout_s
        )
        with self.lock:
            nodes = self._load()
            nodes[ip] = {"tags": dict(tags), "start_output": out.strip()[-300:]}
            self._save(nodes)

    def terminate_node(self, instance_id: str) -> None:
        self._run(
            instance_id,
            [self.python, "-m", "nbcluster.autoscaler.hostcmd", "stop", "--node-name", instance_id],
            "stopping nbcluster",
            timeout=60,
        )
        with self.lock:
            nodes = self._load()
            nodes.pop(instance_id, None)
            self._save(nodes)

    def non_terminated_nodes(self, tag_filters: Mapping[str, str]) -> list[str]:
        nodes = self._load()
        return sorted(ip for ip, rec in nodes.items() if matches(rec.get("tags", {}), tag_filters))

    def node_tags(self, instance_id: str) -> dict[str, str]:
        return dict(self._load().get(instance_id, {}).get("tags", {}))

    def set_node_tags(self, instance_id: str, tags: Mapping[str, str]) -> None:
        with self.lock:
            nodes = self._load()
            if instance_id in nodes:
                nodes[instance_id].setdefault("tags", {}).update(tags)
                self._save(nodes)
