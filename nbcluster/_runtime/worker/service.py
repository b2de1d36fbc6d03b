"""The worker's ``CoreWorker`` service: owners' task streams (gRPC ``PushTasks`` and task
channels), cancels, actor creation and exit.

Runs on the worker's I/O loop; the calls themselves run on the main thread (the executor in
``main.py``), or on their actor's threads and loops (``actor_runner.py``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import os
import queue
import threading
from typing import Any, Protocol

import grpc

from nbcluster._runtime.core.channel import ChannelServer
from nbcluster._runtime.core.client import CoreClient
from nbcluster._runtime.core.service import CoreWorkerService
from nbcluster._runtime.protocol import faults, tls
from nbcluster._runtime.protocol.ctrl import CtrlServer, token_fits
from nbcluster._runtime.protocol.errors import RpcFailure
from nbcluster._runtime.protocol.rpc import pb
from nbcluster._runtime.worker.owner_stream import OwnerStream

__all__ = ["StreamFault", "TaskExecutor", "WorkerService"]

log = logging.getLogger("nbcluster.worker")


class TaskExecutor(Protocol):
    """What the service needs of the executor (``main.Executor``)."""

    queue: queue.SimpleQueue[Any]
    actor_id: bytes
    exit_after_reply: threading.Event

    def enqueue(self, spec: pb.TaskSpec, stream: OwnerStream) -> None: ...
    def put(self, item: Any) -> None: ...
    def drop_stream(self, stream: OwnerStream) -> None: ...
    def owns_work(self, stream: OwnerStream) -> bool: ...
    def cancel(self, task_id: bytes) -> None: ...
    def adopt_channel(self, writer: Any, lease_hex: str = "") -> bool: ...


class StreamFault(ConnectionError):
    """Testing (F13): the fault injector broke an owner's stream (gRPC answers UNAVAILABLE;
    a task channel is closed)."""


class WorkerService(CoreWorkerService):
    """CoreWorker service of a worker: receives tasks and cancellations."""

    def __init__(self, client: CoreClient, executor: TaskExecutor) -> None:
        super().__init__(client)
        self.executor = executor
        self.creating: dict[bytes, concurrent.futures.Future[pb.TaskReply]] = {}
        self.channels: ChannelServer | None = None
        self.ctrl: CtrlServer | None = None

    async def start_channels(self) -> None:
        """Serve task channels (core/channel.py) beside gRPC, on the same host."""
        settings = tls.current()
        self.channels = ChannelServer(
            self.client.token,
            self.serve_stream,
            max_frame=self.client.config.rpc_max_message_bytes,
            ssl_context=tls.ssl_context(settings, server=True) if settings else None,
            adopt=self.executor.adopt_channel,
            local=self.client.config.task_channel_local,
        )
        await self.channels.start(self.client.host)
        # The head creates an actor here over a control channel (protocol/ctrl.py), so it
        # opens no gRPC channel to each new actor's worker.
        if self.client.config.control_channels and token_fits(self.client.token):
            ssl_context = tls.ssl_context(settings, server=True) if settings else None
            create: Any = self.CreateActor
            injector = faults.current()  # testing only (F13): None in production
            if injector is not None:
                create = injector.unary("CreateActor", create)
            self.ctrl = CtrlServer(
                self.client.token,
                {"CreateActor": (create, pb.TaskSpec)},
                max_frame=self.client.config.rpc_max_message_bytes,
                ssl_context=ssl_context,
            )
            await self.ctrl.start(self.client.host)

    def channel_address(self) -> str:
        """Where this worker serves task channels ("": it does not)."""
        return self.channels.address if self.channels is not None else ""

    def ctrl_address(self) -> str:
        """Where this worker serves its control channel ("": it does not)."""
        return self.ctrl.address if self.ctrl is not None else ""

    async def TaskChannel(self, request: pb.Empty, context: Any) -> pb.TaskChannelReply:
        return pb.TaskChannelReply(address=self.channel_address())

    async def PushTasks(self, request_iterator: Any, context: Any) -> Any:
        lease_hex = dict(context.invocation_metadata() or ()).get("nbc-lease", "")
        try:
            async for batch in self.serve_stream(request_iterator, lease_hex):
                yield batch
        except StreamFault as fault:  # testing (F13): the injector broke the stream
            await context.abort(grpc.StatusCode.UNAVAILABLE, str(fault))

    async def serve_stream(self, request_iterator: Any, lease_hex: str) -> Any:
        """One owner's stream of task batches (gRPC's PushTasks or a task channel): run
        them, yield batches of replies and output until the owner hangs up."""
        stream = OwnerStream(asyncio.get_running_loop())
        injector = faults.current()  # testing only (F13): None in production

        async def pump_in() -> None:
            try:
                async for batch in request_iterator:
                    tasks = batch.tasks
                    if injector is not None:  # no faults while a retried task is here
                        stream.retried.update(
                            t.task_id for t in tasks if t.attempt and not t.actor_id
                        )
                    if (
                        injector is not None
                        and tasks
                        and not stream.retried
                        and injector.fire("PushTasks", "cut")
                    ):
                        for spec in tasks[: injector.pick(len(tasks))]:
                            self.executor.enqueue(spec, stream)
                        stream.cut = True  # the rest of the batch is lost; the stream breaks
                        return
                    for spec in tasks:
                        self.executor.enqueue(spec, stream)
            finally:
                stream.open = False
                stream.replies.put_nowait(None)

        reader = asyncio.get_running_loop().create_task(pump_in())
        try:
            while True:
                reply = await stream.replies.get()
                if stream.cut:  # testing (F13): the injector cut the stream mid-batch
                    raise StreamFault("injected fault: stream cut")
                if reply is None:
                    if not stream.open and stream.replies.empty():
                        break
                    continue
                replies: list[pb.TaskReply] = []
                logs: list[pb.LogRecord] = []
                item: Any = reply
                while True:
                    if isinstance(item, pb.LogRecord):
                        logs.append(item)
                    elif item is not None:
                        replies.append(item)
                    if stream.replies.empty():
                        break
                    item = stream.replies.get_nowait()
                if stream.cut or (
                    injector is not None
                    and replies
                    and not stream.retried
                    and injector.fire("PushTasks", "drop")
                ):
                    raise StreamFault("injected fault: a batch of replies lost")
                if stream.retried:
                    stream.retried.difference_update(r.task_id for r in replies)
                yield pb.ReplyBatch(replies=replies, logs=logs)
                if any(r.worker_exiting for r in replies):
                    self.executor.exit_after_reply.set()
        finally:
            reader.cancel()
            self.executor.drop_stream(stream)
            if self.executor.owns_work(stream) and not self.executor.actor_id:
                # The owner is gone while its task runs here: share its fate (Ray does the
                # same); the node sees this worker exit, frees the lease and replaces it.
                log.warning("owner disconnected with tasks in flight; exiting")
                asyncio.get_running_loop().call_later(0.05, os._exit, 1)
            elif lease_hex:
                # The owner hung up (done, or dead): make sure the node gets the lease back.
                # Returning a lease twice is harmless; the node ignores unknown lease ids.
                asyncio.get_running_loop().create_task(self.return_lease(bytes.fromhex(lease_hex)))

    async def return_lease(self, lease_id: bytes) -> None:
        """Give a lease back to this worker's node (its owner hung up)."""
        with contextlib.suppress(RpcFailure):
            await self.client.node().ReturnWorkerLease(
                pb.ReturnLeaseRequest(lease_id=lease_id), timeout=10
            )

    async def CancelTask(self, request: pb.CancelTaskRequest, context: Any) -> pb.Empty:
        self.executor.cancel(request.task_id)
        return pb.Empty()

    async def CreateActor(self, request: pb.TaskSpec, context: Any) -> pb.TaskReply:
        # A retried creation (its reply was lost) must not run __init__ twice.
        fut = self.creating.get(request.actor_id)
        if fut is None:
            fut = concurrent.futures.Future()
            self.creating[request.actor_id] = fut
            self.executor.put(("create", request, fut))
        return await asyncio.wrap_future(fut)

    async def Exit(self, request: pb.Empty, context: Any) -> pb.Empty:
        asyncio.get_running_loop().call_later(0.05, os._exit, 0)
        return pb.Empty()
