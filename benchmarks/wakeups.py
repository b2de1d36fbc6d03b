"""What waking a thread costs on this machine: the floor under every round trip.

A ping-pong of 200-byte messages between two processes over a Unix socket pair, timed
with the caller waiting for each answer in the ways nbcluster's hot paths can wait:

- ``recv``: a blocking ``recv`` (the kernel wakes the caller when the answer arrives);
- ``poll``: ``poll()`` on the socket, then ``recv`` (how a thread reading its own reply
  waits: ``core/actor_submitter.py``, "Thread reads");
- ``relay``: an asyncio (uvloop when installed) thread reads the answer and releases a
  lock the caller waits on (how a reply reached its caller through the I/O loop);
- ``spin``: ``recv(MSG_DONTWAIT)`` in a loop for up to 0.5 ms before ``poll()`` (the
  short poll before sleeping, ``THREAD_READ_SPIN_S``).

No nbcluster and no baseline system: the figures are the machine's, for reading the
round-trip rows of ``microbench.py`` (benchmarks/RESULTS.md, ninth session).
Run: ``python benchmarks/wakeups.py [--n 20000] [--rounds 2]``.
"""

from __future__ import annotations

import _thread
import argparse
import asyncio
import os
import select
import socket
import threading
import time
from collections.abc import Callable

MSG = b"x" * 200


def _echo(sock: socket.socket) -> None:
    while True:
        data = sock.recv(4096)
        if not data:
            return
        sock.sendall(data)


def wait_recv(a: socket.socket, n: int) -> float:
    t = time.perf_counter()
    for _ in range(n):
        a.send(MSG)
        a.recv(4096)
    return time.perf_counter() - t


def _poller(a: socket.socket) -> select.poll:
    a.setblocking(False)
    poller = select.poll()
    poller.register(a.fileno(), select.POLLIN)
    return poller


def wait_poll(a: socket.socket, n: int) -> float:
    poller = _poller(a)
    t = time.perf_counter()
    for _ in range(n):
        a.send(MSG)
        poller.poll(100)
        a.recv(4096)
    return time.perf_counter() - t


def wait_relay(a: socket.socket, n: int) -> float:
    try:
        import uvloop

        loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
    except ImportError:
        loop = asyncio.new_event_loop()
    current: list[Callable[[], None]] = []

    def on_read() -> None:
        a.recv(4096)
        current[0]()

    a.setblocking(False)
    loop.add_reader(a.fileno(), on_read)
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    t = time.perf_counter()
    for _ in range(n):
        lock = _thread.allocate_lock()
        lock.acquire()
        current[:] = [lock.release]
        a.send(MSG)
        while not lock.acquire(timeout=0.1):
            pass
    elapsed = time.perf_counter() - t
    loop.call_soon_threadsafe(loop.stop)
    thread.join()
    loop.close()
    return elapsed


def wait_spin(a: socket.socket, n: int) -> float:
    poller = _poller(a)
    t = time.perf_counter()
    for _ in range(n):
        a.send(MSG)
        until = time.perf_counter() + 0.0005
        while True:
            try:
                a.recv(4096)
                break
            except BlockingIOError:
                if time.perf_counter() > until:
                    poller.poll(100)
    return time.perf_counter() - t


WAYS = {"recv": wait_recv, "poll": wait_poll, "relay": wait_relay, "spin": wait_spin}


def measure(way: str, n: int) -> float:
    """Microseconds per round trip, the caller waiting ``way``."""
    a, b = socket.socketpair()
    pid = os.fork()
    if pid == 0:  # the echoing peer
        a.close()
        try:
            _echo(b)
        finally:
            os._exit(0)
    b.close()
    try:
        return WAYS[way](a, n) / n * 1e6
    finally:
        a.close()
        os.waitpid(pid, 0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=20_000, help="round trips per measurement")
    parser.add_argument("--rounds", type=int, default=2, help="times each way is measured")
    ns = parser.parse_args()
    results: dict[str, list[float]] = {way: [] for way in WAYS}
    for _ in range(ns.rounds):
        for way in WAYS:  # interleaved: the machine's drift hits every way alike
            results[way].append(measure(way, ns.n))
    for way, us in results.items():
        print(f"{way:6s} " + "  ".join(f"{x:6.1f}" for x in us) + "  µs per round trip")


if __name__ == "__main__":
    main()
