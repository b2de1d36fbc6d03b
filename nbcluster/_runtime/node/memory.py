"""The node's memory monitor: ends the newest retriable task's worker while the machine (or
its cgroup) is short of memory, as Ray's does. Actors and idle workers are never chosen."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from nbcluster._runtime.scheduling.policy import ACTOR_LEASE_OWNER

if TYPE_CHECKING:
    from nbcluster._runtime.node.service import NodeService
    from nbcluster._runtime.node.state import Lease

__all__ = ["memory_fraction", "memory_monitor"]

log = logging.getLogger(__name__)


def memory_fraction() -> float:
    """Fraction of this machine's (or cgroup's) memory in use."""
    try:
        limit = open("/sys/fs/cgroup/memory.max").read().strip()  # noqa: SIM115
        if limit != "max":
            current = int(open("/sys/fs/cgroup/memory.current").read())  # noqa: SIM115
            stat = dict(
                line.split()
                for line in open("/sys/fs/cgroup/memory.stat")  # noqa: SIM115
            )
            reclaimable = int(stat.get("inactive_file", 0))
            return max(0, current - reclaimable) / int(limit)
    except (OSError, ValueError):
        pass
    info: dict[str, int] = {}
    with open("/proc/meminfo") as f:
        for line in f:
            key, _, rest = line.partition(":")
            info[key] = int(rest.split()[0])
    total = info.get("MemTotal", 1)
    return 1.0 - info.get("MemAvailable", total) / total


async def memory_monitor(
    service: NodeService,
    threshold: float,
    interval: float,
    measure: Callable[[], float] = memory_fraction,
) -> None:
    """Kill the newest retriable task's worker while memory use is over ``threshold``.

    Actors and idle workers are never chosen; the driver (a notebook kernel) is not a
    worker of this node, so it is never the one killed.

    It checks every ``interval`` seconds only while there is a task it could choose; with
    none (an idle node, or one running only actors) it sleeps until a lease is granted.
    """

    def retriable() -> list[Lease]:
        return [
            lease
            for lease in service.state.leases.values()
            if not lease.owner.startswith(ACTOR_LEASE_OWNER)
            and lease.worker_id not in service.oom_killed
        ]

    while True:
        if not retriable():
            service.leased.clear()
            await service.leased.wait()
            continue
        await asyncio.sleep(interval)
        used = measure()
        if used < threshold:
            continue
        victims = retriable()
        if not victims or service.workers is None:
            continue
        lease = victims[-1]  # the newest lease
        service.oom_killed.add(lease.worker_id)
        detail = (
            f"killed by the memory monitor: node memory at {used:.0%} "
            f"(threshold {threshold:.0%}); the newest retriable task was chosen"
        )
        service.workers.oom_details[lease.worker_id] = detail
        log.warning("%s (worker %s)", detail, lease.worker_id.hex()[:8])
        service.workers.kill(lease.worker_id, force=True)
