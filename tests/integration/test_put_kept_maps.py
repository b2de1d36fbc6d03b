"""A writer rewrites its freed store files through kept mappings, never under a live view.

``objects.kept_maps``: the driver keeps the populated mapping of each pooled file it
wrote and, once the object in it is freed and nobody else maps the file, writes its next
object into it. These tests run on a real cluster: a freed object's file must not be
reused while another process still holds a zero-copy view of the old value, and values
``put``, read by tasks and ``get`` stay right across many reuses.
"""

from __future__ import annotations

import sys
import time

import cloudpickle
import numpy as np
import pytest

import nbcluster
from nbcluster._runtime.objects.kept_maps import kept_maps

pytestmark = pytest.mark.integration
cloudpickle.register_pickle_by_value(sys.modules[__name__])  # workers cannot import tests/

SIZE = 8 * 2**20


def array(fill: float) -> np.ndarray:
    return np.full(SIZE // 8, fill)


@nbcluster.remote
class Holder:
    def __init__(self) -> None:
        self.held: np.ndarray | None = None

    def hold(self, a: np.ndarray) -> bool:
        self.held = a  # a read-only view of the object's mapping (no copy)
        return bool(a.flags.writeable)

    def check(self) -> tuple[float, float, float]:
        assert self.held is not None
        return float(self.held.min()), float(self.held.max()), float(self.held.sum())


@nbcluster.remote
def total(a: np.ndarray) -> float:
    return float(a.sum())


def _warm_up() -> None:
    """Writes of SIZE until the driver writes through kept mappings (the node first learns
    the size and fills its pool in the background, at low priority: give it time)."""
    before = kept_maps.reused
    deadline = time.monotonic() + 90
    while kept_maps.reused < before + 2:
        assert time.monotonic() < deadline, "the driver never rewrote a kept file"
        ref = nbcluster.put(array(1.5))
        del ref
        time.sleep(0.05)


def test_a_freed_file_is_not_reused_while_another_process_views_it(shared_cluster) -> None:
    _warm_up()
    holder = Holder.remote()
    ref = nbcluster.put(array(1.0))
    assert nbcluster.get(holder.hold.remote(ref), timeout=60) is False
    del ref  # freed: the holder's view is all that is left of it
    reused = kept_maps.reused
    for n in range(2, 10):  # writes of the same size, each freed at once
        r = nbcluster.put(array(float(n)))
        del r
        time.sleep(0.05)  # (the free reaches the node asynchronously)
    assert kept_maps.reused > reused  # the driver kept rewriting its other files
    assert nbcluster.get(holder.check.remote(), timeout=60) == (1.0, 1.0, float(SIZE // 8))
    nbcluster.kill(holder)


def test_values_stay_right_across_reuse_put_get_and_tasks(shared_cluster) -> None:
    _warm_up()
    kept_values = []
    for n in range(6):
        fill = float(n + 10)
        ref = nbcluster.put(array(fill))
        sums = nbcluster.get([total.remote(ref) for _ in range(4)], timeout=60)
        assert sums == [fill * (SIZE // 8)] * 4
        value = nbcluster.get(ref, timeout=60)
        if n % 2 == 0:
            kept_values.append((fill, value))  # a zero-copy view outliving its ref
        del ref, value
    for fill, value in kept_values:
        assert float(value.min()) == fill and float(value.max()) == fill
