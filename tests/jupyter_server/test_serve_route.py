"""The Serve forwarding route: an app reached through the Jupyter server's own auth.

A cluster started in this process (in the server's session directory), a Serve app on
it, and requests through ``/nbcluster/api/clusters/<id>/serve/...``: answered with the
token, refused without; the Jupyter credentials never reach the app; the app's own 404
passes through; a cluster without Serve is a clear 404.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import cloudpickle
import pytest

import nbcluster
from nbcluster import serve
from nbcluster.jupyter.server.serve_proxy import proxy_base
from nbcluster.serve._api import jupyter_path
from nbcluster.testing import assert_no_processes

pytestmark = pytest.mark.integration
cloudpickle.register_pickle_by_value(sys.modules[__name__])


@pytest.fixture
def kernel_cluster(cluster_temp_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """A cluster this process started in the server's temp dir (as a kernel would)."""
    monkeypatch.setenv("NBCLUSTER_TEMP_DIR", str(cluster_temp_dir))
    if nbcluster.is_initialized():
        nbcluster.shutdown()
    info = nbcluster.init(num_cpus=1)
    try:
        yield info
    finally:
        try:
            serve.shutdown()
        finally:
            nbcluster.shutdown()
        assert_no_processes(info.session_dir, timeout=15)


def _cluster_id() -> str:
    return jupyter_path("/").split("/clusters/")[1].split("/")[0]


async def test_serve_app_through_the_jupyter_server(
    jp_fetch: Any, manager: Any, kernel_cluster: Any
) -> None:
    cid = _cluster_id()
    r = await jp_fetch("nbcluster", "api", "clusters", cid, "serve", "echo", raise_error=False)
    assert r.code == 404 and b"Serve is not running" in r.body

    @serve.deployment(ray_actor_options={"num_cpus": 0})
    class Echo:
        async def __call__(self, request: Any) -> dict[str, Any]:
            return {
                "path": request.url.path,
                "method": request.method,
                "body": (await request.body()).decode(),
                "q": request.query_params.get("q"),
                "authorization": request.headers.get("authorization"),
                "cookie": request.headers.get("cookie"),
            }

    serve.start(http_options={"port": 0})
    serve.run(Echo.bind(), name="echo", route_prefix="/echo", _display=False)
    assert proxy_base(kernel_cluster.session_dir) is not None
    r = await jp_fetch("nbcluster", "api", "clusters", cid, "serve", "echo", "x", params={"q": "1"})
    assert r.code == 200
    assert json.loads(r.body) == {
        "path": "/echo/x",
        "method": "GET",
        "body": "",
        "q": "1",
        "authorization": None,  # the Jupyter token stays with the Jupyter server
        "cookie": None,
    }
    r = await jp_fetch(
        "nbcluster", "api", "clusters", cid, "serve", "echo", method="POST", body="hello"
    )
    assert json.loads(r.body)["body"] == "hello"
    r = await jp_fetch(
        "nbcluster",
        "api",
        "clusters",
        cid,
        "serve",
        "echo",
        headers={"Authorization": ""},
        raise_error=False,
    )
    assert r.code in (401, 403)
    r = await jp_fetch("nbcluster", "api", "clusters", cid, "serve", "nowhere", raise_error=False)
    assert r.code == 404 and b"not found" in r.body  # the Serve proxy's own 404
    r = await jp_fetch("nbcluster", "api", "clusters", "0123456789ab", "serve", raise_error=False)
    assert r.code == 404 and b"Traceback" not in r.body


def test_proxy_base_only_forwards_to_loopback(tmp_path: Path) -> None:
    serve_dir = tmp_path / "serve"
    serve_dir.mkdir()
    assert proxy_base(str(tmp_path)) is None
    (serve_dir / "proxies.json").write_text(json.dumps([{"url": "http://10.1.2.3:8000"}]))
    assert proxy_base(str(tmp_path)) is None
    (serve_dir / "proxies.json").write_text(json.dumps([{"url": "http://0.0.0.0:8123"}]))
    assert proxy_base(str(tmp_path)) == "http://127.0.0.1:8123"
    (serve_dir / "proxies.json").write_text("not json")
    assert proxy_base(str(tmp_path)) is None
