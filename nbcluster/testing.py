"""Small helpers for testing code that uses nbcluster (and for nbcluster's own tests).

``poll_for`` waits for a condition against a deadline; ``cluster_processes`` lists every
process of a session (head, node managers, the worker fork server and workers all carry
the session directory on their command line); ``assert_cluster_healthy`` checks that a
cluster has all its resources back and still runs tasks.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")

__all__ = [
    "poll_for",
    "cluster_processes",
    "worker_pids",
    "assert_no_processes",
    "assert_cluster_healthy",
    "kill_process",
]


def poll_for(
    predicate: Callable[[], T], timeout: float = 10.0, interval: float = 0.02, message: str = ""
) -> T:
    """Call ``predicate`` until it returns something truthy; return that, or fail at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(message or f"condition not met within {timeout}s: {predicate}")
        time.sleep(interval)


def cluster_processes(session_dir: str | os.PathLike[str]) -> list[Any]:
    """Live processes whose command line names ``session_dir`` (zombies excluded)."""
    import psutil

    needle = str(session_dir)
    found = []
    for p in psutil.process_iter(["cmdline", "status"]):
        try:
            if p.info["status"] == psutil.STATUS_ZOMBIE:
                continue
            if any(needle in part for part in p.info["cmdline"] or ()):
                found.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


def worker_pids(session_dir: str | os.PathLike[str]) -> list[int]:
    """PIDs of the worker processes of a session (forked children of the worker fork server)."""
    import psutil

    procs = cluster_processes(session_dir)
    # The fork server and the workers are forked from the node manager, so all three carry
    # node.main's command line: managers have a parent outside that set, the fork server is
    # a manager's child, and workers are the fork server's children.
    node_like = {}
    for p in procs:
        try:
            if "nbcluster._runtime.node.main" in " ".join(p.cmdline()):
                node_like[p.pid] = p
        except psutil.Error:  # exited meanwhile
            continue
    parents: dict[int, int] = {}
    for pid, p in node_like.items():
        try:
            parents[pid] = p.ppid()
        except psutil.NoSuchProcess:
            continue
    managers = {pid for pid, ppid in parents.items() if ppid not in node_like}
    zygotes = {pid for pid, ppid in parents.items() if ppid in managers}
    out = [pid for pid, ppid in parents.items() if ppid in zygotes]
    return out


def assert_no_processes(session_dir: str | os.PathLike[str], timeout: float = 10.0) -> None:
    """Fail unless every process of the session has ended within ``timeout`` seconds."""
    poll_for(
        lambda: not cluster_processes(session_dir),
        timeout,
        message=f"processes of {Path(session_dir).name} still running after {timeout}s: "
        + ", ".join(str(p.pid) for p in cluster_processes(session_dir)),
    )


def assert_cluster_healthy(timeout: float = 10.0) -> None:
    """All resources are back (available == total) and 20 trivial tasks succeed."""
    import nbcluster

    def resources_back() -> bool:
        total = nbcluster.cluster_resources()
        avail = nbcluster.available_resources()
        return all(abs(avail.get(k, 0.0) - v) < 1e-6 for k, v in total.items())

    poll_for(
        resources_back,
        timeout,
        message=f"resources did not return: total={nbcluster.cluster_resources()} "
        f"available={nbcluster.available_resources()}",
    )

    @nbcluster.remote
    def _healthy(i: int) -> int:
        return i

    assert nbcluster.get([_healthy.remote(i) for i in range(20)], timeout=timeout) == list(
        range(20)
    )


def kill_process(pid: int, sig: int = signal.SIGKILL) -> None:
    """Send ``sig`` to one process by PID (never by name)."""
    os.kill(pid, sig)
