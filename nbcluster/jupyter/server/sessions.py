"""Find the clusters running on this host by reading their session directories.

Every :class:`~nbcluster.LocalCluster` (started by a kernel, the CLI, a script or this
server) creates ``<temp_dir>/session_*`` holding its head's address, the head's PID, the
token file and one JSON file per node manager. A session counts as live when its head
PID is alive *and* that process's command line names the session directory (PIDs are
reused). Nothing here talks to a cluster or starts anything.

The file names below mirror what :class:`~nbcluster.LocalCluster` writes;
``tests/jupyter_server/test_sessions.py`` checks them against a real cluster, so a change
of layout fails a test instead of silently hiding clusters.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import psutil

from nbcluster.jupyter.server.models import valid_address

__all__ = [
    "HEAD_ADDRESS_FILE",
    "HEAD_PID_FILE",
    "NODES_DIR",
    "TOKEN_FILE",
    "Session",
    "live_sessions",
    "read_session",
]

HEAD_ADDRESS_FILE = "head.addr"
HEAD_PID_FILE = "head.pid"
TOKEN_FILE = "token"
NODES_DIR = "nodes"


@dataclass(frozen=True)
class Session:
    """A live cluster on this host, as its session directory describes it."""

    session_dir: Path
    address: str
    token_file: Path
    head_pid: int
    #: The process that started the cluster (the head's parent), None once it is gone.
    owner_pid: int | None
    #: Node managers whose process is alive.
    nodes: int


def _session_process(pid: int, session_dir: Path) -> psutil.Process | None:
    """The process ``pid`` if it is alive and belongs to ``session_dir``."""
    try:
        p = psutil.Process(pid)
        if p.status() == psutil.STATUS_ZOMBIE:
            return None
        if not any(str(session_dir) in part for part in p.cmdline()):
            return None
        return p
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return None


def _live_nodes(session_dir: Path) -> int:
    count = 0
    for path in (session_dir / NODES_DIR).glob("*.json"):
        try:
            pid = int(json.loads(path.read_text())["pid"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if _session_process(pid, session_dir) is not None:
            count += 1
    return count


def read_session(session_dir: Path) -> Session | None:
    """The live cluster of ``session_dir``, or None (not started, ended, or unreadable)."""
    try:
        address = (session_dir / HEAD_ADDRESS_FILE).read_text().strip()
        head_pid = int((session_dir / HEAD_PID_FILE).read_text().strip())
    except (OSError, ValueError):
        return None
    if not valid_address(address):
        return None
    head = _session_process(head_pid, session_dir)
    if head is None:
        return None
    try:
        parent = head.ppid()
    except psutil.NoSuchProcess:
        return None
    owner = parent if parent > 1 else None  # 1: orphaned (detached, or its owner died)
    return Session(
        session_dir=session_dir,
        address=address,
        token_file=session_dir / TOKEN_FILE,
        head_pid=head_pid,
        owner_pid=owner,
        nodes=_live_nodes(session_dir),
    )


def live_sessions(temp_dir: str | os.PathLike[str]) -> list[Session]:
    """Every live cluster under ``temp_dir``, newest first."""
    base = Path(temp_dir)
    try:
        dirs = [p for p in base.glob("session_*") if p.is_dir() and not p.is_symlink()]
    except OSError:
        return []
    dirs.sort(key=lambda p: p.name, reverse=True)
    return [s for s in map(read_session, dirs) if s is not None]
