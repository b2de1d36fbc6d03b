"""Serving the files of a session's ``logs`` folder: listing, reading, following.

Names come from clients, so :func:`safe_path` accepts only a plain file name inside the
folder (no separators, no ``..``, checked with ``commonpath`` after resolving links).
"""

from __future__ import annotations

import asyncio
import fnmatch
import os
from collections.abc import AsyncIterator, Callable
from pathlib import Path

__all__ = [
    "CHUNK",
    "BadLogName",
    "job_log_name",
    "list_files",
    "safe_path",
    "stream_file",
    "tail_text",
]

CHUNK = 256 * 1024
POLL_S = 0.05


class BadLogName(ValueError):
    """A log file name that is not a plain name inside the logs folder."""


def job_log_name(submission_id: str) -> str:
    """The file a job's entrypoint (and supervisor) writes to."""
    return f"job-driver-{submission_id}.log"


def safe_path(logs_dir: str | os.PathLike[str], filename: str) -> Path:
    """``logs_dir/filename`` when ``filename`` is a plain name that stays inside the folder."""
    if (
        not filename
        or "\0" in filename
        or "/" in filename
        or "\\" in filename
        or filename in (".", "..")
        or filename.startswith("~")
    ):
        raise BadLogName(f"not a log file name: {filename!r} (give a name from the list, no path)")
    root = os.path.realpath(logs_dir)
    target = os.path.realpath(os.path.join(root, filename))
    if os.path.commonpath([root, target]) != root:
        raise BadLogName(f"not a log file name: {filename!r}")
    return Path(target)


def list_files(logs_dir: str | os.PathLike[str], pattern: str = "") -> list[tuple[str, int, float]]:
    """(name, size, mtime) of the regular files in the folder, by name."""
    out = []
    try:
        names = sorted(os.listdir(logs_dir))
    except OSError:
        return []
    for name in names:
        if pattern and not fnmatch.fnmatch(name, pattern):
            continue
        try:
            st = os.stat(os.path.join(logs_dir, name))
        except OSError:
            continue
        if os.path.isfile(os.path.join(logs_dir, name)):
            out.append((name, st.st_size, st.st_mtime))
    return out


async def stream_file(
    path: Path,
    *,
    offset: int = 0,
    tail_bytes: int = 0,
    follow: bool = False,
    finished: Callable[[], bool] = lambda: False,
) -> AsyncIterator[tuple[int, bytes]]:
    """(offset, bytes) chunks of a file.

    Without ``follow`` it ends at the current end of the file. With ``follow`` it keeps
    polling for appended bytes until ``finished()`` is true and everything was read (for a
    job: until it ended), or forever (the caller cancels).
    """
    if tail_bytes > 0:
        try:
            offset = max(0, path.stat().st_size - tail_bytes)
        except OSError:
            offset = 0
    f = None
    try:
        while True:
            if f is None:
                try:
                    f = open(path, "rb")  # noqa: SIM115 - closed in finally
                except FileNotFoundError:
                    if not follow or finished():
                        return
                    await asyncio.sleep(POLL_S)
                    continue
            f.seek(offset)
            data = f.read(CHUNK)
            if data:
                yield offset, data
                offset += len(data)
                continue
            if not follow:
                return
            done = finished()
            if done:
                f.seek(offset)
                if not f.read(1):
                    return
                continue
            await asyncio.sleep(POLL_S)
    finally:
        if f is not None:
            f.close()


def tail_text(path: str | os.PathLike[str], max_chars: int = 20_000, max_lines: int = 0) -> str:
    """The end of a text file (at most ``max_chars`` characters / ``max_lines`` lines)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - max_chars * 4))
            text = f.read().decode(errors="replace")
    except OSError:
        return ""
    text = text[-max_chars:]
    if max_lines:
        text = "\n".join(text.splitlines()[-max_lines:])
    return text
