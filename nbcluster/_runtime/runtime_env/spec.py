"""What a ``runtime_env`` may contain, how it is normalized, merged and hashed (no I/O).

A user's ``runtime_env`` (Ray's keys: ``env_vars``, ``working_dir``, ``py_modules``,
``excludes``, ``pip``/``uv``, ``config``) is checked by :func:`validate` when it is given
(``@remote``, ``.options()``, ``init``, ``submit_job``). Before it travels, local paths are
replaced by package URIs (``pkg://<hash>.zip``, see :mod:`.packaging`) and a pip
requirements file by its lines: that *resolved* form is a plain dict, sent as canonical
JSON (:func:`to_json`). Its :func:`env_hash` keys the per-environment worker pools and the
per-node caches.

Inheritance follows Ray: a child's ``env_vars`` are merged over its parent's; every other
key the child gives replaces the parent's (:func:`inherit`). A job's environment given at
submission and the one given to ``init()`` in its entrypoint are merged the same way, but a
key given differently in both is an error unless ``NBCLUSTER_OVERRIDE_JOB_RUNTIME_ENV=1``
(:func:`merge_job_env`), as Ray does with ``RAY_OVERRIDE_JOB_RUNTIME_ENV``.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Mapping
from typing import Any

__all__ = [
    "DEFAULT_SETUP_TIMEOUT_S",
    "KNOWN_KEYS",
    "PKG_SCHEME",
    "env_hash",
    "from_json",
    "inherit",
    "is_package_uri",
    "merge_job_env",
    "package_uri",
    "to_json",
    "uri_hash",
    "validate",
]

PKG_SCHEME = "pkg://"
DEFAULT_SETUP_TIMEOUT_S = 600
KNOWN_KEYS = frozenset({"env_vars", "working_dir", "py_modules", "excludes", "pip", "uv", "config"})
_UNSUPPORTED = {
    "conda": "use 'pip' (or 'uv') for Python packages",
    "container": "run the cluster's processes in the image instead",
    "image_uri": "run the cluster's processes in the image instead",
    "java_jars": "nbcluster runs Python only",
    "nsight": "profile with py-spy or cProfile inside the task instead",
    "worker_process_setup_hook": "call the setup code at the top of the task or actor",
}
_CONFIG_KEYS = frozenset({"setup_timeout_seconds", "eager_install"})
_URI_RE = re.compile(r"^pkg://([0-9a-f]{32,64})\.zip$")


class RuntimeEnvError(ValueError):
    """A ``runtime_env`` that cannot be used; the message says which key and how to fix it."""


def _describe(value: object) -> str:
    return f"{value!r} ({type(value).__name__})"


def is_package_uri(value: object) -> bool:
    """True for ``pkg://<hash>.zip`` (an uploaded package)."""
    return isinstance(value, str) and _URI_RE.match(value) is not None


def package_uri(content_hash: str) -> str:
    """The URI of the package with this content hash."""
    return f"{PKG_SCHEME}{content_hash}.zip"


def uri_hash(uri: str) -> str:
    """The content hash inside a package URI (ValueError for anything else)."""
    m = _URI_RE.match(uri)
    if m is None:
        raise RuntimeEnvError(f"not a package URI: {uri!r} (expected pkg://<hash>.zip)")
    return m.group(1)


def _check_str_list(key: str, value: object) -> list[str]:
    if not isinstance(value, list | tuple) or not all(isinstance(v, str) and v for v in value):
        raise RuntimeEnvError(
            f"runtime_env[{key!r}] must be a list of non-empty strings, got {_describe(value)}"
        )
    return list(value)


def _check_path_or_uri(key: str, value: object) -> str:
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if not isinstance(value, str) or not value:
        raise RuntimeEnvError(
            f"runtime_env[{key!r}] must be a local directory path or a package URI, "
            f"got {_describe(value)}"
        )
    if "://" in value and not is_package_uri(value):
        raise RuntimeEnvError(
            f"runtime_env[{key!r}]={value!r}: remote URIs are not supported; give a local "
            "directory (it is packed and uploaded to the cluster)"
        )
    return value


def _check_pip(key: str, value: object) -> dict[str, Any] | str:
    """A pip/uv spec: a list, a requirements-file path (str), or Ray's dict form."""
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if isinstance(value, str):
        if not value:
            raise RuntimeEnvError(f"runtime_env[{key!r}] must not be empty")
        return value  # a requirements file: read when the environment is resolved
    options: list[str] = []
    check = False
    if isinstance(value, Mapping):
        unknown = set(value) - {
            "packages",
            "pip_check",
            "pip_version",
            "pip_install_options",
            "uv_version",
            "uv_check",
            "uv_pip_install_options",
        }
        if unknown:
            raise RuntimeEnvError(
                f"runtime_env[{key!r}] has unknown key(s) {sorted(unknown)}; valid: packages, "
                "pip_check, pip_install_options (uv: uv_check, uv_pip_install_options)"
            )
        packages = value.get("packages")
        if isinstance(packages, str):
            return packages
        options = _check_str_list(
            f"{key}.install_options",
            value.get("pip_install_options", value.get("uv_pip_install_options", [])),
        )
        check = bool(value.get("pip_check", value.get("uv_check", False)))
        value = packages
    packages_list = _check_str_list(key, value)
    if not packages_list:
        raise RuntimeEnvError(
            f"runtime_env[{key!r}] is an empty list; leave it out when nothing needs installing"
        )
    try:  # only to catch typos early; pip and uv check the requirements again anyway
        from packaging.requirements import InvalidRequirement, Requirement
    except ImportError:  # pragma: no cover - packaging ships with pip in practice
        return {"packages": packages_list, "install_options": options, "check": check}
    for req in packages_list:
        if req.startswith("-"):
            continue  # an option line such as --index-url; pip/uv check it
        try:
            Requirement(req)
        except InvalidRequirement as err:
            raise RuntimeEnvError(
                f"runtime_env[{key!r}]: {req!r} is not a valid requirement ({err}); "
                "write it as pip would, e.g. 'requests==2.32.3' or 'numpy>=1.26'"
            ) from None
    return {"packages": packages_list, "install_options": options, "check": check}


def _check_config(value: object) -> dict[str, Any]:
    if hasattr(value, "to_dict"):
        value = value.to_dict()
    if not isinstance(value, Mapping):
        raise RuntimeEnvError(f"runtime_env['config'] must be a dict, got {_describe(value)}")
    unknown = set(value) - _CONFIG_KEYS
    if unknown:
        raise RuntimeEnvError(
            f"runtime_env['config'] has unknown key(s) {sorted(unknown)}; valid: "
            + ", ".join(sorted(_CONFIG_KEYS))
        )
    out: dict[str, Any] = {}
    timeout = value.get("setup_timeout_seconds", DEFAULT_SETUP_TIMEOUT_S)
    if (
        not isinstance(timeout, int)
        or isinstance(timeout, bool)
        or (timeout <= 0 and timeout != -1)
    ):
        raise RuntimeEnvError(
            "runtime_env['config']['setup_timeout_seconds'] must be a positive integer "
            f"(or -1 for no timeout), got {_describe(timeout)}"
        )
    out["setup_timeout_seconds"] = timeout
    eager = value.get("eager_install", True)
    if not isinstance(eager, bool):
        raise RuntimeEnvError(
            f"runtime_env['config']['eager_install'] must be True or False, got {_describe(eager)}"
        )
    out["eager_install"] = eager
    return out


def validate(runtime_env: object) -> dict[str, Any]:
    """Check a user's ``runtime_env`` and return it normalized (a new dict; None → ``{}``).

    Raises :class:`RuntimeEnvError` (a ``ValueError``) or ``TypeError`` naming the key.
    Local paths are kept as given; :func:`nbcluster._runtime.runtime_env.resolve` turns them
    into package URIs.
    """
    if runtime_env is None:
        return {}
    if not isinstance(runtime_env, Mapping):
        raise TypeError(
            f"runtime_env must be a dict such as {{'env_vars': {{'A': '1'}}}}, "
            f"got {_describe(runtime_env)}"
        )
    out: dict[str, Any] = {}
    for key, value in runtime_env.items():
        if key in _UNSUPPORTED:
            raise RuntimeEnvError(
                f"runtime_env[{key!r}] is not supported by nbcluster: {_UNSUPPORTED[key]}"
            )
        if key not in KNOWN_KEYS:
            raise RuntimeEnvError(
                f"unknown runtime_env key {key!r}; valid keys: {', '.join(sorted(KNOWN_KEYS))}"
            )
        if value is None:
            continue
        if key == "env_vars":
            if not isinstance(value, Mapping) or not all(
                isinstance(k, str) and k and isinstance(v, str) for k, v in value.items()
            ):
                raise TypeError(
                    "runtime_env['env_vars'] must be a dict of str to str (convert numbers "
                    f"with str()), got {_describe(value)}"
                )
            bad = [k for k in value if "=" in k or "\0" in k]
            if bad:
                raise RuntimeEnvError(f"runtime_env['env_vars'] has invalid names: {bad}")
            out[key] = dict(value)
        elif key == "working_dir":
            out[key] = _check_path_or_uri(key, value)
        elif key == "py_modules":
            if not isinstance(value, list | tuple):
                raise RuntimeEnvError(
                    "runtime_env['py_modules'] must be a list of local directories, "
                    f"modules or package URIs, got {_describe(value)}"
                )
            mods = []
            for m in value:
                path = getattr(m, "__file__", None)
                if path is not None:  # a module object: ship its package directory
                    base = os.path.dirname(path)
                    m = base if os.path.basename(path) == "__init__.py" else path
                mods.append(_check_path_or_uri("py_modules", m))
            out[key] = mods
        elif key == "excludes":
            out[key] = _check_str_list(key, value)
        elif key in ("pip", "uv"):
            out[key] = _check_pip(key, value)
        elif key == "config":
            out[key] = _check_config(value)
    if "pip" in out and "uv" in out:
        raise RuntimeEnvError(
            "runtime_env cannot have both 'pip' and 'uv'; give the packages in one of them"
        )
    return out


def inherit(parent: Mapping[str, Any] | None, child: Mapping[str, Any] | None) -> dict[str, Any]:
    """Ray's inheritance: ``env_vars`` merged (child wins), other keys replaced by the child's."""
    out = dict(parent or {})
    for key, value in (child or {}).items():
        if key == "env_vars":
            out[key] = {**out.get("env_vars", {}), **value}
        else:
            out[key] = value
    return out


def merge_job_env(
    job_env: Mapping[str, Any] | None, init_env: Mapping[str, Any] | None, override: bool
) -> dict[str, Any]:
    """The environment of a submitted job's driver: the job's merged with ``init()``'s.

    A key (or env var) set differently in both raises, unless ``override`` (then the value
    given to ``init()`` wins), as Ray does.
    """
    if not job_env or not init_env:
        return dict(job_env or init_env or {})
    if not override:
        conflicts = []
        for key, value in init_env.items():
            if key not in job_env:
                continue
            if key == "env_vars":
                conflicts += [
                    f"env_vars[{k!r}]"
                    for k, v in value.items()
                    if k in job_env["env_vars"] and job_env["env_vars"][k] != v
                ]
            elif job_env[key] != value:
                conflicts.append(repr(key))
        if conflicts:
            raise RuntimeEnvError(
                f"the runtime_env given to init() conflicts with the job's on {', '.join(conflicts)}; "
                "drop them from one of the two, or set NBCLUSTER_OVERRIDE_JOB_RUNTIME_ENV=1 to let "
                "init() win"
            )
    return inherit(job_env, init_env)


def to_json(resolved: Mapping[str, Any]) -> str:
    """Canonical JSON of a resolved environment ('' for an empty one)."""
    if not resolved:
        return ""
    return json.dumps(resolved, sort_keys=True, separators=(",", ":"))


def from_json(text: str) -> dict[str, Any]:
    """The resolved environment from its JSON ('' → ``{}``)."""
    if not text:
        return {}
    value = json.loads(text)
    if not isinstance(value, dict):
        raise RuntimeEnvError("a resolved runtime_env must be a JSON object")
    return value


def env_hash(resolved: Mapping[str, Any] | str) -> str:
    """Key of the worker pool for an environment ('' for none); ``config`` does not count."""
    env = from_json(resolved) if isinstance(resolved, str) else dict(resolved)
    env.pop("config", None)
    if not env:
        return ""
    return hashlib.sha256(to_json(env).encode()).hexdigest()[:24]


def pip_spec(resolved: Mapping[str, Any]) -> dict[str, Any] | None:
    """The normalized pip/uv spec of a resolved environment (None when there is none)."""
    spec = resolved.get("pip") or resolved.get("uv")
    return dict(spec) if spec else None


def pip_hash(spec: Mapping[str, Any]) -> str:
    """Key of the virtual environment built for a pip spec."""
    return hashlib.sha256(to_json(spec).encode()).hexdigest()[:24]


def setup_timeout(resolved: Mapping[str, Any]) -> float | None:
    """Seconds the setup may take (None: no limit)."""
    timeout = resolved.get("config", {}).get("setup_timeout_seconds", DEFAULT_SETUP_TIMEOUT_S)
    return None if timeout == -1 else float(timeout)
