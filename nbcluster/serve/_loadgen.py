"""A small HTTP/1.1 load generator (raw asyncio sockets, keep-alive), for tests and benchmarks.

``run_load(url, total, concurrency)`` sends ``total`` requests over ``concurrency``
persistent connections and counts every answer by status; a connection that fails is
reopened and its request counted as an error. ``processes > 1`` splits the load over
that many client processes (one event loop each), so the client is not the bottleneck.
Nothing here is part of the public API.
"""

from __future__ import annotations

import asyncio
import dataclasses
import multiprocessing
import time
from typing import Any
from urllib.parse import urlsplit

__all__ = ["LoadResult", "run_load"]


@dataclasses.dataclass
class LoadResult:
    """What a load run saw: answers by status, errors, latencies (seconds), wall time."""

    statuses: dict[int, int] = dataclasses.field(default_factory=dict)
    errors: int = 0
    latencies: list[float] = dataclasses.field(default_factory=list)
    elapsed_s: float = 0.0

    @property
    def answered(self) -> int:
        """Requests that got an HTTP answer."""
        return sum(self.statuses.values())

    @property
    def requests_per_s(self) -> float:
        """Answers per second of wall time."""
        return self.answered / self.elapsed_s if self.elapsed_s else 0.0

    def percentile_ms(self, q: float) -> float:
        """The ``q`` quantile of the latencies, in milliseconds."""
        if not self.latencies:
            return float("nan")
        lat = sorted(self.latencies)
        return lat[min(len(lat) - 1, int(q * (len(lat) - 1) + 0.5))] * 1e3

    def merge(self, other: LoadResult) -> None:
        """Add another process's result (wall time: the longest)."""
        for k, v in other.statuses.items():
            self.statuses[k] = self.statuses.get(k, 0) + v
        self.errors += other.errors
        self.latencies.extend(other.latencies)
        self.elapsed_s = max(self.elapsed_s, other.elapsed_s)


async def _read_answer(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    status = int(lines[0].split(b" ", 2)[1])
    length = -1
    chunked = False
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        name = name.strip().lower()
        if name == b"content-length":
            length = int(value)
        elif name == b"transfer-encoding" and b"chunked" in value.lower():
            chunked = True
    if chunked:
        body = b""
        while True:
            size = int((await reader.readuntil(b"\r\n")).strip(), 16)
            chunk = await reader.readexactly(size + 2)
            if size == 0:
                break
            body += chunk[:-2]
        return status, body
    return status, await reader.readexactly(length) if length > 0 else b""


async def _client(
    host: str, port: int, request: bytes, counter: list[int], result: LoadResult, deadline: float
) -> None:
    reader = writer = None
    while counter[0] > 0 and time.monotonic() < deadline:
        counter[0] -= 1
        start = time.perf_counter()
        try:
            if writer is None:
                reader, writer = await asyncio.open_connection(host, port)
            assert reader is not None
            writer.write(request)
            status, _ = await _read_answer(reader)
        except (OSError, asyncio.IncompleteReadError, ValueError):
            result.errors += 1
            if writer is not None:
                writer.close()
            reader = writer = None
            continue
        result.latencies.append(time.perf_counter() - start)
        result.statuses[status] = result.statuses.get(status, 0) + 1
    if writer is not None:
        writer.close()


async def _run(url: str, total: int, concurrency: int, timeout_s: float, body: bytes) -> LoadResult:
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    method = b"POST" if body else b"GET"
    request = (
        method
        + b" "
        + path.encode()
        + b" HTTP/1.1\r\nHost: "
        + host.encode()
        + b"\r\n"
        + (b"Content-Length: " + str(len(body)).encode() + b"\r\n" if body else b"")
        + b"\r\n"
        + body
    )
    result = LoadResult()
    counter = [total]
    start = time.perf_counter()
    deadline = time.monotonic() + timeout_s
    await asyncio.gather(
        *(_client(host, port, request, counter, result, deadline) for _ in range(concurrency))
    )
    result.elapsed_s = time.perf_counter() - start
    return result


def _worker(args: tuple[Any, ...]) -> LoadResult:
    return asyncio.run(_run(*args))


def run_load(
    url: str,
    total: int,
    concurrency: int = 1,
    *,
    processes: int = 1,
    timeout_s: float = 120.0,
    body: bytes = b"",
) -> LoadResult:
    """Send ``total`` requests to ``url`` from ``concurrency`` keep-alive connections.

    With ``processes > 1`` the client processes are *spawned*: they import the calling
    script again, so a script that calls this needs an ``if __name__ == "__main__":`` guard.
    """
    if processes <= 1:
        return asyncio.run(_run(url, total, concurrency, timeout_s, body))
    per = [total // processes + (1 if i < total % processes else 0) for i in range(processes)]
    conc = [max(1, concurrency // processes)] * processes
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(processes) as pool:
        parts = pool.map(
            _worker, [(url, n, c, timeout_s, body) for n, c in zip(per, conc, strict=True)]
        )
    out = LoadResult()
    for p in parts:
        out.merge(p)
    return out
