"""The ``CoreWorker`` service of a driver: answers other processes about its objects."""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING, Any

import grpc

from nbcluster._runtime.core.ownership import READY, Entry
from nbcluster._runtime.protocol.rpc import pb, pb_grpc
from nbcluster._runtime.serialization import serialize

if TYPE_CHECKING:
    from nbcluster._runtime.core.ports import ServiceHost

__all__ = ["CoreWorkerService", "location_reply"]


class CoreWorkerService(pb_grpc.CoreWorkerServicer):
    """Answers other processes about objects this process owns."""

    def __init__(self, client: ServiceHost) -> None:
        self.client = client

    async def GetObjectStatus(
        self, request: pb.ObjectStatusRequest, context: Any
    ) -> pb.ObjectStatusReply:
        client = self.client
        entry = client.table.get(request.object_id)
        if entry is None or not entry.owned:
            return pb.ObjectStatusReply(status=pb.ObjectStatusReply.UNKNOWN)
        if entry.state != READY:
            waiter = asyncio.get_running_loop().create_future()
            client.submitter.add_async_waiter(entry, waiter)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(waiter, timeout=max(0.0, request.timeout) or None)
            if entry.state != READY:
                return pb.ObjectStatusReply(status=pb.ObjectStatusReply.PENDING)
        return location_reply(request.object_id, entry)

    async def UpdateBorrows(self, request: pb.BorrowRequest, context: Any) -> pb.Empty:
        release = self.client.table.update_borrowers(
            request.object_ids, request.borrower_address, request.add
        )
        if release:
            self.client._queue_release(release)
        return pb.Empty()

    async def CancelTask(self, request: pb.CancelTaskRequest, context: Any) -> pb.Empty:
        return pb.Empty()

    async def TaskChannel(self, request: pb.Empty, context: Any) -> pb.TaskChannelReply:
        return pb.TaskChannelReply()  # a driver serves no task channel

    async def PushTasks(self, request_iterator: Any, context: Any) -> Any:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, "a driver does not execute tasks")
        yield pb.ReplyBatch()  # pragma: no cover

    async def Exit(self, request: pb.Empty, context: Any) -> pb.Empty:
        return pb.Empty()

    async def Ping(self, request: pb.Empty, context: Any) -> pb.Empty:
        return pb.Empty()

    async def CreateActor(self, request: pb.TaskSpec, context: Any) -> pb.TaskReply:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, "a driver does not host actors")
        return pb.TaskReply()  # pragma: no cover


def location_reply(object_id: bytes, entry: Entry) -> pb.ObjectStatusReply:
    """Describe a ready object for a borrower."""
    if entry.exc is not None:
        data = serialize(entry.exc).to_bytes()
        return pb.ObjectStatusReply(
            status=pb.ObjectStatusReply.READY,
            is_error=True,
            location=pb.ObjectLocation(object_id=object_id, data=data, size=len(data)),
        )
    return pb.ObjectStatusReply(
        status=pb.ObjectStatusReply.READY,
        is_error=entry.is_error,
        location=pb.ObjectLocation(
            object_id=object_id,
            data=entry.data if not entry.in_store else b"",
            in_store=entry.in_store,
            size=entry.size,
            node_id=entry.node_id,
            node_address=entry.node_address,
            owner_address=entry.owner,
        ),
    )
