"""The run's directory: ``storage_path/name`` holding ``checkpoint_NNNNNN`` directories
and ``train_state.json`` (reports and kept checkpoints, so that a run started again with
the same name carries on, and ``Result.from_path`` works).

Nothing in it is ever seen half-written. The state file is replaced whole
(``_fileio.atomic_write_bytes``). A checkpoint is written by the ranks into a hidden
*staging* directory of their attempt (``.staging-<attempt>-<name>``, each file atomically),
and the driver renames it to ``<name>`` when the report is complete (every rank has sent
it): a ``checkpoint_*`` directory is always a complete checkpoint of a registered report.
Staging directories of a failed attempt (a rank killed half-way) are removed, never
registered.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import time
import uuid
from collections.abc import Mapping
from typing import Any

from nbcluster.train._fileio import TMP_PREFIX, atomic_write_text, fsync_dir

__all__ = ["STAGING_PREFIX", "STATE_FILE", "RunDir", "default_run_name", "staging_name"]

STATE_FILE = "train_state.json"
#: Hidden directories where ranks write a checkpoint before the driver registers it.
STAGING_PREFIX = ".staging-"


def staging_name(attempt: str, name: str) -> str:
    """The staging directory of checkpoint ``name`` written by attempt ``attempt``."""
    return f"{STAGING_PREFIX}{attempt}-{name}"


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
        """Write the state atomically (a reader sees the previous state or this one)."""
        atomic_write_text(os.path.join(self.path, STATE_FILE), json.dumps(snapshot, default=str))

    def commit_checkpoint(self, name: str, attempt: str) -> None:
        """Make the staged checkpoint ``name`` of ``attempt`` the run's ``name`` (a rename).

        A directory already called ``name`` (a loop that reuses a ``checkpoint_dir_name``)
        is replaced. Without a staging directory (the loop wrote into the run's directory
        itself) the existing ``name`` stays as it is.
        """
        staged = os.path.join(self.path, staging_name(attempt, name))
        if not os.path.isdir(staged):
            return
        final = self.checkpoint_path(name)
        old = None
        if os.path.lexists(final):
            old = os.path.join(self.path, f"{STAGING_PREFIX}old-{uuid.uuid4().hex[:8]}-{name}")
            os.replace(final, old)
        os.replace(staged, final)
        fsync_dir(self.path)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)

    def delete_checkpoints(self, names: list[str] | tuple[str, ...]) -> None:
        """Remove checkpoint directories that retention dropped."""
        for name in names:
            shutil.rmtree(self.checkpoint_path(name), ignore_errors=True)

    def remove_unregistered(self, keep: set[str]) -> list[str]:
        """Remove ``checkpoint_*`` directories not in ``keep`` (from a run that ended before
        the driver registered them), staging directories and temporary files left by
        killed writers; return the names of the removed ``checkpoint_*`` directories."""
        removed = []
        try:
            entries = list(os.scandir(self.path))
        except FileNotFoundError:
            return removed
        for entry in entries:
            if entry.name.startswith((STAGING_PREFIX, TMP_PREFIX)):
                if entry.is_dir(follow_symlinks=False):
                    shutil.rmtree(entry.path, ignore_errors=True)
                else:
                    with contextlib.suppress(OSError):
                        os.remove(entry.path)
            elif entry.is_dir() and entry.name.startswith("checkpoint_") and entry.name not in keep:
                shutil.rmtree(entry.path, ignore_errors=True)
                removed.append(entry.name)
        return removed
