"""Kept write mappings (``objects.kept_maps``) and spilling: values and accounting stay right.

A store smaller than what the driver keeps makes the node spill the driver's objects
(some of them written through kept mappings) and restore them on ``get``; freed, the
store's usage goes back to where it was, and the next rounds reuse the files again.
"""

from __future__ import annotations

import gc
import time

import numpy as np
import pytest

import nbcluster
from nbcluster._runtime.objects.kept_maps import kept_maps
from nbcluster.testing import poll_for

pytestmark = pytest.mark.integration

MIB = 2**20
STORE = 64 * MIB
OBJECT = 8 * MIB


def _store_used() -> int:
    return int(nbcluster.nodes()[0]["ObjectStoreUsed"])


def test_spilled_and_restored_objects_written_through_kept_maps(cluster) -> None:
    cluster(num_cpus=1, object_store_memory=STORE)
    baseline = _store_used()
    reused = kept_maps.reused
    deadline = time.monotonic() + 90
    while kept_maps.reused < reused + 2:  # until the driver writes through kept mappings
        assert time.monotonic() < deadline, "the driver never rewrote a kept file"
        ref = nbcluster.put(np.full(OBJECT // 8, -1.0))
        del ref
        time.sleep(0.05)
    for round_ in range(3):
        kept: list[tuple[float, nbcluster.ObjectRef]] = []
        for i in range(16):  # 128 MiB put, 96 MiB kept: some must spill
            fill = float(100 * round_ + i)
            ref = nbcluster.put(np.full(OBJECT // 8, fill))
            if i % 4 != 3:
                kept.append((fill, ref))
            del ref  # (every fourth is freed at once: its file comes back for reuse)
        assert _store_used() <= STORE
        values = [(fill, nbcluster.get(ref, timeout=60)) for fill, ref in kept]  # restored
        for fill, value in values:
            assert float(value.min()) == fill and float(value.max()) == fill
        del values, kept
        gc.collect()
        poll_for(lambda: _store_used() <= baseline, timeout=30, message="store usage back")
