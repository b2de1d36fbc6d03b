"""Fixtures for the Serve tests.

``serve_cluster``: one 2-CPU cluster per test module with Serve started on a free port
(never 8000: other clusters may run on this machine). After each test every application
is deleted; at the end of the module Serve and the cluster are shut down and checked for
leftover processes. Replicas in these tests ask for 0 CPUs so several fit.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

import nbcluster
from nbcluster import serve
from nbcluster.testing import assert_no_processes


@pytest.fixture(scope="module")
def _serve_module() -> Iterator[Any]:
    if nbcluster.is_initialized():
        nbcluster.shutdown()
    info = nbcluster.init(num_cpus=2)
    serve.start(http_options={"port": 0})
    yield info
    try:
        serve.shutdown()
    finally:
        nbcluster.shutdown()
    assert_no_processes(info.session_dir, timeout=15)


@pytest.fixture
def serve_cluster(_serve_module: Any) -> Iterator[Any]:
    """A cluster with Serve running; applications are deleted after the test."""
    yield _serve_module
    for name in list(serve.status().applications):
        serve.delete(name)


@pytest.fixture
def serve_url(serve_cluster: Any) -> str:
    """The URL of this node's proxy."""
    deadline = time.monotonic() + 30
    st = serve.status()
    while not st.proxy_urls and time.monotonic() < deadline:  # serve.start does not wait
        time.sleep(0.05)
        st = serve.status()
    here = nbcluster.get_runtime_context().get_node_id()
    return st.proxy_urls.get(here) or next(iter(st.proxy_urls.values()))
