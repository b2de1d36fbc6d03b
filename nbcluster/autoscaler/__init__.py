"""The autoscaler: clusters that grow with their demand and shrink when idle.

- :mod:`~nbcluster.autoscaler.sdk`: ``request_resources(num_cpus=, bundles=)`` as in Ray.
- :mod:`~nbcluster.autoscaler.config`: the cluster config file (``nbcluster up config.yaml``).
- :mod:`~nbcluster.autoscaler.policy`: the decisions, a pure function of (cluster state,
  demand, config, time); :mod:`~nbcluster.autoscaler.tracker`: the bookkeeping between them.
- :mod:`~nbcluster.autoscaler.providers`: ``local``, ``hosts`` and ``kubernetes`` node
  providers behind :class:`NodeProvider`.
- :mod:`~nbcluster.autoscaler.monitor`: the process that runs it all beside the head.
- :mod:`~nbcluster.autoscaler.status`: what it is doing, read from the head.

``import nbcluster`` does not import this package.
"""

from nbcluster.autoscaler import sdk
from nbcluster.autoscaler.config import (
    ClusterConfig,
    ConfigError,
    NodeTypeConfig,
    load_config,
    parse_config,
)
from nbcluster.autoscaler.policy import (
    ClusterState,
    Decision,
    Demand,
    NodeStatus,
    PlacementGroupDemand,
    decide,
)
from nbcluster.autoscaler.providers import NodeProvider, ProviderError, get_provider
from nbcluster.autoscaler.sdk import request_resources
from nbcluster.autoscaler.status import (
    AutoscalerStatus,
    NodeTypeStatus,
    ScalingEvent,
    read_status,
)

__all__ = [
    "AutoscalerStatus",
    "ClusterConfig",
    "ClusterState",
    "ConfigError",
    "Decision",
    "Demand",
    "NodeProvider",
    "NodeStatus",
    "NodeTypeConfig",
    "NodeTypeStatus",
    "PlacementGroupDemand",
    "ProviderError",
    "ScalingEvent",
    "decide",
    "get_provider",
    "load_config",
    "parse_config",
    "read_status",
    "request_resources",
    "sdk",
]
