"""Process plumbing shared by the head, node manager and worker entry points.

- Session directories and the cluster token file (mode 0600 from creation).
- Parent-death watch: a child inherits the read end of a pipe whose write end only its
  parent holds. EOF on it means the parent is gone (also after SIGKILL), so the child
  shuts itself down. Unlike ``PR_SET_PDEATHSIG`` this does not depend on which thread of
  the parent forked, and unlike ``atexit`` it survives a killed parent.
- Atomic small-file writes used to publish addresses.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path

TOKEN_FILE = "token"
HEAD_ADDRESS_FILE = "head.addr"
LATEST_LINK = "session_latest"

log = logging.getLogger("nbcluster")


def new_id() -> bytes:
    """A fresh 16-byte identifier."""
    return secrets.token_bytes(16)


def write_atomic(path: Path, text: str, mode: int = 0o644) -> None:
    """Write ``text`` to ``path`` so readers see either nothing or the whole file."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)
    os.replace(tmp, path)


def create_token_file(session_dir: Path, token: str | None = None) -> str:
    """Create ``session_dir/token`` with mode 0600 from the first byte on; return the token."""
    token = token or secrets.token_hex(32)  # 256 bits
    path = session_dir / TOKEN_FILE
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, token.encode())
    finally:
        os.close(fd)
    return token


def read_token(path: str | os.PathLike[str]) -> str:
    """Read a token file (whitespace stripped)."""
    return Path(path).read_text().strip()


def new_session_dir(temp_dir: str) -> Path:
    """Create ``<temp_dir>/session_<time>_<pid>`` (mode 0700) and point ``session_latest`` at it
    (``session_latest_<uid>`` in a root shared by several users)."""
    base = Path(temp_dir)
    shared = str(base) == "/tmp/nbcluster"  # the default root, shared by every user
    if not base.exists():
        base.mkdir(parents=True, exist_ok=True, mode=0o700)
        if shared:  # world-writable and sticky like /tmp (mkdir's mode is cut by the umask)
            with contextlib.suppress(PermissionError):
                os.chmod(base, 0o1777)
    shared = shared or base.stat().st_mode & 0o1002 == 0o1002  # any sticky, world-writable root
    stamp = time.strftime("%Y-%m-%d_%H-%M-%S")
    path = base / f"session_{stamp}_{os.getpid()}_{secrets.token_hex(3)}"
    path.mkdir(mode=0o700)
    (path / "logs").mkdir()
    # In the shared root each user has their own link (another user's cannot be replaced).
    link = base / (f"{LATEST_LINK}_{os.geteuid()}" if shared else LATEST_LINK)
    tmp = base / f".{link.name}.{os.getpid()}"
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    os.symlink(path.name, tmp)
    try:
        os.replace(tmp, link)
    except PermissionError:  # a link of another user (a root used as shared): leave it
        tmp.unlink()
    return path


def wait_for_file(path: Path, timeout: float, alive: Callable[[], bool] | None = None) -> str:
    """Poll until ``path`` exists (and ``alive()`` stays true); return its text."""
    deadline = time.monotonic() + timeout
    delay = 0.001
    while True:
        try:
            return path.read_text()
        except FileNotFoundError:
            pass
        if alive is not None and not alive():
            raise RuntimeError(f"process exited before writing {path.name}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {path}")
        time.sleep(delay)
        delay = min(delay * 1.5, 0.02)


def watch_parent(loop: asyncio.AbstractEventLoop, fd: int, on_death: Callable[[], None]) -> None:
    """Call ``on_death`` on the loop when the pipe ``fd`` reaches EOF (the parent died)."""

    def readable() -> None:
        try:
            data = os.read(fd, 64)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            loop.remove_reader(fd)
            on_death()

    os.set_blocking(fd, False)
    loop.add_reader(fd, readable)


def install_signal_handlers(loop: asyncio.AbstractEventLoop, on_stop: Callable[[], None]) -> None:
    """SIGTERM and SIGINT ask the process to stop gracefully."""
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, on_stop)


def setup_logging(level: str, log_file: Path | None, name: str) -> None:
    """Log to a file in the session's log folder (stderr when none)."""
    handler: logging.Handler
    if log_file is not None:
        handler = logging.FileHandler(log_file)
    else:
        handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        logging.Formatter(f"%(asctime)s {name}[%(process)d] %(levelname)s %(message)s")
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())


def pid_alive(pid: int) -> bool:
    """True while a process with this PID exists (and is not a zombie we reaped)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
