"""Checkpoints in a trial's folder: ``checkpoint_NNNNNN`` directories, written atomically.

``Checkpoint`` itself is Train's class (``nbcluster.train.Checkpoint``; Tune re-exports it,
as Ray does). Reporting a checkpoint copies its directory into the trial's folder
(:func:`persist_checkpoint`), so the reporter may delete its temporary directory right
after ``report`` returns.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from pathlib import Path
from typing import Any

from nbcluster.train import Checkpoint
from nbcluster.train._fileio import atomic_copy_tree, atomic_write_text, fsync_dir

__all__ = [
    "CHECKPOINT_PREFIX",
    "METRICS_FILE",
    "Checkpoint",
    "checkpoint_index",
    "persist_checkpoint",
    "read_metrics",
    "write_metrics",
]

#: Inside each persisted checkpoint: the result it was reported with (for restores).
METRICS_FILE = ".tune_metrics.json"

CHECKPOINT_PREFIX = "checkpoint_"


def checkpoint_index(name: str) -> int:
    """``'checkpoint_000012'`` -> 12; -1 for other names."""
    if not name.startswith(CHECKPOINT_PREFIX):
        return -1
    try:
        return int(name[len(CHECKPOINT_PREFIX) :])
    except ValueError:
        return -1


def write_metrics(checkpoint_dir: str, metrics: dict[str, Any]) -> None:
    """Store the result a checkpoint was reported with inside it (read back on restore)."""
    clean = {k: v for k, v in metrics.items() if k != "config"}
    atomic_write_text(os.path.join(checkpoint_dir, METRICS_FILE), json.dumps(clean, default=repr))


def read_metrics(checkpoint_dir: str) -> dict[str, Any] | None:
    """The result stored by :func:`write_metrics`, or None."""
    try:
        with open(os.path.join(checkpoint_dir, METRICS_FILE)) as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def persist_checkpoint(
    source: Checkpoint, trial_dir: str, index: int, metrics: dict[str, Any] | None = None
) -> Checkpoint:
    """Copy ``source`` to ``trial_dir/checkpoint_<index>`` atomically and return it there.

    The copy (with ``metrics``, the result it came with) goes to a hidden temporary name
    first and is renamed when complete, so a process killed mid-copy never leaves a
    half-written ``checkpoint_*`` directory.
    """
    dest = Path(trial_dir) / f"{CHECKPOINT_PREFIX}{index:06d}"
    if Path(source.path).resolve() == dest.resolve():
        if metrics is not None:
            write_metrics(str(dest), metrics)
        return Checkpoint(str(dest))
    tmp = Path(trial_dir) / f".tmp_{dest.name}_{uuid.uuid4().hex[:8]}"
    atomic_copy_tree(source.path, str(tmp))  # every file fsync-ed before the rename
    if metrics is not None:
        write_metrics(str(tmp), metrics)
    if dest.exists():
        shutil.rmtree(dest)
    os.replace(tmp, dest)
    fsync_dir(trial_dir)
    return Checkpoint(str(dest))
