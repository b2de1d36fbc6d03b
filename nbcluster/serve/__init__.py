"""nbcluster.serve: model serving with Ray Serve's names and semantics, on nbcluster actors.

Write ``from nbcluster import serve`` where Ray code has ``from ray import serve``::

    @serve.deployment(num_replicas=2)
    class Model:
        def __call__(self, request):
            return {"ok": True}

    handle = serve.run(Model.bind())           # returns once it serves; prints the URL
    handle.remote(...).result()                 # or: await handle.remote(...)

A detached controller actor reconciles applications with replica actors; an HTTP proxy
per node (uvicorn, 127.0.0.1 by default) and every handle route requests to replicas with
power of two choices. Importing this package starts nothing.
"""

from nbcluster.serve._api import (
    delete,
    get_app_handle,
    get_deployment_handle,
    run,
    shutdown,
    start,
    status,
)
from nbcluster.serve._batching import batch
from nbcluster.serve._context import (
    ReplicaContext,
    get_multiplexed_model_id,
    get_replica_context,
)
from nbcluster.serve._deployment import Application, Deployment, deployment, ingress
from nbcluster.serve._handle import DeploymentHandle, DeploymentResponse
from nbcluster.serve._multiplex import multiplexed
from nbcluster.serve.config import AutoscalingConfig, HTTPOptions, ProxyLocation

__all__ = [
    "Application",
    "AutoscalingConfig",
    "Deployment",
    "DeploymentHandle",
    "DeploymentResponse",
    "HTTPOptions",
    "ProxyLocation",
    "ReplicaContext",
    "batch",
    "delete",
    "deployment",
    "get_app_handle",
    "get_deployment_handle",
    "get_multiplexed_model_id",
    "get_replica_context",
    "ingress",
    "multiplexed",
    "run",
    "shutdown",
    "start",
    "status",
]
