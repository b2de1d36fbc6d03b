"""Concurrency groups of one actor, as a state machine: calls in, calls to start out.

Ray's model: every actor has a default group (limit ``max_concurrency``: 1 for a sync
actor, 1000 for an async one) and the groups its class defines with
``concurrency_groups={"io": 2, ...}``. Each group runs at most ``limit`` calls at once and
starts waiting calls in arrival order; groups do not wait for each other. No I/O here:
:class:`~nbcluster._runtime.worker.actor_runner.ActorCallRunner` runs what this decides.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Mapping

__all__ = ["DEFAULT_GROUP", "GroupQueues", "group_limits"]

#: The name of the default group on the wire (a call with no group runs there).
DEFAULT_GROUP = ""


def group_limits(groups: Mapping[str, int], max_concurrency: int, is_async: bool) -> dict[str, int]:
    """Each group's limit, the default group's included (Ray's defaults: 1000 for an async
    actor, 1 for a sync one, unless ``max_concurrency`` is set)."""
    limits = {DEFAULT_GROUP: max_concurrency or (1000 if is_async else 1)}
    limits.update({name: int(limit) for name, limit in groups.items()})
    return limits


@dataclasses.dataclass
class _Group:
    limit: int
    running: set[bytes] = dataclasses.field(default_factory=set)
    waiting: collections.deque[bytes] = dataclasses.field(default_factory=collections.deque)


class GroupQueues:
    """Which calls of an actor run now, per concurrency group."""

    def __init__(self, limits: Mapping[str, int]) -> None:
        if DEFAULT_GROUP not in limits:
            raise ValueError("limits must include the default group")
        for name, limit in limits.items():
            if limit < 1:
                raise ValueError(f"group {name!r} has limit {limit}; limits must be >= 1")
        self._groups = {name: _Group(limit) for name, limit in limits.items()}
        self._group_of: dict[bytes, str] = {}

    def __contains__(self, group: object) -> bool:
        return group in self._groups

    def submit(self, call_id: bytes, group: str) -> list[bytes]:
        """A call arrived for ``group``; return the calls to start now (it, or none)."""
        if group not in self._groups:
            raise KeyError(group)
        if call_id in self._group_of:
            raise ValueError(f"call {call_id.hex()} was submitted twice")
        g = self._groups[group]
        self._group_of[call_id] = group
        g.waiting.append(call_id)
        return self._fill(g)

    def finished(self, call_id: bytes) -> list[bytes]:
        """A running call ended; return the calls of its group to start now."""
        group = self._group_of.pop(call_id, None)
        if group is None:
            return []
        g = self._groups[group]
        g.running.discard(call_id)
        return self._fill(g)

    def cancel(self, call_id: bytes) -> bool:
        """Drop a call that has not started; False when it runs already (or is unknown)."""
        group = self._group_of.get(call_id)
        if group is None:
            return False
        g = self._groups[group]
        if call_id not in g.waiting:
            return False
        g.waiting.remove(call_id)
        del self._group_of[call_id]
        return True

    def drain(self) -> list[bytes]:
        """Drop and return every call that has not started (the actor is exiting)."""
        out: list[bytes] = []
        for g in self._groups.values():
            out.extend(g.waiting)
            for call_id in g.waiting:
                del self._group_of[call_id]
            g.waiting.clear()
        return out

    def running(self, group: str | None = None) -> int:
        """Calls running now, in ``group`` or in all groups."""
        if group is not None:
            return len(self._groups[group].running)
        return sum(len(g.running) for g in self._groups.values())

    def waiting(self, group: str | None = None) -> int:
        """Calls waiting for a slot, in ``group`` or in all groups."""
        if group is not None:
            return len(self._groups[group].waiting)
        return sum(len(g.waiting) for g in self._groups.values())

    def _fill(self, g: _Group) -> list[bytes]:
        started: list[bytes] = []
        while g.waiting and len(g.running) < g.limit:
            call_id = g.waiting.popleft()
            g.running.add(call_id)
            started.append(call_id)
        return started
