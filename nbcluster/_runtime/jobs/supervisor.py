"""A job's supervisor: ``python -m nbcluster._runtime.jobs.supervisor --submission-id ID ...``.

Started by the head (in a session of its own, output going to the job's log file), it:

1. sets up the job's runtime_env on the node manager of this host (progress → the log);
2. holds a lease for ``entrypoint_num_cpus/gpus/resources`` while the entrypoint runs;
3. runs the entrypoint — split like a shell would (``shlex``), but never through a shell —
   in a new process group, with ``NBCLUSTER_ADDRESS`` set so ``nbcluster.init()`` joins
   this cluster, and the environment's variables, paths and interpreter;
4. reports PENDING → RUNNING → SUCCEEDED / FAILED / STOPPED to the head, retrying while
   the head is away (a restart), and ends the entrypoint if the head stays away longer
   than the grace period.

SIGTERM (``stop_job``) ends the entrypoint's group: SIGTERM, then SIGKILL after 3 s.
Whatever the entrypoint left running in its group is killed when it exits.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from nbcluster._runtime import exceptions as exc
from nbcluster._runtime import proc
from nbcluster._runtime.config import Config
from nbcluster._runtime.jobs import logfiles
from nbcluster._runtime.jobs.head_client import HeadJobsClient
from nbcluster._runtime.jobs.node_client import NodeClient
from nbcluster._runtime.protocol.protos import jobs_pb2 as jpb
from nbcluster._runtime.runtime_env import worker as env_worker

__all__ = ["Supervisor", "main"]

T = TypeVar("T")
TERM_GRACE_S = 3.0


class _Stopped(Exception):
    """The job was asked to stop while it was being prepared."""


class Supervisor:
    """Runs one job's entrypoint and reports on it."""

    def __init__(
        self, *, session_dir: Path, token_file: str, head_address: str, submission_id: str
    ) -> None:
        self.session_dir = session_dir
        self.token_file = token_file
        self.head_address = head_address
        self.sid = submission_id
        self.token = proc.read_token(token_file)
        self.head = HeadJobsClient(head_address, self.token, timeout=10)
        self.config = Config.from_env()
        self.grace_s = max(self.config.head_grace_period_s, 10.0)
        self.stopping = threading.Event()
        self.child: subprocess.Popen[bytes] | None = None
        self.node: NodeClient | None = None
        self.lease: tuple[str, bytes] | None = None

    # -- helpers -----------------------------------------------------------------------------
    def say(self, text: str) -> None:
        """A line of the supervisor's own in the job log."""
        sys.stdout.write(f"[job {self.sid}] {text}\n")
        sys.stdout.flush()

    def _retry_head(self, fn: Callable[[], T], budget_s: float) -> T:
        deadline = time.monotonic() + budget_s
        delay = 0.1
        while True:
            try:
                return fn()
            except (exc.HeadUnavailableError, ConnectionError):
                if time.monotonic() > deadline:
                    raise
            time.sleep(delay)
            delay = min(delay * 2, 1.0)

    def report(self, status: str, **fields: Any) -> None:
        """Tell the head; keep trying through a head restart."""
        update = jpb.JobStatusUpdate(submission_id=self.sid, status=status, **fields)
        try:
            self._retry_head(lambda: self.head.update_job_status(update), self.grace_s)
        except (exc.HeadUnavailableError, ConnectionError):
            self.say(f"could not report {status} to the head (unreachable)")

    def _interruptible(self, fn: Callable[[], T]) -> T:
        """Run a blocking call in a thread; raise :class:`_Stopped` if a stop arrives."""
        box: dict[str, Any] = {}

        def run() -> None:
            try:
                box["value"] = fn()
            except BaseException as e:  # noqa: BLE001 - handed to the main thread
                box["error"] = e

        t = threading.Thread(target=run, daemon=True)
        t.start()
        while t.is_alive():
            if self.stopping.wait(0.05):
                raise _Stopped
        if "error" in box:
            raise box["error"]
        return box["value"]  # type: ignore[no-any-return]

    # -- phases ------------------------------------------------------------------------------
    def _local_node(self) -> dict[str, Any]:
        for f in sorted((self.session_dir / "nodes").glob("*.json")):
            try:
                info = json.loads(f.read_text())
            except (OSError, ValueError):
                continue
            if proc.pid_alive(int(info.get("pid", 0))):
                return info  # type: ignore[no-any-return]
        raise RuntimeError(f"no node manager is running on this host ({socket.gethostname()})")

    def _prepare_env(self, runtime_env: str) -> str:
        assert self.node is not None
        self.say("setting up the runtime environment")
        return self._interruptible(
            lambda: self.node.prepare_runtime_env(  # type: ignore[union-attr]
                runtime_env, lambda phase, text: self.say(f"runtime_env {phase}: {text}")
            )
        )

    def _acquire(self, job: jpb.JobDetails) -> None:
        assert self.node is not None
        resources = dict(job.entrypoint_resources)
        if job.entrypoint_num_cpus:
            resources["CPU"] = job.entrypoint_num_cpus
        if job.entrypoint_num_gpus:
            resources["GPU"] = job.entrypoint_num_gpus
        if not resources:
            return
        self.say(f"waiting for resources {resources}")
        self.report("PENDING", message=f"Waiting for resources {resources} to run the entrypoint.")
        self.lease = self._interruptible(
            lambda: self.node.hold_lease(resources, f"job-supervisor:{self.sid}")  # type: ignore[union-attr]
        )

    def _release(self) -> None:
        if self.lease is not None and self.node is not None:
            with contextlib.suppress(Exception):
                self.node.return_lease(*self.lease)
            self.lease = None

    def _entrypoint_env(
        self, worker_json: str, node_address: str
    ) -> tuple[dict[str, str], str | None]:
        base = {
            k: v
            for k, v in os.environ.items()
            if k not in ("NBCLUSTER_WORKER_ID", "NBCLUSTER_PARENT_FD")
        }
        base["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), base.get("PATH", "")])
        env, cwd = env_worker.entrypoint_environ(worker_json, base)
        env.update(
            NBCLUSTER_ADDRESS=self.head_address,
            NBCLUSTER_TOKEN_FILE=os.path.abspath(self.token_file),
            NBCLUSTER_NODE_ADDRESS=node_address,
            NBCLUSTER_JOB_SUBMISSION_ID=self.sid,
            PYTHONUNBUFFERED="1",
        )
        return env, cwd

    def _end_group(self, pgid: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGTERM)
        deadline = time.monotonic() + TERM_GRACE_S
        assert self.child is not None
        while time.monotonic() < deadline and self.child.poll() is None:
            time.sleep(0.02)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)

    def _wait(self) -> int:
        """Wait for the entrypoint, stopping it when asked or when the head stays away."""
        assert self.child is not None
        last_seen = time.monotonic()
        next_ping = time.monotonic() + 2.0
        while True:
            code = self.child.poll()
            if code is not None:
                return code
            if self.stopping.wait(0.05):
                self._end_group(self.child.pid)
                return self.child.wait()
            if time.monotonic() >= next_ping:
                next_ping = time.monotonic() + 2.0
                try:
                    self.head.get_job(self.sid)
                    last_seen = time.monotonic()
                except LookupError:
                    last_seen = time.monotonic()
                except (exc.NbclusterError, ConnectionError):
                    if time.monotonic() - last_seen > self.grace_s:
                        self.say(f"the head has been unreachable for {self.grace_s:.0f}s: stopping")
                        self._end_group(self.child.pid)
                        return self.child.wait()

    def run(self) -> int:
        """The whole life of the job; returns the supervisor's exit code."""
        signal.signal(signal.SIGTERM, lambda *_: self.stopping.set())
        signal.signal(signal.SIGINT, lambda *_: self.stopping.set())
        try:
            job = self._retry_head(lambda: self.head.get_job(self.sid), self.grace_s)
        except (exc.HeadUnavailableError, ConnectionError, LookupError) as err:
            self.say(f"cannot read the job from the head: {err}")
            return 1
        try:
            node_info = self._local_node()
            self.node = NodeClient(node_info["address"], self.token)
            worker_json = self._prepare_env(job.runtime_env) if job.runtime_env else ""
            self._acquire(job)
        except _Stopped:
            self._release()
            self.say("stopped before the entrypoint started")
            self.report("STOPPED")
            return 0
        except Exception as err:  # noqa: BLE001 - setup failed: the job fails with the reason
            self._release()
            self.say(f"setup failed: {err}")
            self.report(
                "FAILED",
                message=f"Runtime environment setup failed: {err}",
                error_type="RUNTIME_ENV_SETUP_FAILURE",
            )
            return 1
        env, cwd = self._entrypoint_env(worker_json, node_info["address"])
        try:
            argv = shlex.split(job.entrypoint)
            self.say(f"running: {job.entrypoint}")
            self.child = subprocess.Popen(
                argv, env=env, cwd=cwd, stdin=subprocess.DEVNULL, start_new_session=True
            )
        except (OSError, ValueError) as err:
            self._release()
            hint = (
                " (the entrypoint is run without a shell: for pipes, redirection or `&&` "
                "write it as: sh -c '...')"
            )
            self.report(
                "FAILED",
                message=f"Job entrypoint command could not be started: {err}{hint}",
                error_type="JOB_ENTRYPOINT_COMMAND_START_ERROR",
            )
            return 1
        self.report("RUNNING", driver_pid=self.child.pid, node_id=node_info.get("node_id", ""))
        code = self._wait()
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.child.pid, signal.SIGKILL)  # what the entrypoint left behind
        self._release()
        if self.stopping.is_set():
            self.report("STOPPED", has_exit_code=True, exit_code=code)
            return 0
        if code == 0:
            self.report("SUCCEEDED", has_exit_code=True, exit_code=0)
            return 0
        how = f"exit code {code}"
        if code < 0:
            with contextlib.suppress(ValueError):
                how += f" (killed by {signal.Signals(-code).name})"
        tail = logfiles.tail_text(
            self.session_dir / "logs" / logfiles.job_log_name(self.sid), 20_000, max_lines=50
        )
        self.report(
            "FAILED",
            message=f"Job entrypoint command failed with {how}, last available logs "
            f"(truncated to 20,000 chars):\n{tail}",
            has_exit_code=True,
            exit_code=code,
            error_type="JOB_ENTRYPOINT_COMMAND_ERROR",
        )
        return 0


def main(argv: list[str] | None = None) -> None:
    """Parse the arguments and supervise the job."""
    p = argparse.ArgumentParser(prog="nbcluster-job-supervisor")
    p.add_argument("--session-dir", required=True)
    p.add_argument("--token-file", required=True)
    p.add_argument("--head-address", required=True)
    p.add_argument("--submission-id", required=True)
    args = p.parse_args(argv)
    sup = Supervisor(
        session_dir=Path(args.session_dir),
        token_file=args.token_file,
        head_address=args.head_address,
        submission_id=args.submission_id,
    )
    sys.exit(sup.run())


if __name__ == "__main__":
    main()
