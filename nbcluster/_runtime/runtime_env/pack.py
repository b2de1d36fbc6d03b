"""Pack a local directory (``working_dir``, a ``py_modules`` entry) into a content-hashed zip.

The hash covers the files' relative paths, executable bits and bytes, so the same tree
always gives the same package URI, whichever machine packs it. ``excludes`` take
gitignore-style patterns (``*.csv``, ``data/``, ``/build``, ``**/tmp``); a ``.gitignore``
at the top of the directory is honoured too, and ``__pycache__``/``*.pyc`` are never
shipped. A tree over the size limit is refused before anything is read, with the largest
entries named so the user knows what to exclude.

:func:`unpack` checks every member stays inside the destination (no ``../`` escapes).
"""

from __future__ import annotations

import contextlib
import dataclasses
import fnmatch
import hashlib
import os
import re
import stat
import zipfile
from collections.abc import Iterable, Sequence
from pathlib import Path

__all__ = [
    "DEFAULT_MAX_PACKAGE_BYTES",
    "Entry",
    "PackageTooLarge",
    "Snapshot",
    "build_zip",
    "content_hash",
    "matches",
    "scan",
    "unpack",
]

DEFAULT_MAX_PACKAGE_BYTES = 100 * 2**20
_ALWAYS_EXCLUDED = ("__pycache__/", "*.pyc", ".git/")
_ZIP_TIME = (1980, 1, 1, 0, 0, 0)


class PackageTooLarge(ValueError):
    """A directory to ship is larger than the package size limit."""


@dataclasses.dataclass(frozen=True)
class Entry:
    """One file to ship: its path inside the package and on disk."""

    arcname: str
    path: str
    size: int
    mtime_ns: int
    executable: bool


Snapshot = tuple[tuple[str, int, int], ...]


def _compile(pattern: str) -> tuple[re.Pattern[str], bool, bool]:
    """A gitignore-style pattern as (regex on the relative path, anchored, directory only)."""
    dir_only = pattern.endswith("/")
    pattern = pattern.rstrip("/")
    anchored = pattern.startswith("/") or "/" in pattern
    pattern = pattern.lstrip("/")
    parts = []
    i = 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            parts.append("(?:.*/)?")
            i += 3
        elif pattern.startswith("**", i):
            parts.append(".*")
            i += 2
        else:
            ch = pattern[i]
            if ch == "*":
                parts.append("[^/]*")
            elif ch == "?":
                parts.append("[^/]")
            elif ch == "[":
                end = pattern.find("]", i)
                if end == -1:
                    parts.append(re.escape(ch))
                else:
                    parts.append(fnmatch.translate(pattern[i : end + 1])[4:-3])
                    i = end
            else:
                parts.append(re.escape(ch))
            i += 1
    return re.compile("^" + "".join(parts) + "$"), anchored, dir_only


def matches(patterns: Sequence[tuple[re.Pattern[str], bool, bool]], rel: str, is_dir: bool) -> bool:
    """True when a compiled pattern excludes the relative path ``rel``."""
    name = rel.rsplit("/", 1)[-1]
    for regex, anchored, dir_only in patterns:
        if dir_only and not is_dir:
            continue
        if regex.match(rel if anchored else name):
            return True
    return False


def _gitignore(root: Path) -> list[str]:
    try:
        lines = (root / ".gitignore").read_text().splitlines()
    except (OSError, UnicodeDecodeError):
        return []
    return [ln.strip() for ln in lines if ln.strip() and not ln.startswith(("#", "!"))]


def scan(
    root: str | os.PathLike[str], excludes: Iterable[str] = (), prefix: str = ""
) -> list[Entry]:
    """The files under ``root`` to ship (sorted), minus ``excludes``.

    ``root`` may also be a single ``.py`` file (a one-file module). ``prefix`` is put in
    front of every path inside the package (a py_modules directory keeps its name).
    """
    base = Path(root)
    if base.is_file():
        st = base.stat()
        return [
            Entry(
                prefix + base.name, str(base), st.st_size, st.st_mtime_ns, bool(st.st_mode & 0o111)
            )
        ]
    patterns = [_compile(p) for p in (*_ALWAYS_EXCLUDED, *_gitignore(base), *excludes) if p]
    out: list[Entry] = []
    for dirpath, dirnames, filenames in os.walk(base, followlinks=False):
        rel_dir = os.path.relpath(dirpath, base)
        rel_dir = "" if rel_dir == "." else rel_dir.replace(os.sep, "/") + "/"
        dirnames[:] = sorted(
            d
            for d in dirnames
            if not matches(patterns, rel_dir + d, True)
            and not os.path.islink(os.path.join(dirpath, d))
        )
        for name in sorted(filenames):
            rel = rel_dir + name
            if matches(patterns, rel, False):
                continue
            full = os.path.join(dirpath, name)
            try:
                st = os.stat(full)
            except OSError:
                continue  # a dangling link
            if not stat.S_ISREG(st.st_mode):
                continue
            out.append(
                Entry(prefix + rel, full, st.st_size, st.st_mtime_ns, bool(st.st_mode & 0o111))
            )
    out.sort(key=lambda e: e.arcname)
    return out


def snapshot(entries: Sequence[Entry]) -> Snapshot:
    """What must stay equal for a cached hash to still be right (paths, sizes, mtimes)."""
    return tuple((e.arcname, e.size, e.mtime_ns) for e in entries)


def check_size(entries: Sequence[Entry], limit: int, what: str, root: str) -> int:
    """The total size; :class:`PackageTooLarge` naming the largest entries when over ``limit``."""
    total = sum(e.size for e in entries)
    if total <= limit:
        return total
    by_top: dict[str, int] = {}
    for e in entries:
        head, sep, _ = e.arcname.partition("/")
        key = head + "/" if sep else head
        by_top[key] = by_top.get(key, 0) + e.size
    largest = sorted(by_top.items(), key=lambda kv: -kv[1])[:5]
    listing = ", ".join(f"{name} ({size / 2**20:.1f} MiB)" for name, size in largest)
    raise PackageTooLarge(
        f"{what} {root} is {total / 2**20:.1f} MiB, over the {limit / 2**20:.0f} MiB limit for a "
        f"runtime_env package. Largest entries: {listing}. Shrink it: list what the job does "
        "not need in runtime_env['excludes'] (e.g. excludes=['data/', '*.parquet']), or keep "
        "large data outside working_dir (shared storage, or nbcluster.put()). The limit is "
        "NBCLUSTER_RUNTIME_ENV_MAX_PACKAGE_BYTES."
    )


def content_hash(entries: Sequence[Entry]) -> str:
    """sha256 (first 32 hex digits) over every file's path, executable bit and bytes."""
    h = hashlib.sha256()
    for e in entries:
        h.update(e.arcname.encode() + b"\0" + (b"x" if e.executable else b"-") + b"\0")
        h.update(e.size.to_bytes(8, "big"))
        with open(e.path, "rb") as f:
            while chunk := f.read(1 << 20):
                h.update(chunk)
    return h.hexdigest()[:32]


def build_zip(entries: Sequence[Entry], dest: str | os.PathLike[str]) -> int:
    """Write the package (fixed timestamps, so equal trees give equal bytes); return its size."""
    tmp = f"{os.fspath(dest)}.{os.getpid()}.tmp"
    try:
        with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=1) as zf:
            for e in entries:
                info = zipfile.ZipInfo(e.arcname, _ZIP_TIME)
                info.compress_type = zipfile.ZIP_DEFLATED
                info.external_attr = ((0o755 if e.executable else 0o644) | stat.S_IFREG) << 16
                with open(e.path, "rb") as src, zf.open(info, "w") as out:
                    while chunk := src.read(1 << 20):
                        out.write(chunk)
        os.replace(tmp, dest)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
    return os.path.getsize(dest)


def unpack(zip_path: str | os.PathLike[str], dest: str | os.PathLike[str]) -> None:
    """Extract a package into ``dest`` (which must not exist yet), refusing path escapes."""
    root = os.path.realpath(dest)
    with zipfile.ZipFile(zip_path) as zf:
        for info in zf.infolist():
            name = info.filename
            target = os.path.realpath(os.path.join(root, name))
            if os.path.isabs(name) or os.path.commonpath([root, target]) != root:
                raise ValueError(f"package member {name!r} would land outside {dest}")
        os.makedirs(root, exist_ok=False)
        for info in zf.infolist():
            zf.extract(info, root)
            mode = (info.external_attr >> 16) & 0o777
            if mode and not info.is_dir():
                os.chmod(os.path.join(root, info.filename), mode)
