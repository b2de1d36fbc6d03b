"""A dead owner's objects are freed on every node, spilled copies included (issue 12, item 1).

An object dies with its owner (Ray's fate sharing): once the worker or driver that owned it
is gone nobody can resolve it, so its bytes must not stay in any store. A task's return
value belongs to the task's *caller*, not to the worker that wrote it, so it outlives
that worker. Store usage is read from the node manager (``GetStoreStats``), exact at the
time of the call.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from typing import Any

import grpc
import numpy as np

import nbcluster
from nbcluster._runtime.protocol.rpc import pb, pb_grpc
from nbcluster.testing import assert_stays, poll_for, quiet_period

MiB = 2**20


class NodeStore:
    """Raw, authenticated reads of the single node's store."""

    def __init__(self) -> None:
        node = next(n for n in nbcluster.nodes() if n["Alive"])
        address = f"{node['NodeManagerAddress']}:{node['NodeManagerPort']}"
        token = (nbcluster.get_runtime_context().session_dir / "token").read_text().strip()
        self._md = (("authorization", f"Bearer {token}"),)
        self._channel = grpc.insecure_channel(address, options=[("grpc.enable_http_proxy", 0)])
        self._stub = pb_grpc.NodeManagerStub(self._channel)

    def usage(self) -> tuple[int, int]:
        st = self._stub.GetStoreStats(pb.Empty(), metadata=self._md, timeout=10)
        return st.used, st.spilled_bytes

    def has(self, ref: Any) -> bool:
        reply = self._stub.GetObjectInfo(
            pb.ObjectIds(object_ids=[ref.binary()]), metadata=self._md, timeout=10
        )
        return reply.found

    def close(self) -> None:
        self._channel.close()


@nbcluster.remote(max_restarts=0)
class Hoarder:
    """Puts objects and keeps its refs: it owns them."""

    def __init__(self) -> None:
        self.refs: list[Any] = []

    def hoard(self, n: int, mib: int) -> int:
        for i in range(n):
            self.refs.append(nbcluster.put(np.full(mib * MiB // 8, i, dtype=np.int64)))
        return os.getpid()


@nbcluster.remote(max_calls=1)
def big_result(mib: int) -> np.ndarray:
    return np.ones(mib * MiB // 8, dtype=np.int64)


def test_a_killed_workers_objects_are_freed_in_memory_and_spilled(cluster: Any) -> None:
    cluster(num_cpus=2, object_store_memory=100 * MiB)
    store = NodeStore()
    try:
        baseline = store.usage()
        h = Hoarder.remote()
        pid = nbcluster.get(h.hoard.remote(3, 40), timeout=60)  # 120 MiB in 100: one spilled
        used, spilled = poll_for(
            lambda: (u := store.usage())[1] > 0 and u, 30, message="nothing was spilled"
        )
        assert used + spilled >= baseline[0] + 120 * MiB
        os.kill(pid, signal.SIGKILL)
        poll_for(
            lambda: store.usage() == baseline,
            30,
            message=f"the dead worker's objects stayed: {store.usage()} vs {baseline}",
        )
        # the cluster goes on: a new owner can use the room
        again = Hoarder.remote()
        nbcluster.get(again.hoard.remote(2, 40), timeout=60)
        nbcluster.kill(again)
    finally:
        store.close()


def test_a_task_result_outlives_the_worker_that_wrote_it(cluster: Any) -> None:
    cluster(num_cpus=2)
    store = NodeStore()
    try:
        ref = big_result.remote(30)  # in the store; max_calls=1: its worker exits after it
        nbcluster.wait([ref], timeout=60)
        assert store.has(ref)
        assert_stays(lambda: store.has(ref), quiet_period(1.5), "the result went with its writer")
        assert int(nbcluster.get(ref, timeout=30).sum()) == 30 * MiB // 8
    finally:
        store.close()


DRIVER = textwrap.dedent(
    """
    import sys
    import numpy as np
    import nbcluster

    nbcluster.init(address=sys.argv[1])
    refs = [nbcluster.put(np.full(2**20 * 25 // 8, i)) for i in range(2)]
    print("ready", flush=True)
    sys.stdin.readline()
    """
)


def test_a_killed_drivers_objects_are_freed(cluster: Any) -> None:
    info = cluster(num_cpus=2)
    store = NodeStore()
    p = subprocess.Popen(
        [sys.executable, "-c", DRIVER, info.address],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        baseline = store.usage()
        line = p.stdout.readline().strip()  # type: ignore[union-attr]
        assert line == "ready", f"the driver did not start: {line} {p.stderr.read()[-2000:]}"  # type: ignore[union-attr]
        assert store.usage()[0] >= baseline[0] + 50 * MiB
        p.send_signal(signal.SIGKILL)
        p.wait(30)
        poll_for(
            lambda: store.usage() == baseline,
            60,
            message=f"the dead driver's objects stayed: {store.usage()} vs {baseline}",
        )
    finally:
        if p.poll() is None:
            p.kill()
        p.wait(30)
        store.close()
