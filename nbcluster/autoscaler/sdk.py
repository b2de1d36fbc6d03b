"""``nbcluster.autoscaler.sdk.request_resources``: ask the autoscaler for a cluster size, as in Ray.

    from nbcluster.autoscaler.sdk import request_resources
    request_resources(num_cpus=64)                      # room for 64 one-CPU tasks at once
    request_resources(bundles=[{"GPU": 1, "CPU": 4}])   # and a node that holds this shape
    request_resources(num_cpus=0)                       # clear the request

The request is stored at the head (it survives a head restart) and replaces the previous
one. The autoscaler packs its bundles onto the nodes' *total* resources, so running work
counts (asking for 100 CPUs with 45 busy adds nodes until 100 fit, not 145), launches nodes
for the rest right away (bypassing ``upscaling_speed``), and keeps the nodes it needs for
it even when they are idle. It is a hint: ``max_workers`` still applies.
"""

from __future__ import annotations

from nbcluster._runtime import context
from nbcluster._runtime.protocol.errors import Peer, RpcFailure, to_exception
from nbcluster._runtime.protocol.protos import autoscaler_pb2 as apb
from nbcluster._runtime.protocol.protos import autoscaler_pb2_grpc as apb_grpc
from nbcluster._runtime.protocol.rpc import SyncStub, make_sync_channel

__all__ = ["request_resources"]


def _bundles(num_cpus: int | None, bundles: list[dict[str, float]] | None) -> list[apb.Shape]:
    # Ray's checks and messages (python/ray/autoscaler/sdk/sdk.py).
    if num_cpus is not None and (not isinstance(num_cpus, int) or isinstance(num_cpus, bool)):
        raise TypeError("num_cpus should be of type int.")
    if num_cpus is not None and num_cpus < 0:
        raise ValueError(f"num_cpus must be >= 0, got {num_cpus}")
    if bundles is not None:
        if not isinstance(bundles, list):
            raise TypeError("bundles should be of type List")
        for bundle in bundles:
            if not isinstance(bundle, dict):
                raise TypeError("each bundle should be a Dict.")
            for key, value in bundle.items():
                if not isinstance(key, str):
                    raise TypeError("each bundle key should be str.")
                if isinstance(value, bool) or not isinstance(value, int | float):
                    raise TypeError("each bundle value should be a number (int or float).")
                if not value >= 0 or value == float("inf"):
                    raise ValueError(
                        f"bundle amounts must be finite numbers >= 0, got {key!r}: {value}"
                    )
    out: list[apb.Shape] = []
    if num_cpus:
        out.append(apb.Shape(resources={"CPU": 1.0}, count=num_cpus))
    for bundle in bundles or []:
        shape = {k: float(v) for k, v in bundle.items() if v > 0}
        if shape:
            out.append(apb.Shape(resources=shape, count=1))
    return out


def request_resources(
    num_cpus: int | None = None, bundles: list[dict[str, float]] | None = None
) -> None:
    """Command the autoscaler to scale to accommodate the specified requests.

    ``num_cpus``: make room for this many CPUs (as one-CPU bundles). ``bundles``: make
    sure this set of resource shapes can fit. Each call replaces the previous request;
    ``request_resources(num_cpus=0)`` (or ``bundles=[]``) clears it. Needs a connected
    driver (``nbcluster.init()``); without an autoscaler the request is stored and has no
    effect until one starts.
    """
    shapes = _bundles(num_cpus, bundles)
    client = context.require_client()
    address, token = client.head_address, client.token  # type: ignore[attr-defined]
    channel = make_sync_channel(address, token)
    try:
        stub = SyncStub(apb_grpc.AutoscalingStub(channel), token, address)
        try:
            stub.RequestResources(apb.RequestResourcesRequest(bundles=shapes), timeout=10)
        except RpcFailure as err:
            raise to_exception(err, Peer.HEAD, "request_resources") from None
    finally:
        channel.close()
