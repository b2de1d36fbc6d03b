"""Generator tasks, executor side: run a generator and store what it yields.

``num_returns=N`` stores the N yielded values as the task's N returns, one at a time
(a different count is an error, as in Ray). ``"streaming"`` and ``"dynamic"`` store each
value as item ``task_id + (i + 2)`` and report it to the owner (``ReportGeneratorItem``).
With backpressure each report waits for its reply before the generator runs further (the
owner replies late while too many items are unconsumed); without, up to REPORT_WINDOW
reports are in flight. All are answered before the task's final reply (so an error takes
the position after the last item). The task's own return is then ``None`` (streaming) or
a :class:`~nbcluster.DynamicObjectRefGenerator` of the items (dynamic).

Sync generators run on the calling thread (the main thread, or an actor's thread);
async generators (async actors) on the actor's event loop.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextvars
import inspect
from typing import TYPE_CHECKING, Any

from nbcluster._runtime.core import generators as core_gen
from nbcluster._runtime.protocol.protos import generators_pb2 as gpb
from nbcluster._runtime.ref_generators import DynamicObjectRefGenerator
from nbcluster._runtime.worker.returns import place, serialize_value

if TYPE_CHECKING:
    from nbcluster._runtime.core.client import CoreClient
    from nbcluster._runtime.protocol.rpc import pb

__all__ = ["REPORT_WINDOW", "is_generator_call", "run_generator", "run_generator_async"]

#: Reports in flight at once when the owner has no backpressure for the stream.
REPORT_WINDOW = 64


def is_generator_call(spec: pb.TaskSpec, result: Any) -> bool:
    """True when the call's result must be run as a generator."""
    return spec.num_returns < 0 or inspect.isgenerator(result) or inspect.isasyncgen(result)


def _store(client: CoreClient, oid: bytes, value: Any, spec: pb.TaskSpec) -> dict[str, Any]:
    """One yielded value, inline or in the local store (owned by the call's caller, like
    any return): its location fields."""
    sv = serialize_value(client, value, f"a value yielded by {spec.function_name}")
    return place(client, oid, sv, spec.owner_address)


def _not_a_generator(spec: pb.TaskSpec, result: Any) -> TypeError:
    mode = "streaming" if spec.num_returns == core_gen.STREAMING else "dynamic"
    return TypeError(
        f'{spec.function_name} was called with num_returns="{mode}" but returned a '
        f"{type(result).__name__}, not a generator; use yield, or an integer num_returns"
    )


def _count_error(spec: pb.TaskSpec, got: int, more: bool) -> ValueError:
    n = spec.num_returns
    said = f"more than {n}" if more else str(got)
    return ValueError(
        f"{spec.function_name} declared num_returns={n} but its generator yielded {said} "
        f'value(s); yield exactly {n}, or use num_returns="streaming" for any number'
    )


class _Stream:
    """Reports of one streaming/dynamic call to its owner."""

    def __init__(self, executor: Any, spec: pb.TaskSpec) -> None:
        self.client: CoreClient = executor.client
        self.spec = spec
        self.ids: list[bytes] = []
        self._stub: Any = None
        self.pipelined = False  # learnt from the first reply
        self.inflight: collections.deque[concurrent.futures.Future[None]] = collections.deque()

    def item(self, value: Any) -> gpb.GeneratorItem:
        spec = self.spec
        index = len(self.ids)
        oid = core_gen.item_id(spec.task_id, index)
        loc = _store(self.client, oid, value, spec)
        self.ids.append(oid)
        return gpb.GeneratorItem(task_id=spec.task_id, attempt=spec.attempt, index=index, **loc)

    async def send(self, item: gpb.GeneratorItem) -> None:
        """Report on the I/O loop; returns when the owner lets the generator go on."""
        if self._stub is None:
            self._stub = core_gen.reporter(self.client, self.spec.owner_address)
        ack = await self._stub.ReportGeneratorItem(item)
        if ack.backpressure <= 0:
            self.pipelined = True  # no backpressure: later reports need not wait

    def report(self, value: Any) -> None:
        """Store and report one value (a thread other than the I/O loop's)."""
        item = self.item(value)
        if not self.pipelined:
            self.client.run(self.send(item))
            return
        fut = contextvars.Context().run(
            asyncio.run_coroutine_threadsafe, self.send(item), self.client.loop
        )
        self.inflight.append(fut)
        if len(self.inflight) >= REPORT_WINDOW:
            self.inflight.popleft().result()
        while self.inflight and self.inflight[0].done():
            self.inflight.popleft().result()  # raises a failed report's error

    def drain(self, quiet: bool = False) -> None:
        """Wait until the owner has every report (before the task's final reply);
        ``quiet``: the call fails anyway, ignore failed reports."""
        while self.inflight:
            fut = self.inflight.popleft()
            if quiet:
                concurrent.futures.wait([fut])
            else:
                fut.result()

    def final(self) -> Any:
        if self.spec.num_returns == core_gen.DYNAMIC:
            return DynamicObjectRefGenerator._from_ids(self.ids, self.spec.owner_address)
        return None


def run_generator(executor: Any, spec: pb.TaskSpec, result: Any, reply: pb.TaskReply) -> None:
    """Run a sync generator call to its end, storing its values in ``reply`` (or
    reporting them); raises what the generator raises."""
    if spec.num_returns >= 0:
        if not inspect.isgenerator(result):
            raise TypeError(f"{spec.function_name} returned an async generator; use an async actor")
        _fixed(executor, spec, result, reply)
        return
    if not inspect.isgenerator(result):
        raise _not_a_generator(spec, result)
    stream = _Stream(executor, spec)
    try:
        for value in result:
            stream.report(value)
    except BaseException:
        stream.drain(quiet=True)  # the items before the error reach the owner first
        raise
    stream.drain()
    executor._store_returns(spec, [stream.final()], reply)


def _fixed(executor: Any, spec: pb.TaskSpec, gen: Any, reply: pb.TaskReply) -> None:
    """Store the values as returns 1..N as they are yielded (the heap holds one)."""
    n = spec.num_returns
    count = 0
    for value in gen:
        _fixed_one(executor, spec, count, value, reply)
        count += 1
    if count != n:
        raise _count_error(spec, count, more=False)


def _fixed_one(executor: Any, spec: pb.TaskSpec, count: int, value: Any, reply: Any) -> None:
    if count == spec.num_returns:
        raise _count_error(spec, count + 1, more=True)
    oid = spec.task_id + (count + 1).to_bytes(4, "big")
    reply.returns.add(**_store(executor.client, oid, value, spec))


async def run_generator_async(
    executor: Any, spec: pb.TaskSpec, result: Any, reply: pb.TaskReply
) -> None:
    """:func:`run_generator` on an async actor's loop (sync or async generators)."""
    if spec.num_returns >= 0:
        if inspect.isgenerator(result):
            await asyncio.to_thread(_fixed, executor, spec, result, reply)
        else:
            await _afixed(executor, spec, result, reply)
        return
    if not (inspect.isgenerator(result) or inspect.isasyncgen(result)):
        raise _not_a_generator(spec, result)
    stream = _Stream(executor, spec)
    try:
        if inspect.isasyncgen(result):
            async for value in result:
                await asyncio.to_thread(stream.report, value)
        else:
            for value in result:
                await asyncio.to_thread(stream.report, value)
    except BaseException:
        await asyncio.to_thread(stream.drain, True)  # earlier items reach the owner first
        raise
    await asyncio.to_thread(stream.drain)
    await asyncio.to_thread(executor._store_returns, spec, [stream.final()], reply)


async def _afixed(executor: Any, spec: pb.TaskSpec, agen: Any, reply: pb.TaskReply) -> None:
    count = 0
    async for value in agen:
        await asyncio.to_thread(_fixed_one, executor, spec, count, value, reply)
        count += 1
    if count != spec.num_returns:
        raise _count_error(spec, count, more=False)
