"""``nbcluster.timeline()``: the finished task attempts as a Chrome trace (Perfetto, chrome://tracing).

Like ``ray.timeline()``: one complete event (``"ph": "X"``) per task attempt, plus
metadata events (``"ph": "M"``) that name each node (a trace "process") and each worker
(a trace "thread"), so the viewer shows a track per worker grouped by node.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import Any

from nbcluster import state

__all__ = ["chrome_trace", "timeline"]


def chrome_trace(
    events: Sequence[state.TaskEvent], node_names: dict[str, str] | None = None
) -> list[dict[str, Any]]:
    """Chrome-trace dicts for ``events``.

    Each attempt becomes ``{"name": function, "cat": "task", "ph": "X", "ts": start µs,
    "dur": µs, "pid": node number, "tid": worker pid, "args": {task_id, job_id, node_id,
    worker_id, state, attempt, parent_task_id}}``; failed attempts also get
    ``"cname": "terrible"`` (drawn red by chrome://tracing). ``pid`` numbers nodes from 1 in
    order of first appearance; the ``process_name`` metadata event gives the node's name
    (``node_names``, else the start of its id).
    """
    names = node_names or {}
    node_pid: dict[str, int] = {}
    threads: set[tuple[int, int]] = set()
    out: list[dict[str, Any]] = []
    meta: list[dict[str, Any]] = []
    for e in events:
        pid = node_pid.get(e.node_id)
        if pid is None:
            pid = node_pid[e.node_id] = len(node_pid) + 1
            label = names.get(e.node_id) or f"node {e.node_id[:8]}"
            meta.append(
                {"name": "process_name", "ph": "M", "pid": pid, "tid": 0, "args": {"name": label}}
            )
        if (pid, e.worker_pid) not in threads:
            threads.add((pid, e.worker_pid))
            meta.append(
                {
                    "name": "thread_name",
                    "ph": "M",
                    "pid": pid,
                    "tid": e.worker_pid,
                    "args": {"name": f"worker {e.worker_pid}"},
                }
            )
        record: dict[str, Any] = {
            "name": e.name,
            "cat": "task",
            "ph": "X",
            "ts": e.start_time * 1e6,
            "dur": max(e.end_time - e.start_time, 0.0) * 1e6,
            "pid": pid,
            "tid": e.worker_pid,
            "args": {
                "task_id": e.task_id,
                "job_id": e.job_id,
                "node_id": e.node_id,
                "worker_id": e.worker_id,
                "state": e.state,
                "attempt": e.attempt,
                "parent_task_id": e.parent_task_id,
            },
        }
        if e.state == "FAILED":
            record["cname"] = "terrible"
        out.append(record)
    return out + meta


def timeline(
    path: str | os.PathLike[str] | None = None, *, job_id: str | None = None
) -> list[dict[str, Any]]:
    """Return the cluster's finished task attempts as Chrome-trace events; write them to ``path``.

    The file is a JSON array, which chrome://tracing and https://ui.perfetto.dev open
    directly. ``job_id`` (hex) keeps one job's tasks; by default every job's are included.
    The head keeps a bounded ring of events, so a very long session shows its latest
    attempts only. Needs a connected driver (``nbcluster.init()``).
    """
    events, _dropped = state.task_events(job_id)
    names = {n.node_id: n.name for n in state.node_stats() if n.name}
    trace = chrome_trace(events, names)
    if path is not None:
        with open(path, "w", encoding="utf-8") as f:
            json.dump(trace, f)
    return trace
