"""Fixtures shared by the test suites.

- ``cluster``: a factory. ``cluster(num_cpus=2, ...)`` calls ``nbcluster.init`` with those
  arguments and returns its ``ClusterInfo``; teardown shuts it down and checks that every
  process of the session has ended.
- ``shared_cluster``: one 2-CPU cluster per test module (faster); each test that uses it is
  followed by a health check (resources back, no orphan processes, no threads or file
  descriptors leaked by the test, an actor and 100 tasks still run).
Every test runs in its own temp dir for cluster sessions (``NBCLUSTER_TEMP_DIR``).
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import nbcluster
from nbcluster.config import Config
from nbcluster.testing import (
    assert_cluster_healthy,
    assert_no_leaks,
    assert_no_processes,
    health_baseline,
)


@pytest.fixture(scope="session", autouse=True)
def _session_temp_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    base = tmp_path_factory.mktemp("nbcluster")
    old = os.environ.get("NBCLUSTER_TEMP_DIR")
    os.environ["NBCLUSTER_TEMP_DIR"] = str(base)
    yield
    if old is None:
        os.environ.pop("NBCLUSTER_TEMP_DIR", None)
    else:
        os.environ["NBCLUSTER_TEMP_DIR"] = old


def _shutdown_and_check() -> None:
    info = nbcluster._api.context.current_client()
    session = getattr(getattr(info, "info", None), "session_dir", "") if info else ""
    started_here = bool(info and info.info.started_here)  # type: ignore[attr-defined]
    nbcluster.shutdown()
    if session and started_here:
        assert_no_processes(session, timeout=10)
        stores = Path(Config.from_env().store_base_dir) / f"nbcluster-{Path(session).name}"
        assert not stores.exists(), f"object store files left in {stores}"


@pytest.fixture
def cluster() -> Iterator[Callable[..., Any]]:
    """Factory: start a cluster in this process with ``nbcluster.init(**kwargs)``."""
    if nbcluster.is_initialized():
        nbcluster.shutdown()
    baseline = health_baseline()

    def start(**kwargs: Any) -> Any:
        return nbcluster.init(**kwargs)

    yield start
    _shutdown_and_check()
    assert_no_leaks(baseline, timeout=10)  # the driver's threads and sockets went with it


@pytest.fixture
def ctrl_c_raises() -> Iterator[None]:
    """SIGINT raises KeyboardInterrupt in the main thread, as in a kernel or a terminal. A
    process started in the background by a non-interactive shell (``cmd &``, as CI runners
    may) inherits SIGINT ignored, and Python then installs no handler for it (so
    ``_thread.interrupt_main()`` does nothing)."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


@pytest.fixture
def tls_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """A TLS cluster's environment for clusters started in this test: fresh certificates
    in the environment, encryption required. Returns the certificates."""
    from nbcluster._runtime.protocol import tls

    certs = tls.make_cluster_certificates(tmp_path / "tls")
    for k, v in certs.env().items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("NBCLUSTER_REQUIRE_ENCRYPTION", "1")
    return certs


@pytest.fixture(scope="module")
def _module_cluster() -> Iterator[Any]:
    if nbcluster.is_initialized():
        nbcluster.shutdown()
    info = nbcluster.init(num_cpus=2)
    yield info
    _shutdown_and_check()


@pytest.fixture
def shared_cluster(_module_cluster: Any) -> Iterator[Any]:
    """A 2-CPU cluster shared by the tests of a module; checked for health after each test."""
    if not nbcluster.is_initialized():
        pytest.fail("the module's shared cluster was shut down by an earlier test")
    baseline = health_baseline()
    yield _module_cluster
    assert_cluster_healthy(timeout=15, baseline=baseline)
