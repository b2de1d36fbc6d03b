"""A blocking client of one node manager: runtime_env setup with progress, and leases.

Used by a job's supervisor (and by drivers that show runtime_env setup progress).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping

import grpc

from nbcluster._runtime import exceptions as exc
from nbcluster._runtime.protocol.errors import Peer, RpcFailure, to_exception
from nbcluster._runtime.protocol.protos import jobs_pb2 as jpb
from nbcluster._runtime.protocol.protos import jobs_pb2_grpc as jpb_grpc
from nbcluster._runtime.protocol.rpc import (
    SyncStub,
    make_sync_channel,
    pb,
    pb_grpc,
)

__all__ = ["NodeClient"]


class NodeClient:
    """Typed blocking calls to a node manager."""

    def __init__(self, address: str, token: str) -> None:
        self.address = address
        self._token = token
        self._channels: dict[str, grpc.Channel] = {}

    def _channel(self, address: str) -> grpc.Channel:
        ch = self._channels.get(address)
        if ch is None:
            ch = self._channels[address] = make_sync_channel(address, self._token)
        return ch

    def close(self) -> None:
        """Close the channels."""
        for ch in self._channels.values():
            ch.close()
        self._channels.clear()

    def prepare_runtime_env(
        self, runtime_env: str, progress: Callable[[str, str], None] | None = None
    ) -> str:
        """Set up a resolved environment on the node; return its worker JSON.

        Raises :class:`~nbcluster.exceptions.RuntimeEnvSetupError` when the setup fails.
        """
        address = self.address
        stub = SyncStub(jpb_grpc.NodeAgentStub(self._channel(address)), self._token, address)
        try:
            for msg in stub.PrepareRuntimeEnv(jpb.PrepareEnvRequest(runtime_env=runtime_env)):
                if msg.done:
                    if msg.error:
                        raise exc.RuntimeEnvSetupError(msg.error)
                    return str(msg.worker_env)
                if progress is not None:
                    progress(msg.phase, msg.text)
        except RpcFailure as err:
            raise to_exception(err, Peer.NODE, "PrepareRuntimeEnv") from None
        raise exc.RuntimeEnvSetupError("the node manager ended the setup without an answer")

    def hold_lease(self, resources: Mapping[str, float], owner: str) -> tuple[str, bytes]:
        """Wait for a worker lease with ``resources`` (following spillback); (address, lease id)."""
        address = self.address
        request_id = os.urandom(16)
        spilled = False
        while True:
            stub = SyncStub(pb_grpc.NodeManagerStub(self._channel(address)), self._token, address)
            try:
                reply = stub.RequestWorkerLease(
                    pb.LeaseRequest(
                        resources=dict(resources),
                        owner_address=owner,
                        request_id=request_id,
                        no_spillback=spilled,
                    ),
                )
            except RpcFailure as err:
                raise to_exception(err, Peer.NODE, "RequestWorkerLease") from None
            if reply.status == pb.LeaseReply.GRANTED:
                return address, bytes(reply.lease_id)
            if reply.status == pb.LeaseReply.SPILLBACK and not spilled:
                address, spilled = reply.spill_address, True
                request_id = os.urandom(16)
                continue
            # Infeasible now (or cancelled): a node with the resources may join; ask again.
            address, spilled = self.address, False
            request_id = os.urandom(16)
            time.sleep(1.0)

    def return_lease(self, address: str, lease_id: bytes) -> None:
        """Give a lease back."""
        stub = SyncStub(pb_grpc.NodeManagerStub(self._channel(address)), self._token, address)
        try:
            stub.ReturnWorkerLease(pb.ReturnLeaseRequest(lease_id=lease_id), timeout=10)
        except RpcFailure as err:
            raise to_exception(err, Peer.NODE, "ReturnWorkerLease") from None
