"""``local``: worker nodes are node-manager processes on this host.

This is what ``%cluster start --max-nodes N`` uses to let a notebook's cluster grow and
shrink by itself, and what ``nbcluster up`` uses with ``provider: {type: local}``. Each
node is ``python -m nbcluster._runtime.node.main --node-name <id>`` started in its own
session; the provider remembers id, PID and tags in ``<session>/autoscaler/local-nodes.json``
so that a restarted monitor finds them again. A node only counts while its process lives
and still carries its ``--node-name`` (PIDs get reused).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from nbcluster.autoscaler.providers.base import NodeProvider, ProviderError, matches

__all__ = ["LocalNodeProvider", "node_args"]

STATE_FILE = "local-nodes.json"


def node_args(resources: Mapping[str, float], object_store_memory: int | None) -> list[str]:
    """Command-line flags of a node manager offering ``resources``."""
    args = ["--num-cpus", f"{resources.get('CPU', 0.0):g}"]
    if resources.get("GPU"):
        args += ["--num-gpus", f"{resources['GPU']:g}"]
    custom = {k: v for k, v in resources.items() if k not in ("CPU", "GPU")}
    if custom:
        args += ["--resources", json.dumps(custom, sort_keys=True)]
    if object_store_memory:
        args += ["--object-store-memory", str(int(object_store_memory))]
    return args


def _cmdline(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [p.decode(errors="replace") for p in raw.split(b"\0") if p]


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return ""


class LocalNodeProvider(NodeProvider):
    """Node managers as processes on this host (see the module docstring).

    ``parent_fd``: a pipe the nodes watch (they stop when it closes: the notebook's
    cluster dies with its kernel). ``setup_commands`` run (``sh -c``) before each node.
    """

    provider_type = "local"

    def __init__(
        self,
        provider_config: Mapping[str, Any],
        cluster_name: str,
        *,
        session_dir: str | os.PathLike[str],
        token_file: str | os.PathLike[str],
        head_address: str,
        host: str = "127.0.0.1",
        parent_fd: int = -1,
        env: Mapping[str, str] | None = None,
        setup_commands: tuple[str, ...] = (),
        python: str = sys.executable,
    ) -> None:
        super().__init__(provider_config, cluster_name)
        self.session_dir = Path(session_dir)
        self.token_file = str(token_file)
        self.head_address = head_address
        self.host = host
        self.parent_fd = parent_fd
        self.env = dict(env if env is not None else os.environ)
        self.setup_commands = setup_commands
        self.python = python
        self.dir = self.session_dir / "autoscaler"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.path = self.dir / STATE_FILE
        self.lock = threading.Lock()
        self.children: dict[str, subprocess.Popen[bytes]] = {}
        self.exit_codes: dict[str, int] = {}

    # -- state file --------------------------------------------------------------------------
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

    def _alive(self, iid: str, rec: Mapping[str, Any]) -> bool:
        child = self.children.get(iid)
        if child is not None:
            code = child.poll()
            if code is not None:
                self.exit_codes[iid] = code
                return False
            return True
        pid = int(rec.get("pid", 0))
        if pid <= 0 or _state(pid) in ("", "Z", "X"):
            return False
        cmd = _cmdline(pid)
        return "--node-name" in cmd and iid in cmd

    # -- NodeProvider ------------------------------------------------------------------------
    def create_node(
        self, node_config: Mapping[str, Any], tags: Mapping[str, str], count: int
    ) -> list[str]:
        resources = dict(node_config.get("resources", {}))
        store = node_config.get("object_store_memory")
        kind = str(tags.get("nbcluster-node-type", "worker")).lower().replace("_", "-")
        for cmd in self.setup_commands:
            self._setup(cmd)
        ids: list[str] = []
        errors: list[str] = []
        for _ in range(count):
            iid = f"{self.cluster_name}-{kind}-{secrets.token_hex(3)}"
            try:
                self._spawn(iid, resources, store, tags)
                ids.append(iid)
            except OSError as err:
                errors.append(str(err))
        if not ids and errors:
            raise ProviderError(f"could not start a node process: {errors[0]}")
        return ids

    def _setup(self, cmd: str) -> None:
        try:
            r = subprocess.run(
                ["sh", "-c", cmd],
                cwd=self.session_dir,
                env=self.env,
                capture_output=True,
                text=True,
                timeout=600,
                stdin=subprocess.DEVNULL,
            )
        except subprocess.TimeoutExpired:
            raise ProviderError(f"setup command {cmd!r} did not finish within 600s") from None
        if r.returncode != 0:
            tail = (r.stderr or r.stdout).strip()[-500:]
            raise ProviderError(f"setup command {cmd!r} failed (exit {r.returncode}): {tail}")

    def _spawn(
        self, iid: str, resources: Mapping[str, float], store: Any, tags: Mapping[str, str]
    ) -> None:
        argv = [
            self.python,
            "-m",
            "nbcluster._runtime.node.main",
            "--session-dir",
            str(self.session_dir),
            "--token-file",
            self.token_file,
            "--head-address",
            self.head_address,
            "--host",
            self.host,
            "--node-name",
            iid,
            *node_args(resources, store),
        ]
        if self.host not in ("127.0.0.1", "localhost", "::1"):
            argv.append("--allow-external")
        fds: tuple[int, ...] = ()
        if self.parent_fd >= 0:
            argv += ["--parent-fd", str(self.parent_fd)]
            fds = (self.parent_fd,)
        log_path = self.session_dir / "logs" / f"{iid}.out"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "ab") as log:
            p = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                env=self.env,
                pass_fds=fds,
                start_new_session=True,
            )
        with self.lock:
            self.children[iid] = p
            nodes = self._load()
            nodes[iid] = {"pid": p.pid, "tags": dict(tags), "log": str(log_path)}
            self._save(nodes)

    def terminate_node(self, instance_id: str) -> None:
        with self.lock:
            nodes = self._load()
            rec = nodes.get(instance_id)
        if rec is None:
            return
        if self._alive(instance_id, rec):
            pid = int(rec["pid"])
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + 10
            while self._alive(instance_id, rec) and time.monotonic() < deadline:
                time.sleep(0.05)
            if self._alive(instance_id, rec):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        child = self.children.pop(instance_id, None)
        if child is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.wait(5)
        with self.lock:
            nodes = self._load()
            nodes.pop(instance_id, None)
            self._save(nodes)

    def non_terminated_nodes(self, tag_filters: Mapping[str, str]) -> list[str]:
        with self.lock:
            nodes = self._load()
            gone = [iid for iid, rec in nodes.items() if not self._alive(iid, rec)]
            for iid in gone:
                del nodes[iid]
                self.children.pop(iid, None)
            if gone:
                self._save(nodes)
        return sorted(
            iid for iid, rec in nodes.items() if matches(rec.get("tags", {}), tag_filters)
        )

    def node_tags(self, instance_id: str) -> dict[str, str]:
        return dict(self._load().get(instance_id, {}).get("tags", {}))

    def set_node_tags(self, instance_id: str, tags: Mapping[str, str]) -> None:
        with self.lock:
            nodes = self._load()
            if instance_id in nodes:
                nodes[instance_id].setdefault("tags", {}).update(tags)
                self._save(nodes)

    def describe(self, instance_id: str) -> str:
        code = self.exit_codes.get(instance_id)
        log = self.session_dir / "logs" / f"{instance_id}.out"
        tail = ""
        with contextlib.suppress(OSError):
            lines = log.read_text(errors="replace").strip().splitlines()
            tail = lines[-1][-300:] if lines else ""
        status = f"exited with code {code}" if code is not None else "not running"
        return f"{instance_id} {status}" + (f": {tail}" if tail else "") + f" (log: {log})"
