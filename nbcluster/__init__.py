"""nbcluster: the Ray programming model as a Jupyter-first cluster.

The public API is exactly the names in ``__all__``; everything under ``nbcluster._runtime``
is internal. Importing this package starts nothing and reads no configuration:
``nbcluster.init()`` (or ``%cluster start``) does that.
"""

from nbcluster import exceptions
from nbcluster._api import (
    ClusterInfo,
    RuntimeContext,
    available_resources,
    cancel,
    cluster_resources,
    get,
    get_gpu_ids,
    get_runtime_context,
    init,
    is_initialized,
    nodes,
    put,
    shutdown,
    wait,
)
from nbcluster._actor import ActorClass, ActorHandle, ActorMethod, get_actor, kill, method
from nbcluster._refs import ObjectRef
from nbcluster._remote import RemoteFunction, remote
from nbcluster.cluster import LocalCluster

__version__ = "0.1.0"

__all__ = [
    "ActorClass",
    "ActorHandle",
    "ActorMethod",
    "ClusterInfo",
    "LocalCluster",
    "ObjectRef",
    "RemoteFunction",
    "RuntimeContext",
    "__version__",
    "available_resources",
    "cancel",
    "cluster_resources",
    "exceptions",
    "get",
    "get_actor",
    "get_gpu_ids",
    "get_runtime_context",
    "init",
    "is_initialized",
    "kill",
    "method",
    "nodes",
    "put",
    "remote",
    "shutdown",
    "wait",
]
