"""What the Serve controller keeps in the session directory, so a restart finds it again.

``serve/apps.pkl``: the applications and their deployments' code, config and target
(written on each deploy and delete); ``serve/replicas.json``: the replicas (written when
the set changes). A restarted controller reads both (``ControllerCore._recover``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import pickle
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from nbcluster.serve._reconcile import DeploymentState
from nbcluster.serve.schema import ReplicaState

__all__ = ["AppRecord", "SavedState"]

#: ``(application, deployment)``.
Key = tuple[str, str]

#: Files the controller and its proxy manager write in the directory.
_FILES = ("apps.pkl", "replicas.json", "proxies.json")


@dataclasses.dataclass
class AppRecord:
    """One declared application."""

    name: str
    route_prefix: str | None
    ingress: str
    deployments: list[str]
    deployed_at: float
    deleting: bool = False


class SavedState:
    """The controller's files in ``directory`` (``<session>/serve``)."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self._replica_sig = ""

    def _write(self, name: str, data: bytes) -> None:
        path = self.dir / name
        tmp = path.with_name(f".{name}.{os.getpid()}.tmp")
        tmp.write_bytes(data)
        os.replace(tmp, path)

    def save_apps(
        self, apps: Iterable[AppRecord], deployments: list[tuple[Key, Any, Any, bool]]
    ) -> None:
        """Write the applications and ``(key, spec, target, deleting)`` of each deployment."""
        state = {"apps": [dataclasses.asdict(a) for a in apps], "deployments": deployments}
        self._write("apps.pkl", pickle.dumps(state))

    def save_replicas(self, deps: Mapping[Key, DeploymentState]) -> None:
        """Write the replicas that are not stopping, when they changed since the last write."""
        records = {
            f"{k[0]}#{k[1]}": [
                [r.replica_id, r.version, r.config_version]
                for r in ds.replicas.values()
                if r.state != ReplicaState.STOPPING
            ]
            for k, ds in deps.items()
        }
        sig = json.dumps(records, sort_keys=True)
        if sig != self._replica_sig:
            self._replica_sig = sig
            self._write("replicas.json", sig.encode())

    def load_apps(self) -> dict[str, Any] | None:
        """What :meth:`save_apps` wrote (None: nothing was saved)."""
        try:
            return pickle.loads((self.dir / "apps.pkl").read_bytes())  # type: ignore[no-any-return]
        except FileNotFoundError:
            return None

    def load_replicas(self) -> dict[str, list[list[Any]]]:
        """What :meth:`save_replicas` wrote: ``"app#deployment"`` -> replica rows."""
        try:
            return json.loads((self.dir / "replicas.json").read_text())  # type: ignore[no-any-return]
        except (FileNotFoundError, ValueError):
            return {}

    def remove(self) -> None:
        """Delete the files (Serve shut down)."""
        for name in _FILES:
            with contextlib.suppress(FileNotFoundError):
                (self.dir / name).unlink()
