"""What a process started in a runtime_env applies: env vars, ``sys.path``, working directory.

A worker gets its environment's *worker JSON* (from :meth:`.agent.LocalEnv.worker_json`)
when it registers with its node and calls :func:`apply_in_process` before running any
task, so functions pickled by reference to a module of the ``working_dir`` or of
``py_modules`` import. A job's entrypoint gets the same through its process environment
(:func:`entrypoint_environ`): ``PYTHONPATH``, the current directory and, for a pip
environment, the environment's ``bin`` first on ``PATH`` (so ``python`` is its python).
"""

from __future__ import annotations

import importlib
import json
import os
import sys
from collections.abc import Mapping
from typing import Any

__all__ = ["JOB_ENV_VAR", "apply_in_process", "entrypoint_environ", "parse"]

#: The resolved runtime_env of a submitted job, set in its entrypoint's environment.
JOB_ENV_VAR = "NBCLUSTER_JOB_RUNTIME_ENV"


def parse(worker_json: str) -> dict[str, Any]:
    """The worker JSON as a dict (``{}`` for '')."""
    return json.loads(worker_json) if worker_json else {}


def apply_in_process(worker_json: str) -> str:
    """Apply an environment to this process; return its resolved runtime_env JSON."""
    env = parse(worker_json)
    if not env:
        return ""
    os.environ.update(env.get("env_vars", {}))
    paths = [p for p in env.get("py_paths", []) if p]
    if env.get("working_dir"):
        paths.insert(0, env["working_dir"])
        os.chdir(env["working_dir"])
    for path in reversed(paths):
        if path not in sys.path:
            sys.path.insert(0, path)
    importlib.invalidate_caches()
    return str(env.get("runtime_env", ""))


def entrypoint_environ(
    worker_json: str, base: Mapping[str, str]
) -> tuple[dict[str, str], str | None]:
    """(environment variables, working directory) for a job's entrypoint process."""
    env = parse(worker_json)
    out = dict(base)
    if not env:
        return out, None
    out.update(env.get("env_vars", {}))
    paths = [p for p in [env.get("working_dir", ""), *env.get("py_paths", [])] if p]
    if paths:
        old = out.get("PYTHONPATH", "")
        out["PYTHONPATH"] = os.pathsep.join([*paths, *([old] if old else [])])
    python = env.get("python", "")
    if python:
        bin_dir = os.path.dirname(python)
        out["PATH"] = os.pathsep.join([bin_dir, out.get("PATH", os.defpath)])
        out["VIRTUAL_ENV"] = os.path.dirname(bin_dir)
    out[JOB_ENV_VAR] = str(env.get("runtime_env", ""))
    return out, env.get("working_dir") or None


def current_python(worker_json: str) -> str:
    """The interpreter a process of this environment runs (a pip env's, else this one's)."""
    return parse(worker_json).get("python") or sys.executable
