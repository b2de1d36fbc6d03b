"""J04 (RELIABILITY.md): the F14 chaos soak run from a Jupyter kernel, with the lab extension's
status routes polled the whole time, as the lab's status bar and panel do.

The kernel is started through this jupyter_server and runs ``benchmarks/chaos_soak.py``'s
short soak (node managers SIGKILLed under a counting workload). Meanwhile the test polls
``GET /nbcluster/api/clusters`` and ``.../clusters/<id>/load`` four times as often as the
lab does (every 0.5 s, the lab every 2 s). Passing means: the soak's own checks pass (every
result and sequence number, resources and CPU back), every poll was answered (200, or a 503
saying the head did not answer), the server log has no errors, and the polling costs the head under 5 % of a core (CPU time,
measured on an idle cluster of the same kernel with and without polling).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from pathlib import Path
from typing import Any

import psutil

from nbcluster.testing import assert_no_processes

REPO = Path(__file__).resolve().parents[2]
SOAK = REPO / "benchmarks" / "chaos_soak.py"
POLL_S = 0.5  # the lab polls every 2 s (labextension/src/store.ts)


async def _get(jp_fetch: Any, path: str) -> tuple[int, Any]:
    r = await jp_fetch(
        "nbcluster", "api", *path.split("/"), method="GET", raise_error=False, request_timeout=60
    )
    return r.code, (json.loads(r.body) if r.body else None)


class Poller:
    """What the lab does: list the clusters, then ask each for its load."""

    def __init__(self, jp_fetch: Any) -> None:
        self.jp_fetch = jp_fetch
        self.codes: list[int] = []
        self.loads = 0
        self.sessions: set[str] = set()
        self.stop = asyncio.Event()

    async def run(self) -> None:
        while not self.stop.is_set():
            code, listing = await _get(self.jp_fetch, "clusters")
            self.codes.append(code)
            for entry in (listing or {}).get("clusters", []):
                self.sessions.add(entry["session_dir"])
                code, _ = await _get(self.jp_fetch, f"clusters/{entry['id']}/load")
                self.codes.append(code)
                self.loads += code == 200
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stop.wait(), POLL_S)


async def _cell(client: Any, code: str, timeout: float = 300) -> str:
    """Run ``code`` in the kernel; return what it printed."""
    out: list[str] = []

    def output(msg: dict[str, Any]) -> None:
        if msg["msg_type"] == "stream":
            out.append(msg["content"]["text"])
        elif msg["msg_type"] == "error":
            out.append("\n".join(msg["content"]["traceback"]))

    reply = await client.execute_interactive(code, timeout=timeout, output_hook=output)
    assert reply["content"]["status"] == "ok", "".join(out)[-4000:]
    return "".join(out)


def _head_cpu(session_dir: str) -> float:
    pid = int((Path(session_dir) / "head.pid").read_text())
    t = psutil.Process(pid).cpu_times()
    return t.user + t.system


async def test_j04_chaos_soak_from_a_kernel_with_the_extension_polling(
    jp_fetch: Any, jp_serverapp: Any, cluster_temp_dir: Path, jp_logging_stream: Any
) -> None:
    r = await jp_fetch("api", "kernels", method="POST", body=json.dumps({"name": "python3"}))
    kernel_id = json.loads(r.body)["id"]
    client = jp_serverapp.kernel_manager.get_kernel(kernel_id).client()
    client.start_channels()
    poller = Poller(jp_fetch)
    try:
        await client.wait_for_ready(timeout=120)
        await _cell(
            client,
            "import importlib.util, json, os, sys\n"
            f"os.environ['NBCLUSTER_TEMP_DIR'] = {str(cluster_temp_dir)!r}\n"
            f"spec = importlib.util.spec_from_file_location('chaos_soak', {str(SOAK)!r})\n"
            "soak = sys.modules['chaos_soak'] = importlib.util.module_from_spec(spec)\n"
            "spec.loader.exec_module(soak)\n",
        )
        polling = asyncio.ensure_future(poller.run())
        printed = await _cell(client, "print(json.dumps(soak.run(soak.QUICK)))", timeout=400)
        poller.stop.set()
        await polling
        summary = json.loads(printed.strip().splitlines()[-1])
        assert summary["passed"], json.dumps(summary, indent=2)
        assert summary["kills"] >= 1 and summary["missing_sequence_numbers"] == {}
        assert poller.loads >= 5, poller.codes  # the cluster was seen and polled throughout
        # Every poll was answered: 200, or 503 with its message when the head did not answer
        # in time (a busy machine) or had just stopped (the soak's last poll); never a 500.
        assert set(poller.codes) <= {200, 503}, poller.codes
        assert poller.codes.count(200) >= 0.8 * len(poller.codes), poller.codes

        # What the polling costs the head: CPU time over a window, polled and not.
        printed = await _cell(
            client,
            "import nbcluster\n"
            "info = nbcluster.init(num_cpus=1)\n"
            "print(json.dumps({'session': info.session_dir}))\n",
        )
        session = json.loads(printed.strip().splitlines()[-1])["session"]
        window = 6.0
        before = _head_cpu(session)
        await asyncio.sleep(window)
        quiet = _head_cpu(session) - before
        poller = Poller(jp_fetch)
        polling = asyncio.ensure_future(poller.run())
        start, before = time.monotonic(), _head_cpu(session)
        await asyncio.sleep(window)
        polled = _head_cpu(session) - before
        elapsed = time.monotonic() - start
        poller.stop.set()
        await polling
        assert poller.loads >= 3
        extra = max(0.0, polled - quiet) / elapsed
        assert extra < 0.05, f"polling every {POLL_S}s costs the head {extra:.1%} of a core"
        await _cell(client, "nbcluster.shutdown()")
    finally:
        poller.stop.set()
        client.stop_channels()
        await jp_fetch("api", "kernels", kernel_id, method="DELETE")
    for s in poller.sessions:
        assert_no_processes(s, timeout=30)
    log = jp_logging_stream.getvalue()
    assert "Traceback" not in log, log[-3000:]
    errors = [line for line in log.splitlines() if "ERROR" in line or "Uncaught" in line]
    assert not errors, "\n".join(errors)
