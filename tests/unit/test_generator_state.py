"""GeneratorState: the positions of a generator stream, without processes."""

from __future__ import annotations

import threading

import pytest

from nbcluster._runtime.core.generators import (
    DYNAMIC,
    STREAMING,
    GeneratorState,
    item_id,
    wire_num_returns,
)


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
