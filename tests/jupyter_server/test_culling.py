"""Binder-style idle culling (issue 13, item 5): jupyter_server's kernel culler, for real.

A kernel whose cell has finished but whose tasks still run reports activity (the
keep-alive), so the culler leaves it alone however long the tasks take; once they are
done nothing reports, the culler shuts the kernel down, and the kernel's cluster ends
with it (no process left).
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pytest
from traitlets.config import Config

from nbcluster.testing import assert_no_processes

pytestmark = pytest.mark.integration

CULL_AFTER_S = 3
TASK_S = 8


@pytest.fixture
def jp_server_config(cluster_temp_dir: Path) -> Config:
    """The folder's server config plus a culler that is quick to act."""
    return Config(
        {
            "ServerApp": {
                "jpserver_extensions": {
                    "nbcluster.jupyter.server": True,
                    "jupyter_server_terminals": False,
                },
                "allow_unauthenticated_access": False,
            },
            "NbclusterServerApp": {"temp_dir": str(cluster_temp_dir)},
            "MappingKernelManager": {"cull_idle_timeout": CULL_AFTER_S, "cull_interval": 1},
        }
    )


async def test_keepalive_holds_the_culler_off_and_culling_ends_the_cluster(
    jp_fetch: Any, jp_serverapp: Any, cluster_temp_dir: Path, monkeypatch: Any
) -> None:
    monkeypatch.setenv("NBCLUSTER_KEEPALIVE_S", "0.5")
    monkeypatch.setenv("NBCLUSTER_TEMP_DIR", str(cluster_temp_dir))
    r = await jp_fetch("api", "kernels", method="POST", body=json.dumps({"name": "python3"}))
    kernel_id = json.loads(r.body)["id"]
    km = jp_serverapp.kernel_manager
    client = km.get_kernel(kernel_id).client()
    client.start_channels()
    out: list[str] = []

    def collect(msg: dict[str, Any]) -> None:
        if msg["msg_type"] == "stream":
            out.append(msg["content"]["text"])

    try:
        await client.wait_for_ready(timeout=120)
        code = (
            "%load_ext nbcluster\n%cluster start --num-cpus 1\n"
            "import time, nbcluster\n"
            "@nbcluster.remote\n"
            "def work(s):\n"
            "    time.sleep(s)\n"
            "    return s\n"
            f"ref = work.remote({TASK_S})\n"
            "print('SESSION', nbcluster.state.session_info()['session_dir'])\n"
        )
        reply = await client.execute_interactive(code, output_hook=collect, timeout=120)
        assert reply["content"]["status"] == "ok", reply["content"]
    finally:
        client.stop_channels()
    submitted = time.monotonic()
    session_dir = next(
        line.split(" ", 1)[1] for line in "".join(out).splitlines() if line.startswith("SESSION ")
    )

    # The cell is over and nothing else happens: only the keep-alive reports activity.
    await asyncio.sleep(CULL_AFTER_S * 2)
    assert kernel_id in km.list_kernel_ids(), "culled while its tasks were running"

    deadline = submitted + TASK_S + CULL_AFTER_S + 30
    while kernel_id in km.list_kernel_ids() and time.monotonic() < deadline:
        await asyncio.sleep(0.25)
    assert kernel_id not in km.list_kernel_ids(), "not culled after its tasks finished"
    assert time.monotonic() - submitted >= TASK_S, "culled before its tasks finished"
    assert_no_processes(session_dir, timeout=30)
