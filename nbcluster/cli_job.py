"""``nbcluster job ...``: submit, follow and manage jobs from a shell (like ``ray job``).

::

    nbcluster job submit [--address A] [--working-dir DIR] [--runtime-env-json JSON]
                         [--submission-id ID] [--entrypoint-num-cpus N] [--no-wait] -- CMD...
    nbcluster job status ID      nbcluster job logs ID [--follow]
    nbcluster job stop ID        nbcluster job list        nbcluster job delete ID
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from typing import Any

from nbcluster import exceptions as exc
from nbcluster.job_submission import JobStatus, JobSubmissionClient

__all__ = ["add_subcommands"]


def _client(args: argparse.Namespace) -> JobSubmissionClient:
    return JobSubmissionClient(args.address or None)


def _json_arg(text: str, what: str) -> Any:
    try:
        return json.loads(text)
    except ValueError as err:
        raise SystemExit(f"nbcluster job: {what} is not valid JSON: {err}") from None


def _follow(client: JobSubmissionClient, sid: str) -> JobStatus:
    try:
        for text in client.iter_job_logs(sid):
            sys.stdout.write(text)
            sys.stdout.flush()
    except KeyboardInterrupt:
        print(f"\n(stopped following; job '{sid}' keeps running: `nbcluster job stop {sid}`)")
        return client.get_job_status(sid)
    return client.wait_until_finished(sid, timeout=30)


def _final(client: JobSubmissionClient, sid: str, status: JobStatus) -> int:
    info = client.get_job_info(sid)
    if status == JobStatus.SUCCEEDED:
        print(f"------------------------------------------\nJob '{sid}' succeeded")
        return 0
    if status == JobStatus.STOPPED:
        print(f"Job '{sid}' was stopped")
        return 1
    if status == JobStatus.FAILED:
        first = (info.message or "").splitlines()[0] if info.message else ""
        print(f"------------------------------------------\nJob '{sid}' failed: {first}")
        return 1
    print(f"Job '{sid}' is {status.value}")
    return 0


def cmd_submit(args: argparse.Namespace) -> int:
    cmd = list(args.entrypoint)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if not cmd:
        print(
            "nbcluster job submit: give the command after --, e.g. -- python job.py",
            file=sys.stderr,
        )
        return 2
    runtime_env: dict[str, Any] = {}
    if args.runtime_env_json:
        runtime_env = _json_arg(args.runtime_env_json, "--runtime-env-json")
        if not isinstance(runtime_env, dict):
            print("nbcluster job submit: --runtime-env-json must be a JSON object", file=sys.stderr)
            return 2
    if args.working_dir:
        runtime_env["working_dir"] = args.working_dir
    metadata = _json_arg(args.metadata_json, "--metadata-json") if args.metadata_json else None
    resources = (
        _json_arg(args.entrypoint_resources, "--entrypoint-resources")
        if args.entrypoint_resources
        else None
    )
    client = _client(args)
    sid = client.submit_job(
        entrypoint=shlex.join(cmd),
        runtime_env=runtime_env or None,
        submission_id=args.submission_id or None,
        metadata=metadata,
        entrypoint_num_cpus=args.entrypoint_num_cpus,
        entrypoint_num_gpus=args.entrypoint_num_gpus,
        entrypoint_resources=resources,
    )
    print(f"Job '{sid}' submitted successfully")
    if args.no_wait:
        print(f"  status: nbcluster job status {sid}\n  logs:   nbcluster job logs {sid} --follow")
        print(f"  stop:   nbcluster job stop {sid}")
        return 0
    print("Tailing logs until the job exits (disable with --no-wait):")
    sys.stdout.flush()
    return _final(client, sid, _follow(client, sid))


def cmd_status(args: argparse.Namespace) -> int:
    info = _client(args).get_job_info(args.submission_id)
    print(f"Status for job '{args.submission_id}': {info.status.value}")
    if info.message:
        print(f"Status message: {info.message}")
    return 0


def cmd_logs(args: argparse.Namespace) -> int:
    client = _client(args)
    if args.follow:
        _follow(client, args.submission_id)
    else:
        sys.stdout.write(client.get_job_logs(args.submission_id))
    return 0


def cmd_stop(args: argparse.Namespace) -> int:
    client = _client(args)
    sid = args.submission_id
    if not client.stop_job(sid):
        print(f"Job '{sid}' has already ended ({client.get_job_status(sid).value})")
        return 0
    print(f"Requested stop of job '{sid}'")
    if args.no_wait:
        return 0
    status = client.wait_until_finished(sid, timeout=30)
    print(f"Job '{sid}' is {status.value}")
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    jobs = _client(args).list_jobs()
    if args.format == "json":
        print(
            json.dumps([j.to_json() | {"type": j.type.value} for j in jobs], indent=1, default=str)
        )
        return 0
    print(f"{'SUBMISSION ID':<28} {'TYPE':<10} {'STATUS':<10} {'DURATION':>9}  ENTRYPOINT")
    for j in jobs:
        dur = j.duration_s
        print(
            f"{(j.submission_id or j.job_id or ''):<28} {j.type.value:<10} {j.status.value:<10} "
            f"{(f'{dur:.1f}s' if dur is not None else '-'):>9}  {j.entrypoint[:60]}"
        )
    return 0


def cmd_delete(args: argparse.Namespace) -> int:
    _client(args).delete_job(args.submission_id)
    print(f"Job '{args.submission_id}' deleted")
    return 0


def _run(fn: Any) -> Any:
    def run(args: argparse.Namespace) -> int:
        try:
            return int(fn(args))
        except (
            RuntimeError,
            ValueError,
            TypeError,
            ConnectionError,
            TimeoutError,
            exc.NbclusterError,
        ) as err:
            print(f"nbcluster job {args.job_command}: {err}", file=sys.stderr)
            return 1

    return run


def add_subcommands(subparsers: Any) -> None:
    """Register ``nbcluster job ...``."""
    job = subparsers.add_parser("job", help="submit and manage jobs (like `ray job`)")
    sub = job.add_subparsers(dest="job_command", required=True)

    def parser(name: str, help_text: str, fn: Any) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_text)
        p.add_argument("--address", default="", help="HOST:PORT of the head (default: auto)")
        p.set_defaults(fn=_run(fn))
        return p

    p = parser("submit", "run a command on the cluster as a job", cmd_submit)
    p.add_argument(
        "--working-dir", default="", help="local folder shipped as the job's working_dir"
    )
    p.add_argument("--runtime-env-json", default="", help="runtime_env as JSON")
    p.add_argument("--submission-id", default="", help="id for the job (default: generated)")
    p.add_argument("--metadata-json", default="", help="metadata as a JSON object of strings")
    p.add_argument("--entrypoint-num-cpus", type=float, default=None)
    p.add_argument("--entrypoint-num-gpus", type=float, default=None)
    p.add_argument("--entrypoint-resources", default="", help="custom resources as JSON")
    p.add_argument(
        "--no-wait", action="store_true", help="return at once instead of following the logs"
    )
    p.add_argument("entrypoint", nargs=argparse.REMAINDER, help="-- the command to run")
    for name, help_text, fn in (
        ("status", "show a job's status", cmd_status),
        ("delete", "delete a finished job and its logs", cmd_delete),
    ):
        parser(name, help_text, fn).add_argument("submission_id")
    p = parser("logs", "print a job's logs", cmd_logs)
    p.add_argument("submission_id")
    p.add_argument("--follow", "-f", action="store_true", help="keep printing until the job ends")
    p = parser("stop", "stop a job (its whole process group)", cmd_stop)
    p.add_argument("submission_id")
    p.add_argument("--no-wait", action="store_true", help="do not wait until it has stopped")
    p = parser("list", "list the jobs of the cluster", cmd_list)
    p.add_argument("--format", choices=("table", "json"), default="table")
