"""A fork server for job supervisors: ``python -m nbcluster._runtime.jobs.launcher``.

Starting a supervisor as a fresh interpreter costs a second or more of imports on a busy
machine, most of the time from submission to RUNNING. The head starts this launcher once
(on the first submission); it imports the supervisor's modules, creates no thread and no
gRPC object, and forks a supervisor per request in milliseconds. Each supervisor starts a
session of its own (``setsid``), writes to its job's log file, and outlives the launcher
and the head (a restarted head finds it by PID and process start time).

Protocol (lines on two pipes): head → launcher ``spawn <id> <head-address> <log-path>``;
launcher → head ``pid <id> <pid>``. The launcher reaps its children and exits when its
command pipe closes (the head is gone); the supervisors keep running.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

from nbcluster._runtime.jobs.supervisor import Supervisor

__all__ = ["Launcher", "main", "process_start"]

MODULE = "nbcluster._runtime.jobs.launcher"


def process_start(pid: int) -> int:
    """When process ``pid`` started (clock ticks since boot; 0 if it does not exist).

    A PID with the same start time is the same process, even after PIDs were reused.
    """
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0
    fields = stat.rsplit(")", 1)[1].split()
    if fields[0] == "Z":
        return 0
    return int(fields[19])


class Launcher:
    """Head-side handle of the supervisor fork server."""

    def __init__(self, session_dir: Path, token_file: str) -> None:
        cmd_r, cmd_w = os.pipe()
        ev_r, ev_w = os.pipe()
        try:
            with open(session_dir / "logs" / "job-launcher.log", "ab") as out:
                self.proc = subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        MODULE,
                        "--cmd-fd",
                        str(cmd_r),
                        "--ev-fd",
                        str(ev_w),
                        "--session-dir",
                        str(session_dir),
                        "--token-file",
                        token_file,
                    ],
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=out,
                    pass_fds=(cmd_r, ev_w),
                    start_new_session=True,
                )
        except BaseException:
            os.close(cmd_w)
            os.close(ev_r)
            raise
        finally:
            os.close(cmd_r)
            os.close(ev_w)
        self.cmd_w = cmd_w
        self.ev_r = ev_r
        self._buf = b""

    def alive(self) -> bool:
        """True while the launcher process runs."""
        return self.proc.poll() is None

    def spawn(
        self, submission_id: str, head_address: str, log_path: Path, timeout: float = 30
    ) -> int:
        """Fork a supervisor for the job; return its PID (OSError if the launcher is gone)."""
        os.write(self.cmd_w, f"spawn {submission_id} {head_address} {log_path}\n".encode())
        deadline = time.monotonic() + timeout
        while True:
            while b"\n" in self._buf:
                line, self._buf = self._buf.split(b"\n", 1)
                parts = line.decode().split()
                if len(parts) == 3 and parts[0] == "pid" and parts[1] == submission_id:
                    return int(parts[2])
            left = deadline - time.monotonic()
            if left <= 0 or not self.alive():
                raise OSError("the job launcher did not start the supervisor")
            ready, _, _ = select.select([self.ev_r], [], [], min(left, 0.5))
            if ready:
                data = os.read(self.ev_r, 65536)
                if not data:
                    raise OSError("the job launcher exited")
                self._buf += data

    def close(self) -> None:
        """Stop the launcher (the supervisors it started keep running)."""
        with contextlib.suppress(OSError):
            os.close(self.cmd_w)
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
        with contextlib.suppress(OSError):
            os.close(self.ev_r)


def _fork_supervisor(args: argparse.Namespace, sid: str, head: str, log_path: str) -> int:
    pid = os.fork()
    if pid:
        return pid
    code = 1
    try:
        os.setsid()
        os.close(args.cmd_fd)
        os.close(args.ev_fd)
        fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
        sys.stdout = os.fdopen(1, "w", buffering=1)
        sys.stderr = os.fdopen(2, "w", buffering=1)
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGCHLD):
            signal.signal(sig, signal.SIG_DFL)
        code = Supervisor(
            session_dir=Path(args.session_dir),
            token_file=args.token_file,
            head_address=head,
            submission_id=sid,
        ).run()
    except BaseException:  # noqa: BLE001 - report and exit
        import traceback

        traceback.print_exc()
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)
    return 0  # pragma: no cover


def main(argv: list[str] | None = None) -> None:
    """Preload the supervisor, then fork one per request until the head goes away."""
    p = argparse.ArgumentParser(prog="nbcluster-job-launcher")
    p.add_argument("--cmd-fd", type=int, required=True)
    p.add_argument("--ev-fd", type=int, required=True)
    p.add_argument("--session-dir", required=True)
    p.add_argument("--token-file", required=True)
    args = p.parse_args(argv)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    buf = b""
    while True:
        readable, _, _ = select.select([args.cmd_fd], [], [], 0.2)
        with contextlib.suppress(ChildProcessError):
            while os.waitpid(-1, os.WNOHANG)[0]:
                pass
        if not readable:
            continue
        data = os.read(args.cmd_fd, 65536)
        if not data:
            return
        buf += data
        *lines, buf = buf.split(b"\n")
        for line in lines:
            parts = line.decode().split(" ", 3)
            if len(parts) == 4 and parts[0] == "spawn":
                pid = _fork_supervisor(args, parts[1], parts[2], parts[3])
                os.write(args.ev_fd, f"pid {parts[1]} {pid}\n".encode())


if __name__ == "__main__":
    main()
