"""An owner's watch on the head's node table: its work out in the cluster dies with a node.

While this process has leases or tasks out (and for a while after a ``get`` that cannot
reach an owned object's node), it asks the head for the node table every second or so and
reports each newly dead node once (``on_death``). With nothing out it stops asking: an idle
driver costs the head nothing. A new lease, or such a ``get``, starts it again, and it then
sees the deaths it missed.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from nbcluster._runtime.core.ports import NodeWatchHost

from nbcluster._runtime.protocol.errors import RpcFailure
from nbcluster._runtime.protocol.rpc import pb

__all__ = ["NodeWatch"]


class NodeWatch:
    """Polls the head for dead nodes while ``has_work_out()`` (see the module docstring)."""

    def __init__(
        self,
        client: NodeWatchHost,
        has_work_out: Callable[[], bool],
        closed: Callable[[], bool],
        on_death: Callable[[bytes, str, str], None],
    ) -> None:
        self.client = client
        self._has_work_out = has_work_out
        self._closed = closed
        self._on_death = on_death
        self.running = False
        self.hold = 0.0  # keep watching until this time (monotonic) at least
        self.dead: set[bytes] = set()  #: nodes reported dead so far

    def ensure(self, hold_s: float = 0.0) -> None:
        """Watch while work is out, and for at least ``hold_s`` seconds (loop thread)."""
        self.hold = max(self.hold, time.monotonic() + hold_s)
        if not self.running and not self._closed():
            self.running = True
            self.client.loop.create_task(self._run())

    async def _run(self) -> None:
        client = self.client
        interval = max(0.2, min(1.0, client.config.heartbeat_interval_s * 2))
        try:
            while not self._closed():
                await asyncio.sleep(interval)
                if not self._has_work_out() and time.monotonic() > self.hold:
                    break
                try:
                    reply = await client.head().GetNodes(
                        pb.GetNodesRequest(include_dead=True), timeout=10
                    )
                except RpcFailure:
                    continue
                for n in reply.nodes:
                    if not n.alive and n.node_id not in self.dead:
                        self.dead.add(n.node_id)
                        self._on_death(
                            n.node_id, n.address, n.death_reason or "it stopped responding"
                        )
        finally:
            self.running = False
