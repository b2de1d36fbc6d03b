"""Fixtures of the unit tests."""

from __future__ import annotations

import gc
import os
import shutil
import tempfile
from collections.abc import Iterator

import pytest

from nbcluster._runtime.objects import kept_maps, readers


def _clear_kept() -> None:
    kept_maps.kept_maps.clear()
    readers.reader_maps.clear()


@pytest.fixture
def shm_dir() -> Iterator[str]:
    """A private store directory on /dev/shm (tmpfs), removed afterwards; no mappings kept
    by this process's writers or readers before or after."""
    if not os.path.isdir("/dev/shm"):
        pytest.skip("no /dev/shm")
    path = tempfile.mkdtemp(prefix="nbc-test-store-", dir="/dev/shm")
    _clear_kept()
    yield path
    gc.collect()  # values a test left to the collector let go of their files
    _clear_kept()
    shutil.rmtree(path, ignore_errors=True)
