"""Compiled graphs without processes (issue 20 item 6): the channel protocol of ``_ring``
(slots, sequence numbers, wrap-around, encoding) and the plan of ``_plan`` (which calls
run where, which values need channels, and the checks Ray makes at compile time)."""

from __future__ import annotations

import numpy as np
import pytest

from nbcluster.dag import InputNode, MultiOutputNode
from nbcluster.dag._class_node import ClassMethodNode
from nbcluster.dag.compiled._plan import DRIVER, INPUT_CHANNEL, Arg, build_plan
from nbcluster.dag.compiled._ring import (
    ERROR,
    SLOT_HEADER,
    VALUE,
    ProtocolError,
    RingReader,
    RingWriter,
    decode,
    encode,
    encoded_size,
    ring_size,
)

# ----------------------------------------------------------------------------- the ring


def _ring(nslots: int = 3, capacity: int = 256) -> tuple[RingWriter, RingReader, RingReader]:
    buf = memoryview(bytearray(ring_size(nslots, capacity)))
    return (
        RingWriter(buf, nslots, capacity),
        RingReader(buf, nslots, capacity),
        RingReader(buf, nslots, capacity),
    )


def _read(reader: RingReader) -> tuple[int, object] | None:
    item = reader.poll()
    return None if item is None else (item[0], decode(item[1]))


def test_items_arrive_in_order_for_every_reader() -> None:
    w, r1, r2 = _ring()
    assert r1.poll() is None  # nothing written yet
    assert w.write(VALUE, encode("a")) == 1
    assert w.write(ERROR, encode({"b": 2})) == 2
    assert _read(r1) == (VALUE, "a")
    assert _read(r1) == (ERROR, {"b": 2})
    assert r1.poll() is None
    assert _read(r2) == (VALUE, "a")  # each reader reads every item
    assert r2.seq == 1 and r1.seq == 2


def test_slots_wrap_around() -> None:
    w, r, _ = _ring(nslots=3)
    for i in range(10):
        w.write(VALUE, encode(i))
        assert _read(r) == (VALUE, i)
    assert w.slot_of(10) == 0 and w.slot_of(3) == 2


def test_an_overwritten_slot_is_a_protocol_error_not_a_wrong_value() -> None:
    w, r, _ = _ring(nslots=2)
    for i in range(3):  # item 3 overwrites item 1, which r never read
        w.write(VALUE, encode(i))
    with pytest.raises(ProtocolError, match="waited for item 1, found item 3"):
        r.poll()


def test_an_item_is_invisible_until_its_sequence_number_is_written() -> None:
    w, r, _ = _ring(nslots=2)
    off = 0
    w.write(VALUE, encode("x"))
    seq, kind, size = SLOT_HEADER.unpack_from(w.buf, off)
    assert (seq, kind) == (1, VALUE) and size == encoded_size(encode("x"))
    SLOT_HEADER.pack_into(w.buf, off, 0, kind, size)  # as if the writer were mid-way
    assert r.poll() is None
    SLOT_HEADER.pack_into(w.buf, off, 1, kind, size)
    assert _read(r) == (VALUE, "x")


def test_payload_size_limits() -> None:
    w, _, _ = _ring(nslots=2, capacity=64)
    assert w.fits(64) and not w.fits(65)
    with pytest.raises(ValueError, match="larger than the slot"):
        w.write(VALUE, [b"x" * 65])
    with pytest.raises(ValueError, match="too small"):
        RingWriter(memoryview(bytearray(10)), 2, 64)


def test_encoding_keeps_arrays_out_of_band_and_copies_them_out() -> None:
    arr = np.arange(1000, dtype=np.float64)
    chunks = encode({"a": arr, "f": lambda x: x + 1})  # a lambda needs cloudpickle
    assert any(memoryview(c).nbytes == arr.nbytes for c in chunks)  # the array, unpickled
    payload = bytearray(b"".join(bytes(memoryview(c).cast("B")) for c in chunks))
    value = decode(memoryview(payload))
    payload[:] = bytes(len(payload))  # the slot is reused: the value must not change
    np.testing.assert_array_equal(value["a"], arr)
    assert value["a"].flags.writeable
    assert value["f"](1) == 2


# ----------------------------------------------------------------------------- the plan


class FakeHandle:
    """Stands for an actor handle: the plan only needs ``actor_id``."""

    def __init__(self, actor_id: str) -> None:
        self.actor_id = actor_id


def call(handle: FakeHandle, method: str, *args: object, **kwargs: object) -> ClassMethodNode:
    return ClassMethodNode(handle, method, args, kwargs, class_name="A")


def test_a_chain_has_an_input_channel_one_channel_per_hop_and_an_output() -> None:
    a, b = FakeHandle("aa"), FakeHandle("bb")
    with InputNode() as inp:
        dag = call(b, "g", call(a, "f", inp))
    plan = build_plan(dag)
    assert plan.actors == ["aa", "bb"]
    chans = {(c.writer, c.readers) for c in plan.channels}
    assert chans == {(DRIVER, ("aa",)), ("aa", ("bb",)), ("bb", (DRIVER,))}
    f, g = plan.tasks
    assert f.args == (Arg("input"),)
    assert g.args[0].kind == "chan" and plan.channels[g.args[0].value].writer == "aa"
    assert plan.outputs == [g.out] and not plan.multi_output and plan.input_direct


def test_calls_on_one_actor_pass_values_in_memory() -> None:
    a, b = FakeHandle("aa"), FakeHandle("bb")
    with InputNode() as inp:
        x = call(a, "f", inp[0])
        y = call(a, "g", x, scale=inp.scale)  # same actor: no channel for x
        z = call(b, "h", x, 3)
        dag = MultiOutputNode([y, z, y])
    plan = build_plan(dag)
    fx, gy, hz = plan.tasks
    assert gy.args == (Arg("local", fx.tid),)
    assert gy.kwargs == {"scale": Arg("attr", ("scale", "attr", "inp.scale"))}
    assert hz.args[1] == Arg("const", 3)
    x_chan = plan.channels[fx.out]
    assert x_chan.readers == ("bb",)  # only the other actor reads it
    assert plan.outputs == [gy.out, hz.out, gy.out] and plan.multi_output
    assert plan.reads("aa")[0].cid == INPUT_CHANNEL
    assert set(plan.input_reads) == {(0, "item", "inp[0]"), ("scale", "attr", "inp.scale")}
    assert not plan.input_direct
    assert [t.tid for t in plan.tasks_of("aa")] == [fx.tid, gy.tid]


def test_compile_time_checks_follow_ray() -> None:
    import nbcluster

    a = FakeHandle("aa")
    with InputNode() as inp:
        no_input = call(a, "f", 1)
        dag = call(a, "g", inp, no_input)
    with pytest.raises(ValueError, match="require each task to take"):
        build_plan(dag)
    with pytest.raises(NotImplementedError, match="exactly one InputNode"):
        build_plan(call(a, "f", 1))
    with InputNode() as inp:
        nested = call(a, "f", [inp])
    with pytest.raises(NotImplementedError, match="direct arguments"):
        build_plan(nested)
    with InputNode() as inp:
        two = ClassMethodNode(a, "f", (inp,), {}, num_returns=2, class_name="A")
    with pytest.raises(NotImplementedError, match="num_returns=2"):
        build_plan(two)

    @nbcluster.remote
    def task(x: int) -> int:
        return x

    @nbcluster.remote
    class Actor:
        def f(self, x: int) -> int:
            return x

    with InputNode() as inp:
        fn = task.bind(inp)
    with pytest.raises(NotImplementedError, match="only support actor method nodes"):
        build_plan(fn)
    with InputNode() as inp:
        unborn = Actor.bind().f.bind(inp)
    with pytest.raises(ValueError, match=r"already created with Actor.remote\(\)"):
        build_plan(unborn)
