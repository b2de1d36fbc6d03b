"""Checkpoints in a trial's folder: ``checkpoint_NNNNNN`` directories, written atomically.

``Checkpoint`` itself is Train's class (``nbcluster.train.Checkpoint``; Tune re-exports it,
as Ray does). Reporting a checkpoint copies its directory into the trial's folder
(:func:`persist_checkpoint`), so the reporter may delete its temporary directory right
after ``report`` returns.
"""

from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path

from nbcluster.train import Checkpoint

__all__ = ["Checkpoint", "persist_checkpoint", "checkpoint_index", "CHECKPOINT_PREFIX"]

CHECKPOINT_PREFIX = "checkpoint_"


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
