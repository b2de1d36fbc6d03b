"""The node's worker processes while it stops: no worker starts once ``stop_all`` begins.

A node refills its pool of idle workers whenever one exits, so without the rule every worker
``stop_all`` ended was replaced, and the node waited out both graces for the replacements (a
3-node cluster took over 3 s to stop instead of well under one).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import threading
from pathlib import Path

from nbcluster._runtime.node.service import WorkerProcesses


class FakeZygote:
    """Records spawn requests; the test writes the zygote's events to ``ev_w`` itself."""

    def __init__(self) -> None:
        self.ev_r, self.ev_w = os.pipe()
        self.spawned: list[bytes] = []
        self._buf = b""

    def spawn(self, worker_id: bytes, node_address: str, log_path: str) -> None:
        self.spawned.append(worker_id)

    def read_events(self) -> list[tuple[str, ...]]:
        try:
            data = os.read(self.ev_r, 65536)
        except BlockingIOError:
            return []
        self._buf += data
        *lines, self._buf = self._buf.split(b"\n")
        return [tuple(line.decode().split()) for line in lines if line]

    def close(self) -> None:
        for fd in (self.ev_r, self.ev_w):
            with contextlib.suppress(OSError):
                os.close(fd)


def test_a_worker_ended_by_stop_all_is_not_replaced(tmp_path: Path) -> None:
    zygote = FakeZygote()
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])

    def report_exit() -> None:  # what the real zygote does when its child ends
        code = child.wait(30)
        os.write(zygote.ev_w, f"exit {child.pid} {(-code) & 0x7F}\n".encode())

    async def scenario() -> tuple[list[bytes], list[bytes]]:
        exits: list[bytes] = []
        workers: WorkerProcesses

        def on_exit(worker_id: bytes, code: int) -> None:
            exits.append(worker_id)
            asyncio.ensure_future(workers.start(b"replacement"))  # the pool refills

        workers = WorkerProcesses(
            zygote=zygote,  # type: ignore[arg-type]
            node_address="127.0.0.1:1",
            session_dir=tmp_path,
            on_exit=on_exit,
        )
        (tmp_path / "logs").mkdir()
        await workers.start(b"w1")
        assert zygote.spawned == [b"w1"]
        os.write(zygote.ev_w, f"pid {b'w1'.hex()} {child.pid}\n".encode())
        await asyncio.sleep(0.05)  # the loop reads the pid event
        assert workers.pids == {b"w1": child.pid}
        threading.Thread(target=report_exit, daemon=True).start()
        await asyncio.wait_for(workers.stop_all(grace=10.0), 30)
        await asyncio.sleep(0.05)  # a refill the exit scheduled gets its turn
        return exits, zygote.spawned

    try:
        exits, spawned = asyncio.run(scenario())
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(10)
        zygote.close()
    assert exits == [b"w1"]  # SIGTERM ended it, and the node saw the exit
    assert spawned == [b"w1"]  # and started nothing in its place
    assert child.returncode is not None and child.returncode < 0
