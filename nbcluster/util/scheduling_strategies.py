"""Scheduling strategies: where tasks and actors run (Ray's ``ray.util.scheduling_strategies``).

Pass one as ``scheduling_strategy=`` in ``@remote(...)`` or ``.options(...)``; the strings
``"DEFAULT"`` (the local node until it is busy, then the least loaded) and ``"SPREAD"``
(round-robin over the nodes that can fit the request) work too.
"""

from __future__ import annotations

import dataclasses
from typing import Any

__all__ = ["NodeAffinitySchedulingStrategy", "PlacementGroupSchedulingStrategy"]


@dataclasses.dataclass(frozen=True)
class NodeAffinitySchedulingStrategy:
    """Run on the node ``node_id`` (hex, as in ``nodes()`` / ``get_runtime_context()``).

    With ``soft=False`` the work waits for that node and fails with
    ``TaskUnschedulableError`` if it is dead or unknown; with ``soft=True`` it runs
    elsewhere when that node cannot take it.
    """

    node_id: str
    soft: bool = False
    _nbcluster_strategy: str = dataclasses.field(default="NODE_AFFINITY", init=False, repr=False)

    def __post_init__(self) -> None:
        if not isinstance(self.node_id, str) or not self.node_id:
            raise TypeError(f"node_id must be a node id (hex string), got {self.node_id!r}")
        try:
            bytes.fromhex(self.node_id)
        except ValueError:
            raise ValueError(
                f"node_id must be hex, as returned by nodes(); got {self.node_id!r}"
            ) from None
        if not isinstance(self.soft, bool):
            raise TypeError(f"soft must be a bool, got {self.soft!r}")

    def wire(self) -> str:
        """How the strategy travels to the head (for actors)."""
        return f"NODE_AFFINITY:{self.node_id}:{int(self.soft)}"


@dataclasses.dataclass(frozen=True)
class PlacementGroupSchedulingStrategy:
    """Run inside a placement group: on bundle ``placement_group_bundle_index`` (-1: any).

    With ``placement_group_capture_child_tasks=True`` the tasks this task submits run in
    the same group too.
    """

    placement_group: Any
    placement_group_bundle_index: int = -1
    placement_group_capture_child_tasks: bool | None = None
    _nbcluster_strategy: str = dataclasses.field(default="PLACEMENT_GROUP", init=False, repr=False)

    def __post_init__(self) -> None:
        from nbcluster.util.placement_group import PlacementGroup

        if not isinstance(self.placement_group, PlacementGroup):
            raise TypeError(
                "placement_group must be a PlacementGroup from nbcluster.util.placement_group(...), "
                f"got {type(self.placement_group).__name__}"
            )
        n = len(self.placement_group.bundle_specs)
        idx = self.placement_group_bundle_index
        if not isinstance(idx, int) or isinstance(idx, bool) or idx < -1 or idx >= n:
            raise ValueError(
                f"placement_group_bundle_index must be -1 (any bundle) or 0..{n - 1}, got {idx!r}"
            )
