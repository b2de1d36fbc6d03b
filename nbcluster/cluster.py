"""``LocalCluster``: a head and node managers as processes on this host.

The processes watch a pipe whose write end only this object holds: when the owning
process exits for any reason (also ``SIGKILL``), the pipe closes and they shut down
(no reliance on ``atexit``). :meth:`LocalCluster.stop` ends them by PID.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import time
import warnings
from pathlib import Path
from typing import Any

from nbcluster._runtime import proc
from nbcluster._runtime.protocol.tls import TlsSettings, make_cluster_certificates

__all__ = [
    "LocalCluster",
    "exposure_warning",
    "find_session",
    "own_sessions",
    "signallable",
    "trusted_session",
]


class LocalCluster:
    """A cluster of processes on this machine: one head and ``nodes`` node managers.

    ``LocalCluster(num_cpus=4).start()`` returns once the head and every node are serving;
    ``address`` is then the head's ``host:port`` and ``token_file`` the token's path.
    With ``detached=True`` the processes outlive this object's process (the CLI uses it).
    With ``tls=True`` a fresh CA and cluster certificate are made in ``<session>/tls`` and
    every process of the cluster talks TLS (``tls_env`` is what other processes then need);
    TLS files already named by ``NBCLUSTER_TLS_*`` variables are used as they are.
    """

    def __init__(
        self,
        *,
        num_cpus: float | None = None,
        num_gpus: float | None = None,
        resources: dict[str, float] | None = None,
        object_store_memory: int | None = None,
        nodes: int = 1,
        host: str = "127.0.0.1",
        port: int = 0,
        detached: bool = False,
        temp_dir: str | None = None,
        env: dict[str, str] | None = None,
        token: str | None = None,
        node_configs: list[dict[str, Any]] | None = None,
        max_nodes: int | None = None,
        idle_timeout_s: float | None = None,
        autoscaler_config: dict[str, Any] | None = None,
        tls: bool = False,
    ) -> None:
        if node_configs is not None:
            nodes = len(node_configs)
        if nodes < 1:
            raise ValueError(f"nodes must be >= 1, got {nodes}")
        for cfg in node_configs or []:
            bad = set(cfg) - {"num_cpus", "num_gpus", "resources", "object_store_memory", "name"}
            if bad:
                raise ValueError(
                    f"unknown node_configs key(s) {sorted(bad)}; valid: num_cpus, num_gpus, "
                    "resources, object_store_memory, name"
                )
        if max_nodes is not None and (type(max_nodes) is not int or max_nodes < nodes):
            raise ValueError(
                f"max_nodes must be a whole number >= nodes ({nodes}), got {max_nodes!r}: the "
                "cluster starts with `nodes` node managers and the autoscaler adds up to max_nodes"
            )
        if idle_timeout_s is not None and not (
            isinstance(idle_timeout_s, int | float) and 0 <= idle_timeout_s < float("inf")
        ):
            raise ValueError(f"idle_timeout_s must be a number >= 0, got {idle_timeout_s!r}")
        self.max_nodes = max_nodes
        self.idle_timeout_s = idle_timeout_s
        self.autoscaler_config = autoscaler_config
        self.monitor: subprocess.Popen[bytes] | None = None
        self.node_configs = list(node_configs or [])
        self.num_cpus = num_cpus
        self.num_gpus = num_gpus
        self.resources = dict(resources or {})
        self.object_store_memory = object_store_memory
        self.num_nodes = nodes
        self.host = host
        self.port = port
        self.detached = detached
        self.temp_dir = temp_dir
        self.env = dict(env or {})
        self.tls = tls
        self._token = token
        self.session_dir: Path | None = None
        self.token_file: Path | None = None
        self.address = ""
        self.head: subprocess.Popen[bytes] | None = None
        self.nodes: list[subprocess.Popen[bytes]] = []
        self._pipe_w = -1
        self._pipe_r = -1

    # -- starting ----------------------------------------------------------------------------
    def start(self, timeout: float = 60.0) -> LocalCluster:
        """Start the processes and wait until every node has registered."""
        from nbcluster.config import Config

        config = Config.from_env({**os.environ, **self.env})
        given_tls = TlsSettings.from_env({**os.environ, **self.env})
        exposed = exposure_warning(self.host, tls=self.tls or given_tls is not None)
        if exposed:  # on the terminal (or under the cell), not only in a log
            warnings.warn(exposed, stacklevel=2)
        self.session_dir = proc.new_session_dir(self.temp_dir or config.temp_dir)
        proc.create_token_file(
            self.session_dir, self._token or os.environ.get("NBCLUSTER_TOKEN") or None
        )
        self.token_file = self.session_dir / proc.TOKEN_FILE
        if self.tls and given_tls is None:
            made = make_cluster_certificates(self.session_dir / "tls", hosts=[self.host])
            self.env.update(made.env())
        if not self.detached:
            self._pipe_r, self._pipe_w = os.pipe()
            os.set_inheritable(self._pipe_r, True)
        env = {**os.environ, **self.env}
        common = ["--session-dir", str(self.session_dir), "--token-file", str(self.token_file)]
        external = [] if proc_is_loopback(self.host) else ["--allow-external"]
        self.head = self._spawn(
            "nbcluster._runtime.head.main",
            [*common, "--host", self.host, "--port", str(self.port), *external],
            env,
        )
        for i in range(self.num_nodes):
            self.nodes.append(
                self._spawn("nbcluster._runtime.node.main", [*common, *self._node_args(i)], env)
            )
        try:
            head = self.head
            self.address = proc.wait_for_file(
                self.session_dir / proc.HEAD_ADDRESS_FILE,
                timeout,
                alive=lambda: head.poll() is None,
            ).strip()
            self._wait_nodes(timeout)
            self._start_autoscaler(config, env)
        except BaseException:
            self.stop()
            raise
        if self.detached:
            self._write_pids()
        return self

    def _start_autoscaler(self, config: Any, env: dict[str, str]) -> None:
        """Start the autoscaler (``nbcluster.autoscaler.monitor``) beside the head: with
        ``autoscaler_config`` (a cluster config, ``nbcluster up``), or with ``max_nodes``
        (local provider: node managers like the first one, added under load, removed idle)."""
        cfg = self.autoscaler_config
        if cfg is None:
            max_nodes = self.max_nodes if self.max_nodes is not None else config.autoscale_max_nodes
            if not max_nodes or max_nodes <= self.num_nodes:
                return
            from nbcluster.autoscaler.local import local_cluster_config

            idle = self.idle_timeout_s
            if idle is None:
                idle = config.autoscale_idle_timeout_s
            cfg = local_cluster_config(
                max_workers=max_nodes - self.num_nodes,
                idle_timeout_s=idle,
                num_cpus=self.num_cpus,
                num_gpus=self.num_gpus,
                resources=self.resources,
                object_store_memory=self.object_store_memory,
            )
        assert self.session_dir is not None and self.token_file is not None
        path = self.session_dir / "autoscaler" / "cluster.json"
        path.parent.mkdir(exist_ok=True)
        path.write_text(json.dumps(cfg))
        args = ["--config", str(path), "--head-address", self.address]
        if cfg.get("provider", {}).get("type") == "local" and not self.detached:
            args.append("--stop-nodes-on-exit")  # they are this cluster's processes
        self.monitor = self._spawn(
            "nbcluster.autoscaler.monitor",
            ["--session-dir", str(self.session_dir), "--token-file", str(self.token_file), *args],
            env,
        )

    def _node_args(self, index: int) -> list[str]:
        cfg = self.node_configs[index] if index < len(self.node_configs) else {}
        num_cpus = cfg.get("num_cpus", self.num_cpus)
        num_gpus = cfg.get("num_gpus", self.num_gpus)
        resources = cfg.get("resources", self.resources)
        store = cfg.get("object_store_memory", self.object_store_memory)
        args = ["--host", self.host]
        if num_cpus is not None:
            args += ["--num-cpus", str(num_cpus)]
        if num_gpus is not None:
            args += ["--num-gpus", str(num_gpus)]
        if resources:
            args += ["--resources", json.dumps(resources)]
        if store:
            args += ["--object-store-memory", str(int(store))]
        if cfg.get("name"):
            args += ["--node-name", str(cfg["name"])]
        elif self.num_nodes > 1:
            args += ["--node-name", f"node{index}"]
        if not proc_is_loopback(self.host):
            args.append("--allow-external")
        return args

    def _spawn(self, module: str, args: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
        assert self.session_dir is not None
        name = module.split(".")[-2]
        log = open(self.session_dir / "logs" / f"{name}.out", "ab")  # noqa: SIM115 - closed below
        fds: tuple[int, ...] = ()
        if self._pipe_r >= 0:
            args = [*args, "--parent-fd", str(self._pipe_r)]
            fds = (self._pipe_r,)
        try:
            return subprocess.Popen(
                [sys.executable, "-m", module, *args],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                env=env,
                pass_fds=fds,
                start_new_session=True,
            )
        finally:
            log.close()

    def _wait_nodes(self, timeout: float, watch: list[Any] | None = None) -> None:
        assert self.session_dir is not None
        deadline = time.monotonic() + timeout
        nodes_dir = self.session_dir / "nodes"
        delay = 0.002
        while True:
            if nodes_dir.exists() and len(list(nodes_dir.glob("*.json"))) >= self.num_nodes:
                return
            for p in watch if watch is not None else [self.head, *self.nodes]:
                if p is not None and p.poll() is not None:
                    raise RuntimeError(
                        f"a cluster process exited during start-up (code {p.returncode}); "
                        f"see the logs in {self.session_dir / 'logs'}"
                    )
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"the cluster did not start within {timeout:.0f}s; logs: {self.session_dir}/logs"
                )
            time.sleep(delay)
            delay = min(delay * 1.5, 0.02)

    def _write_pids(self) -> None:
        assert self.session_dir is not None
        pids = {"head": self.head.pid if self.head else 0, "nodes": [p.pid for p in self.nodes]}
        proc.write_atomic(self.session_dir / "pids.json", json.dumps(pids))

    # -- info --------------------------------------------------------------------------------
    @property
    def tls_env(self) -> dict[str, str]:
        """The ``NBCLUSTER_TLS_*`` variables a driver or joining node needs ({} without TLS)."""
        found = TlsSettings.from_env({**os.environ, **self.env})
        return found.env() if found is not None else {}

    @property
    def token(self) -> str:
        """The cluster token (keep it secret: it lets anyone run code as you)."""
        assert self.token_file is not None
        return proc.read_token(self.token_file)

    def node_addresses(self) -> list[str]:
        """Addresses of this cluster's node managers."""
        assert self.session_dir is not None
        return [
            json.loads(p.read_text())["address"]
            for p in sorted((self.session_dir / "nodes").glob("*.json"))
        ]

    def pids(self) -> list[int]:
        """PIDs of the head and node processes."""
        return [p.pid for p in [self.head, *self.nodes] if p is not None]

    def add_node(self, timeout: float = 60.0, **kwargs: Any) -> subprocess.Popen[bytes]:
        """Start one more node manager in this cluster."""
        assert self.session_dir is not None and self.token_file is not None
        before = self.num_nodes
        self.num_nodes += 1
        args = ["--session-dir", str(self.session_dir), "--token-file", str(self.token_file)]
        args += self._node_args(before)
        for k, v in kwargs.items():
            args += [f"--{k.replace('_', '-')}", str(v)]
        nodes_dir = self.session_dir / "nodes"
        before = set(nodes_dir.glob("*.json"))
        p = self._spawn("nbcluster._runtime.node.main", args, {**os.environ, **self.env})
        self.nodes.append(p)
        self._wait_new_node(before, timeout, p)
        return p

    def _wait_new_node(
        self, before: set[Path], timeout: float, new: subprocess.Popen[bytes]
    ) -> None:
        assert self.session_dir is not None
        deadline = time.monotonic() + timeout
        nodes_dir = self.session_dir / "nodes"
        while not set(nodes_dir.glob("*.json")) - before:
            if new.poll() is not None:
                raise RuntimeError(f"the new node exited during start-up (code {new.returncode})")
            if time.monotonic() > deadline:
                raise TimeoutError(f"the new node did not start within {timeout:.0f}s")
            time.sleep(0.01)

    def kill_head(self) -> None:
        """SIGKILL the head process (fault-injection for tests; nodes keep running)."""
        if self.head is not None and self.head.poll() is None:
            self.head.kill()
            self.head.wait(10)

    def restart_head(self, timeout: float = 30.0) -> None:
        """Start the head again on the same address; it recovers its state from SQLite."""
        assert self.session_dir is not None and self.token_file is not None
        self.kill_head()
        host, _, port = self.address.rpartition(":")
        (self.session_dir / proc.HEAD_ADDRESS_FILE).unlink(missing_ok=True)
        args = ["--session-dir", str(self.session_dir), "--token-file", str(self.token_file)]
        args += ["--host", host.strip("[]"), "--port", port]
        if not proc_is_loopback(self.host):
            args.append("--allow-external")
        self.head = self._spawn("nbcluster._runtime.head.main", args, {**os.environ, **self.env})
        head = self.head
        proc.wait_for_file(
            self.session_dir / proc.HEAD_ADDRESS_FILE, timeout, alive=lambda: head.poll() is None
        )

    def remove_node(self, timeout: float = 10.0) -> None:
        """Stop the most recently added node manager (never the last one)."""
        if len(self.nodes) <= 1:
            raise ValueError("a cluster keeps at least one node; use stop() to end it")
        # Never the node this process's driver is attached to (its objects live there).
        from nbcluster._runtime import context

        client = context.current_client()
        mine = getattr(client, "node_address", "")
        by_pid = {}
        if self.session_dir is not None:
            for f in (self.session_dir / "nodes").glob("*.json"):
                try:
                    d = json.loads(f.read_text())
                    by_pid[int(d["pid"])] = d["address"]
                except (OSError, ValueError, KeyError):
                    continue
        victim = next(
            (q for q in reversed(self.nodes) if not mine or by_pid.get(q.pid) != mine),
            self.nodes[-1],
        )
        self.nodes.remove(victim)
        p = victim
        self.num_nodes -= 1
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(5)

    def scale(self, nodes: int, timeout: float = 60.0) -> None:
        """Add or remove node managers until the cluster has ``nodes`` of them."""
        if nodes < 1:
            raise ValueError(f"a cluster needs at least one node, got {nodes}")
        while len(self.nodes) < nodes:
            self.add_node(timeout)
        while len(self.nodes) > nodes:
            self.remove_node()

    # -- stopping ----------------------------------------------------------------------------
    def stop(self, grace: float = 3.0) -> None:
        """End every process of the cluster (SIGTERM, then SIGKILL after ``grace`` seconds)."""
        if self.monitor is not None:  # first, so it launches nothing more; it stops its nodes
            if self.monitor.poll() is None:
                self.monitor.send_signal(signal.SIGTERM)
            try:
                self.monitor.wait(grace + 15)
            except subprocess.TimeoutExpired:
                self.monitor.kill()
                self.monitor.wait(5)
            self.monitor = None
        procs = [p for p in [*self.nodes, self.head] if p is not None]
        for p in procs:
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace
        for p in procs:
            try:
                p.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    p.kill()
                p.wait(5)
        for fd in (self._pipe_w, self._pipe_r):
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self._pipe_w = self._pipe_r = -1
        self.nodes = []
        self.head = None
        self._remove_stores()

    def _remove_stores(self) -> None:
        """Delete what killed node managers left in shared memory (a node stopped cleanly
        removes its own store; one that was SIGKILLed cannot, and /dev/shm is RAM)."""
        if self.session_dir is None or self.detached:
            return
        from nbcluster.config import Config

        base = Config.from_env({**os.environ, **self.env}).store_base_dir
        stores = Path(base) / f"nbcluster-{self.session_dir.name}"
        if stores.is_dir() and not stores.is_symlink() and stores.stat().st_uid == os.geteuid():
            shutil.rmtree(stores, ignore_errors=True)

    def __enter__(self) -> LocalCluster:
        return self.start() if self.head is None else self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"LocalCluster(address={self.address!r}, nodes={self.num_nodes})"


def exposure_warning(host: str, tls: bool = False) -> str | None:
    """The warning for a listener beyond loopback without TLS (None when there is none)."""
    if proc_is_loopback(host) or tls:
        return None
    return (
        f"listening on {host}, beyond this machine, without TLS: the cluster token and all "
        "data (pickled functions and objects) cross the network in clear text, and anyone who "
        "sees the token can run code as you. Use it only on a network you trust."
    )


def proc_is_loopback(host: str) -> bool:
    """True for loopback addresses (the only ones bound without an explicit opt-in)."""
    from nbcluster._runtime.protocol.rpc import is_loopback

    return is_loopback(host)


def trusted_session(path: Path) -> bool:
    """Whether a session directory may be used: a real directory (not a symlink) that this
    user owns and that nobody else can write.

    In a root shared by several users (``/tmp/nbcluster``) anyone can create a
    ``session_*`` directory; one that another user made (or could change) could point this
    user's driver, ``nbcluster stop`` or ``%cluster connect`` at a head of their choosing,
    or at PIDs to signal.
    """
    try:
        st = path.lstat()
    except OSError:
        return False
    return (
        stat.S_ISDIR(st.st_mode)
        and st.st_uid == os.geteuid()
        and not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
    )


def signallable(pid: int) -> bool:
    """True when ``pid`` exists and this user may signal it.

    A PID this user cannot signal is not the head of one of its sessions (that PID was
    reused by another user's process), so it does not count as alive.
    """
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except OSError:  # ProcessLookupError, or PermissionError: someone else's process
        return False
    return True


def own_sessions(temp_dir: str) -> list[Path]:
    """This user's trusted session directories under ``temp_dir``, newest first."""
    base = Path(temp_dir)
    try:
        found = [p for p in base.glob("session_*") if trusted_session(p)]
    except OSError:
        return []

    def mtime(p: Path) -> float:
        try:
            return p.stat().st_mtime
        except OSError:
            return 0.0

    return sorted(found, key=mtime, reverse=True)


def find_session(address: str | None, temp_dir: str) -> Path | None:
    """The session directory of a cluster on this host.

    ``address`` None or ``"auto"``: the newest session whose head is alive; otherwise the
    session whose head listens on ``address``. Only this user's trusted session
    directories count (:func:`trusted_session`), and only a head PID this user can signal.
    """
    for s in own_sessions(temp_dir):
        try:
            head_pid = int((s / "head.pid").read_text())
            head_address = (s / proc.HEAD_ADDRESS_FILE).read_text().strip()
        except (OSError, ValueError):
            continue
        if not signallable(head_pid):
            continue
        if address in (None, "auto") or head_address == address:
            return s
    return None
