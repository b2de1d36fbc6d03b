"""A node's runtime_env cache: fetch and unpack packages, build pip environments, once.

Everything lives under the host's cache directory (``<temp_dir>/runtime_resources`` by
default), shared by every node manager of the host and kept across sessions::

    packages/<hash>/            an unpacked working_dir or py_module (renamed in when complete)
    pip/<hash>/                 a virtual environment (usable once it holds .ready)
    pip/<hash>.install.log      its install log (kept, also after a failure)

Concurrent requests for one environment share one setup (in this process) and a file
lock (across the host's processes). A setup that fails or runs past
``config.setup_timeout_seconds`` leaves nothing half-built behind.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import fcntl
import json
import logging
import os
import shutil
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

from nbcluster._runtime.runtime_env import pack, pip_env, spec

__all__ = ["LocalEnv", "RuntimeEnvAgent", "SetupFailed"]

log = logging.getLogger(__name__)

Progress = Callable[[str, str], None]
Download = Callable[[str, Path, Progress], Awaitable[None]]


class SetupFailed(RuntimeError):
    """A runtime_env could not be set up on this node (message says why and what to do)."""


@dataclasses.dataclass(frozen=True)
class LocalEnv:
    """A prepared environment on this node: what a process started in it needs."""

    key: str
    resolved: str
    env_vars: dict[str, str]
    working_dir: str
    py_paths: tuple[str, ...]
    python: str

    def worker_json(self) -> str:
        """The JSON a worker or job entrypoint applies (see :mod:`.worker`)."""
        return json.dumps(
            {
                "env_vars": self.env_vars,
                "working_dir": self.working_dir,
                "py_paths": list(self.py_paths),
                "python": self.python,
                "runtime_env": self.resolved,
                "key": self.key,
            },
            sort_keys=True,
        )


class _Setup:
    """One environment being set up: its task and the progress lines seen so far."""

    def __init__(self) -> None:
        self.task: asyncio.Task[LocalEnv] | None = None
        self.history: collections.deque[tuple[str, str]] = collections.deque(maxlen=200)
        self.listeners: list[Progress] = []

    def emit(self, phase: str, text: str) -> None:
        self.history.append((phase, text))
        for listener in list(self.listeners):
            with contextlib.suppress(Exception):
                listener(phase, text)


@contextlib.asynccontextmanager
async def _file_lock(path: Path) -> AsyncIterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        await asyncio.to_thread(fcntl.flock, fd, fcntl.LOCK_EX)
        yield
    finally:
        with contextlib.suppress(OSError):
            fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


class RuntimeEnvAgent:
    """Prepares resolved environments on this node (call from the node's event loop)."""

    def __init__(
        self, cache_dir: str | os.PathLike[str], download: Download, installer: str
    ) -> None:
        self.cache = Path(cache_dir)
        self.download = download
        self.installer = installer
        self.ready: dict[str, LocalEnv] = {}
        self._setups: dict[str, _Setup] = {}
        self.specs: dict[str, str] = {}  # env key -> resolved JSON (as leased)

    def local_env(self, key: str) -> LocalEnv | None:
        """A prepared environment by key (None until :meth:`prepare` finished)."""
        return self.ready.get(key)

    def remember(self, resolved_json: str) -> str:
        """Record a resolved environment seen in a lease request; return its key."""
        key = spec.env_hash(resolved_json)
        if key:
            self.specs.setdefault(key, resolved_json)
        return key

    async def prepare(self, resolved_json: str, progress: Progress | None = None) -> LocalEnv:
        """Make the environment ready here (shared with concurrent callers); raise SetupFailed."""
        key = self.remember(resolved_json)
        done = self.ready.get(key)
        if done is not None:
            if progress is not None:
                progress("ready", "runtime_env is cached on this node")
            return done
        setup = self._setups.get(key)
        if setup is None:
            setup = self._setups[key] = _Setup()
            setup.task = asyncio.get_running_loop().create_task(
                self._setup(key, resolved_json, setup)
            )
        if progress is not None:
            for phase, text in list(setup.history):
                progress(phase, text)
            setup.listeners.append(progress)
        assert setup.task is not None
        try:
            return await asyncio.shield(setup.task)
        finally:
            if progress is not None and progress in setup.listeners:
                setup.listeners.remove(progress)

    async def _setup(self, key: str, resolved_json: str, setup: _Setup) -> LocalEnv:
        resolved = spec.from_json(resolved_json)
        timeout = spec.setup_timeout(resolved)
        try:
            env = await asyncio.wait_for(
                self._build(key, resolved, resolved_json, setup.emit), timeout
            )
        except TimeoutError:
            msg = (
                f"runtime_env setup did not finish within config.setup_timeout_seconds={timeout:g}; "
                "raise it (runtime_env={'config': {'setup_timeout_seconds': N}}) or use a smaller "
                "environment"
            )
            setup.emit("failed", msg)
            raise SetupFailed(msg) from None
        except (SetupFailed, pip_env.PipInstallError) as err:
            setup.emit("failed", str(err))
            raise SetupFailed(str(err)) from None
        except Exception as err:  # noqa: BLE001 - any failure fails this environment only
            log.exception("runtime_env setup failed")
            msg = f"runtime_env setup failed: {type(err).__name__}: {err}"
            setup.emit("failed", msg)
            raise SetupFailed(msg) from None
        finally:
            self._setups.pop(key, None)
        self.ready[key] = env
        setup.emit("ready", "runtime_env is ready")
        return env

    async def _build(
        self, key: str, resolved: dict[str, Any], resolved_json: str, emit: Progress
    ) -> LocalEnv:
        working_dir = ""
        if resolved.get("working_dir"):
            working_dir = str(await self._package(resolved["working_dir"], "working_dir", emit))
        py_paths = []
        for uri in resolved.get("py_modules", []):
            py_paths.append(str(await self._package(uri, "py_module", emit)))
        python = ""
        pip_spec = spec.pip_spec(resolved)
        if pip_spec is not None:
            python = await self._pip(pip_spec, emit)
        return LocalEnv(
            key=key,
            resolved=resolved_json,
            env_vars=dict(resolved.get("env_vars", {})),
            working_dir=working_dir,
            py_paths=tuple(py_paths),
            python=python,
        )

    async def _package(self, uri: str, what: str, emit: Progress) -> Path:
        digest = spec.uri_hash(uri)
        final = self.cache / "packages" / digest
        if final.is_dir():
            emit("download", f"{what} {uri} is cached on this node")
            return final
        async with _file_lock(self.cache / "packages" / f"{digest}.lock"):
            if final.is_dir():
                return final
            part = final.with_name(f"{digest}.zip.{os.getpid()}.part")
            tmp = final.with_name(f"{digest}.{os.getpid()}.unpacking")
            try:
                emit("download", f"downloading {what} {uri}")
                await self.download(uri, part, emit)
                emit("unpack", f"unpacking {what} ({part.stat().st_size / 2**20:.1f} MiB)")
                shutil.rmtree(tmp, ignore_errors=True)
                await asyncio.to_thread(pack.unpack, part, tmp)
                os.replace(tmp, final)
            finally:
                part.unlink(missing_ok=True)
                shutil.rmtree(tmp, ignore_errors=True)
        return final

    async def _pip(self, pip_spec: dict[str, Any], emit: Progress) -> str:
        digest = spec.pip_hash(pip_spec)
        env_dir = self.cache / "pip" / digest
        if (env_dir / pip_env.READY).exists():
            emit("install", "pip environment is cached on this node")
            return str(env_dir / "bin" / "python")
        async with _file_lock(self.cache / "pip" / f"{digest}.lock"):
            return await pip_env.build(
                pip_spec,
                env_dir,
                self.cache / "pip" / f"{digest}.install.log",
                self.installer,
                emit,
            )
