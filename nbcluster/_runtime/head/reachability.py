"""Can the cluster reach the address a node advertised? The head probes it and says so.

A node manager started on another host with the wrong ``--host`` (say 127.0.0.1) registers
fine, since it connects out to the head, but nobody can connect back to it: leases sent
there fail over and over. So the head calls the node at its advertised address (an
authenticated ``GetNodeStats``, which also proves it is that node) before it takes work.
A node that does not answer is kept out of the cluster view (no leases, no spillback, no
actors) and probed again until it answers. The problem is logged once per node, and the
``NodeHealth`` service lets ``nbcluster start --address`` print it to the user.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

import grpc

from nbcluster._runtime.head.state import HeadState, NodeRecord
from nbcluster._runtime.protocol.errors import RpcFailure
from nbcluster._runtime.protocol.protos import health_pb2 as hpb
from nbcluster._runtime.protocol.protos import health_pb2_grpc as hpb_grpc
from nbcluster._runtime.protocol.rpc import (
    AuthedStub,
    SyncStub,
    is_loopback,
    make_channel,
    make_sync_channel,
    pb,
    pb_grpc,
)

log = logging.getLogger(__name__)

__all__ = ["NodeReachability", "ask", "unreachable_message"]


def unreachable_message(node: NodeRecord, head_address: str, detail: str) -> str:
    """What to tell the user about a node the head cannot reach."""
    host = node.address.rpartition(":")[0].strip("[]")
    hint = (
        "it listens on a loopback address, which other hosts cannot reach"
        if is_loopback(host)
        else "check that this address belongs to the node's host and that no firewall is in the way"
    )
    return (
        f"node {node.node_name or node.node_id.hex()[:8]} advertised {node.address}, but the "
        f"head at {head_address} cannot reach it ({detail}); {hint}. It gets no work until it "
        "is reachable. Restart it with `nbcluster start --address "
        f"{head_address} --host <an address of its host that the head can reach>` "
        "(without --host, the address on the route to the head is used)."
    )


class NodeReachability(hpb_grpc.NodeHealthServicer):
    """Probes nodes' advertised addresses and serves the result (``NodeHealth``)."""

    def __init__(self, state: HeadState, token: str, probe_timeout_s: float = 2.0) -> None:
        self.state = state
        self.token = token
        self.probe_timeout_s = probe_timeout_s
        self.head_address = ""  # set once the head is bound

    def needs_probe(self, node: NodeRecord) -> bool:
        """A loopback node of a loopback head is on the head's host: nothing to prove."""
        head_host = self.head_address.rpartition(":")[0].strip("[]")
        node_host = node.address.rpartition(":")[0].strip("[]")
        return not (is_loopback(node_host) and (not head_host or is_loopback(head_host)))

    async def probe(self, node: NodeRecord) -> str:
        """Call the node at its advertised address: "" when it answers as itself, else why not."""
        channel = make_channel(node.address, self.token)
        try:
            stub = AuthedStub(pb_grpc.NodeManagerStub(channel), self.token)
            reply = await stub.GetNodeStats(pb.Empty(), timeout=self.probe_timeout_s)
        except RpcFailure as err:
            return f"{err.code().name}: {err.details() or 'no answer'}"
        finally:
            with contextlib.suppress(Exception):
                await channel.close(grace=None)
        if reply.node.node_id != node.node_id:
            return "another process answers at that address"
        return ""

    async def check(self, node: NodeRecord) -> bool:
        """Probe ``node`` (when needed) and record the result; True when it is reachable."""
        if not self.needs_probe(node):
            return True
        detail = await self.probe(node)
        if not detail:
            if self.state.set_reachable(node.node_id, True):
                log.warning("node %s at %s is reachable now", node.node_id.hex()[:8], node.address)
            return True
        message = unreachable_message(node, self.head_address, detail)
        if self.state.set_reachable(node.node_id, False, message):
            log.warning("%s", message)  # once per node, not per probe
        return False

    async def run(self, interval_s: float = 2.0) -> None:
        """Probe the unreachable live nodes again, every ``interval_s`` seconds."""
        while True:
            await asyncio.sleep(interval_s)
            waiting = [n for n in self.state.nodes.values() if n.alive and not n.reachable]
            for node in waiting:
                await self.check(node)

    async def GetReachability(
        self, request: hpb.ReachabilityRequest, context: grpc.aio.ServicerContext
    ) -> hpb.ReachabilityReply:
        node = self.state.nodes.get(request.node_id)
        if node is None:
            return hpb.ReachabilityReply(known=False)
        return hpb.ReachabilityReply(
            known=True,
            reachable=node.reachable,
            address=node.address,
            message="" if node.reachable else node.unreachable_reason,
        )


def ask(head_address: str, token: str, node_id: bytes, timeout: float = 10.0) -> str:
    """What the head says about ``node_id``: "" when it reaches it, else the message.

    For tools (``nbcluster start --address``); an unanswered question counts as no news.
    """
    channel = make_sync_channel(head_address, token)
    try:
        stub = SyncStub(hpb_grpc.NodeHealthStub(channel), token, head_address)
        reply = stub.GetReachability(hpb.ReachabilityRequest(node_id=node_id), timeout=timeout)
    except RpcFailure as err:
        log.info("could not ask the head about node reachability: %s", err)
        return ""
    finally:
        channel.close()
    return "" if not reply.known or reply.reachable else reply.message
