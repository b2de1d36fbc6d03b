"""What each helper of the core client uses of it, as typing protocols.

The core client (``client.py``) builds its helpers (the task submitter, the pending-task
reporter, the generator bookkeeping, the head retrier, the ``CoreWorker`` service) and
hands each itself. A helper names the client by the protocol here that lists exactly what
it uses, never by ``CoreClient``: the helpers sit below the client, and the client is the
one module that knows them all. ``CoreClient`` satisfies every protocol here
(``tests/unit/test_core_ports.py`` checks it, and that each protocol covers what its
helper reads).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from nbcluster._runtime.config import Config
    from nbcluster._runtime.core.ownership import Entry, OwnershipTable, Release
    from nbcluster._runtime.core.records import TaskRecord
    from nbcluster._runtime.protocol.rpc import AuthedStub, Channels

__all__ = [
    "ActorCalls",
    "ActorSubmitterHost",
    "GeneratorHost",
    "HeadRetryHost",
    "NodeWatchHost",
    "ObjectWaits",
    "PendingHost",
    "RouteHost",
    "ServiceHost",
    "SubmitterHost",
    "TaskQueue",
    "ThreadTasksHost",
]


class ActorCalls(Protocol):
    """The actor-call submitter, as the task submitter and the reporter see it."""

    @property
    def conns(self) -> Mapping[bytes, Any]:
        """Each actor's connection (``.inflight``: task ids sent and not answered)."""
        ...

    def enqueue(self, rec: TaskRecord) -> None:
        """Queue an actor call whose arguments are not all ready."""
        ...

    def ready(self, rec: TaskRecord) -> None:
        """An actor call's arguments are all ready: send it."""
        ...

    def cancel(self, rec: TaskRecord) -> None:
        """Cancel an actor call that is queued or running."""
        ...

    def sent_call(self, task_id: bytes) -> TaskRecord | None:
        """A call sent and not answered (its caller's thread may have sent it)."""
        ...

    def flush_dirty(self) -> None:
        """Write the calls queued so far (the end of the task submitter's inbox drain)."""
        ...

    def loop_reads_for(self, entry: Entry) -> None:
        """The loop is about to wait for ``entry``: it reads the replies that make it."""
        ...

    def loop_reads_soon(self, entries: Any) -> None:
        """Observers that do not read will wait for ``entries``: the loop reads them."""
        ...

    def wait_reading(self, entries: Any, flag: Any, deadline: float | None) -> None:
        """A thread waits for ``entries``: read the reply of the call behind them here."""
        ...


class ObjectWaits(Protocol):
    """The task submitter, as the ``CoreWorker`` service and the generators see it."""

    def object_ready(self, entry: Entry) -> None:
        """An owned object became ready (or failed): wake what waits for it."""
        ...

    def add_async_waiter(self, entry: Entry, fut: asyncio.Future[None]) -> None:
        """Resolve ``fut`` when ``entry`` is ready."""
        ...


class TaskQueue(Protocol):
    """The task submitter, as the pending-task reporter sees it."""

    @property
    def closed(self) -> bool:
        """True once the client is stopping."""
        ...

    @property
    def tasks(self) -> Mapping[bytes, Any]:
        """Every task submitted and not finished, by task id."""
        ...


class HeadRetryHost(Protocol):
    """What the head retrier (``head_retry.py``) uses of the client."""

    @property
    def channels(self) -> Channels: ...
    @property
    def head_address(self) -> str: ...
    @property
    def config(self) -> Config: ...
    @property
    def closed(self) -> bool: ...


class NodeWatchHost(Protocol):
    """What the owner's watch on dead nodes (``node_watch.py``) uses of the client."""

    @property
    def loop(self) -> asyncio.AbstractEventLoop: ...
    @property
    def config(self) -> Config: ...
    def head(self) -> Any: ...


class ServiceHost(Protocol):
    """What the ``CoreWorker`` service (``service.py``) uses of the client."""

    @property
    def table(self) -> OwnershipTable: ...
    @property
    def submitter(self) -> ObjectWaits: ...
    def _queue_release(self, release: Release) -> None: ...


class GeneratorHost(Protocol):
    """What the owner's generator bookkeeping (``generators.py``) uses of the client."""

    @property
    def address(self) -> str: ...
    @property
    def channels(self) -> Channels: ...
    @property
    def loop(self) -> asyncio.AbstractEventLoop: ...
    @property
    def submitter(self) -> ObjectWaits: ...
    @property
    def table(self) -> OwnershipTable: ...
    @property
    def token(self) -> str: ...
    def _queue_release(self, release: Release) -> None: ...


class PendingHost(Protocol):
    """What the pending-task reporter (``pending_tasks.py``) uses of the client."""

    @property
    def actor_submitter(self) -> ActorCalls: ...
    @property
    def address(self) -> str: ...
    @property
    def channels(self) -> Channels: ...
    @property
    def head_address(self) -> str: ...
    @property
    def loop(self) -> asyncio.AbstractEventLoop: ...
    @property
    def submitter(self) -> TaskQueue: ...
    @property
    def token(self) -> str: ...


class SubmitterHost(Protocol):
    """What the task submitter (``submitter.py``) uses of the client."""

    @property
    def actor_submitter(self) -> ActorCalls: ...
    @property
    def address(self) -> str: ...
    @property
    def config(self) -> Config: ...
    @property
    def job_id(self) -> bytes: ...
    @property
    def loop(self) -> asyncio.AbstractEventLoop: ...
    @property
    def node_address(self) -> str: ...
    @property
    def output_handler(self) -> Callable[[Any, str, Any], None]: ...
    @property
    def table(self) -> OwnershipTable: ...
    def node(self, address: str | None = None) -> AuthedStub: ...
    def core(self, address: str) -> AuthedStub: ...
    def forget_placement_group(self, pg_id: bytes) -> None: ...
    async def fetch_status(self, object_id: bytes, entry: Entry) -> None: ...
    def _queue_release(self, release: Release) -> None: ...


class RouteHost(Protocol):
    """What the route lookup (``routes.py``) uses of the client."""

    @property
    def node_address(self) -> str: ...
    async def alive_nodes(self, max_age: float = 1.0) -> list[Any]: ...
    async def placement_group_info(self, pg_id: bytes) -> Any: ...


class ThreadTasksHost(Protocol):
    """What the thread I/O of tasks (``thread_tasks.py``) uses of the client."""

    @property
    def actor_submitter(self) -> ActorCalls: ...
    @property
    def config(self) -> Config: ...
    @property
    def loop(self) -> asyncio.AbstractEventLoop: ...
    def call_soon(self, fn: Callable[..., Any], *args: Any) -> None: ...


class ActorSubmitterHost(Protocol):
    """What the actor-call submitter (``actor_submitter.py``) uses of the client."""

    @property
    def loop(self) -> asyncio.AbstractEventLoop: ...
    @property
    def config(self) -> Any: ...
    @property
    def submitter(self) -> Any: ...
    def call_soon(self, fn: Callable[..., Any], *args: Any) -> None: ...
    def head(self) -> Any: ...
    def core(self, address: str) -> AuthedStub: ...
