"""Object transfer between nodes, beside raw loopback TCP bandwidth measured in the same run.

    python benchmarks/transfer_bench.py [--mib 1024] [--repeat 3]

A 2-node cluster on this host (each node its own store and node manager): an array made
by a task on node B is read by the driver on node A, so node A's manager pulls it from
node B over the data plane (``nbcluster/_runtime/objects/transfer.py``: ``sendfile`` on
B, ``splice`` from the socket into the destination file on A, two ranges in parallel). Two
baselines, each a socket pair on 127.0.0.1 between two threads, measured in the same run:

- *TCP, 4 MiB buffer*: the same 4 MiB buffer sent again and again into one 4 MiB receive
  buffer. Both stay in the CPU cache, so this is loopback TCP's ceiling, higher than any
  transfer of an object that does not fit in the cache can reach.
- *TCP, memory to memory*: the object's size sent from one touched buffer into another,
  i.e. what moving that many bytes between two processes' memory costs over loopback.

Medians of ``--repeat`` rounds; the rounds interleave the three measurements, so load
from other processes hits them alike.
"""

from __future__ import annotations

import argparse
import socket
import statistics
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


def tcp_memory_gbps(nbytes: int) -> float:
    """GB/s of a socket pair on 127.0.0.1 moving ``nbytes`` from one touched buffer into
    another (one thread sends, one receives)."""
    src = np.ones(nbytes, dtype=np.uint8)
    dst = np.ones(nbytes, dtype=np.uint8)  # touched: no page faults while receiving
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    sender = socket.create_connection(srv.getsockname())
    receiver, _ = srv.accept()
    view = memoryview(dst)

    def sink() -> None:
        got = 0
        while got < nbytes:
            n = receiver.recv_into(view[got:])
            if not n:
                break
            got += n

    t = threading.Thread(target=sink)
    start = time.perf_counter()
    t.start()
    sender.sendall(memoryview(src))
    t.join()
    elapsed = time.perf_counter() - start
    for s in (sender, receiver, srv):
        s.close()
    return nbytes / elapsed / 1e9


class Pull:
    """A 2-node cluster; each :meth:`once` reads on node A a new array made on node B."""

    def __init__(self, nbytes: int) -> None:
        import nbcluster
        from nbcluster.util import NodeAffinitySchedulingStrategy

        self.nb = nbcluster
        self.nbytes = nbytes
        # Room for a few copies in flight (frees reach the nodes a moment after the refs
        # go) and for the reuse pool (up to three quarters of the store).
        nbcluster.init(num_cpus=1, _nodes=2, object_store_memory=6 * nbytes)
        me = nbcluster.get_runtime_context().get_node_id()
        other = next(n["NodeID"] for n in nbcluster.nodes() if n["Alive"] and n["NodeID"] != me)

        def make(n: int) -> np.ndarray:
            return np.arange(n // 8, dtype=np.int64)

        self.make = nbcluster.remote(make).options(
            scheduling_strategy=NodeAffinitySchedulingStrategy(other)
        )

    def once(self) -> tuple[float, bool]:
        """GB/s of one pull, and whether the data arrived intact."""
        ref = self.make.remote(self.nbytes)
        self.nb.wait([ref])
        start = time.perf_counter()
        arr = self.nb.get(ref)
        elapsed = time.perf_counter() - start
        ok = bool(arr.nbytes == self.nbytes and arr[-1] == self.nbytes // 8 - 1)
        del arr, ref
        return self.nbytes / elapsed / 1e9, ok

    def close(self) -> None:
        self.nb.shutdown()


def main() -> None:
    """Print the figures and the ratios (medians of the rounds)."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mib", type=int, default=1024, help="object size in MiB (default 1 GiB)")
    p.add_argument("--repeat", type=int, default=3, help="rounds (default 3)")
    args = p.parse_args()
    nbytes = args.mib * 2**20
    cached, memory, pulls = [], [], []
    ok = True
    pull = Pull(nbytes)
    try:
        for _ in range(args.repeat):
            cached.append(tcp_loopback_gbps(nbytes))
            memory.append(tcp_memory_gbps(nbytes))
            gbps, good = pull.once()
            pulls.append(gbps)
            ok = ok and good
    finally:
        pull.close()
    c, m, n = (statistics.median(x) for x in (cached, memory, pulls))
    print(f"object of {args.mib} MiB between two nodes on this host (median of {args.repeat})")
    print(f"  loopback TCP, 4 MiB buffer (cache)  {c:6.2f} GB/s")
    print(f"  loopback TCP, memory to memory      {m:6.2f} GB/s")
    print(
        f"  nbcluster node-to-node pull         {n:6.2f} GB/s   "
        f"({n / c:.0%} of the first, {n / m:.0%} of the second)" + ("" if ok else "   WRONG DATA")
    )
    print(
        "  rounds: "
        + "; ".join(
            f"{a:.2f} {b:.2f} {x:.2f}" for a, b, x in zip(cached, memory, pulls, strict=True)
        )
    )


if __name__ == "__main__":
    main()
