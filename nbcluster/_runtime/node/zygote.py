"""A fork server for worker processes.

The node manager imports the worker's modules, then forks this zygote *before* it
creates any gRPC object or event loop. The zygote forks a worker per request in a few
milliseconds, with every module already imported and its pages shared (copy-on-write),
instead of paying a fresh interpreter and ~0.2 s of imports per worker.

Protocol (lines on two pipes): node → zygote ``spawn <worker-id-hex> <log-path>``;
zygote → node ``pid <worker-id-hex> <pid>`` and ``exit <pid> <wait-status>``.
The zygote exits when the command pipe closes (the node manager is gone).
"""

from __future__ import annotations

import contextlib
import importlib
import os
import select
import signal
import sys
from collections.abc import Callable

#: What a worker imports on start-up, loaded in the node manager before the zygote forks:
#: a forked worker inherits them, so it imports (and, without .pyc files, compiles) none of
#: them itself. Beside the worker's own module: ``CoreClient`` imports its submitters
#: lazily, ``loops.new_event_loop`` imports uvloop (optional), ``_raise_fd_limit`` imports
#: ``resource``, and asyncio's ``getaddrinfo`` of a host name loads the ``idna`` codec.
WORKER_MODULES = (
    "nbcluster._runtime.worker.main",
    "nbcluster._runtime.core.submitter",
    "nbcluster._runtime.core.actor_submitter",
    "resource",
    "encodings.idna",
    "uvloop",
)


def preload_worker_modules() -> None:
    """Import :data:`WORKER_MODULES` (those not installed are skipped)."""
    for name in WORKER_MODULES:
        with contextlib.suppress(ImportError):
            importlib.import_module(name)


class Zygote:
    """Node-side handle of the fork server."""

    def __init__(self, worker_env: dict[str, str], keep_fds: tuple[int, ...] = ()) -> None:
        cmd_r, cmd_w = os.pipe()
        ev_r, ev_w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the zygote
            try:
                os.close(cmd_w)
                os.close(ev_r)
                _close_others(keep={0, 1, 2, cmd_r, ev_w, *keep_fds})
                os.environ.update(worker_env)
                _serve(cmd_r, ev_w)
            finally:
                os._exit(0)
        os.close(cmd_r)
        os.close(ev_w)
        self.pid = pid
        self.cmd_w = cmd_w
        self.ev_r = ev_r
        self._buf = b""

    def spawn(self, worker_id: bytes, node_address: str, log_path: str) -> None:
        """Ask for a worker (its pid arrives as an event)."""
        os.write(self.cmd_w, f"spawn {worker_id.hex()} {node_address} {log_path}\n".encode())

    def read_events(self) -> list[tuple[str, ...]]:
        """Drain available events (call when ``ev_r`` is readable)."""
        try:
            data = os.read(self.ev_r, 65536)
        except BlockingIOError:
            return []
        if not data:
            return [("zygote-exited",)]
        self._buf += data
        *lines, self._buf = self._buf.split(b"\n")
        return [tuple(line.decode().split()) for line in lines if line]

    def close(self) -> None:
        """Stop the zygote (it exits when its command pipe closes)."""
        with contextlib.suppress(OSError):
            os.close(self.cmd_w)
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitpid(self.pid, 0)
        with contextlib.suppress(OSError):
            os.close(self.ev_r)


def _close_others(keep: set[int]) -> None:
    try:
        fds = [int(x) for x in os.listdir("/proc/self/fd")]
    except OSError:
        return
    for fd in fds:
        if fd not in keep:
            with contextlib.suppress(OSError):
                os.close(fd)


def _serve(cmd_r: int, ev_w: int) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    # A child's exit wakes select() through this pipe (SIGCHLD): no timer, no polling.
    sig_r, sig_w = os.pipe()
    os.set_blocking(sig_r, False)
    os.set_blocking(sig_w, False)
    signal.set_wakeup_fd(sig_w)
    signal.signal(signal.SIGCHLD, _on_sigchld)
    buf = b""
    children: set[int] = set()
    while True:
        readable, _, _ = select.select([cmd_r, sig_r], [], [])
        if sig_r in readable:
            with contextlib.suppress(BlockingIOError):
                while os.read(sig_r, 4096):
                    pass
        _reap(children, ev_w)
        if cmd_r not in readable:
            continue
        data = os.read(cmd_r, 65536)
        if not data:
            return
        buf += data
        *lines, buf = buf.split(b"\n")
        for line in lines:
            parts = line.decode().split(" ", 3)
            if len(parts) == 4 and parts[0] == "spawn":
                pid = _fork_worker(parts[1], parts[2], parts[3], (cmd_r, ev_w, sig_r, sig_w))
                children.add(pid)
                os.write(ev_w, f"pid {parts[1]} {pid}\n".encode())
        _reap(children, ev_w)  # a child that died at once


def _on_sigchld(signum: int, frame: object) -> None:
    """Nothing to do here: the signal's byte on the wakeup pipe is what wakes select()."""


def _reap(children: set[int], ev_w: int) -> None:
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        children.discard(pid)
        os.write(ev_w, f"exit {pid} {status}\n".encode())


def _fork_worker(
    worker_hex: str, node_address: str, log_path: str, zygote_fds: tuple[int, ...]
) -> int:
    pid = os.fork()
    if pid != 0:
        return pid
    code = 1
    try:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        for fd in zygote_fds:
            os.close(fd)
        fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
        sys.stdout = os.fdopen(1, "w", buffering=1)
        sys.stderr = os.fdopen(2, "w", buffering=1)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        os.environ["NBCLUSTER_WORKER_ID"] = worker_hex
        os.environ["NBCLUSTER_NODE_ADDRESS"] = node_address
        from nbcluster._runtime.worker.main import main

        main()
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    except BaseException:  # noqa: BLE001 - report and exit
        import traceback

        traceback.print_exc()
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)
    return 0  # pragma: no cover


def decode_status(status: int) -> int:
    """A wait status as a Popen-style return code (negative for a signal)."""
    if os.WIFSIGNALED(status):
        return -os.WTERMSIG(status)
    return os.WEXITSTATUS(status)


OnExit = Callable[[bytes, int], None]
