"""Helpers of the store's unit tests: objects of ``SIZE`` bytes in a store directory."""

from __future__ import annotations

import os

import numpy as np

from nbcluster._runtime.objects import store
from nbcluster._runtime.serialization import serialize

MiB = 1 << 20
SIZE = 4 * MiB


def oid(n: int) -> bytes:
    """The object id numbered ``n``."""
    return n.to_bytes(20, "big")


def inode(shm_dir: str, n: int) -> int:
    """The inode of object ``n``'s file."""
    return os.stat(store.object_path(shm_dir, oid(n))).st_ino


def value(fill: float) -> np.ndarray:
    """An array of ``SIZE`` bytes, each element ``fill``."""
    return np.full(SIZE // 8, fill)


def put(shm_dir: str, n: int, fill: float) -> None:
    """Write object ``n`` (:func:`value` of ``fill``)."""
    store.write_object(shm_dir, oid(n), serialize(value(fill)))


def free(shm_dir: str, n: int) -> int:
    """Free object ``n`` as the node does (its file is pooled)."""
    return store.delete_object(shm_dir, oid(n), recycle_limit=64 * MiB)
