"""The issue's own example, end to end on a real local cluster."""

from __future__ import annotations

import numpy as np

import nbcluster


def test_quickstart_example(cluster):
    cluster(num_cpus=2)

    @nbcluster.remote
    def square(x):
        return x * x

    refs = [square.remote(i) for i in range(1000)]
    assert sum(nbcluster.get(refs)) == sum(i * i for i in range(1000))
    arr_ref = nbcluster.put(np.ones(10**7))
    arr = nbcluster.get(arr_ref)
    assert arr.sum() == 10**7
    assert not arr.flags.writeable
    ready, pending = nbcluster.wait(refs, num_returns=10, timeout=1.0)
    assert len(ready) == 10 and len(pending) == 990


def test_shared_cluster_runs_tasks(shared_cluster):
    @nbcluster.remote
    def add(a, b):
        return a + b

    assert nbcluster.get(add.remote(1, 2)) == 3
