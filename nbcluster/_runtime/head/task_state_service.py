"""``TaskState`` on the head (``task_state.proto``): owners' pending tasks in, live tasks out.

A thin shell around :class:`~nbcluster._runtime.head.live_tasks.LiveTasks` (held by the
head's state); the head registers it on its authenticated server.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import grpc

from nbcluster._runtime.head.live_tasks import LiveTasks
from nbcluster._runtime.protocol.protos import task_state_pb2 as tspb
from nbcluster._runtime.protocol.protos import task_state_pb2_grpc as tspb_grpc
from nbcluster._runtime.protocol.rpc import pb

__all__ = ["TaskStateService"]


class TaskStateService(tspb_grpc.TaskStateServicer):
    """Serves ``TaskState/ReportPendingTasks`` and ``TaskState/GetLiveTasks``."""

    def __init__(self, live: LiveTasks, clock: Callable[[], float] = time.time) -> None:
        self.live = live
        self.clock = clock

    def register(self, server: grpc.aio.Server) -> None:
        """Serve ``TaskState`` on the head's server."""
        tspb_grpc.add_TaskStateServicer_to_server(self, server)

    async def ReportPendingTasks(self, request: tspb.PendingTasks, context: Any) -> pb.Empty:
        self.live.report_pending(
            request.owner_address, request.tasks, request.not_listed, self.clock()
        )
        return pb.Empty()

    async def GetLiveTasks(
        self, request: tspb.LiveTasksRequest, context: Any
    ) -> tspb.LiveTasksReply:
        tasks, not_listed = self.live.live(self.clock(), request.job_id)
        return tspb.LiveTasksReply(tasks=tasks, not_listed=not_listed)
