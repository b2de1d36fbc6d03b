"""Routing decisions, as pure functions: which replica takes a request, which app a path is.

- :func:`choose_replica`: power of two choices on queue length (Ray Serve's default
  router). Among the replicas with room (fewer than ``max_ongoing_requests`` requests
  sent and not answered), two are drawn at random and the one with the shorter queue
  wins. With a multiplexed model id, replicas that already hold the model are
  preferred. ``None`` means every replica is full (or there is none): the request waits
  in the router's queue until an answer frees a slot.
- :func:`match_route`: the application whose ``route_prefix`` is the longest prefix of
  the request path, on path-segment boundaries (``/api`` matches ``/api`` and
  ``/api/x``, not ``/apix``).

Both are used by handles and HTTP proxies alike (one router, DESIGN §9).
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Mapping, Sequence

__all__ = ["ReplicaSlot", "choose_replica", "match_route", "normalize_route_prefix"]


@dataclasses.dataclass
class ReplicaSlot:
    """A router's view of one replica: its id, requests in flight from this router, models."""

    replica_id: str
    inflight: int = 0
    models: frozenset[str] = frozenset()


def choose_replica(
    replicas: Sequence[ReplicaSlot],
    max_ongoing: int,
    *,
    model_id: str = "",
    rng: random.Random | None = None,
) -> ReplicaSlot | None:
    """The replica for the next request, or None when all are full (see module docstring)."""
    rand = rng or random
    free = [r for r in replicas if r.inflight < max_ongoing]
    if not free:
        return None
    if model_id:
        holding = [r for r in free if model_id in r.models]
        if holding:
            free = holding
    if len(free) == 1:
        return free[0]
    a, b = rand.sample(free, 2)
    if a.inflight != b.inflight:
        return a if a.inflight < b.inflight else b
    return a


def normalize_route_prefix(prefix: str | None) -> str | None:
    """``"/api/"`` → ``"/api"``; ``"/"`` stays; None (no HTTP route) stays None."""
    if prefix is None:
        return None
    if not isinstance(prefix, str):
        raise TypeError(f"route_prefix must be a string or None, got {type(prefix).__name__}")
    if not prefix.startswith("/"):
        raise ValueError(f"route_prefix must start with '/', got {prefix!r}")
    if "{" in prefix or "}" in prefix:
        raise ValueError(f"route_prefix may not contain wildcards ('{{' or '}}'), got {prefix!r}")
    if len(prefix) > 1:
        prefix = prefix.rstrip("/") or "/"
    return prefix


def match_route(path: str, routes: Mapping[str, str]) -> tuple[str, str] | None:
    """``(route_prefix, app_name)`` of the longest prefix of ``path``, or None (404)."""
    best: tuple[str, str] | None = None
    for prefix, app in routes.items():
        ok = True if prefix == "/" else path == prefix or path.startswith(prefix + "/")
        if ok and (best is None or len(prefix) > len(best[0])):
            best = (prefix, app)
    return best
