"""A worker fork server running a pip runtime_env's interpreter.

Workers of a pip environment must run that environment's python, so they cannot be
forked from the node's zygote. Starting a fresh interpreter per worker costs a second or
more of imports, so each (node, environment) gets a fork server of its own, started once
from the environment's python: ``<venv>/bin/python -m nbcluster._runtime.runtime_env.venv_zygote``.
It preloads the worker's modules and speaks the node zygote's protocol on two pipes (see
:mod:`nbcluster._runtime.node.zygote`), so the node manager handles its workers exactly
like the others. It exits when its command pipe closes; its workers watch a parent-death
pipe of their own.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
from pathlib import Path

from nbcluster._runtime.node import zygote

__all__ = ["VenvZygote", "main"]

MODULE = "nbcluster._runtime.runtime_env.venv_zygote"


class VenvZygote:
    """Node-side handle of a fork server running another interpreter (same API as Zygote)."""

    def __init__(self, python: str, worker_env: dict[str, str], log_path: Path) -> None:
        cmd_r, cmd_w = os.pipe()
        ev_r, ev_w = os.pipe()
        death_r, death_w = os.pipe()  # workers see EOF when this node manager is gone
        env = {
            **os.environ,
            **worker_env,
            "NBCLUSTER_PARENT_FD": str(death_r),
        }
        try:
            with open(log_path, "ab") as out:
                self.proc = subprocess.Popen(
                    [
                        python,
                        "-m",
                        MODULE,
                        "--cmd-fd",
                        str(cmd_r),
                        "--ev-fd",
                        str(ev_w),
                        "--session-dir",
                        worker_env.get("NBCLUSTER_SESSION_DIR", ""),
                    ],
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=out,
                    env=env,
                    pass_fds=(cmd_r, ev_w, death_r),
                )
        except BaseException:
            for fd in (cmd_w, ev_r, death_w):
                os.close(fd)
            raise
        finally:
            for fd in (cmd_r, ev_w, death_r):
                os.close(fd)
        self.pid = self.proc.pid
        self.python = python
        self.cmd_w = cmd_w
        self.ev_r = ev_r
        self.death_w = death_w
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
        """Stop the fork server (it exits when its command pipe closes)."""
        for fd in (self.cmd_w, self.death_w):
            with contextlib.suppress(OSError):
                os.close(fd)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(5)
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(5)
        with contextlib.suppress(OSError):
            os.close(self.ev_r)


def main(argv: list[str] | None = None) -> None:
    """Preload the worker's modules, then serve spawn requests until the node goes away."""
    p = argparse.ArgumentParser(prog="nbcluster-venv-zygote")
    p.add_argument("--cmd-fd", type=int, required=True)
    p.add_argument("--ev-fd", type=int, required=True)
    p.add_argument("--session-dir", default="")
    args = p.parse_args(argv)
    import nbcluster._runtime.worker.main  # noqa: F401 - preload for the forked workers

    try:
        zygote._serve(args.cmd_fd, args.ev_fd)  # noqa: SLF001 - the same protocol as the node's
    finally:
        os._exit(0)


if __name__ == "__main__":
    main()
