"""The head's event publisher without gRPC: bounded buffers, fan-out, snapshots, "dropped N"."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import pytest

from nbcluster._runtime.head.events import (
    EventPublisher,
    Snapshot,
    SubscriberBuffer,
    node_key,
)
from nbcluster._runtime.head.service import _job_info, node_info
from nbcluster._runtime.head.state import JobRecord, NodeRecord
from nbcluster._runtime.protocol.protos import events_pb2 as epb
from nbcluster._runtime.protocol.rpc import pb

# --------------------------------------------------------------------------- the buffer


def test_buffer_keeps_order_and_takes_in_batches() -> None:
    buf = SubscriberBuffer(10)
    for i in range(5):
        buf.push(i)
    assert buf.take(3) == (0, [0, 1, 2])
    assert buf.take(3) == (0, [3, 4])
    assert buf.take(3) == (0, [])


def test_buffer_drops_the_oldest_and_reports_it_once() -> None:
    buf = SubscriberBuffer(4)
    for i in range(10):
        buf.push(i)
    assert len(buf) == 4
    assert buf.take() == (6, [6, 7, 8, 9])
    assert buf.take() == (0, [])
    buf.push(10)
    assert buf.take() == (0, [10])
    assert buf.total_dropped == 6


def test_buffer_needs_room() -> None:
    with pytest.raises(ValueError, match="capacity must be at least 1"):
        SubscriberBuffer(0)


# --------------------------------------------------------------------------- the publisher


def make_node(name: str = "n1", **kw: Any) -> NodeRecord:
    fields: dict[str, Any] = {
        "node_id": name.encode().ljust(16, b"\0"),
        "node_name": name,
        "address": "127.0.0.1:7000",
        "hostname": "host",
        "store_dir": "/dev/shm/x",
        "total": {"CPU": 2.0},
        "available": {"CPU": 2.0},
        "store_capacity": 1000,
        "pid": 1,
        "start_time": 0.0,
        "last_heartbeat": 0.0,
    }
    fields.update(kw)
    return NodeRecord(**fields)


class FakeContext:
    """What ``Subscribe`` needs of a ``ServicerContext``: ``abort``."""

    async def abort(self, code: grpc.StatusCode, details: str) -> None:
        raise AssertionError(f"{code.name}: {details}")


def publisher(nodes: list[NodeRecord] | None = None) -> EventPublisher:
    job = JobRecord(b"j" * 4, "127.0.0.1:1", 7, "", "nb", 1.0)
    snap = Snapshot(
        nodes=[node_info(n) for n in nodes or []],
        actors=[pb.ActorInfo(actor_id=b"a" * 16, class_name="Counter", state=1)],
        jobs=[_job_info(job)],
    )
    return EventPublisher(lambda: snap, node_info, _job_info, clock=lambda: 100.0)


def subscribe(pub: EventPublisher, **req: Any) -> Any:
    return pub.Subscribe(epb.SubscribeRequest(**req), FakeContext())


def task(i: int, job: bytes = b"j" * 4) -> pb.TaskEvent:
    return pb.TaskEvent(task_id=i.to_bytes(16, "big"), job_id=job, name=f"t{i}", state="FINISHED")


def kinds(batch: epb.EventBatch) -> list[str]:
    return [e.WhichOneof("body") for e in batch.events]


async def next_batch(stream: Any) -> epb.EventBatch:
    return await asyncio.wait_for(stream.__anext__(), timeout=5)


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def test_snapshot_then_changes_in_order() -> None:
    async def main() -> None:
        node = make_node()
        pub = publisher([node])
        stream = subscribe(pub, snapshot=True)
        snap = await next_batch(stream)
        assert snap.snapshot and snap.head_id == pub.head_id
        assert kinds(snap) == ["node", "object", "actor", "job"]
        assert pub.subscribers == 1
        pub.tasks([task(1), task(2)])
        before = node_key(node)
        node.available = {"CPU": 1.0}
        node.leased_workers = 1
        pub.node_heartbeat(before, node)
        batch = await next_batch(stream)
        assert kinds(batch) == ["task", "task", "node"]
        seqs = [e.seq for e in batch.events]
        assert seqs == sorted(seqs) and len(set(seqs)) == 3
        assert batch.events[2].node.node.available["CPU"] == 1.0
        await stream.aclose()
        assert pub.subscribers == 0

    run(main())


def test_an_unchanged_heartbeat_publishes_nothing() -> None:
    async def main() -> None:
        node = make_node()
        pub = publisher([node])
        stream = subscribe(pub)
        pending = asyncio.ensure_future(stream.__anext__())
        await asyncio.sleep(0)
        seq = pub.seq
        pub.node_heartbeat(node_key(node), node)  # the same values again
        await asyncio.sleep(0.05)
        assert not pending.done() and pub.seq == seq
        before = node_key(node)
        node.store_used = 500  # the store changed: a node event and an object event
        pub.node_heartbeat(before, node)
        batch = await asyncio.wait_for(pending, 5)
        assert kinds(batch) == ["node", "object"]
        assert batch.events[1].object.used == 500
        await stream.aclose()

    run(main())


def test_kinds_and_job_filter() -> None:
    async def main() -> None:
        pub = publisher()
        stream = subscribe(pub, kinds=["task"], job_id=b"mine")
        first = asyncio.ensure_future(stream.__anext__())
        await asyncio.sleep(0)
        pub.job_changed(JobRecord(b"x", "a:1", 1, "", "", 0.0))
        pub.tasks([task(1, b"other"), task(2, b"mine")])
        batch = await asyncio.wait_for(first, 5)
        assert kinds(batch) == ["task"]
        assert batch.events[0].task.name == "t2"
        await stream.aclose()

    run(main())


def test_a_slow_subscriber_gets_a_dropped_marker() -> None:
    async def main() -> None:
        pub = publisher()
        slow = subscribe(pub, buffer=10)
        fast = subscribe(pub, buffer=1000)
        f1 = asyncio.ensure_future(fast.__anext__())
        s1 = asyncio.ensure_future(slow.__anext__())
        await asyncio.sleep(0)
        pub.tasks([task(i) for i in range(100)])
        got = await asyncio.wait_for(f1, 5)
        assert len(got.events) == 100 and kinds(got) == ["task"] * 100
        batch = await asyncio.wait_for(s1, 5)
        # The slow one: 90 dropped, then the newest 10, numbered so the gap is visible.
        assert kinds(batch) == ["dropped"] + ["task"] * 10
        marker, *kept = batch.events
        assert marker.dropped.count == 90
        assert [e.task.name for e in kept] == [f"t{i}" for i in range(90, 100)]
        assert marker.seq == kept[0].seq - 1
        assert kept[0].seq - 90 == got.events[0].seq
        await slow.aclose()
        await fast.aclose()

    run(main())


def test_close_ends_every_stream() -> None:
    async def main() -> None:
        pub = publisher()
        stream = subscribe(pub)
        pending = asyncio.ensure_future(stream.__anext__())
        await asyncio.sleep(0)
        pub.close()
        with pytest.raises(StopAsyncIteration):
            await asyncio.wait_for(pending, 5)
        assert pub.subscribers == 0

    run(main())


@pytest.mark.parametrize(
    ("req", "message"),
    [
        ({"kinds": ["tasks"]}, r"unknown event kinds \['tasks'\]; choose from"),
        ({"buffer": 10**6}, r"buffer must be at most 65536 events"),
    ],
)
def test_bad_requests_are_refused_with_a_message(req: dict[str, Any], message: str) -> None:
    async def main() -> None:
        with pytest.raises(AssertionError, match=rf"INVALID_ARGUMENT: {message}"):
            await next_batch(subscribe(publisher(), **req))

    run(main())


def test_nobody_listening_costs_no_event_objects() -> None:
    pub = publisher()
    made: list[int] = []
    pub._fanout("task", lambda: made.append(1) or epb.Event())  # type: ignore[func-returns-value]
    assert made == [] and pub.seq == 1


def test_autoscaler_news_is_an_event() -> None:
    async def main() -> None:
        pub = publisher()
        stream = subscribe(pub, kinds=["autoscaler"])
        pending = asyncio.ensure_future(stream.__anext__())
        await asyncio.sleep(0)
        pub.tasks([task(1)])
        pub.autoscaler_changed(7)
        batch = await asyncio.wait_for(pending, 5)
        assert kinds(batch) == ["autoscaler"] and batch.events[0].autoscaler.last_seq == 7
        await stream.aclose()

    run(main())
