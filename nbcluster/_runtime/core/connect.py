"""Connecting a driver: a core client attached to the cluster's head and to a local node.

``nbcluster.init()`` and the client-mode proxy process both connect this way. The driver
needs a node on its own host (or network namespace) whose store directory it can see, so
it can map that store's objects.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Sequence
from typing import Any

from nbcluster._runtime import proc
from nbcluster._runtime.config import Config
from nbcluster._runtime.core.client import CoreClient
from nbcluster._runtime.protocol.errors import Peer, RpcFailure, to_exception
from nbcluster._runtime.protocol.rpc import RetryingStub, pb

__all__ = ["connect_driver"]


def connect_driver(config: Config, head_address: str, token: str, namespace: str) -> CoreClient:
    """A started core client in driver mode, attached to the head and to a node on this host."""
    job_id = proc.new_id()
    client = CoreClient(
        mode="driver",
        config=config,
        token=token,
        head_address=head_address,
        node_address="",
        job_id=job_id,
        namespace=namespace,
    )
    client.start()
    try:
        client.run(_attach(client), timeout=30)
    except BaseException:
        client.stop()
        raise
    return client


async def _attach(client: CoreClient) -> None:
    head = RetryingStub(
        client.head_once(), budget_s=5.0
    )  # a short grace: a wrong address fails fast
    try:
        info = await head.GetClusterInfo(pb.Empty(), timeout=10)
        me = socket.gethostname()
        local = _local_nodes(info.nodes)
        if not local:
            raise ConnectionError(
                f"the cluster at {client.head_address} has no node on this host ({me}); "
                "joining from another machine (client mode) is not available in this build"
            )
        node = local[0]
        client.node_address = node.address
        client.node_id = node.node_id
        client.store_dir = node.store_dir
        client.session_dir = info.session_dir
        await client.head().RegisterJob(
            pb.RegisterJobRequest(
                job=pb.JobInfo(
                    job_id=client.job_id,
                    driver_address=client.address,
                    driver_pid=os.getpid(),
                    namespace=client.namespace,
                    driver_hostname=me,
                )
            ),
            timeout=10,
        )
    except RpcFailure as err:
        raise to_exception(err, Peer.HEAD, "connect") from None


def _local_ips() -> set[str]:
    import psutil  # only when connecting: ``import nbcluster`` stays light

    ips = {"127.0.0.1", "::1", "localhost"}
    for addrs in psutil.net_if_addrs().values():
        for a in addrs:
            if a.family in (socket.AF_INET, socket.AF_INET6):
                ips.add(a.address.split("%")[0])
    return ips


def _local_nodes(nodes: Sequence[Any]) -> list[Any]:
    """Nodes whose manager listens on an address of this machine (or namespace) and whose
    store directory this process can see, so it can map their objects."""
    forced = os.environ.get("NBCLUSTER_NODE_ADDRESS")
    if forced:
        return [n for n in nodes if n.address == forced]
    ips = _local_ips()
    return [
        n
        for n in nodes
        if n.address.rsplit(":", 1)[0].strip("[]") in ips and os.path.isdir(n.store_dir)
    ]
