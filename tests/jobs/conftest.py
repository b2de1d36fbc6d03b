"""Fixtures for the jobs and runtime_env tests.

``job_cluster``: one 2-CPU :class:`LocalCluster` per module (not connected to this process:
jobs are submitted to it through its head); its processes must all be gone afterwards.
``jobs``: a :class:`JobSubmissionClient` for it. Every module gets a fresh runtime_env cache
(``NBCLUSTER_RUNTIME_ENV_DIR``), so "cold" means cold.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from nbcluster import LocalCluster
from nbcluster.job_submission import JobStatus, JobSubmissionClient
from nbcluster.testing import assert_no_processes


@pytest.fixture(scope="module")
def env_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    path = tmp_path_factory.mktemp("runtime_resources")
    old = os.environ.get("NBCLUSTER_RUNTIME_ENV_DIR")
    os.environ["NBCLUSTER_RUNTIME_ENV_DIR"] = str(path)
    yield path
    if old is None:
        os.environ.pop("NBCLUSTER_RUNTIME_ENV_DIR", None)
    else:
        os.environ["NBCLUSTER_RUNTIME_ENV_DIR"] = old


@pytest.fixture(scope="module")
def job_cluster(env_cache: Path) -> Iterator[LocalCluster]:
    cluster = LocalCluster(num_cpus=2).start()
    try:
        yield cluster
    finally:
        cluster.stop()
        assert cluster.session_dir is not None
        assert_no_processes(cluster.session_dir, timeout=15)


@pytest.fixture
def jobs(job_cluster: LocalCluster) -> Iterator[JobSubmissionClient]:
    client = JobSubmissionClient(job_cluster.address)
    yield client
    client.close()


def wait_status(
    client: JobSubmissionClient, sid: str, wanted: set[JobStatus], timeout: float = 60.0
) -> JobStatus:
    """Poll until the job's status is one of ``wanted`` (generous deadline against hangs)."""
    deadline = time.monotonic() + timeout
    while True:
        status = client.get_job_status(sid)
        if status in wanted:
            return status
        if time.monotonic() > deadline:
            raise AssertionError(f"job {sid} is {status.value}, not {wanted}, after {timeout}s")
        time.sleep(0.02)


def group_alive(pgid: int) -> bool:
    """True while any process of the group exists."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@pytest.fixture
def wait_job() -> object:
    """:func:`wait_status` as a fixture (test modules do not import conftest)."""
    return wait_status


@pytest.fixture
def alive_group() -> object:
    """:func:`group_alive` as a fixture."""
    return group_alive
