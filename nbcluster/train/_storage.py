"""The run's directory: ``storage_path/name`` holding ``checkpoint_NNNNNN`` directories
and ``train_state.json`` (reports and kept checkpoints, so that a run started again with
the same name carries on, and ``Result.from_path`` works)."""

from __future__ import annotations

import json
import os
import shutil
import time
import uuid
from collections.abc import Mapping
from typing import Any

__all__ = ["STATE_FILE", "RunDir", "default_run_name"]

STATE_FILE = "train_state.json"


def default_run_name(trainer_name: str) -> str:
    """``TorchTrainer_2026-11-24_01-02-03_1a2b``: the class, the time and a random suffix."""
    return f"{trainer_name}_{time.strftime('%Y-%m-%d_%H-%M-%S')}_{uuid.uuid4().hex[:4]}"


class RunDir:
    """Reads and writes one run's directory."""

    def __init__(self, storage_path: str, name: str) -> None:
        self.storage_path = storage_path
        self.name = name
        self.path = os.path.join(storage_path, name)

    def create(self) -> None:
        """Make the directory; a clear ``PermissionError``/``NotADirectoryError`` if not."""
        try:
            os.makedirs(self.path, exist_ok=True)
        except OSError as err:
            raise type(err)(
                f"cannot create the run directory {self.path}: {err.strerror or err}. Choose a "
                "writable RunConfig(storage_path=...)"
            ) from None
        probe = os.path.join(self.path, f".write-test-{uuid.uuid4().hex[:8]}")
        try:
            with open(probe, "w") as f:
                f.write("")
            os.remove(probe)
        except OSError as err:
            raise PermissionError(
                f"the run directory {self.path} is not writable ({err.strerror or err}). Choose "
                "a writable RunConfig(storage_path=...)"
            ) from None

    def checkpoint_path(self, name: str) -> str:
        """Where the checkpoint directory ``name`` lives."""
        return os.path.join(self.path, name)

    def load_state(self) -> dict[str, Any] | None:
        """The saved state of an earlier run with this name, if there is one."""
        try:
            with open(os.path.join(self.path, STATE_FILE), encoding="utf-8") as f:
                data = json.load(f)
        except (FileNotFoundError, NotADirectoryError):
            return None
        except (OSError, ValueError) as err:
            raise ValueError(
                f"{os.path.join(self.path, STATE_FILE)} cannot be read ({err}); remove it or "
                "choose another RunConfig(name=...)"
            ) from None
        return data if isinstance(data, dict) else None

    def save_state(self, snapshot: Mapping[str, Any]) -> None:
        """Write the state atomically."""
        file = os.path.join(self.path, STATE_FILE)
        tmp = f"{file}.tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(snapshot, f, default=str)
        os.replace(tmp, file)

    def delete_checkpoints(self, names: list[str] | tuple[str, ...]) -> None:
        """Remove checkpoint directories that retention dropped."""
        for name in names:
            shutil.rmtree(self.checkpoint_path(name), ignore_errors=True)

    def remove_unregistered(self, keep: set[str]) -> list[str]:
        """Remove ``checkpoint_*`` directories not in ``keep`` (written by a failed attempt
        before the driver registered them); return their names."""
        removed = []
        try:
            entries = list(os.scandir(self.path))
        except FileNotFoundError:
            return removed
        for entry in entries:
            if entry.is_dir() and entry.name.startswith("checkpoint_") and entry.name not in keep:
                shutil.rmtree(entry.path, ignore_errors=True)
                removed.append(entry.name)
        return removed
