"""Serve on a cluster of two nodes (one host): a proxy per node, replicas spread over them."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from typing import Any

import cloudpickle
import httpx
import pytest

import nbcluster
from nbcluster import serve
from nbcluster.testing import assert_no_processes

pytestmark = pytest.mark.integration
cloudpickle.register_pickle_by_value(sys.modules[__name__])


@pytest.fixture
def two_nodes() -> Iterator[Any]:
    if nbcluster.is_initialized():
        nbcluster.shutdown()
    info = nbcluster.init(num_cpus=1, _nodes=2)
    try:
        yield info
    finally:
        try:
            serve.shutdown()
        finally:
            nbcluster.shutdown()
        assert_no_processes(info.session_dir, timeout=15)


def test_a_proxy_per_node_and_replicas_spread(two_nodes: Any) -> None:
    @serve.deployment(num_replicas=2, ray_actor_options={"num_cpus": 0.5})
    class Where:
        def __call__(self, request: Any = None) -> str:
            return nbcluster.get_runtime_context().get_node_id()

    serve.start(http_options={"port": 0})
    serve.run(Where.bind(), name="where", route_prefix="/where", _display=False)
    st = serve.status()
    nodes = {n["NodeID"] for n in nbcluster.nodes() if n["Alive"]}
    assert set(st.proxy_urls) == nodes and len(nodes) == 2
    assert len(set(st.proxy_urls.values())) == 2  # one host: the second proxy took another port
    replicas = st.applications["where"].deployments["Where"].replicas
    assert {r.node_id for r in replicas} == nodes  # SPREAD
    seen = set()
    for url in st.proxy_urls.values():
        with httpx.Client(base_url=url, timeout=30) as c:
            for _ in range(20):
                r = c.get("/where")
                assert r.status_code == 200
                seen.add(r.text)
    assert seen == nodes  # every proxy routes to every replica
    assert os.getpid()
