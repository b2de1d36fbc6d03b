"""A fresh worker fetches a function from the head's table (``Executor.function``).

The fetch goes through the client's retrying head call (``CoreClient.call_head``): a head
restart between the function's export and its first run is ridden out, and a head that
stays away for the grace period is :class:`HeadUnavailableError`, never a raw gRPC error.
The client's real ``run`` / ``call_head`` / ``head`` (``HeadRetry``) run on an I/O loop
thread; only the head's stub is faked (no process, no socket).
"""

from __future__ import annotations

import asyncio
import threading
import types
from collections.abc import Iterator
from typing import Any

import cloudpickle
import grpc
import grpc.aio
import pytest

from nbcluster._runtime.core.client import CoreClient
from nbcluster._runtime.protocol.errors import translated
from nbcluster._runtime.protocol.rpc import pb
from nbcluster._runtime.worker.main import Executor
from nbcluster.exceptions import HeadUnavailableError

GRACE_S = 0.5
FUNCTION_ID = b"f" * 16


def double(x: int) -> int:
    return 2 * x


class RestartingHead:
    """A head stub whose ``GetFunction`` fails UNAVAILABLE ``down_for`` times (the head
    restarting; forever when ``None``) and then answers with ``double``."""

    def __init__(self, down_for: int | None) -> None:
        self.down_for = down_for
        self.calls = 0

    async def GetFunction(self, request: Any, timeout: float) -> Any:  # noqa: N802 - gRPC name
        self.calls += 1
        assert request.function_id == FUNCTION_ID
        if self.down_for is None or self.calls <= self.down_for:
            # what the protocol layer's stub raises for a refused connection (translated)
            raise translated(
                grpc.aio.AioRpcError(
                    grpc.StatusCode.UNAVAILABLE,
                    initial_metadata=grpc.aio.Metadata(),
                    trailing_metadata=grpc.aio.Metadata(),
                    details="Connection refused",
                ),
                "head",
            )
        return types.SimpleNamespace(found=True, payload=cloudpickle.dumps(double))


class WorkerClient:
    """What ``Executor.function`` uses of a worker's ``CoreClient``: its real head-call
    methods on a real I/O loop thread, with the head's channel replaced by ``head``."""

    run = CoreClient.run
    call_head = CoreClient.call_head
    head = CoreClient.head

    def __init__(self, head: RestartingHead) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.config = types.SimpleNamespace(head_grace_period_s=GRACE_S)
        self.closed = False
        self.head_address = "127.0.0.1:1"
        self.channels = types.SimpleNamespace(stub=lambda address, kind: head)
        self._head_retry = None

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)
        self.loop.close()


@pytest.fixture
def worker() -> Iterator[Any]:
    made: list[WorkerClient] = []

    def make(head: RestartingHead) -> Executor:
        client = WorkerClient(head)
        made.append(client)
        return Executor(client)  # type: ignore[arg-type]

    yield make
    for client in made:
        client.stop()


def spec() -> pb.TaskSpec:
    return pb.TaskSpec(task_id=b"t" * 16, function_id=FUNCTION_ID, function_name="double")


def test_a_head_restart_before_the_first_run_is_ridden_out(worker: Any) -> None:
    head = RestartingHead(down_for=3)
    fn = worker(head).function(spec())
    assert fn(21) == 42
    assert head.calls == 4


def test_a_head_that_stays_away_is_head_unavailable_error(worker: Any) -> None:
    head = RestartingHead(down_for=None)
    with pytest.raises(HeadUnavailableError, match="head cannot be reached"):
        worker(head).function(spec())
    assert head.calls > 1  # retried for the grace period before giving up
