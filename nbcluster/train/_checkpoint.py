"""``Checkpoint``: a directory of files that a training run can resume from.

A checkpoint is only a path (``ray.train.Checkpoint``): ``from_directory(path)`` wraps a
directory the training function wrote; ``report(metrics, checkpoint=...)`` copies it into
the run's storage (``storage_path/name/checkpoint_NNNNNN``), and the ``Checkpoint`` that
``Result.checkpoint`` or ``get_checkpoint()`` returns points there. Metadata (a small
JSON-serialisable dict) lives beside the files in ``.metadata.json``, which is only ever
replaced whole (written to a temporary name, fsync-ed, renamed), so a reader never sees a
partial file.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from typing import Any

from nbcluster.train._fileio import atomic_write_text, dir_lock

__all__ = ["Checkpoint", "METADATA_FILE"]

#: The file holding a checkpoint's metadata (Ray's name).
METADATA_FILE = ".metadata.json"


class Checkpoint:
    """A directory of checkpoint files (``ray.train.Checkpoint``)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        if not isinstance(path, (str, os.PathLike)):
            raise TypeError(f"Checkpoint(path) expects a directory path, got {type(path).__name__}")
        self.path = os.path.abspath(os.fspath(path))

    @classmethod
    def from_directory(cls, path: str | os.PathLike[str]) -> Checkpoint:
        """A checkpoint of the files in the directory ``path`` (nothing is copied yet)."""
        ckpt = cls(path)
        ckpt._require_dir("Checkpoint.from_directory()")
        return ckpt

    def _require_dir(self, where: str) -> None:
        if not os.path.isdir(self.path):
            what = "is not a directory" if os.path.exists(self.path) else "does not exist"
            raise FileNotFoundError(
                f"{where}: the checkpoint directory {self.path} {what}. Write the checkpoint "
                "files first, and keep the directory until report() has returned (report "
                "copies it into the run's storage)"
            )

    def to_directory(self, path: str | os.PathLike[str] | None = None) -> str:
        """Copy the files into ``path`` (default: a new temporary directory); return it."""
        self._require_dir("Checkpoint.to_directory()")
        dest = tempfile.mkdtemp(prefix="checkpoint_") if path is None else os.fspath(path)
        dest = os.path.abspath(dest)
        if dest != self.path:
            shutil.copytree(self.path, dest, dirs_exist_ok=True)
        return dest

    @contextlib.contextmanager
    def as_directory(self) -> Iterator[str]:
        """``with ckpt.as_directory() as d:`` — read the files in place (a local path)."""
        self._require_dir("Checkpoint.as_directory()")
        yield self.path

    def get_metadata(self) -> dict[str, Any]:
        """The metadata dict ({} when none was set)."""
        file = os.path.join(self.path, METADATA_FILE)
        try:
            with open(file, encoding="utf-8") as f:
                data = json.load(f)
        except FileNotFoundError:
            self._require_dir("Checkpoint.get_metadata()")
            return {}
        return data if isinstance(data, dict) else {}

    def set_metadata(self, metadata: dict[str, Any]) -> None:
        """Replace the metadata (a JSON-serialisable dict)."""
        if not isinstance(metadata, dict):
            raise TypeError(f"set_metadata() expects a dict, got {type(metadata).__name__}")
        self._require_dir("Checkpoint.set_metadata()")
        try:
            text = json.dumps(metadata)
        except (TypeError, ValueError) as err:
            raise TypeError(f"checkpoint metadata must be JSON-serialisable: {err}") from None
        atomic_write_text(os.path.join(self.path, METADATA_FILE), text)

    def update_metadata(self, metadata: dict[str, Any]) -> None:
        """Merge ``metadata`` into the existing metadata (safe against other processes
        merging into the same checkpoint at the same time)."""
        self._require_dir("Checkpoint.update_metadata()")
        with dir_lock(self.path):
            merged = self.get_metadata()
            merged.update(metadata)
            self.set_metadata(merged)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Checkpoint) and other.path == self.path

    def __hash__(self) -> int:
        return hash(self.path)

    def __repr__(self) -> str:
        return f"Checkpoint(filesystem=local, path={self.path})"
