"""Utilities built on the core API: actor pools, placement groups, scheduling strategies."""

from nbcluster.util.actor_pool import ActorPool
from nbcluster.util.placement_group import (
    PlacementGroup,
    get_placement_group,
    placement_group,
    placement_group_table,
    remove_placement_group,
)
from nbcluster.util.scheduling_strategies import (
    NodeAffinitySchedulingStrategy,
    PlacementGroupSchedulingStrategy,
)

__all__ = [
    "ActorPool",
    "NodeAffinitySchedulingStrategy",
    "PlacementGroup",
    "PlacementGroupSchedulingStrategy",
    "get_placement_group",
    "placement_group",
    "placement_group_table",
    "remove_placement_group",
]
