"""``Checkpoint``: a directory of files that a trial (or a training run) can resume from.

Same names and behaviour as Ray's ``ray.tune.Checkpoint`` / ``ray.train.Checkpoint`` on a
local (or shared) filesystem: ``Checkpoint.from_directory(path)``, ``to_directory()``,
``as_directory()``, and small JSON metadata kept in ``.metadata.json`` inside the
directory. Reporting a checkpoint copies its directory into the trial's folder under
``storage_path`` (see :func:`persist_checkpoint`), so the reporter may delete its temporary
directory right after ``report`` returns.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

__all__ = ["Checkpoint", "persist_checkpoint", "checkpoint_index", "CHECKPOINT_PREFIX"]

_METADATA_FILE_NAME = ".metadata.json"
CHECKPOINT_PREFIX = "checkpoint_"


class Checkpoint:
    """A reference to a checkpoint directory (it does not copy or load anything itself)."""

    def __init__(self, path: str | os.PathLike[str], filesystem: Any = None) -> None:
        if filesystem is not None:
            raise NotImplementedError(
                "nbcluster checkpoints live on a local or shared filesystem; "
                "filesystem= (pyarrow remote filesystems) is not supported"
            )
        self.path: str = os.fspath(path)
        self.filesystem = None

    @classmethod
    def from_directory(cls, path: str | os.PathLike[str]) -> Checkpoint:
        """A checkpoint of the files in ``path``."""
        return cls(os.path.abspath(os.fspath(path)))

    def to_directory(self, path: str | os.PathLike[str] | None = None) -> str:
        """Copy the checkpoint's files into ``path`` (a new temporary dir when None)."""
        dest = os.fspath(path) if path is not None else tempfile.mkdtemp(prefix="checkpoint_")
        os.makedirs(dest, exist_ok=True)
        shutil.copytree(self.path, dest, dirs_exist_ok=True)
        return dest

    @contextlib.contextmanager
    def as_directory(self) -> Iterator[str]:
        """The checkpoint's local directory, for reading (no copy on a local filesystem)."""
        yield self.path

    def get_metadata(self) -> dict[str, Any]:
        """The metadata dict stored with the checkpoint (empty when none)."""
        try:
            with open(os.path.join(self.path, _METADATA_FILE_NAME)) as f:
                return dict(json.load(f))
        except FileNotFoundError:
            return {}

    def set_metadata(self, metadata: dict[str, Any]) -> None:
        """Replace the metadata (JSON-serializable values)."""
        with open(os.path.join(self.path, _METADATA_FILE_NAME), "w") as f:
            json.dump(metadata, f)

    def update_metadata(self, metadata: dict[str, Any]) -> None:
        """Merge ``metadata`` into the stored metadata."""
        merged = self.get_metadata()
        merged.update(metadata)
        self.set_metadata(merged)

    def __fspath__(self) -> str:
        return self.path

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Checkpoint) and other.path == self.path

    def __hash__(self) -> int:
        return hash(self.path)

    def __repr__(self) -> str:
        return f"Checkpoint(filesystem=local, path={self.path})"


def checkpoint_index(name: str) -> int:
    """``'checkpoint_000012'`` -> 12; -1 for other names."""
    if not name.startswith(CHECKPOINT_PREFIX):
        return -1
    try:
        return int(name[len(CHECKPOINT_PREFIX) :])
    except ValueError:
        return -1


def persist_checkpoint(source: Checkpoint, trial_dir: str, index: int) -> Checkpoint:
    """Copy ``source`` to ``trial_dir/checkpoint_<index>`` atomically and return it there.

    The copy goes to a hidden temporary name first and is renamed when complete, so a
    process killed mid-copy never leaves a half-written ``checkpoint_*`` directory.
    A checkpoint that already lies at the destination is returned as it is.
    """
    dest = Path(trial_dir) / f"{CHECKPOINT_PREFIX}{index:06d}"
    if Path(source.path).resolve() == dest.resolve():
        return Checkpoint(str(dest))
    tmp = Path(trial_dir) / f".tmp_{dest.name}_{uuid.uuid4().hex[:8]}"
    shutil.copytree(source.path, tmp)
    if dest.exists():
        shutil.rmtree(dest)
    os.replace(tmp, dest)
    return Checkpoint(str(dest))
