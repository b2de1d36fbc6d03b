"""The head creates an actor on its worker's control channel (``protocol/ctrl.py``), and
over gRPC when that channel fails: real servers on loopback in this process, no cluster."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import grpc

from nbcluster._runtime.head.actor_service import ActorManager
from nbcluster._runtime.head.state import HeadState
from nbcluster._runtime.protocol.ctrl import CtrlServer
from nbcluster._runtime.protocol.rpc import Channels, bind, make_server, pb, pb_grpc

TOKEN = "t" * 64


class FakeWorker(pb_grpc.CoreWorkerServicer):
    """``CreateActor`` as a worker answers it; records who asked how."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, bytes]] = []

    async def create(self, request: pb.TaskSpec, context: Any, how: str) -> pb.TaskReply:
        self.calls.append((how, request.actor_id))
        return pb.TaskReply(task_id=request.task_id)

    async def CreateActor(self, request: pb.TaskSpec, context: Any) -> pb.TaskReply:
        return await self.create(request, context, "grpc")

    async def create_over_ctrl(self, request: pb.TaskSpec, context: Any) -> pb.TaskReply:
        return await self.create(request, context, "ctrl")


async def _create(worker: FakeWorker, ctrl_address: str) -> tuple[pb.TaskReply, Channels]:
    server = make_server(TOKEN)
    pb_grpc.add_CoreWorkerServicer_to_server(worker, server)
    port = bind(server, "127.0.0.1", 0)
    await server.start()
    channels = Channels(TOKEN, 1 << 20)
    manager = ActorManager(HeadState(node_death_timeout_s=30), channels)
    lease = pb.LeaseReply(
        worker_address=f"127.0.0.1:{port}", worker_ctrl_address=ctrl_address, lease_id=b"l"
    )
    spec = pb.TaskSpec(task_id=b"t1", actor_id=b"a1")
    try:
        reply = await manager._create(b"a1", lease, spec)
    finally:
        for channel in list(channels._channels.values()):
            await channel.close()
        await server.stop(None)
    return reply, channels


async def _create_over(
    worker: FakeWorker, handler: Callable[..., Awaitable[pb.TaskReply]]
) -> tuple[pb.TaskReply, Channels]:
    """:func:`_create` with the worker serving ``CreateActor`` on a control channel."""
    ctrl = CtrlServer(TOKEN, {"CreateActor": (handler, pb.TaskSpec)}, max_frame=1 << 20)
    address = await ctrl.start("127.0.0.1")
    try:
        return await _create(worker, address)
    finally:
        await ctrl.close()


def test_the_head_creates_an_actor_over_the_workers_control_channel() -> None:
    worker = FakeWorker()

    reply, channels = asyncio.run(_create_over(worker, worker.create_over_ctrl))
    assert reply.task_id == b"t1"
    assert worker.calls == [("ctrl", b"a1")]
    assert not channels._channels  # no gRPC channel was opened to the worker


def test_a_control_channel_that_fails_falls_back_to_grpc() -> None:
    worker = FakeWorker()

    async def main() -> tuple[pb.TaskReply, Channels]:
        ctrl = CtrlServer(TOKEN, {}, max_frame=1 << 20)
        address = await ctrl.start("127.0.0.1")
        await ctrl.close()  # nobody listens there any more
        return await _create(worker, address)

    reply, _ = asyncio.run(main())
    assert reply.task_id == b"t1"
    assert worker.calls == [("grpc", b"a1")]


def test_a_lease_without_a_control_channel_uses_grpc() -> None:
    worker = FakeWorker()
    reply, _ = asyncio.run(_create(worker, ""))
    assert reply.task_id == b"t1" and worker.calls == [("grpc", b"a1")]


def test_a_reply_lost_on_the_control_channel_is_asked_again_over_grpc() -> None:
    """``UNAVAILABLE`` from the control channel (a lost reply, as the F13 injector makes it)
    is asked again over gRPC; the worker's ``CreateActor`` is idempotent."""
    worker = FakeWorker()

    async def lose_reply(request: pb.TaskSpec, context: Any) -> pb.TaskReply:
        await worker.create(request, context, "ctrl")
        await context.abort(grpc.StatusCode.UNAVAILABLE, "reply dropped")
        raise AssertionError("unreachable")

    reply, _ = asyncio.run(_create_over(worker, lose_reply))
    assert reply.task_id == b"t1"
    assert worker.calls == [("ctrl", b"a1"), ("grpc", b"a1")]
