"""``nbcluster up``, ``nbcluster down`` and ``nbcluster attach``: clusters from a config file.

    nbcluster up cluster.yaml [--block] [--token-file PATH]
    nbcluster attach cluster.yaml | --name NAME        # prints the connect code
    nbcluster down cluster.yaml | --name NAME          # workers, autoscaler, head

``up`` starts the head (and the head's node manager, shaped by ``head_node_type``) on this
machine, then the autoscaler beside it, which launches workers through the config's
provider as demand comes (and ``min_workers`` at once). On Kubernetes the head pod runs
``nbcluster up --block`` itself (``deploy/kubernetes``). ``nbcluster status`` shows the
autoscaler's node types, pending demand and recent decisions (:func:`print_status`).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from nbcluster._runtime import proc
from nbcluster.autoscaler.config import ClusterConfig, ConfigError, load_config, parse_config

__all__ = [
    "add_subcommands",
    "attach_text",
    "find_cluster",
    "print_status",
    "stop_autoscaled",
]


def _temp_dir() -> str:
    from nbcluster.config import Config

    return Config.from_env().temp_dir


def _cluster_file(session: Path) -> Path:
    return session / "autoscaler" / "cluster.json"


def find_cluster(name: str, temp_dir: str | None = None) -> Path | None:
    """The session directory of the running cluster called ``name`` on this host."""
    base = Path(temp_dir or _temp_dir())
    if not base.exists():
        return None
    sessions = sorted(base.glob("session_*"), key=lambda p: p.stat().st_mtime, reverse=True)
    for s in sessions:
        if s.is_symlink():
            continue
        try:
            cfg = json.loads(_cluster_file(s).read_text())
            head_pid = int((s / "head.pid").read_text())
        except (OSError, ValueError):
            continue
        if cfg.get("cluster_name") == name and proc.pid_alive(head_pid):
            return s
    return None


def attach_text(address: str, token_file: str, name: str = "") -> str:
    """How to connect to the cluster at ``address``: notebook and Python code."""
    title = f"cluster {name!r}" if name else "cluster"
    return "\n".join(
        [
            f"{title} at {address}",
            "In a notebook on a machine that reaches the cluster's nodes:",
            "    %load_ext nbcluster",
            f"    %cluster connect {address}",
            "From a notebook outside the cluster's network (client mode, through the head only):",
            f"    %cluster connect nbcluster://{address}",
            "In Python:",
            f"    import nbcluster; nbcluster.init(address={address!r})",
            f"The token: export NBCLUSTER_TOKEN_FILE={token_file}",
            "  (keep it secret: whoever holds it can run code on the cluster)",
        ]
    )


# -- up -------------------------------------------------------------------------------------------
def _run_setup(commands: tuple[str, ...]) -> None:
    for cmd in commands:
        r = subprocess.run(["sh", "-c", cmd], stdin=subprocess.DEVNULL, check=False)
        if r.returncode != 0:
            raise RuntimeError(f"setup command {cmd!r} failed with exit code {r.returncode}")


def cmd_up(args: argparse.Namespace) -> int:
    """``nbcluster up CONFIG``."""
    from nbcluster.cluster import LocalCluster

    try:
        cfg = load_config(args.config)
    except ConfigError as err:
        print(f"nbcluster up: {err}", file=sys.stderr)
        return 2
    if args.host:
        cfg = parse_config({**cfg.to_dict(), "head": {"host": args.host, "port": cfg.head_port}})
    if args.port is not None:
        cfg = parse_config({**cfg.to_dict(), "head": {"host": cfg.head_host, "port": args.port}})
    running = find_cluster(cfg.cluster_name)
    if running is not None:
        address = (running / proc.HEAD_ADDRESS_FILE).read_text().strip()
        print(f"nbcluster up: cluster {cfg.cluster_name!r} is already up at {address}")
        print(attach_text(address, str(running / proc.TOKEN_FILE), cfg.cluster_name))
        return 0
    token = None
    if args.token_file:
        try:
            token = proc.read_token(args.token_file)
        except OSError as err:
            print(f"nbcluster up: cannot read --token-file: {err.strerror}", file=sys.stderr)
            return 2
    try:
        _run_setup(cfg.setup_commands + cfg.head_setup_commands)
    except RuntimeError as err:
        print(f"nbcluster up: {err}", file=sys.stderr)
        return 1
    head = cfg.available_node_types.get(cfg.head_node_type or "")
    kwargs: dict[str, Any] = {}
    if head is not None:
        res = dict(head.resources)
        kwargs["num_cpus"] = res.pop("CPU", 0.0)
        kwargs["num_gpus"] = res.pop("GPU", None)
        kwargs["resources"] = res or None
        kwargs["object_store_memory"] = head.object_store_memory
    cluster = LocalCluster(
        host=cfg.head_host,
        port=cfg.head_port,
        detached=not args.block,
        token=token,
        autoscaler_config=cfg.to_dict(),
        **kwargs,
    )
    try:
        cluster.start()
    except (RuntimeError, TimeoutError, OSError) as err:
        print(f"nbcluster up: the head did not start: {err}", file=sys.stderr)
        return 1
    assert cluster.session_dir is not None and cluster.token_file is not None
    mins = {n: t.min_workers for n, t in cfg.worker_types().items() if t.min_workers}
    print(f"nbcluster up: cluster {cfg.cluster_name!r} ({cfg.provider_type} provider) is up")
    print(f"  session dir: {cluster.session_dir}")
    if mins:
        print("  launching min_workers: " + ", ".join(f"{n} x {t}" for t, n in mins.items()))
    print(attach_text(cluster.address, str(cluster.token_file), cfg.cluster_name))
    sys.stdout.flush()
    if args.block:
        done = threading.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: done.set())
        try:
            while not done.wait(0.5):
                if cluster.head is not None and cluster.head.poll() is not None:
                    print("nbcluster up: the head exited", file=sys.stderr)
                    break
        finally:
            cluster.stop()
            print("nbcluster up: stopped")
    return 0


# -- down ------------------------------------------------------------------------------------------
def _session_for(args: argparse.Namespace) -> tuple[Path | None, ClusterConfig | None, str]:
    cfg: ClusterConfig | None = None
    name = args.name or ""
    if args.config:
        try:
            cfg = load_config(args.config)
        except ConfigError as err:
            return None, None, str(err)
        name = cfg.cluster_name
    if not name:
        return None, None, "give the cluster's config file or --name NAME"
    session = find_cluster(name)
    if session is None:
        return None, cfg, f"no cluster named {name!r} is running on this host"
    if cfg is None:
        with contextlib.suppress(OSError, ValueError, ConfigError):
            cfg = parse_config(json.loads(_cluster_file(session).read_text()))
    return session, cfg, ""


def _cmdline(pid: int) -> list[str]:
    try:
        return [
            p.decode(errors="replace")
            for p in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            if p
        ]
    except OSError:
        return []


def _ours(pid: int, session: Path, marker: str) -> bool:
    cmd = _cmdline(pid)
    return any(marker in c for c in cmd) and any(
        c == str(session) or c == str(session.resolve()) for c in cmd
    )


def _terminate(pid: int, grace: float = 15.0) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while proc.pid_alive(pid) and time.monotonic() < deadline:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)
        time.sleep(0.05)
    if proc.pid_alive(pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def stop_autoscaled(session: Path, config: ClusterConfig | None = None) -> int:
    """Stop a session's autoscaler and remove the worker nodes it launched; return how
    many processes or nodes were stopped. The head is left alone."""
    from nbcluster.autoscaler.providers import TAG_NODE_KIND, get_provider

    stopped = 0
    try:
        info = json.loads((session / "autoscaler" / "monitor.json").read_text())
        pid = int(info["pid"])
    except (OSError, ValueError, KeyError):
        pid = 0
    if pid and proc.pid_alive(pid) and _ours(pid, session, "nbcluster.autoscaler.monitor"):
        _terminate(pid)
        stopped += 1
    if config is None:
        try:
            config = parse_config(json.loads(_cluster_file(session).read_text()))
        except (OSError, ValueError, ConfigError):
            return stopped
    try:
        address = (session / proc.HEAD_ADDRESS_FILE).read_text().strip()
        provider = get_provider(
            config, session_dir=session, token_file=session / proc.TOKEN_FILE, head_address=address
        )
        ids = provider.non_terminated_nodes({TAG_NODE_KIND: "worker"})
        provider.terminate_nodes(ids)
    except Exception as err:  # noqa: BLE001 - report and go on stopping the rest
        print(f"nbcluster: could not remove the worker nodes: {err}", file=sys.stderr)
        return stopped
    return stopped + len(ids)


def cmd_down(args: argparse.Namespace) -> int:
    """``nbcluster down CONFIG``: workers, autoscaler, then the head."""
    session, cfg, why = _session_for(args)
    if session is None:
        if cfg is not None and cfg.provider_type == "kubernetes":
            return _down_kubernetes(cfg)
        print(f"nbcluster down: {why}", file=sys.stderr)
        return 1
    n = stop_autoscaled(session, cfg)
    pids_file = session / "pids.json"
    try:
        pids = json.loads(pids_file.read_text())
    except (OSError, ValueError):
        pids = {}
    for pid in [*pids.get("nodes", []), pids.get("head", 0)]:
        if pid and proc.pid_alive(pid) and _ours(pid, session, "nbcluster._runtime"):
            _terminate(pid, grace=5)
            n += 1
    pids_file.unlink(missing_ok=True)
    name = cfg.cluster_name if cfg else session.name
    print(f"nbcluster down: stopped cluster {name!r} ({n} process(es) and node(s))")
    return 0


def _down_kubernetes(cfg: ClusterConfig) -> int:
    """Outside the cluster: remove the worker pods (kubeconfig credentials)."""
    from nbcluster.autoscaler.providers import TAG_NODE_KIND, ProviderError
    from nbcluster.autoscaler.providers.kubernetes import KubernetesNodeProvider

    try:
        provider = KubernetesNodeProvider({**cfg.provider, "in_cluster": False}, cfg.cluster_name)
        ids = provider.non_terminated_nodes({TAG_NODE_KIND: "worker"})
        provider.terminate_nodes(ids)
    except ProviderError as err:
        print(f"nbcluster down: {err}", file=sys.stderr)
        return 1
    print(
        f"nbcluster down: deleted {len(ids)} worker pod(s) of {cfg.cluster_name!r}; delete the "
        "head with: kubectl delete -k deploy/kubernetes"
    )
    return 0


# -- attach ----------------------------------------------------------------------------------------
def cmd_attach(args: argparse.Namespace) -> int:
    """``nbcluster attach CONFIG``: print the connect code."""
    session, cfg, why = _session_for(args)
    if session is None:
        print(f"nbcluster attach: {why}", file=sys.stderr)
        return 1
    address = (session / proc.HEAD_ADDRESS_FILE).read_text().strip()
    print(attach_text(address, str(session / proc.TOKEN_FILE), cfg.cluster_name if cfg else ""))
    return 0


# -- status ----------------------------------------------------------------------------------------
def print_status() -> None:
    """The autoscaler's part of ``nbcluster status`` (a connected driver is needed)."""
    from nbcluster import state

    try:
        st = state.autoscaler_status()
    except Exception as err:  # noqa: BLE001 - status must print what it can
        print(f"autoscaler: could not be read ({err})")
        return
    print(st.format())


def add_subcommands(subparsers: Any) -> None:
    """Register ``up``, ``down`` and ``attach`` on the ``nbcluster`` command."""
    p = subparsers.add_parser(
        "up", help="start a cluster from a config file (head + autoscaler)", description=__doc__
    )
    p.add_argument("config", help="cluster config (YAML or JSON)")
    p.add_argument("--block", action="store_true", help="stay in the foreground; Ctrl-C stops")
    p.add_argument("--token-file", default="", help="use this token (default: a new one)")
    p.add_argument("--host", default="", help="address the head listens on (overrides head.host)")
    p.add_argument("--port", type=int, default=None, help="head port (overrides head.port)")
    p.set_defaults(fn=cmd_up)
    for name, fn, text in (
        ("down", cmd_down, "stop a cluster started with `nbcluster up`: workers, autoscaler, head"),
        ("attach", cmd_attach, "print the code that connects a notebook to a cluster"),
    ):
        p = subparsers.add_parser(name, help=text, description=text)
        p.add_argument("config", nargs="?", default="", help="the cluster's config file")
        p.add_argument("--name", default="", help="the cluster's name (instead of the file)")
        p.set_defaults(fn=fn)
