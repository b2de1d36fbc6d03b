"""The node-provider interface: create, terminate, list and tag worker nodes.

A provider turns the autoscaler's decisions into machines: processes on this host
(``local``), machines reached over SSH (``hosts``) or pods (``kubernetes``). It knows
nothing about demand or policy. Every node it creates runs a node manager that joins the
head with ``--node-name <instance id>``, which is how the autoscaler matches the cluster's
nodes to the provider's instances. Tags are small string key/values stored with the
instance (a state file, pod labels); the autoscaler writes the node type and launch time
there so that a restarted monitor can adopt the nodes it launched before.

Methods are blocking; the monitor calls them from worker threads, never on its loop.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = [
    "NodeProvider",
    "ProviderError",
    "TAG_CLUSTER",
    "TAG_LAUNCH_TIME",
    "TAG_NODE_KIND",
    "TAG_NODE_TYPE",
    "matches",
]

#: The cluster a node belongs to (``cluster_name``).
TAG_CLUSTER = "nbcluster-cluster"
#: The node type from the config that the node was launched as.
TAG_NODE_TYPE = "nbcluster-node-type"
#: ``worker`` for nodes the autoscaler launched.
TAG_NODE_KIND = "nbcluster-node-kind"
#: Seconds since the epoch when the node was launched.
TAG_LAUNCH_TIME = "nbcluster-launch-time"


class ProviderError(RuntimeError):
    """A provider could not do what it was asked; the message says what went wrong."""


def matches(tags: Mapping[str, str], tag_filters: Mapping[str, str]) -> bool:
    """True when every filter key is in ``tags`` with the same value."""
    return all(tags.get(k) == v for k, v in tag_filters.items())


class NodeProvider(abc.ABC):
    """Where worker nodes come from (see the module docstring)."""

    #: The provider's name in the config (``provider.type``).
    provider_type: str = ""

    def __init__(self, provider_config: Mapping[str, Any], cluster_name: str) -> None:
        self.provider_config = dict(provider_config)
        self.cluster_name = cluster_name

    @abc.abstractmethod
    def create_node(
        self, node_config: Mapping[str, Any], tags: Mapping[str, str], count: int
    ) -> list[str]:
        """Start ``count`` nodes; return their instance ids (fewer when some failed).

        ``node_config`` is the node type's settings: its ``resources`` and the type's
        ``node_config`` (provider-specific, e.g. a pod template). Raises
        :class:`ProviderError` when none could be started.
        """

    @abc.abstractmethod
    def terminate_node(self, instance_id: str) -> None:
        """Stop a node (idempotent: a node already gone is not an error)."""

    @abc.abstractmethod
    def non_terminated_nodes(self, tag_filters: Mapping[str, str]) -> list[str]:
        """Instance ids of this cluster's nodes that are starting or running and whose tags
        match ``tag_filters``."""

    @abc.abstractmethod
    def node_tags(self, instance_id: str) -> dict[str, str]:
        """The tags of one node."""

    @abc.abstractmethod
    def set_node_tags(self, instance_id: str, tags: Mapping[str, str]) -> None:
        """Add or overwrite tags of one node."""

    def terminate_nodes(self, instance_ids: Sequence[str]) -> None:
        """Stop several nodes (one by one unless a provider can do better)."""
        for iid in instance_ids:
            self.terminate_node(iid)

    def describe(self, instance_id: str) -> str:
        """A line about a node for error messages (e.g. where its log is)."""
        return instance_id
