"""Fixtures for the training tests.

``train_cluster``: one cluster per test module with 4 logical CPUs on the 2 real cores,
so that a 2-worker group (which reserves 2 CPUs while it trains) leaves room for the
tasks the tests run beside it. Each test is followed by a health check (every resource
back, tasks still run). Warm worker groups are kept between the tests of a module (that
is what they are for) and ended with the module's cluster.

Test modules register themselves with ``cloudpickle.register_pickle_by_value`` so that
the training functions and datasets they define reach the workers by value, as a
notebook's would.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

import nbcluster
from nbcluster.testing import assert_cluster_healthy, assert_no_processes

HEALTH_TIMEOUT_S = 60.0


@pytest.fixture(scope="module")
def _train_cluster() -> Iterator[Any]:
    if nbcluster.is_initialized():
        nbcluster.shutdown()
    info = nbcluster.init(num_cpus=4)
    yield info
    from nbcluster.train import release_warm_groups

    release_warm_groups()
    session = info.session_dir
    nbcluster.shutdown()
    assert_no_processes(session, timeout=HEALTH_TIMEOUT_S)


@pytest.fixture
def train_cluster(_train_cluster: Any) -> Iterator[Any]:
    """A 4-CPU cluster shared by a module's tests; checked for health after each."""
    if not nbcluster.is_initialized():
        pytest.fail("the module's cluster was shut down by an earlier test")
    yield _train_cluster
    # A deadline against a hang, not a timing check: after a test that killed workers,
    # the pool starts new ones, which took more than 15 s at a load average above 30.
    assert_cluster_healthy(timeout=HEALTH_TIMEOUT_S)
