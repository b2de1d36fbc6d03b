"""GeneratorState and OwnerGenerator: a generator stream's positions, without processes."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from nbcluster._runtime.core.generators import (
    DYNAMIC,
    STREAMING,
    GeneratorState,
    OwnerGenerator,
    item_id,
    registry,
    wire_num_returns,
)
from nbcluster._runtime.core.ownership import OwnershipTable, Release
from nbcluster._runtime.protocol.protos import generators_pb2 as gpb


def test_items_are_taken_in_order_then_the_stream_stops():
    st = GeneratorState()
    assert not st.ready()
    assert st.take(0) is None  # nothing yet: a zero timeout does not block
    for i in range(3):
        assert st.is_new(i)
        st.on_item(i)
    assert st.ready()
    assert [st.take(0), st.take(0)] == [0, 1]
    assert st.on_finish(errored=False) is None
    assert st.take(0) == 2
    assert st.ready()  # next() would not block: it raises StopIteration
    with pytest.raises(StopIteration):
        st.take(0)
    with pytest.raises(StopIteration):
        st.take(None)


def test_an_error_takes_the_position_after_the_last_item():
    st = GeneratorState()
    st.on_item(0)
    st.on_item(1)
    assert st.on_finish(errored=True) == 2
    assert st.total == 3
    assert [st.take(0), st.take(0), st.take(0)] == [0, 1, 2]
    with pytest.raises(StopIteration):
        st.take(0)
    assert st.on_finish(errored=True) is None  # the end is decided once


def test_an_error_before_any_item_is_position_zero():
    st = GeneratorState()
    assert st.on_finish(errored=True) == 0
    assert st.take(0) == 0
    with pytest.raises(StopIteration):
        st.take(0)


def test_a_retried_attempt_repeats_positions_that_are_ignored():
    st = GeneratorState()
    st.on_item(0)
    st.on_item(1)
    assert not st.is_new(0) and not st.is_new(1)  # the retry reports them again
    st.on_item(0)
    assert st.reported == 2
    assert st.is_new(2)
    st.on_finish(errored=False)
    assert not st.is_new(2)  # ended: nothing more is accepted


def test_backpressure_pauses_while_threshold_items_are_unconsumed():
    st = GeneratorState(threshold=2)
    st.on_item(0)
    assert not st.should_pause(0)  # one unconsumed
    st.on_item(1)
    assert st.should_pause(1)  # two unconsumed: the executor waits
    assert st.take(0) == 0
    assert not st.should_pause(1)  # one was taken: go on
    st.on_item(2)
    assert st.should_pause(2)
    st.close()
    assert not st.should_pause(2)  # nobody will consume: never hold the task


def test_no_backpressure_by_default():
    st = GeneratorState()
    for i in range(100):
        st.on_item(i)
        assert not st.should_pause(i)


def test_close_returns_the_positions_nobody_took():
    st = GeneratorState()
    for i in range(4):
        st.on_item(i)
    st.take(0)
    assert st.close() == [1, 2, 3]
    assert not st.is_new(4)


def test_watchers_fire_once_on_the_next_change():
    st = GeneratorState()
    calls: list[int] = []
    st.add_watcher(lambda: calls.append(1))
    st.on_item(0)
    st.on_item(1)
    assert calls == [1]
    cb = lambda: calls.append(2)  # noqa: E731
    st.add_watcher(cb)
    st.remove_watcher(cb)
    st.take(0)
    assert calls == [1]


def test_take_blocks_until_an_item_arrives_from_another_thread():
    st = GeneratorState()
    t = threading.Timer(0.05, st.on_item, args=(0,))
    t.start()
    assert st.take(30) == 0
    t.join()


def test_wire_encoding_and_item_ids():
    assert wire_num_returns(3) == 3
    assert wire_num_returns("streaming") == STREAMING < 0
    assert wire_num_returns("dynamic") == DYNAMIC < 0
    tid = bytes(range(16))
    assert item_id(tid, 0) == tid + (2).to_bytes(4, "big")  # task_id + 1 is the task's return
    assert len(item_id(tid, 5)) == 20


class _FakeSubmitter:
    def __init__(self) -> None:
        self.ready: list[Any] = []

    def object_ready(self, entry: Any) -> None:
        self.ready.append(entry)


class _FakeClient:
    """What OwnerGenerator uses of a core client: its table, submitter and releases."""

    def __init__(self) -> None:
        self.address = "owner:1"
        self.table = OwnershipTable(self.address)
        self.submitter = _FakeSubmitter()
        self.released: list[Release] = []

    def _queue_release(self, rel: Release) -> None:
        self.released.append(rel)


class _Rec:
    def __init__(self, task_id: bytes) -> None:
        self.task_id = task_id
        self.return_ids = [task_id + (1).to_bytes(4, "big")]


def _item(tid: bytes, index: int, in_store: bool = False) -> gpb.GeneratorItem:
    return gpb.GeneratorItem(
        task_id=tid,
        index=index,
        object_id=item_id(tid, index),
        data=b"" if in_store else b"v%d" % index,
        in_store=in_store,
        size=10,
        node_address="node:1" if in_store else "",
    )


def test_owner_puts_reports_that_overtook_others_back_in_order():
    client = _FakeClient()
    tid = bytes(16)
    gen = OwnerGenerator(client, _Rec(tid), STREAMING, -1)  # type: ignore[arg-type]
    registry(client)[tid] = gen  # type: ignore[arg-type]
    asyncio.run(gen.on_report(_item(tid, 2)))
    asyncio.run(gen.on_report(_item(tid, 1)))
    assert gen.state.reported == 0 and client.table.get(item_id(tid, 1)) is None
    asyncio.run(gen.on_report(_item(tid, 0)))
    assert gen.state.reported == 3
    assert [client.table.get(item_id(tid, i)).data for i in range(3)] == [b"v0", b"v1", b"v2"]
    asyncio.run(gen.on_report(_item(tid, 1)))  # a retried attempt's repeat: ignored
    assert gen.state.reported == 3


def test_owner_places_the_error_after_the_last_item_and_drops_stranded_reports():
    client = _FakeClient()
    tid = bytes(15) + b"\x01"
    rec = _Rec(tid)
    done = client.table.create_owned(rec.return_ids[0])
    gen = OwnerGenerator(client, rec, STREAMING, -1)  # type: ignore[arg-type]
    registry(client)[tid] = gen  # type: ignore[arg-type]
    asyncio.run(gen.on_report(_item(tid, 0)))
    asyncio.run(gen.on_report(_item(tid, 2, in_store=True)))  # item 1 died with the worker
    done.set_ready(exc=RuntimeError("worker died"))
    gen.task_finished()
    assert tid not in registry(client)  # type: ignore[arg-type]
    assert gen.state.total == 2
    err = client.table.get(item_id(tid, 1))
    assert err is not None and isinstance(err.exc, RuntimeError)
    assert [r.free_in_store for r in client.released] == [[("node:1", item_id(tid, 2))]]
    assert [gen.state.take(0), gen.state.take(0)] == [0, 1]


def test_dropping_the_generator_frees_what_was_not_taken():
    client = _FakeClient()
    tid = bytes(15) + b"\x02"
    gen = OwnerGenerator(client, _Rec(tid), STREAMING, -1)  # type: ignore[arg-type]
    registry(client)[tid] = gen  # type: ignore[arg-type]
    for i in range(3):
        asyncio.run(gen.on_report(_item(tid, i, in_store=True)))
    assert gen.state.take(0) == 0
    client.table.add_local_ref(item_id(tid, 0), client.address, False)  # next() made a ref
    gen.close()
    assert client.table.get(item_id(tid, 0)) is not None
    assert client.table.get(item_id(tid, 1)) is None and client.table.get(item_id(tid, 2)) is None
    freed = [f for r in client.released for f in r.free_in_store]
    assert freed == [("node:1", item_id(tid, 1)), ("node:1", item_id(tid, 2))]
