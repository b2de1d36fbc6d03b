"""Where a node's object store lives, and how big it is by default.

``prepare_store_dir`` makes the node's private directory in shared memory (``/dev/shm``),
or in ordinary files when shared memory is too small (Docker and Binder give 64 MB);
``default_store_capacity`` sizes the store from the memory this process may use (cgroup
limits included) and the free shared memory. Each node manager holds a lock on its
directory (``lock_store_dir``), so that ``sweep_stale_stores`` can free what a node
manager killed without cleaning up left behind.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import shutil
import tempfile
import warnings

__all__ = [
    "LOCK_NAME",
    "MIN_CAPACITY",
    "StoreFallbackWarning",
    "default_store_capacity",
    "free_bytes",
    "lock_store_dir",
    "prepare_store_dir",
    "remove_store_dir",
    "sweep_stale_stores",
]

#: The lock file that marks a node's store directory as in use (see lock_store_dir).
LOCK_NAME = ".lock"
#: Smallest store :func:`default_store_capacity` chooses.
MIN_CAPACITY = 64 << 20

_DIR_MODE = 0o700
_SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
_fallback_warned: set[tuple[str, str]] = set()


class StoreFallbackWarning(UserWarning):
    """The shared-memory directory was too small, so the store lives in ordinary files."""


def prepare_store_dir(
    session_name: str,
    node_id_hex: str,
    capacity: int,
    base_dir: str = "/dev/shm",
    fallback_dir: str | None = None,
) -> tuple[str, bool]:
    """Create the node's store directory; return ``(directory, file_backed)``.

    The directory is ``<base_dir>/nbcluster-<session_name>/<node_id_hex>`` (mode 0700)
    when ``base_dir`` has at least ``capacity`` bytes free. Otherwise (Docker and Binder
    give ``/dev/shm`` 64 MB, or it is missing or not writable) it is the same path under
    ``fallback_dir`` (default: the system temporary directory), ``file_backed`` is True,
    and a :class:`StoreFallbackWarning` is emitted once per session and base directory.
    Raises ``PermissionError`` if a directory on the path exists but is a symlink or
    belongs to another user (``/dev/shm`` and ``/tmp`` are shared by everyone).
    """
    _check_name("session_name", session_name)
    _check_name("node_id_hex", node_id_hex)
    if capacity <= 0:
        raise ValueError(f"capacity must be positive, got {capacity}")
    free = free_bytes(base_dir)
    writable = free is not None and os.access(base_dir, os.W_OK | os.X_OK)
    if writable and free >= capacity:  # type: ignore[operator]
        return _private_dirs(base_dir, f"nbcluster-{session_name}", node_id_hex), False
    root = fallback_dir if fallback_dir is not None else tempfile.gettempdir()
    key = (session_name, base_dir)
    if key not in _fallback_warned:
        _fallback_warned.add(key)
        if free is None:
            problem = "does not exist"
        elif not writable:
            problem = "is not writable"
        else:
            problem = (
                f"has only {_fmt_bytes(free)} free, less than the {_fmt_bytes(capacity)} "
                "the object store needs"
            )
        warnings.warn(
            f"{base_dir} {problem}, so the object store uses ordinary files in {root}, "
            "which is slower. Give the container more shared memory (docker run "
            "--shm-size=2g; Kubernetes: an emptyDir with medium Memory on /dev/shm), or lower "
            "object_store_memory (NBCLUSTER_OBJECT_STORE_MEMORY).",
            StoreFallbackWarning,
            stacklevel=2,
        )
    return _private_dirs(root, f"nbcluster-{session_name}", node_id_hex), True


def remove_store_dir(store_dir: str) -> None:
    """Delete a store directory, and its session directory if that is then empty."""
    shutil.rmtree(store_dir, ignore_errors=True)
    with contextlib.suppress(OSError):  # not empty: other nodes of the session remain
        os.rmdir(os.path.dirname(store_dir.rstrip(os.sep)))


def lock_store_dir(store_dir: str) -> int:
    """Mark ``store_dir`` as in use for as long as this process lives; return the lock's fd.

    The lock is an ``flock`` on ``<store_dir>/.lock``, which the kernel drops when the
    process ends however it ends (a SIGKILLed node manager included), so
    :func:`sweep_stale_stores` can tell a dead node's directory from a live one. The file
    appears already locked (made under a temporary name, then renamed), so no sweeper can
    see it unlocked. Keep the returned descriptor open; it is not inherited across exec.
    """
    tmp = os.path.join(store_dir, f".lock-{os.getpid()}")
    fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.write(fd, str(os.getpid()).encode())
        os.rename(tmp, os.path.join(store_dir, LOCK_NAME))
    except BaseException:
        os.close(fd)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    return fd


def sweep_stale_stores(root: str) -> int:
    """Delete the store directories under ``root`` whose node manager is gone; return bytes.

    A node manager killed without a chance to clean up (SIGKILL, the OOM killer, a crash)
    leaves its shared-memory files behind, and nothing else would ever free them. Only
    directories of this user, with a lock file that nobody holds any more, are removed
    (see :func:`lock_store_dir`); an empty session directory goes with them.
    """
    freed = 0
    try:
        sessions = [e for e in os.scandir(root) if e.name.startswith("nbcluster-")]
    except OSError:
        return 0
    uid = os.getuid()
    for session in sessions:
        try:
            if not session.is_dir(follow_symlinks=False) or session.stat().st_uid != uid:
                continue
            nodes = list(os.scandir(session.path))
        except OSError:
            continue
        for node in nodes:
            lock = os.path.join(node.path, LOCK_NAME)
            try:
                fd = os.open(lock, os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW)
            except OSError:  # no lock file: an older version's, or being made: leave it
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:  # held: its node manager lives
                os.close(fd)
                continue
            try:
                freed += _tree_bytes(node.path)
                shutil.rmtree(node.path, ignore_errors=True)
            finally:
                os.close(fd)
        with contextlib.suppress(OSError):  # not empty: other nodes of the session live
            os.rmdir(session.path)
    return freed


def _tree_bytes(path: str) -> int:
    total = 0
    for dirpath, _dirs, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(dirpath, name)).st_size
    return total


def default_store_capacity(base_dir: str = "/dev/shm") -> int:
    """The store size to use when none is configured.

    30% of the memory this process may use (physical RAM, lowered to the cgroup limit
    when one is set), and at least ``MIN_CAPACITY`` (64 MiB). When ``base_dir`` is big
    enough to be worth using (90% of its free space is at least 64 MiB) the result is
    also capped at 90% of its free space, so the store fits in shared memory. When it is
    smaller than that (Docker's default 64 MB ``/dev/shm``) there is no cap:
    :func:`prepare_store_dir` then falls back to a file-backed store of the full size.
    """
    want = max(int(_usable_memory() * 0.3), MIN_CAPACITY)
    free = free_bytes(base_dir)
    if free is not None and int(free * 0.9) >= MIN_CAPACITY:
        return min(want, int(free * 0.9))
    return want


def _usable_memory() -> int:
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    limit = _cgroup_memory_limit()
    return min(total, limit) if limit else total


def _cgroup_memory_limit(
    proc_cgroup: str = "/proc/self/cgroup", root: str = "/sys/fs/cgroup"
) -> int | None:
    """The memory limit of this process's cgroup (v2, else v1), or ``None`` if unlimited."""
    candidates = []
    try:
        with open(proc_cgroup) as f:
            for line in f:
                if line.startswith("0::"):
                    rel = line[3:].strip().lstrip("/")
                    if rel:
                        candidates.append(os.path.join(root, rel, "memory.max"))
    except OSError:
        pass
    candidates += [
        os.path.join(root, "memory.max"),
        os.path.join(root, "memory", "memory.limit_in_bytes"),
    ]
    for path in candidates:
        try:
            with open(path) as f:
                text = f.read().strip()
        except OSError:
            continue
        if text.isdigit():
            value = int(text)
            return value if value < (1 << 60) else None  # v1 says "unlimited" with a huge number
        return None  # "max": no limit
    return None


def free_bytes(path: str) -> int | None:
    """Free bytes of the filesystem holding ``path`` (``None`` if it does not exist)."""
    try:
        st = os.statvfs(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    return st.f_bavail * st.f_frsize


def _private_dirs(root: str, session_part: str, node_part: str) -> str:
    """Make ``root/session_part/node_part`` (0700), refusing directories owned by others."""
    os.makedirs(root, _DIR_MODE, exist_ok=True)
    session_dir = os.path.join(root, session_part)
    for directory in (session_dir, os.path.join(session_dir, node_part)):
        with contextlib.suppress(FileExistsError):
            os.mkdir(directory, _DIR_MODE)
        st = os.lstat(directory)
        if not os.path.isdir(directory) or os.path.islink(directory) or st.st_uid != os.getuid():
            raise PermissionError(
                f"{directory} exists but is not a directory owned by this user; remove it"
            )
    return os.path.join(session_dir, node_part)


def _check_name(what: str, value: str) -> None:
    if not _SAFE_NAME.fullmatch(value) or ".." in value:
        raise ValueError(f"{what} must be letters, digits, '.', '_' or '-'; got {value!r}")


def _fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    raise AssertionError("unreachable")
