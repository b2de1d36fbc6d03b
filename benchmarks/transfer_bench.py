"""Object transfer between nodes, beside raw loopback TCP bandwidth measured in the same run.

    python benchmarks/transfer_bench.py [--mib 1024]

A 2-node cluster on this host (each node its own store and node manager): an array made
by a task on node B is read by the driver on node A, so node A's manager pulls it from
node B's in chunks over gRPC. The baseline is a plain socket pair on 127.0.0.1 sending the
same number of bytes (the ceiling of any loopback transport in Python).
"""

from __future__ import annotations

import argparse
import socket
import threading
import time

import numpy as np


def tcp_loopback_gbps(nbytes: int, chunk: int = 4 * 2**20) -> float:
    """GB/s of a socket pair on 127.0.0.1 moving ``nbytes`` from one thread to another."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    port = srv.getsockname()[1]
    payload = memoryview(bytearray(chunk))
    received = [0]

    def sink() -> None:
        conn, _ = srv.accept()
        buf = bytearray(chunk)
        while received[0] < nbytes:
            n = conn.recv_into(buf)
            if not n:
                break
            received[0] += n
        conn.close()

    t = threading.Thread(target=sink)
    t.start()
    c = socket.create_connection(("127.0.0.1", port))
    start = time.perf_counter()
    sent = 0
    while sent < nbytes:
        c.sendall(payload[: min(chunk, nbytes - sent)])
        sent += min(chunk, nbytes - sent)
    t.join()
    elapsed = time.perf_counter() - start
    c.close()
    srv.close()
    return nbytes / elapsed / 1e9


def nbcluster_pull_gbps(nbytes: int) -> tuple[float, bool]:
    """GB/s of reading, on node A, an array a task made on node B (and whether it was equal)."""
    import nbcluster
    from nbcluster.util import NodeAffinitySchedulingStrategy

    nbcluster.init(num_cpus=1, _nodes=2, object_store_memory=3 * nbytes)
    try:
        me = nbcluster.get_runtime_context().get_node_id()
        other = next(n["NodeID"] for n in nbcluster.nodes() if n["Alive"] and n["NodeID"] != me)

        @nbcluster.remote
        def make(n: int) -> np.ndarray:
            return np.arange(n // 8, dtype=np.int64)

        ref = make.options(scheduling_strategy=NodeAffinitySchedulingStrategy(other)).remote(nbytes)
        nbcluster.wait([ref])
        start = time.perf_counter()
        arr = nbcluster.get(ref)
        elapsed = time.perf_counter() - start
        ok = bool(arr[-1] == nbytes // 8 - 1 and arr.nbytes == nbytes)
        return nbytes / elapsed / 1e9, ok
    finally:
        nbcluster.shutdown()


def main() -> None:
    """Print both figures and their ratio."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mib", type=int, default=1024, help="object size in MiB (default 1 GiB)")
    args = p.parse_args()
    nbytes = args.mib * 2**20
    tcp = tcp_loopback_gbps(nbytes)
    pull, ok = nbcluster_pull_gbps(nbytes)
    print(f"object of {args.mib} MiB between two nodes on this host")
    print(f"  loopback TCP (socket pair)   {tcp:6.2f} GB/s")
    print(f"  nbcluster node-to-node pull  {pull:6.2f} GB/s   ({pull / tcp:.0%} of TCP){'' if ok else '  WRONG DATA'}")


if __name__ == "__main__":
    main()
