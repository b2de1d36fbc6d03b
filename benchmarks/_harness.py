"""The child-runner harness the benchmark scripts share.

Every benchmark here measures each system (or each point of a series) in a fresh
subprocess: this same script, run again with hidden flags, in its own process group. The
parent waits for it with a time limit, then ends whatever the child left behind by that
group's id (never by name: other clusters run on the machine), reads the child's results
(one JSON record a line, or one JSON document) and prints a table of ratios.

The parent's side: :func:`run_child` (start, wait, end the group), :func:`run_system`
(the same for one system of a ``--_child``/``--_out`` script, with its version and its
records), :func:`read_records`, :func:`tail`, :class:`SystemAdapter` (a system's version).
The child's side: :func:`record_workload`, :func:`start_ray`. The script's frame:
:func:`bench_parser`, :func:`select_systems`, :func:`new_report`, :func:`finish`. The
table: :func:`format_table`, :func:`fmt`, :func:`better`, :func:`versions_line`,
:func:`note_lines`, :func:`machine_info`.

Only the standard library is imported here: the scripts' children re-run their script, and
microbench's cold-start child measures its import time. The scripts import this module as
``_harness`` (Python puts a script's folder first on ``sys.path``). Nothing of it may be
shipped to cluster workers (they could not import it): only the parent and the child's
driver call it.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import importlib.util
import json
import logging
import os
import platform
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "ChildRun",
    "SystemAdapter",
    "bench_parser",
    "better",
    "end_group",
    "finish",
    "fmt",
    "format_table",
    "init_ray",
    "free_port",
    "group_alive",
    "log",
    "measure_all",
    "machine_info",
    "new_report",
    "note_lines",
    "package_version",
    "read_records",
    "record_workload",
    "run_child",
    "run_system",
    "select_systems",
    "start_ray",
    "tail",
    "versions_line",
]

#: How long a child that exited may take to let the rest of its process group end.
GRACE_S = 10.0


def log(msg: str) -> None:
    """Print ``msg`` to stderr at once (in a child, stderr is the system's log file)."""
    print(msg, file=sys.stderr, flush=True)


def package_version(module: str, dist: str | None = None) -> str:
    """The installed version of ``dist`` (default: ``module``), or ``"(source tree)"``.

    Raises ImportError when ``module`` cannot be imported. Imports nothing, so the parent
    stays clean for the next system.
    """
    if importlib.util.find_spec(module) is None:
        raise ImportError(f"No module named {module!r}")
    try:
        return importlib.metadata.version(dist or module)
    except importlib.metadata.PackageNotFoundError:
        return "(source tree)"


class SystemAdapter:
    """A system behind a benchmark's small interface; each script adds its operations.

    ``module`` is what must be importable (None: only the standard library), ``dist`` the
    distribution whose version is shown (default: ``module``), ``notes`` lines printed below
    the table when the system ran.
    """

    name = ""
    module: str | None = ""
    dist: str | None = None
    notes: dict[str, str] = {}

    def version(self) -> str:
        """Raise ImportError when not installed. Imports nothing: the parent stays clean."""
        if self.module is None:
            return "python " + platform.python_version()
        return package_version(self.module, self.dist)


def free_port() -> int:
    """A TCP port of 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def machine_info() -> dict[str, Any]:
    """The machine line's figures: CPU count and model, Python version, the time."""
    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    return {
        "cpus": os.cpu_count(),
        "cpu": cpu,
        "python": platform.python_version(),
        "time": time.ctime(),
    }


# --------------------------------------------------------------------------- process groups


def group_alive(pgid: int) -> bool:
    """True while any process of the group ``pgid`` exists (a zombie counts)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def end_group(pgid: int, grace_s: float) -> None:
    """Give the process group ``pgid`` up to ``grace_s`` to end, then SIGKILL what is left.

    The group is named by its id only: processes are never looked up by name.
    """
    deadline = time.monotonic() + grace_s
    while group_alive(pgid) and time.monotonic() < deadline:
        time.sleep(0.2)
    if group_alive(pgid):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)


@dataclass(frozen=True)
class ChildRun:
    """How one child run ended."""

    returncode: int | None  #: None when it overstayed its time limit
    started: float  #: CLOCK_MONOTONIC just before it was spawned (comparable across processes)
    log: Path  #: the file its stdout and stderr went to

    @property
    def why(self) -> str:
        """``"timed out"`` or ``"exited N"``: how a failed run ended, for messages."""
        return "timed out" if self.returncode is None else f"exited {self.returncode}"


def run_child(
    script: str,
    args: Sequence[str],
    *,
    timeout_s: float,
    logfile: Path,
    grace_s: float = GRACE_S,
) -> ChildRun:
    """Run ``python script *args`` as the leader of a new process group, then end the group.

    Its stdout and stderr are appended to ``logfile``. If it overstays ``timeout_s`` the
    whole group is killed at once; if it exits, what it left behind gets ``grace_s`` to end
    before the group is killed.
    """
    cmd = [sys.executable, os.path.abspath(script), *args]
    with open(logfile, "ab") as logf:
        started = time.clock_gettime(time.CLOCK_MONOTONIC)
        proc = subprocess.Popen(
            cmd, stdin=subprocess.DEVNULL, stdout=logf, stderr=logf, start_new_session=True
        )
        try:
            rc: int | None = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            rc = None
    # The child leads its own process group: end whatever it left behind (by group id).
    end_group(proc.pid, 0 if rc is None else grace_s)
    proc.wait()
    return ChildRun(rc, started, logfile)


def read_records(path: Path) -> list[dict[str, Any]]:
    """The JSON records a child appended to ``path``, one a line (none if it wrote none)."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def tail(path: Path, n: int = 15) -> str:
    """The last ``n`` lines of a log file, indented, for a failure message."""
    lines = path.read_text(errors="replace").splitlines() if path.exists() else []
    return "\n".join("    " + ln for ln in lines[-n:])


def run_system(
    script: str,
    system: str,
    version: Callable[[], str],
    *,
    workdir: Path,
    timeout_s: float,
    flags: Sequence[str] = (),
    value_field: str = "value",
    grace_s: float = GRACE_S,
) -> dict[str, Any]:
    """Measure one system: ``script --_child SYSTEM --_out FILE *flags`` in a fresh group.

    Returns the system's report entry: ``results`` and ``errors`` by workload key, its
    ``version``, ``status`` (``"ok"`` or ``"not installed"``, when ``version()`` raises)
    and ``log``; a child that timed out or exited non-zero adds the error ``run``. The
    child appends records ``{"key", value_field}`` or ``{"key", "error"}`` to FILE (see
    :func:`record_workload`).
    """
    entry: dict[str, Any] = {"results": {}, "errors": {}}
    try:
        entry["version"] = version()
    except Exception as e:  # ImportError, or a half-written package
        entry["status"] = "not installed"
        log(f"[{system}] not installed ({type(e).__name__}: {e})")
        return entry
    entry["status"] = "ok"
    out = workdir / f"{system}.jsonl"
    logfile = workdir / f"{system}.log"
    entry["log"] = str(logfile)
    run = run_child(
        script,
        ["--_child", system, "--_out", str(out), *flags],
        timeout_s=timeout_s,
        logfile=logfile,
        grace_s=grace_s,
    )
    for rec in read_records(out):
        if value_field in rec:
            entry["results"][rec["key"]] = rec[value_field]
        else:
            entry["errors"][rec["key"]] = rec["error"]
    if run.returncode != 0:
        entry["errors"]["run"] = f"child {run.why}; log: {logfile}"
    return entry


def measure_all(
    script: str,
    report: dict[str, Any],
    systems: Sequence[str],
    adapters: Mapping[str, Callable[[], SystemAdapter]],
    *,
    prefix: str,
    timeout_s: float,
    flags: Sequence[str] = (),
    value_field: str = "value",
) -> Path:
    """:func:`run_system` for each of ``systems`` in turn, into ``report["systems"]``.

    Returns the new temporary folder (named ``prefix...``) that holds their logs and records.
    """
    workdir = Path(tempfile.mkdtemp(prefix=prefix))
    for name in systems:
        report["systems"][name] = run_system(
            script,
            name,
            adapters[name]().version,
            workdir=workdir,
            timeout_s=timeout_s,
            flags=flags,
            value_field=value_field,
        )
    return workdir


# --------------------------------------------------------------------------- the child's side


def record_workload(
    system: str,
    out: str | Path,
    key: str,
    fn: Callable[[], Any],
    *,
    value_field: str = "value",
    expand: bool = False,
    skip: tuple[type[BaseException], ...] = (),
) -> None:
    """Run one workload in the child and append its record to ``out``, logging both.

    The record is ``{"key": key, value_field: fn()}``, or ``{"key": key, "error": ...}``
    when ``fn`` raises (a broken workload must not hide the others). With ``expand``, a dict
    that ``fn`` returns becomes one record per item. An exception of a type in ``skip``
    records nothing (the system has no such workload).
    """
    log(f"[{system}] {key} ...")
    try:
        value = fn()
    except skip:
        return
    except Exception as e:  # a broken workload must not hide the others
        records: list[dict[str, Any]] = [{"key": key, "error": f"{type(e).__name__}: {e}"[:300]}]
    else:
        items = value.items() if expand and isinstance(value, dict) else [(key, value)]
        records = [{"key": k, value_field: v} for k, v in items]
    with open(out, "a") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")
    log(f"[{system}] {records if expand else records[0]}")


def start_ray(num_cpus: int) -> Any:
    """``ray.init`` for a benchmark child: no usage stats, no dashboard, loopback; the module."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")  # no reporting home, no prompt
    import ray

    kwargs = dict(num_cpus=num_cpus, include_dashboard=False, logging_level=logging.WARNING)
    try:  # keep Ray's traffic on loopback, as ours is
        ray.init(_node_ip_address="127.0.0.1", **kwargs)
    except TypeError:
        ray.init(**kwargs)
    return ray


def init_ray(attempts: int = 3, **kwargs: Any) -> Any:
    """``ray.init(**kwargs)`` for a benchmark child, tried ``attempts`` times; the module.

    Ray's start-up times out on a loaded machine; a failed start is shut down before the
    next try, and the last failure is raised. No usage stats.
    """
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    import ray

    for attempt in range(attempts):
        try:
            ray.init(**kwargs)
            break
        except Exception:  # noqa: BLE001 - retried, then raised
            if attempt == attempts - 1:
                raise
            with contextlib.suppress(Exception):
                ray.shutdown()
    return ray


# --------------------------------------------------------------------------- the table


def bench_parser(doc: str | None, systems: Sequence[str]) -> argparse.ArgumentParser:
    """The flags of a ``--_child``/``--_out`` script: ``--quick``, ``--only``, ``--json``."""
    parser = argparse.ArgumentParser(description=(doc or "").split("\n", 1)[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, for a smoke run")
    parser.add_argument("--only", help=f"comma-separated: {','.join(systems)}")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    parser.add_argument("--_child", help=argparse.SUPPRESS)
    parser.add_argument("--_out", help=argparse.SUPPRESS)
    return parser


def new_report(quick: bool, sizes: Any, machine: dict[str, Any] | None = None) -> dict[str, Any]:
    """The report a script fills: its sizes, the machine, and ``systems`` (empty)."""
    return {
        "quick": quick,
        "machine": machine_info() if machine is None else machine,
        "sizes": vars(sizes),
        "systems": {},
    }


def finish(table: str, workdir: Path, report: Mapping[str, Any], json_path: str | None) -> None:
    """Print the table and where the logs are; write the report to ``json_path`` if given."""
    print(table)
    print(f"logs: {workdir}")
    if json_path:
        Path(json_path).write_text(json.dumps(report, indent=2) + "\n")
        print(f"results written to {json_path}")


def select_systems(only: str | None, systems: Sequence[str]) -> list[str]:
    """The systems ``--only`` names (all of ``systems`` when unset); exits on an unknown one."""
    chosen = [x.strip().lower() for x in only.split(",")] if only else list(systems)
    for name in chosen:
        if name not in systems:
            raise SystemExit(f"unknown system {name!r}; choose from {', '.join(systems)}")
    return chosen


def fmt(v: float | None, fine_below: float = 0.0) -> str:
    """A figure with as many digits as it needs: ``12,345``, ``12.3``, ``1.23``.

    Below ``fine_below`` (in absolute value) it gets three decimals instead of two.
    """
    if v is None:
        return ""
    if abs(v) >= 100:
        return f"{v:,.0f}"
    if abs(v) >= 10:
        return f"{v:.1f}"
    if abs(v) >= fine_below:
        return f"{v:.2f}"
    return f"{v:.3f}"


def better(nb: float | None, peer: float | None, higher_is_better: bool) -> float | None:
    """How many times better nbcluster is than a peer (>1: nbcluster wins); None if unknown."""
    if not nb or not peer:
        return None
    return nb / peer if higher_is_better else peer / nb


def format_table(
    rows: Sequence[Sequence[str]],
    *,
    right: slice = slice(2, None),
    indent: str = "",
    full_rule: bool = False,
) -> list[str]:
    """Lines of an aligned text table: the first row is the head, ruled below.

    Columns in ``right`` are right-aligned (figures), the others left-aligned; columns are
    two spaces apart and trailing blanks are cut. The rule is as long as the head's line,
    or with ``full_rule`` as wide as every column.
    """
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    right_cols = set(range(len(widths))[right])
    out = []
    for n, r in enumerate(rows):
        cells = [
            c.rjust(w) if i in right_cols else c.ljust(w)
            for i, (c, w) in enumerate(zip(r, widths, strict=True))
        ]
        out.append(indent + "  ".join(cells).rstrip())
        if n == 0:
            rule = sum(widths) + 2 * (len(widths) - 1) if full_rule else len(out[0]) - len(indent)
            out.append(indent + "-" * rule)
    return out


def note_lines(
    systems: Mapping[str, Mapping[str, Any]],
    labels: Mapping[str, str],
    notes: Callable[[str], Iterable[str]] = lambda system: (),
) -> list[str]:
    """The lines below a table: each system that ran, its notes, then its failed workloads."""
    out = []
    for k, v in systems.items():
        if v.get("status") != "ok":
            continue
        out += [f"  - {note}" for note in notes(k)]
        out += [f"  - {labels[k]} {key} failed: {msg}" for key, msg in v["errors"].items()]
    return out


def versions_line(systems: Mapping[str, Mapping[str, Any]], labels: Mapping[str, str]) -> str:
    """``systems: nbcluster 0.1, Ray 2.60 (not installed)``: each system's version and status."""
    return "systems: " + ", ".join(
        f"{labels[k]} {v.get('version', '')}".strip()
        + ("" if v["status"] == "ok" else f" ({v['status']})")
        for k, v in systems.items()
    )
