"""Utilities built on the core API: actor pools, placement groups, scheduling strategies,
custom serializers, rich ``display()`` from tasks."""

from nbcluster._runtime.worker.display_hook import display
from nbcluster.util.actor_pool import ActorPool
from nbcluster.util.check_serialize import inspect_serializability
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
from nbcluster.util.serialization import deregister_serializer, register_serializer

__all__ = [
    "ActorPool",
    "NodeAffinitySchedulingStrategy",
    "PlacementGroup",
    "PlacementGroupSchedulingStrategy",
    "deregister_serializer",
    "display",
    "get_placement_group",
    "inspect_serializability",
    "placement_group",
    "placement_group_table",
    "register_serializer",
    "remove_placement_group",
]
