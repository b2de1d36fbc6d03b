"""Request statistics of one deployment, from its replicas' reports (pure, no I/O).

The controller pulls each replica's counters (requests, errors, ongoing) and its latency
samples since the last pull, and feeds them to :class:`DeploymentStats`, which keeps
the last ``window_s`` seconds: requests per second, p50/p99 latency, errors, and the
total ongoing requests that autoscaling averages.
"""

from __future__ import annotations

from collections import deque
from typing import Any

__all__ = ["DeploymentStats", "percentile"]


def percentile(sorted_values: list[float], q: float) -> float:
    """The ``q`` quantile (0..1) of an ascending list, nearest rank."""
    if not sorted_values:
        raise ValueError("percentile of an empty list")
    k = min(len(sorted_values) - 1, max(0, int(round(q * (len(sorted_values) - 1)))))
    return sorted_values[k]


class DeploymentStats:
    """Sliding-window statistics of one deployment."""

    def __init__(self, window_s: float = 10.0, max_samples: int = 20000) -> None:
        self.window_s = window_s
        self._counters: dict[str, tuple[int, int]] = {}  # replica -> (requests, errors)
        self._events: deque[tuple[float, int, int]] = deque()  # (t, new requests, new errors)
        self._latencies: deque[tuple[float, float]] = deque(maxlen=max_samples)
        self.ongoing: dict[str, float] = {}
        self.models: dict[str, list[str]] = {}
        self.total_requests = 0
        self.total_errors = 0
        self._since: float | None = None  # first report

    def report(self, replica_id: str, metrics: dict[str, Any], now: float) -> None:
        """One replica's pull: cumulative counters, ongoing count, fresh latency samples."""
        if self._since is None:
            self._since = now
        requests, errors = int(metrics["requests"]), int(metrics["errors"])
        prev_r, prev_e = self._counters.get(replica_id, (0, 0))
        if requests < prev_r:  # a new replica under an old id cannot happen, but be safe
            prev_r, prev_e = 0, 0
        self._counters[replica_id] = (requests, errors)
        new_r, new_e = requests - prev_r, errors - prev_e
        if new_r or new_e:
            self._events.append((now, new_r, new_e))
            self.total_requests += new_r
            self.total_errors += new_e
        for sample in metrics.get("latencies", ()):
            self._latencies.append((now, float(sample)))
        self.ongoing[replica_id] = float(metrics["ongoing"])
        self.models[replica_id] = list(metrics.get("models", ()))
        self._trim(now)

    def forget(self, replica_id: str) -> None:
        """A replica is gone: its ongoing count no longer counts."""
        self.ongoing.pop(replica_id, None)
        self.models.pop(replica_id, None)
        self._counters.pop(replica_id, None)

    def _trim(self, now: float) -> None:
        while self._events and self._events[0][0] < now - self.window_s:
            self._events.popleft()
        while self._latencies and self._latencies[0][0] < now - self.window_s:
            self._latencies.popleft()

    def total_ongoing(self) -> float:
        """Requests ongoing in all replicas, as last reported."""
        return sum(self.ongoing.values())

    def summary(self, now: float) -> dict[str, Any]:
        """``requests_per_s``, ``p50_ms``, ``p99_ms`` (None without samples), ``errors``."""
        self._trim(now)
        if self._events and self._since is not None:
            span = max(min(self.window_s, now - self._since), 1.0)
            rps = sum(n for _, n, _ in self._events) / span
        else:
            rps = 0.0
        lat = sorted(v for _, v in self._latencies)
        return {
            "requests_per_s": rps,
            "p50_ms": percentile(lat, 0.5) * 1e3 if lat else None,
            "p99_ms": percentile(lat, 0.99) * 1e3 if lat else None,
            "errors": self.total_errors,
            "recent_errors": sum(e for _, _, e in self._events),
        }
