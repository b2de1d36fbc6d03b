"""Turn a validated ``runtime_env`` into its resolved form: local paths become packages.

``working_dir`` and each ``py_modules`` directory are packed (:mod:`.pack`), uploaded to
the head once per content hash, and replaced by their ``pkg://`` URI; a requirements file
given as ``pip`` is read into its lines; ``excludes`` is used up. The :class:`Uploader`
remembers, per path, the files' sizes and times with the hash it gave, so an unchanged
directory is neither hashed nor uploaded again by the same process.
"""

from __future__ import annotations

import os
import tempfile
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from nbcluster._runtime.runtime_env import pack, spec

__all__ = ["Uploader", "resolve"]


class Uploader:
    """Packs and uploads directories to one cluster's head, remembering what it sent."""

    def __init__(
        self,
        exists: Callable[[str], bool],
        upload: Callable[[str, str], None],
        max_package_bytes: int,
    ) -> None:
        self._exists = exists
        self._upload = upload
        self.max_package_bytes = max_package_bytes
        self._known: dict[tuple[str, str, tuple[str, ...]], tuple[pack.Snapshot, str]] = {}
        self._sent: set[str] = set()
        self._lock = threading.Lock()
        self.uploads = 0

    def package(self, path: str, excludes: tuple[str, ...], what: str, prefix: str = "") -> str:
        """The package URI of ``path`` (packed and uploaded if the head lacks it)."""
        entries = pack.scan(path, excludes, prefix)
        snap = pack.snapshot(entries)
        key = (os.path.realpath(path), prefix, excludes)
        with self._lock:
            known = self._known.get(key)
        if known is not None and known[0] == snap and known[1] in self._sent:
            return known[1]
        pack.check_size(entries, self.max_package_bytes, what, path)
        uri = spec.package_uri(pack.content_hash(entries))
        if uri not in self._sent and not self._exists(uri):
            with tempfile.TemporaryDirectory(prefix="nbcluster-pkg-") as tmp:
                zip_path = os.path.join(tmp, "package.zip")
                pack.build_zip(entries, zip_path)
                self._upload(uri, zip_path)
                self.uploads += 1
        with self._lock:
            self._sent.add(uri)
            self._known[key] = (snap, uri)
        return uri


def _local_dir(key: str, value: str) -> str:
    path = os.path.abspath(os.path.expanduser(value))
    if not os.path.exists(path):
        raise spec.RuntimeEnvError(
            f"runtime_env[{key!r}]: {value!r} does not exist (relative paths are taken from "
            f"the current directory, {os.getcwd()}); give an existing directory"
        )
    return path


def _read_requirements(key: str, path: str) -> list[str]:
    try:
        text = Path(os.path.expanduser(path)).read_text()
    except OSError as err:
        raise spec.RuntimeEnvError(
            f"runtime_env[{key!r}]={path!r} is neither a list of packages nor a readable "
            f"requirements file ({err.strerror})"
        ) from None
    lines = [ln.split(" #", 1)[0].strip() for ln in text.splitlines()]
    packages = [ln for ln in lines if ln and not ln.startswith("#")]
    if not packages:
        raise spec.RuntimeEnvError(f"runtime_env[{key!r}]: the requirements file {path} is empty")
    return packages


def resolve(env: Mapping[str, Any], uploader: Uploader | None) -> dict[str, Any]:
    """The resolved form of a validated environment (what travels and is hashed)."""
    out: dict[str, Any] = {}
    excludes = tuple(env.get("excludes", ()))
    for key, value in env.items():
        if key == "excludes":
            continue
        if key == "working_dir":
            if not spec.is_package_uri(value):
                path = _local_dir(key, value)
                if not os.path.isdir(path):
                    raise spec.RuntimeEnvError(
                        f"runtime_env['working_dir']={value!r} is a file; give a directory"
                    )
                if uploader is None:
                    raise spec.RuntimeEnvError(
                        "a local working_dir needs a connection to a cluster"
                    )
                value = uploader.package(path, excludes, "working_dir")
            out[key] = value
        elif key == "py_modules":
            uris = []
            for mod in value:
                if not spec.is_package_uri(mod):
                    path = _local_dir(key, mod)
                    if path.endswith(".whl"):
                        raise spec.RuntimeEnvError(
                            f"runtime_env['py_modules']: {mod!r} is a wheel; list it in "
                            "runtime_env['pip'] instead"
                        )
                    if uploader is None:
                        raise spec.RuntimeEnvError(
                            "local py_modules need a connection to a cluster"
                        )
                    prefix = os.path.basename(path.rstrip("/")) + "/" if os.path.isdir(path) else ""
                    mod = uploader.package(path, excludes, "py_module", prefix)
                uris.append(mod)
            out[key] = uris
        elif key in ("pip", "uv"):
            if isinstance(value, str):
                value = {
                    "packages": _read_requirements(key, value),
                    "install_options": [],
                    "check": False,
                }
            out["pip"] = dict(value)
        else:
            out[key] = value
    return out


def check_local_paths(env: Mapping[str, Any]) -> None:
    """Fail early (at ``.options()`` or decoration time) on local paths that do not exist."""
    if env.get("working_dir") and not spec.is_package_uri(env["working_dir"]):
        path = _local_dir("working_dir", env["working_dir"])
        if not os.path.isdir(path):
            raise spec.RuntimeEnvError(
                f"runtime_env['working_dir']={env['working_dir']!r} is a file; give a directory"
            )
    for mod in env.get("py_modules", []):
        if not spec.is_package_uri(mod):
            _local_dir("py_modules", mod)
    pip = env.get("pip") or env.get("uv")
    if isinstance(pip, str) and not os.path.isfile(os.path.expanduser(pip)):
        raise spec.RuntimeEnvError(
            f"runtime_env pip={pip!r} is neither a list of packages nor an existing requirements file"
        )
