"""The runtime_env hooks of the core client (drivers and workers).

- :func:`set_job_env` — ``init(runtime_env=...)``: the job's environment, merged with the
  one a submitted job's entrypoint inherits (``NBCLUSTER_JOB_RUNTIME_ENV``), resolved
  (local paths uploaded) once.
- :func:`set_worker_env` — a worker applies the environment its node started it in; its
  own tasks and actors inherit it.
- :func:`for_submit` — the resolved environment of one task or actor: the process's
  environment, inherited by the one given in its options (Ray's rules). The result is
  cached for a moment per distinct option value, so a burst of submissions packs and
  uploads a ``working_dir`` once; later a changed directory is packed again.
- Progress of a setup (download, unpack, install) on the local node is shown where the
  submitting code's output goes (the notebook cell, through the client's output handler).

State lives in a per-client record (a weak map), not on the client itself.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import threading
import time
import weakref
from collections.abc import Mapping
from typing import Any

from nbcluster._runtime.jobs.head_client import HeadJobsClient
from nbcluster._runtime.jobs.node_client import NodeClient
from nbcluster._runtime.runtime_env import resolve, spec, worker
from nbcluster._runtime.runtime_env.settings import RuntimeEnvSettings

__all__ = ["for_submit", "process_env", "set_job_env", "set_worker_env"]

CACHE_TTL_S = 2.0


@dataclasses.dataclass
class _ProgressRecord:
    """What the output handler expects of a task output record."""

    stream: str
    text: str
    dropped_lines: int = 0
    pid: int = 0


class _ClientEnv:
    """The runtime_env state of one core client."""

    def __init__(self) -> None:
        self.env: dict[str, Any] = {}  # this process's resolved environment
        self.env_json = ""
        self.uploader: resolve.Uploader | None = None
        self.cache: dict[str, tuple[float, str]] = {}
        self.watched: set[str] = set()
        self.lock = threading.Lock()


_STATE: weakref.WeakKeyDictionary[Any, _ClientEnv] = weakref.WeakKeyDictionary()
_STATE_LOCK = threading.Lock()


_LAST: tuple[weakref.ref[Any], _ClientEnv] | None = None  # the last client's, without a lock


def _state(client: Any) -> _ClientEnv:
    global _LAST
    last = _LAST  # (one read: another thread may replace it meanwhile)
    if last is not None and last[0]() is client:
        return last[1]  # every submission asks: no lock, no weak ref made per call
    with _STATE_LOCK:
        st = _STATE.get(client)
        if st is None:
            st = _STATE[client] = _ClientEnv()
        _LAST = (weakref.ref(client), st)
        return st


def _uploader(client: Any, st: _ClientEnv) -> resolve.Uploader:
    if st.uploader is None:
        head = HeadJobsClient(client.head_address, client.token)
        settings = RuntimeEnvSettings.from_env(client.config.temp_dir)
        st.uploader = resolve.Uploader(
            head.package_exists, head.upload_package, settings.max_package_bytes
        )
    return st.uploader


def process_env(client: Any) -> str:
    """This process's resolved environment (JSON; '' for none)."""
    st = _STATE.get(client)
    return st.env_json if st is not None else ""


def set_worker_env(client: Any, worker_json: str) -> None:
    """A worker registered: apply its environment; its tasks and actors inherit it."""
    resolved = worker.apply_in_process(worker_json)
    st = _state(client)
    st.env = spec.from_json(resolved)
    st.env_json = spec.to_json(st.env)


def check_job_env(runtime_env: Mapping[str, Any] | None) -> dict[str, Any]:
    """``init(runtime_env=...)`` checked before anything starts (raises on a bad one)."""
    env = spec.validate(runtime_env)
    resolve.check_local_paths(env)
    return env


def resolve_job_env(
    head_address: str, token: str, temp_dir: str, runtime_env: Mapping[str, Any] | None
) -> str:
    """The job's resolved environment: ``init()``'s (uploaded) merged with a submitted job's."""
    settings = RuntimeEnvSettings.from_env(temp_dir)
    inherited = spec.from_json(os.environ.get(worker.JOB_ENV_VAR, ""))
    own = spec.validate(runtime_env)
    resolved: dict[str, Any] = {}
    if own:
        with HeadJobsClient(head_address, token) as head:
            uploader = resolve.Uploader(
                head.package_exists, head.upload_package, settings.max_package_bytes
            )
            resolved = resolve.resolve(own, uploader)
    return spec.to_json(spec.merge_job_env(inherited, resolved, settings.override_job_env))


def set_job_env(client: Any, env_json: str) -> None:
    """Make ``env_json`` (from :func:`resolve_job_env`) the environment this driver's tasks
    and actors inherit."""
    st = _state(client)
    st.env = spec.from_json(env_json)
    st.env_json = env_json


def for_submit(client: Any, runtime_env: Mapping[str, Any] | None, context: Any = None) -> str:
    """The resolved environment (JSON) a task or actor with option ``runtime_env`` runs in."""
    st = _state(client)
    if not runtime_env:
        return st.env_json
    key = getattr(runtime_env, "key", None) or spec.to_json(dict(runtime_env))
    now = time.monotonic()
    with st.lock:
        hit = st.cache.get(key)
    if hit is not None and now - hit[0] < CACHE_TTL_S:
        return hit[1]
    own = resolve.resolve(dict(runtime_env), _uploader(client, st))
    env_json = spec.to_json(spec.inherit(st.env, own))
    with st.lock:
        st.cache[key] = (now, env_json)
        if len(st.cache) > 256:
            st.cache.pop(next(iter(st.cache)))
        new = env_json not in st.watched
        st.watched.add(env_json)
    if new and _needs_setup(env_json):
        _watch_setup(client, env_json, context)
    return env_json


def _needs_setup(env_json: str) -> bool:
    env = spec.from_json(env_json)
    return bool(env.get("working_dir") or env.get("py_modules") or env.get("pip"))


def _watch_setup(client: Any, env_json: str, context: Any) -> None:
    """Start the setup on the local node now and show its progress (in a thread)."""
    address = getattr(client, "node_address", "")
    handler = getattr(client, "output_handler", None)
    if not address or handler is None:
        return

    def show(text: str) -> None:
        record = _ProgressRecord("stderr", f"{text}\n", pid=os.getpid())
        with contextlib.suppress(RuntimeError):  # the client's loop is closed
            client.loop.call_soon_threadsafe(handler, context, "runtime_env", record)

    def run() -> None:
        node = NodeClient(address, client.token)
        start = time.monotonic()
        lines: list[str] = []

        def progress(phase: str, text: str) -> None:
            if phase == "ready" and not lines:
                return  # cached: nothing worth showing
            lines.append(text)
            show(f"{phase}: {text}")

        try:
            node.prepare_runtime_env(env_json, progress)
            if lines:
                show(f"ready after {time.monotonic() - start:.1f}s")
        except Exception as err:  # noqa: BLE001 - the task itself reports the failure
            if not lines:
                show(f"setup failed: {err}")
        finally:
            node.close()

    threading.Thread(target=run, name="runtime-env-progress", daemon=True).start()
