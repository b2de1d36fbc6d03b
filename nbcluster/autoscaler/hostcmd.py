"""What the ``hosts`` provider runs on a worker machine: ``python3 -m nbcluster.autoscaler.hostcmd``.

``stop --node-name NAME`` stops the node manager started there with ``--node-name NAME``
(SIGTERM, then SIGKILL after ``--grace`` seconds). Only processes whose command line is a
node manager with exactly that name are signalled, never anything found by a looser match.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time

__all__ = ["find_nodes", "main"]


def find_nodes(name: str) -> list[int]:
    """PIDs of node managers on this machine started with ``--node-name name``."""
    import psutil

    found = []
    for p in psutil.process_iter(["cmdline", "status", "ppid"]):
        try:
            cmd = p.info["cmdline"] or []
            if (
                p.info["status"] == psutil.STATUS_ZOMBIE
                or "nbcluster._runtime.node.main" not in cmd
            ):
                continue
            i = cmd.index("--node-name") if "--node-name" in cmd else -1
            if i >= 0 and i + 1 < len(cmd) and cmd[i + 1] == name:
                found.append(p.pid)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    # The manager, not its forked fork server and workers (they carry the same command line).
    pids = set(found)
    managers = []
    for pid in found:
        try:
            if psutil.Process(pid).ppid() not in pids:
                managers.append(pid)
        except psutil.NoSuchProcess:
            continue
    return managers


def stop(name: str, grace: float) -> int:
    """Stop the named node manager; return how many processes were signalled."""
    pids = find_nodes(name)
    for pid in pids:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            continue
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and any(p in find_nodes(name) for p in pids):
        time.sleep(0.1)
    for pid in find_nodes(name):
        if pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                continue
    return len(pids)


def main(argv: list[str] | None = None) -> int:
    """Entry point."""
    p = argparse.ArgumentParser(prog="python -m nbcluster.autoscaler.hostcmd")
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("stop", help="stop the node manager started with --node-name NAME")
    s.add_argument("--node-name", required=True)
    s.add_argument("--grace", type=float, default=10.0)
    args = p.parse_args(argv)
    n = stop(args.node_name, args.grace)
    print(f"stopped {n} node manager(s) named {args.node_name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
