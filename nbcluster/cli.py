"""The ``nbcluster`` command: start, join, inspect and stop clusters from a shell.

nbcluster start --head [--num-cpus N] [--port P] [--block]
nbcluster start --address HOST:PORT [--num-cpus N] [--block]
nbcluster status [--address HOST:PORT]
nbcluster stop
nbcluster up CONFIG | down CONFIG | attach CONFIG   (nbcluster/autoscaler/cli.py)
nbcluster serve run|status|deploy|shutdown   (Serve; see nbcluster/serve/_cli.py)
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from nbcluster import cli_job, cli_state
from nbcluster._runtime import proc
from nbcluster._runtime.netaddr import route_address, split_host_port
from nbcluster._runtime.protocol.tls import (
    CA_FILE,
    CA_KEY_FILE,
    CERT_FILE,
    DEFAULT_SERVER_NAME,
    KEY_FILE,
    TlsSettings,
    make_cluster_certificates,
)
from nbcluster.cluster import exposure_warning, own_sessions, proc_is_loopback, signallable
from nbcluster.serve._cli import add_subcommands as add_serve_subcommands


def _temp_dir() -> str:
    from nbcluster.config import Config

    return Config.from_env().temp_dir


def _add_resource_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--num-cpus", type=float, default=None, help="CPUs this node offers (default: all)"
    )
    p.add_argument("--num-gpus", type=float, default=None, help="GPUs this node offers")
    p.add_argument("--resources", default="", help="custom resources as JSON, e.g. '{\"disk\": 2}'")
    p.add_argument("--object-store-memory", type=int, default=None, help="store size in bytes")
    p.add_argument(
        "--block", action="store_true", help="stay in the foreground; Ctrl-C stops the processes"
    )


def cmd_start(args: argparse.Namespace) -> int:
    if args.head == bool(args.address):
        print("nbcluster start: give exactly one of --head or --address HOST:PORT", file=sys.stderr)
        return 2
    resources = json.loads(args.resources) if args.resources else None
    tls_env = _tls_env(args)
    if tls_env is None:
        return 2
    os.environ.update(tls_env)  # this process talks to the cluster too
    if args.head:
        from nbcluster.cluster import LocalCluster

        cluster = LocalCluster(
            num_cpus=args.num_cpus,
            num_gpus=args.num_gpus,
            resources=resources,
            object_store_memory=args.object_store_memory,
            host=args.host or "127.0.0.1",
            port=args.port,
            detached=not args.block,
            env=tls_env,
            tls=args.tls,
        ).start()
        tls_flags = ""
        if cluster.tls_env:
            os.environ.update(cluster.tls_env)
            ca, cert, key = (
                cluster.tls_env[f"NBCLUSTER_TLS_{k}"] for k in ("CA_CERT", "CERT", "KEY")
            )
            tls_flags = f" --tls-ca {ca} --tls-cert {cert} --tls-key {key}"
        print(f"nbcluster head started at {cluster.address}")
        print(
            f"  token file:  {cluster.token_file}   (keep it secret: it lets anyone run code as you)"
        )
        print(f"  session dir: {cluster.session_dir}")
        print(
            f"  join a node: nbcluster start --address {cluster.address} --token-file {cluster.token_file}"
            + tls_flags
        )
        print(f"  connect:     nbcluster.init(address='{cluster.address}')   or   address='auto'")
        if tls_flags:
            print(
                "  TLS:         every connection is encrypted; drivers need "
                + " ".join(f"{k}={v}" for k, v in cluster.tls_env.items() if "NAME" not in k)
            )
        sys.stdout.flush()
        if args.block:
            _block(cluster.stop)
        return 0
    return _join(args, resources)


def _tls_env(args: argparse.Namespace) -> dict[str, str] | None:
    """The TLS variables for the processes to start ({} without TLS; None after an error)."""
    given = [args.tls_ca, args.tls_cert, args.tls_key]
    if any(given) and not all(given):
        print("nbcluster start: give all of --tls-ca, --tls-cert and --tls-key", file=sys.stderr)
        return None
    env: dict[str, str] = {}
    if all(given):
        env = {
            "NBCLUSTER_TLS_CA_CERT": os.path.abspath(args.tls_ca),
            "NBCLUSTER_TLS_CERT": os.path.abspath(args.tls_cert),
            "NBCLUSTER_TLS_KEY": os.path.abspath(args.tls_key),
        }
    if args.tls and args.address and not all(given):
        print(
            "nbcluster start: to join a TLS cluster pass the files the head printed: "
            "--tls-ca, --tls-cert and --tls-key",
            file=sys.stderr,
        )
        return None
    if args.require_encryption:
        env["NBCLUSTER_REQUIRE_ENCRYPTION"] = "1"
    try:
        TlsSettings.from_env({**os.environ, **env})
    except (ValueError, OSError) as err:
        print(f"nbcluster start: {err}", file=sys.stderr)
        return None
    return env


def _join(args: argparse.Namespace, resources: dict[str, float] | None) -> int:
    from nbcluster.cluster import find_session

    token_file = args.token_file or os.environ.get("NBCLUSTER_TOKEN_FILE", "")
    session = find_session(args.address, _temp_dir())
    if not token_file and session is not None:
        token_file = str(session / proc.TOKEN_FILE)
    if not token_file and os.environ.get("NBCLUSTER_TOKEN"):
        session_tmp = proc.new_session_dir(_temp_dir())
        proc.create_token_file(session_tmp, os.environ["NBCLUSTER_TOKEN"])
        token_file = str(session_tmp / proc.TOKEN_FILE)
    if not token_file:
        print(
            "nbcluster start: no token for that cluster; pass --token-file PATH or set NBCLUSTER_TOKEN",
            file=sys.stderr,
        )
        return 2
    session_dir = (session.resolve() if session else None) or proc.new_session_dir(_temp_dir())
    host = args.host
    if not host:  # listen on (and advertise) the address through which we reach the head
        try:
            host = route_address(split_host_port(args.address)[0])
        except (OSError, ValueError) as err:
            print(
                f"nbcluster start: cannot tell which address of this host reaches {args.address} "
                f"({err}); pass --host ADDRESS",
                file=sys.stderr,
            )
            return 2
    exposed = exposure_warning(host, tls=TlsSettings.from_env(os.environ) is not None)
    if exposed:
        print(f"nbcluster start: warning: {exposed}", file=sys.stderr)
    cmd = [
        sys.executable,
        "-m",
        "nbcluster._runtime.node.main",
        "--session-dir",
        str(session_dir),
        "--token-file",
        token_file,
        "--head-address",
        args.address,
        "--host",
        host,
    ]
    if args.node_name:
        cmd += ["--node-name", args.node_name]
    if args.num_cpus is not None:
        cmd += ["--num-cpus", str(args.num_cpus)]
    if args.num_gpus is not None:
        cmd += ["--num-gpus", str(args.num_gpus)]
    if resources:
        cmd += ["--resources", json.dumps(resources)]
    if args.object_store_memory:
        cmd += ["--object-store-memory", str(args.object_store_memory)]
    if not proc_is_loopback(host):
        cmd.append("--allow-external")
    nodes_dir = Path(session_dir) / "nodes"
    before = set(nodes_dir.glob("*.json")) if nodes_dir.exists() else set()
    # With --block, a stop (SIGTERM, Ctrl-C) that comes while the node is still starting
    # stops it too: the node runs in its own session, so nothing else would end it.
    done = _stop_signals() if args.block else None
    log = open(Path(session_dir) / "logs" / f"node-join-{os.getpid()}.out", "ab")  # noqa: SIM115
    p = subprocess.Popen(
        cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True
    )
    log.close()

    def stop() -> None:
        p.terminate()
        try:
            p.wait(5)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(5)

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if done is not None and done.is_set():
            stop()
            print("nbcluster: stopped before the node joined")
            return 1
        now = set(nodes_dir.glob("*.json")) if nodes_dir.exists() else set()
        if now - before:
            break
        if p.poll() is not None:
            print(
                f"nbcluster start: the node exited (code {p.returncode}); logs in {session_dir}/logs",
                file=sys.stderr,
            )
            return 1
        time.sleep(0.02)
    else:
        print("nbcluster start: the node did not register within 60 s", file=sys.stderr)
        p.kill()
        return 1
    _warn_if_unreachable(args.address, token_file, now - before)
    pids_file = Path(session_dir) / "pids.json"
    pids = json.loads(pids_file.read_text()) if pids_file.exists() else {"head": 0, "nodes": []}
    pids["nodes"].append(p.pid)
    proc.write_atomic(pids_file, json.dumps(pids))
    print(f"nbcluster node joined {args.address} (pid {p.pid})")
    sys.stdout.flush()
    if args.block:
        _block(stop, done)
    return 0


def _warn_if_unreachable(head_address: str, token_file: str, new_files: set[Path]) -> None:
    """Say once if the head cannot reach the node that just joined (it gets no work then)."""
    from nbcluster._runtime.head import reachability

    for f in new_files:
        try:
            node_id = bytes.fromhex(json.loads(f.read_text())["node_id"])
        except (OSError, ValueError, KeyError):
            continue
        message = reachability.ask(head_address, proc.read_token(token_file), node_id)
        if message:
            print(f"nbcluster start: warning: {message}", file=sys.stderr)


def _stop_signals() -> threading.Event:
    """An event set by SIGINT or SIGTERM (installed now)."""
    done = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: done.set())
    return done


def _block(stop: object, done: threading.Event | None = None) -> None:
    if done is None:
        done = _stop_signals()
    try:
        while not done.wait(0.5):
            pass
    finally:
        stop()  # type: ignore[operator]
        print("nbcluster: stopped")


def cmd_status(args: argparse.Namespace) -> int:
    import nbcluster

    try:
        info = nbcluster.init(address=args.address or "auto")
    except (ConnectionError, nbcluster.exceptions.NbclusterError) as e:
        print(f"nbcluster status: {e}", file=sys.stderr)
        return 1
    try:
        print(f"cluster at {info.address}   session: {info.session_dir}")
        for n in nbcluster.nodes():
            state = "alive" if n["Alive"] else f"dead ({n['DeathReason']})"
            res = ", ".join(
                f"{k} {n['Available'].get(k, 0):g}/{v:g}"
                for k, v in sorted(n["Resources"].items())
                if k != "memory"
            )
            store = f"store {n['ObjectStoreUsed'] / 2**20:.1f}/{n['ObjectStoreCapacity'] / 2**20:.0f} MiB"
            print(
                f"  node {n['NodeID'][:8]} {n['NodeName']:<12} {n['NodeManagerAddress']}:{n['NodeManagerPort']}"
                f"  {state}  {res}  {store}"
            )
        from nbcluster.autoscaler.cli import print_status

        print_status()  # node types, pending demand and decisions of the autoscaler
    finally:
        nbcluster.shutdown()
    return 0


def cmd_stop(args: argparse.Namespace) -> int:
    stopped = 0
    for session in own_sessions(_temp_dir()):  # never another user's (or a writable) session
        pids_file = session / "pids.json"
        try:
            pids = json.loads(pids_file.read_text())
        except (OSError, ValueError):
            continue
        if (session / "autoscaler").is_dir():  # its autoscaler and the nodes it launched
            from nbcluster.autoscaler.cli import stop_autoscaled

            stopped += stop_autoscaled(session)
        for pid in [*pids.get("nodes", []), pids.get("head", 0)]:
            if pid and signallable(pid) and _is_ours(pid, session):
                os.kill(pid, signal.SIGTERM)
                stopped += 1
        pids_file.unlink()
    print(f"nbcluster stop: signalled {stopped} process(es)")
    return 0


def _is_ours(pid: int, session: Path) -> bool:
    """Only signal a PID whose command line names this session (PIDs get reused)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    if not any(b"nbcluster._runtime" in part for part in cmdline):
        return False
    real = session.resolve()
    for i, part in enumerate(cmdline):
        if part == b"--session-dir" and i + 1 < len(cmdline):
            try:
                if Path(cmdline[i + 1].decode()).resolve() == real:
                    return True
            except (OSError, UnicodeDecodeError):
                continue
    return False


def cmd_tls_certs(args: argparse.Namespace) -> int:
    """``nbcluster tls-certs DIR``: a fresh CA and one cluster certificate in ``DIR``."""
    if args.days <= 0:
        print(f"nbcluster tls-certs: --days must be positive, got {args.days}", file=sys.stderr)
        return 2
    directory = Path(args.directory)
    existing = [f for f in (CA_FILE, CERT_FILE, KEY_FILE) if (directory / f).exists()]
    if existing:
        print(
            f"nbcluster tls-certs: {directory} already holds {', '.join(existing)}; "
            "choose an empty directory (certificates are never overwritten)",
            file=sys.stderr,
        )
        return 1
    directory.mkdir(parents=True, exist_ok=True)
    made = make_cluster_certificates(
        directory, server_name=args.name, hosts=args.host, days=args.days
    )
    print(f"CA certificate:   {made.ca_file}")
    print(f"certificate:      {made.cert_file} (name {made.server_name!r})")
    print(f"private key:      {made.key_file} (mode 0600)")
    print(f"the CA's own key: {directory / CA_KEY_FILE} (keep it; peers never need it)")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``nbcluster`` command."""
    parser = argparse.ArgumentParser(
        prog="nbcluster", description="Start and manage nbcluster clusters."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("start", help="start a head, or join a node to a head")
    p.add_argument(
        "--head", action="store_true", help="start a new cluster (head + a node on this host)"
    )
    p.add_argument("--address", default="", help="HOST:PORT of a head to join as a node")
    p.add_argument(
        "--host",
        default=None,
        help="address to listen on: default 127.0.0.1 for --head; with --address, the address "
        "of this host on the route to the head (what other hosts reach it through)",
    )
    p.add_argument("--port", type=int, default=0, help="head port (default: any free port)")
    p.add_argument("--node-name", default="", help="name of this node (default: hostname)")
    p.add_argument("--token-file", default="", help="token file of the cluster to join")
    p.add_argument(
        "--tls",
        action="store_true",
        help="with --head: make a CA and certificate for this cluster and encrypt every "
        "connection (prints the files that nodes and drivers need)",
    )
    p.add_argument("--tls-ca", default="", help="CA certificate (PEM) that signs the cluster's")
    p.add_argument("--tls-cert", default="", help="this cluster's certificate (PEM)")
    p.add_argument("--tls-key", default="", help="the certificate's private key (PEM)")
    p.add_argument(
        "--require-encryption",
        action="store_true",
        help="refuse to run without TLS (and TLS servers refuse plain connections)",
    )
    _add_resource_args(p)
    p.set_defaults(fn=cmd_start)
    p = sub.add_parser(
        "tls-certs",
        help="make a CA and a cluster certificate (for --tls-ca/--tls-cert/--tls-key, or a "
        "Kubernetes Secret: deploy/README.md)",
    )
    p.add_argument("directory", help="where to write ca.pem, cert.pem, key.pem (and ca-key.pem)")
    p.add_argument(
        "--name",
        default=DEFAULT_SERVER_NAME,
        help="the name peers check (NBCLUSTER_TLS_SERVER_NAME; default: %(default)s)",
    )
    p.add_argument(
        "--host", action="append", default=[], help="an extra address or DNS name (repeatable)"
    )
    p.add_argument("--days", type=int, default=365, help="validity in days (default: %(default)s)")
    p.set_defaults(fn=cmd_tls_certs)
    p = sub.add_parser("status", help="show the nodes and resources of a cluster")
    p.add_argument(
        "--address", default="", help="HOST:PORT of the head (default: newest local cluster)"
    )
    p.set_defaults(fn=cmd_status)
    p = sub.add_parser("stop", help="stop the clusters started with `nbcluster start` on this host")
    p.set_defaults(fn=cmd_stop)
    from nbcluster.autoscaler.cli import add_subcommands  # up, down, attach

    add_subcommands(sub)
    cli_job.add_subcommands(sub)  # nbcluster job ... (issue 17)
    cli_state.add_subcommands(sub)  # nbcluster list / summary / get / logs (issue 17)
    add_serve_subcommands(sub)
    args = parser.parse_args(argv)
    return int(args.fn(args))


if __name__ == "__main__":
    sys.exit(main())
