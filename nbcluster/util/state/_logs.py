"""``list_logs`` and ``get_log``: the log files of the cluster, by node, actor, task or job.

A worker's log file (``worker-<id>.log`` on its node) holds what its tasks printed; an
actor's or a task's log is that of the worker that ran it. A job's log is its entrypoint's
output, kept by the head. ``follow=True`` keeps yielding what is appended (a job's log
ends when the job does).
"""

from __future__ import annotations

from collections.abc import Iterator

from nbcluster import _connect
from nbcluster.util.state._api import get_actor, get_task

__all__ = ["get_log", "list_logs"]


def _group(name: str) -> str:
    for prefix, group in (
        ("job-driver-", "job"),
        ("worker-", "worker"),
        ("node", "node"),
        ("head", "head"),
    ):
        if name.startswith(prefix):
            return group
    return "other"


def list_logs(
    address: str | None = None,
    node_id: str | None = None,
    glob_filter: str = "*",
    timeout: int = 30,
) -> dict[str, list[str]]:
    """Log file names by group (``head``, ``node``, ``worker``, ``job``, ``other``).

    Without ``node_id``: the files of the head's host; with it, that node's.
    """
    head = _connect.connect(address, timeout=timeout)
    try:
        files = head.list_logs(node_id or "", "" if glob_filter == "*" else glob_filter)
    finally:
        head.close()
    out: dict[str, list[str]] = {}
    for f in files:
        out.setdefault(_group(f.filename), []).append(f.filename)
    return out


def _worker_file(worker_id: str) -> str:
    return f"worker-{worker_id[:8]}.log"


def _last_lines(chunks: Iterator[bytes], tail: int) -> Iterator[bytes]:
    data = b"".join(chunks)
    if tail >= 0:
        lines = data.splitlines(keepends=True)
        data = b"".join(lines[-tail:]) if tail else b""
    yield data


def get_log(
    address: str | None = None,
    node_id: str | None = None,
    filename: str | None = None,
    actor_id: str | None = None,
    task_id: str | None = None,
    submission_id: str | None = None,
    follow: bool = False,
    tail: int = 1000,
    timeout: int = 30,
) -> Iterator[str]:
    """Yield the text of one log: a file of a node, or an actor's, a task's or a job's.

    ``tail`` lines from the end (-1: the whole file) and then, with ``follow``, what is
    appended. Raises ``ValueError`` when nothing (or more than one thing) is named, and
    ``LookupError`` for an unknown actor, task or file.
    """
    given = [x for x in (filename, actor_id, task_id, submission_id) if x]
    if len(given) != 1:
        raise ValueError("name exactly one of filename, actor_id, task_id or submission_id")
    head = _connect.connect(address, timeout=timeout)
    try:
        if submission_id:
            stream = (c.data for c in head.job_logs(submission_id, follow=follow))
            if not follow:
                stream = _last_lines(stream, tail)
            for data in stream:
                if data:
                    yield data.decode(errors="replace")
            return
        if actor_id:
            actor = get_actor(actor_id, address=head.address if address else None)
            if actor is None:
                raise LookupError(f"no actor {actor_id!r}; `nbcluster list actors` shows them")
            if not actor.worker_id:
                raise LookupError(f"actor {actor_id} has not started on a worker yet")
            node_id, filename = actor.node_id, _worker_file(actor.worker_id)
        elif task_id:
            task = get_task(task_id, address=head.address if address else None)
            if task is None or not task.worker_id:
                raise LookupError(
                    f"no recorded attempt of task {task_id!r} ran on a worker; "
                    "`nbcluster list tasks` shows them"
                )
            node_id, filename = task.node_id, _worker_file(task.worker_id)
        assert filename is not None
        node = node_id or ""
        offset = 0
        if tail >= 0:  # the last lines as of now, then (with follow) what is appended
            data = b""
            for chunk in head.stream_log(node, filename, tail_bytes=max(tail, 1) * 400):
                data += chunk.data
                offset = chunk.offset + len(chunk.data)
            lines = data.splitlines(keepends=True)
            yield b"".join(lines[-tail:] if tail else []).decode(errors="replace")
            if not follow:
                return
        for chunk in head.stream_log(node, filename, follow=follow, offset=offset):
            if chunk.data:
                yield chunk.data.decode(errors="replace")
    finally:
        head.close()
