"""Small helpers for testing code that uses nbcluster (and for nbcluster's own tests).

``poll_for`` waits for a condition against a deadline; ``assert_stays`` checks that one
keeps holding for a :func:`quiet_period` (a negative check that means something on a
loaded machine); ``cluster_processes`` lists every process of a session (head, node
managers, the worker fork server and workers all carry the session directory on their
command line); ``assert_cluster_healthy`` checks that a cluster has all its resources back,
no orphan processes, that the driver leaked no threads or file descriptors (against a
:func:`health_baseline`), and that an actor and 100 tasks still run.
"""

from __future__ import annotations

import dataclasses
import os
import re
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")

__all__ = [
    "HealthBaseline",
    "poll_for",
    "assert_stays",
    "quiet_period",
    "cluster_processes",
    "orphan_processes",
    "worker_pids",
    "assert_no_processes",
    "assert_cluster_healthy",
    "assert_no_leaks",
    "health_baseline",
    "kill_process",
    "pid_alive",
    "driver_holds_leases",
    "thread_names",
    "grpc_threads",
    "GRPC_THREAD_PREFIXES",
]

#: Name prefixes of the threads grpc-core starts in a process that uses gRPC (a worker
#: whose gRPC sleeps has none of them: see ``_runtime/core/dormancy.py``).
GRPC_THREAD_PREFIXES = ("grpc_global_tim", "event_engine", "lifeguard")


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


def thread_names(pid: int) -> list[str]:
    """Names of process ``pid``'s threads, from ``/proc`` (empty once it ended)."""
    names = []
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:  # the process ended
        return names
    for tid in tids:
        try:
            names.append(Path(f"/proc/{pid}/task/{tid}/comm").read_text().strip())
        except OSError:  # the thread ended meanwhile
            continue
    return names


def grpc_threads(pid: int) -> list[str]:
    """Names of process ``pid``'s grpc-core threads (:data:`GRPC_THREAD_PREFIXES`)."""
    return [name for name in thread_names(pid) if name.startswith(GRPC_THREAD_PREFIXES)]


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
    deadline = time.monotonic() + timeout
    while True:
        left = cluster_processes(session_dir)
        if not left:
            return
        if time.monotonic() > deadline:
            raise AssertionError(
                f"processes of {Path(session_dir).name} still running after {timeout}s: "
                + "; ".join(_describe(p) for p in left)
            )
        time.sleep(0.02)


def _describe(p: Any) -> str:
    """``pid (status, parent pid) command line`` of a process, for failure messages."""
    try:
        return f"{p.pid} ({p.status()}, ppid {p.ppid()}) {' '.join(p.cmdline())[:200]}"
    except Exception:  # noqa: BLE001 - it may have just ended
        return f"{p.pid} (ended)"


def quiet_period(base: float = 1.0, cap: float = 10.0) -> float:
    """How long a negative check should wait: ``base`` seconds on an idle machine, scaled
    up by the load average per CPU (what it rules out would take that much longer there),
    at most ``cap``. ``NBCLUSTER_TEST_QUIET_FACTOR`` multiplies it (slow CI runners)."""
    try:
        load = os.getloadavg()[0] / (os.cpu_count() or 1)
    except OSError:  # pragma: no cover - no load average on this platform
        load = 1.0
    factor = float(os.environ.get("NBCLUSTER_TEST_QUIET_FACTOR", "1") or 1)
    return min(cap, base * max(1.0, load) * factor)


def assert_stays(
    predicate: Callable[[], object],
    duration: float | None = None,
    message: str = "",
    *,
    interval: float = 0.05,
) -> None:
    """Fail as soon as ``predicate`` is falsy, checking for ``duration`` seconds
    (default :func:`quiet_period`): "this does not happen", said with a deadline."""
    end = time.monotonic() + (quiet_period() if duration is None else duration)
    while True:
        if not predicate():
            raise AssertionError(message or f"condition stopped holding: {predicate}")
        if time.monotonic() > end:
            return
        time.sleep(interval)


@dataclasses.dataclass(frozen=True)
class HealthBaseline:
    """What the driver process had before a test: its threads and open file descriptors."""

    threads: frozenset[threading.Thread]
    fds: int


def health_baseline() -> HealthBaseline:
    """Take a :class:`HealthBaseline` of this process (before the code under test runs)."""
    return HealthBaseline(frozenset(threading.enumerate()), _count_fds())


def _count_fds() -> int:
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:  # pragma: no cover - not Linux
        return 0


# Threads that live as long as the process by design, started on first use (one each, or a
# bounded pool): grpc's poller (grpc.aio), the default executor of an asyncio loop, tqdm's
# monitor, and the object store's copy helper (objects/store.py).
_PROCESS_THREADS = re.compile(
    r"^(Thread-\d+ \(_poll_wrapper\)|asyncio_\d+|tqdm_monitor|nbc-copy_\d+)$"
)


def _leaked_threads(baseline: HealthBaseline) -> list[threading.Thread]:
    return [
        t
        for t in threading.enumerate()
        if t not in baseline.threads and t.is_alive() and not _PROCESS_THREADS.match(t.name)
    ]


def orphan_processes(session_dir: str | os.PathLike[str]) -> list[Any]:
    """Processes of a session that lost their parent (e.g. workers of a dead node manager).

    The head, node managers and the autoscaler may have any parent (the driver, or init
    after ``nbcluster start``); every other process of the session must be the child of a
    live process of the session or of this process.
    """
    import psutil

    procs = cluster_processes(session_dir)
    pids = {p.pid for p in procs}
    out = []
    for p in procs:
        try:
            cmd = " ".join(p.cmdline())
            ppid = p.ppid()
            parent_cmd = " ".join(psutil.Process(ppid).cmdline()) if ppid in pids else ""
        except psutil.Error:
            continue
        root = (
            "nbcluster._runtime.head.main" in cmd
            or "nbcluster.autoscaler.monitor" in cmd
            or ("nbcluster._runtime.node.main" in cmd and "node.main" not in parent_cmd)
        )
        if not root and ppid not in pids and ppid != os.getpid():
            out.append(p)
    return out


def assert_no_leaks(baseline: HealthBaseline, timeout: float = 10.0, fd_slack: int = 16) -> None:
    """Within ``timeout``: every thread started since ``baseline`` has ended, and this process
    holds at most ``fd_slack`` more file descriptors than then (a channel to a new peer or a
    log file is not a leak; one per call is)."""
    _poll(
        lambda: not _leaked_threads(baseline),
        timeout,
        lambda: "threads leaked: " + ", ".join(repr(t.name) for t in _leaked_threads(baseline)),
    )
    _poll(
        lambda: _count_fds() <= baseline.fds + fd_slack,
        timeout,
        lambda: f"file descriptors leaked: {_count_fds()} open, {baseline.fds} before",
    )


def _poll(predicate: Callable[[], object], timeout: float, describe: Callable[[], str]) -> None:
    """:func:`poll_for` whose failure message is made at the deadline (the state then)."""
    try:
        poll_for(predicate, timeout)
    except AssertionError:
        raise AssertionError(describe()) from None


def assert_cluster_healthy(timeout: float = 10.0, baseline: HealthBaseline | None = None) -> None:
    """The health check of RELIABILITY.md, within ``timeout`` seconds:

    - 100 trivial tasks succeed, and a new actor answers (then it is killed);
    - then every resource is back (available == total), those of the check included, so
      the next test starts on an idle cluster;
    - no process of the session lost its parent (:func:`orphan_processes`);
    - with a ``baseline``: no thread started since is still running, and the driver holds
      at most a few more file descriptors than then.
    """
    import nbcluster

    def resources() -> str:
        return f"total={nbcluster.cluster_resources()} available={nbcluster.available_resources()}"

    @nbcluster.remote
    def _healthy(i: int) -> int:
        return i

    @nbcluster.remote
    class _HealthProbe:
        def ping(self) -> str:
            return "pong"

    try:
        got = nbcluster.get([_healthy.remote(i) for i in range(100)], timeout=timeout)
        assert got == list(range(100))
        probe = _HealthProbe.remote()
        try:
            assert nbcluster.get(probe.ping.remote(), timeout=timeout) == "pong"
        finally:
            nbcluster.kill(probe)
    except nbcluster.exceptions.GetTimeoutError as e:
        raise AssertionError(f"the cluster no longer runs tasks and actors ({resources()})") from e

    def resources_back() -> bool:
        # The nodes' heartbeats may predate the leases of the work above: the view counts
        # only once this driver holds none (and its returns were answered).
        if driver_holds_leases(release_idle=True):
            return False
        total = nbcluster.cluster_resources()
        avail = nbcluster.available_resources()
        return all(abs(avail.get(k, 0.0) - v) < 1e-6 for k, v in total.items())

    _poll(resources_back, timeout, lambda: f"resources did not return: {resources()}")
    session = nbcluster.state.session_info()["session_dir"]
    if session:
        _poll(
            lambda: not orphan_processes(session),
            timeout,
            lambda: (
                f"orphan processes of {Path(session).name}: "
                + ", ".join(
                    f"{p.pid} {' '.join(p.cmdline())[:160]}" for p in orphan_processes(session)
                )
            ),
        )
    if baseline is not None:
        assert_no_leaks(baseline, timeout)


def driver_holds_leases(release_idle: bool = False) -> bool:
    """True while this process's driver holds a worker lease, asks for one, or gives one
    back (client mode: False, the proxy's leases are not seen from here). ``release_idle``:
    first give back the leases waiting idle for work, rather than at their timers."""
    from nbcluster._runtime.context import current_client

    client = current_client()
    submitter = getattr(client, "submitter", None)
    if submitter is None:
        return False

    async def holds() -> bool:
        if release_idle:
            submitter.release_idle_leases()
        return submitter.holds_leases()

    return bool(client.run(holds(), timeout=10))


def pid_alive(pid: int) -> bool:
    """True while process ``pid`` exists and is not a zombie (it may end while asked)."""
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def kill_process(pid: int, sig: int = signal.SIGKILL) -> None:
    """Send ``sig`` to one process by PID (never by name)."""
    os.kill(pid, sig)
