"""``nbcluster list|summary|get|logs``: the state API from a shell (like ``ray list`` ...).

::

    nbcluster list tasks [--filter "state=FAILED"]... [--limit N] [--detail] [--format F]
    nbcluster summary tasks|actors|objects
    nbcluster get actors|tasks|nodes|jobs|placement-groups|workers ID
    nbcluster logs [cluster] [GLOB] [--node-id ID]     nbcluster logs actor|task|job --id ID
                   [--follow] [--tail N]
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from nbcluster import exceptions as exc
from nbcluster.util import state

__all__ = ["add_subcommands"]

_LISTS = {
    "actors": state.list_actors,
    "tasks": state.list_tasks,
    "nodes": state.list_nodes,
    "jobs": state.list_jobs,
    "objects": state.list_objects,
    "placement-groups": state.list_placement_groups,
    "workers": state.list_workers,
}
_GETS = {
    "actors": state.get_actor,
    "tasks": state.get_task,
    "nodes": state.get_node,
    "jobs": state.get_job,
    "placement-groups": state.get_placement_group,
    "workers": state.get_worker,
}
_SUMMARIES = {
    "tasks": state.summarize_tasks,
    "actors": state.summarize_actors,
    "objects": state.summarize_objects,
}


def parse_filter(text: str) -> tuple[str, str, str]:
    """``"key=value"`` or ``"key!=value"`` → ``(key, predicate, value)``."""
    for pred in ("!=", "="):
        key, sep, value = text.partition(pred)
        if sep and key.strip():
            return key.strip(), pred, value.strip()
    raise ValueError(f"a filter looks like key=value or key!=value, got {text!r}")


def _table(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return "(none)"
    cols = [c for c in rows[0] if any(r.get(c) not in (None, "", {}, []) for r in rows)]
    cells = [[_cell(r.get(c)) for c in cols] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(cols)]
    lines = ["  ".join(c.upper().ljust(w) for c, w in zip(cols, widths, strict=True))]
    lines += ["  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)) for row in cells]
    return "\n".join(line.rstrip() for line in lines)


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, dict | list):
        return json.dumps(value, separators=(",", ":"))
    text = str(value).replace("\n", " ")
    return text if len(text) <= 60 else text[:57] + "..."


def _emit(data: Any, fmt: str) -> None:
    if fmt == "json":
        print(json.dumps(data, indent=1, default=str))
    elif fmt == "yaml":
        import yaml

        print(yaml.safe_dump(data, sort_keys=False), end="")
    elif isinstance(data, list):
        print(_table(data))
    else:
        print(json.dumps(data, indent=1, default=str))


def cmd_list(args: argparse.Namespace) -> int:
    filters = [parse_filter(f) for f in args.filter]
    records = _LISTS[args.resource](
        args.address or None, filters=filters, limit=args.limit, detail=args.detail
    )
    _emit([r.asdict() for r in records], args.format)
    if len(records) == args.limit:
        print(f"(showing the first {args.limit}; raise --limit to see more)", file=sys.stderr)
    return 0


def cmd_get(args: argparse.Namespace) -> int:
    record = _GETS[args.resource](args.id, address=args.address or None)
    if record is None:
        print(f"nbcluster get: no {args.resource[:-1]} with id {args.id!r}", file=sys.stderr)
        return 1
    _emit(record.asdict(), "json" if args.format == "table" else args.format)
    return 0


def cmd_summary(args: argparse.Namespace) -> int:
    data = _SUMMARIES[args.resource](args.address or None)
    if args.format != "table":
        _emit(data, args.format)
        return 0
    cluster = data["cluster"]
    totals = {k: v for k, v in cluster.items() if k.startswith("total")}
    print(
        "  ".join(f"{k}: {v:g}" if isinstance(v, float) else f"{k}: {v}" for k, v in totals.items())
    )
    rows = []
    for name, entry in cluster["summary"].items():
        counts = ", ".join(f"{s}: {n}" for s, n in sorted(entry.get("state_counts", {}).items()))
        rows.append({"name": name, "type": entry.get("type", ""), "states": counts})
    print(_table(rows))
    return 0


def cmd_logs(args: argparse.Namespace) -> int:
    target = args.target
    if target in ("actor", "task", "job"):
        if not args.id:
            print(f"nbcluster logs {target}: give --id", file=sys.stderr)
            return 2
        kwargs = {{"actor": "actor_id", "task": "task_id", "job": "submission_id"}[target]: args.id}
    else:
        glob = args.glob or (target if target not in (None, "cluster") else "")
        if not glob or any(ch in glob for ch in "*?["):
            listing = state.list_logs(
                args.address or None, node_id=args.node_id, glob_filter=glob or "*"
            )
            for group, names in sorted(listing.items()):
                print(f"{group}:")
                for name in names:
                    print(f"  {name}")
            return 0
        kwargs = {"filename": glob, "node_id": args.node_id}
    try:
        for text in state.get_log(
            args.address or None, follow=args.follow, tail=args.tail, **kwargs
        ):
            sys.stdout.write(text)
            sys.stdout.flush()
    except KeyboardInterrupt:
        return 0
    return 0


def _run(fn: Any, name: str) -> Any:
    def run(args: argparse.Namespace) -> int:
        try:
            return int(fn(args))
        except (ValueError, LookupError, RuntimeError, ConnectionError, exc.NbclusterError) as err:
            print(f"nbcluster {name}: {err}", file=sys.stderr)
            return 1

    return run


def add_subcommands(subparsers: Any) -> None:
    """Register ``nbcluster list``, ``summary``, ``get`` and ``logs``."""
    formats = ("table", "json", "yaml")
    p = subparsers.add_parser("list", help="list actors, tasks, nodes, jobs, objects, ...")
    p.add_argument("resource", choices=sorted(_LISTS))
    p.add_argument(
        "--filter", "-f", action="append", default=[], help='e.g. "state=FAILED" (repeatable)'
    )
    p.add_argument("--limit", type=int, default=100)
    p.add_argument("--detail", action="store_true", help="all fields")
    p.add_argument("--format", choices=formats, default="table")
    p.add_argument("--address", default="")
    p.set_defaults(fn=_run(cmd_list, "list"))
    p = subparsers.add_parser("summary", help="count tasks, actors or objects by state")
    p.add_argument("resource", choices=sorted(_SUMMARIES))
    p.add_argument("--format", choices=formats, default="table")
    p.add_argument("--address", default="")
    p.set_defaults(fn=_run(cmd_summary, "summary"))
    p = subparsers.add_parser("get", help="show one actor, task, node, job, ...")
    p.add_argument("resource", choices=sorted(_GETS))
    p.add_argument("id")
    p.add_argument("--format", choices=formats, default="table")
    p.add_argument("--address", default="")
    p.set_defaults(fn=_run(cmd_get, "get"))
    p = subparsers.add_parser("logs", help="list or print log files (by node, actor, task or job)")
    p.add_argument(
        "target",
        nargs="?",
        default="cluster",
        help="cluster (default), actor, task, job, or a file name / glob",
    )
    p.add_argument("glob", nargs="?", default="", help="with `cluster`: a file name or glob")
    p.add_argument("--id", default="", help="actor / task id, or job submission id")
    p.add_argument("--node-id", default=None, help="the node whose files to read (default: head's)")
    p.add_argument("--follow", "-f", action="store_true", help="keep printing what is appended")
    p.add_argument("--tail", type=int, default=1000, help="lines from the end (-1: all)")
    p.add_argument("--address", default="")
    p.set_defaults(fn=_run(cmd_logs, "logs"))
