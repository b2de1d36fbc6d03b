"""Serialization: encoding, zero-copy buffers, contained refs, and error reports."""

from __future__ import annotations

import functools
import mmap
import os
import pickle
import socket
import struct
import subprocess
import sys
import textwrap
import threading

import cloudpickle
import numpy as np
import pytest

from nbcluster._runtime import serialization
from nbcluster._runtime.serialization import (
    ALIGNMENT,
    MAGIC,
    OOB_MIN_BYTES,
    SerializedValue,
    current_deserialize_context,
    deserialize,
    function_hash,
    note_contained_ref,
    register_ref_deserializer_hook,
    serialize,
)


def roundtrip(value: object) -> object:
    return deserialize(serialize(value).to_bytes())


# -- round trips -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value",
    [
        5,
        -(2**100),
        3.5,
        1 + 2j,
        True,
        None,
        "héllo",
        b"\x00bytes",
        bytearray(b"abc"),
        (1, "a", 2.0),
        [1, [2, [3]]],
        {"a": 1, 2: "b", (3, 4): None},
        {1, 2, 3},
        frozenset({"x"}),
        list(range(1000)),
        {"k": list(range(20))},
        range(5),
    ],
)
def test_builtin_values_round_trip(value: object) -> None:
    assert roundtrip(value) == value


def test_functions_closures_and_local_classes_round_trip() -> None:
    factor = 3

    def scale(x: int) -> int:
        return x * factor

    class Point:
        def __init__(self, x: int) -> None:
            self.x = x

    assert roundtrip(lambda x: x + 1)(1) == 2
    assert roundtrip(scale)(2) == 6
    p = roundtrip(Point(4))
    assert p.x == 4 and type(p).__name__ == "Point"


def test_self_referential_values_round_trip() -> None:
    lst: list[object] = [1]
    lst.append(lst)
    out = roundtrip(lst)
    assert out[0] == 1 and out[1] is out

    d: dict[str, object] = {}
    d["me"] = d
    out_d = roundtrip(d)
    assert out_d["me"] is out_d


@pytest.mark.parametrize(
    "arr",
    [
        np.arange(100_000, dtype=np.float64),
        np.arange(12, dtype=np.int32).reshape(3, 4),
        np.asfortranarray(np.arange(20_000, dtype=np.int64).reshape(100, 200)),
        np.arange(40_000, dtype=np.float32).reshape(200, 200)[::2, ::3],  # not contiguous
        np.zeros((0, 5)),
        np.array(7.0),
        np.array([{"a": 1}, None], dtype=object),
        np.array([(1, 2.0)], dtype=[("a", "i4"), ("b", "f8")]),
    ],
    ids=["1d", "small", "fortran", "strided", "empty", "0d", "object", "structured"],
)
def test_numpy_arrays_round_trip(arr: np.ndarray) -> None:
    out = roundtrip(arr)
    assert out.dtype == arr.dtype and out.shape == arr.shape
    np.testing.assert_array_equal(out, arr)


def test_plain_fast_path_is_used_only_for_builtin_types() -> None:
    class MyInt(int):
        pass

    assert type(serialize(5)) is not SerializedValue  # the fast-path subclass
    assert type(serialize((1, "a", None))) is not SerializedValue
    assert type(serialize({"a": 1.5})) is not SerializedValue
    # nested plain containers (a task's (args, kwargs)) take the fast path too
    assert type(serialize(((1, "a"), {"k": [2]}))) is not SerializedValue
    for value in (
        MyInt(5),
        [[[[1]]]],
        (lambda: 1),
        list(range(100)),
        {"a": object()},
        ((MyInt(1),), {}),
    ):
        assert type(serialize(value)) is SerializedValue
    assert roundtrip(MyInt(5)) == 5 and type(roundtrip(MyInt(5))).__name__ == "MyInt"


def test_a_calls_ref_placeholders_take_the_fast_path() -> None:
    # f.remote(ref): (args, kwargs) with a placeholder for the ref (core/args.py) is
    # pickled by the C pickler alone, like plain values, and comes back the same.
    from nbcluster._runtime.core.args import ArgPlaceholder

    call = ((ArgPlaceholder(0), 3), {"y": ArgPlaceholder(1)})
    sv = serialize(call)
    assert type(sv) is not SerializedValue
    assert sv.meta == cloudpickle.dumps(call, protocol=5)
    (a, b), kw = deserialize(sv.to_bytes())
    assert (type(a), a.index, b, kw["y"].index) == (ArgPlaceholder, 0, 3, 1)


def test_plain_fast_path_emits_the_same_stream_as_cloudpickle() -> None:
    for value in (5, "x", (1, "a", 2.0), {"a": [1][0], "b": None}, [1.5, b"z"]):
        assert serialize(value).meta == cloudpickle.dumps(value, protocol=5)


# -- encoding ---------------------------------------------------------------------------------


def test_value_without_buffers_is_header_plus_pickle() -> None:
    sv = serialize({"a": 1})
    data = sv.to_bytes()
    assert data[:4] == MAGIC
    assert struct.unpack_from("<4sBBHI", data) == (MAGIC, 1, 0, 0, 0)
    assert data[12:] == pickle.dumps({"a": 1}, protocol=5)
    assert sv.total_size == len(data) == 12 + len(sv.meta)
    assert sv.buffers == () and list(sv.contained_refs) == []


def test_out_of_band_buffers_are_aligned_and_described_by_the_table() -> None:
    a = np.arange(1000, dtype=np.float64)
    b = np.arange(333, dtype=np.uint8).repeat(3)  # 999 bytes: not a multiple of 64
    sv = serialize({"a": a, "b": b, "c": "text"})
    assert len(sv.buffers) == 2
    data = sv.to_bytes()
    assert len(data) == sv.total_size
    magic, version, flags, _, nbuf = struct.unpack_from("<4sBBHI", data)
    assert (magic, version, flags, nbuf) == (MAGIC, 1, 0, 2)
    table = struct.unpack_from("<6Q", data, 12)
    meta_off, meta_len = table[0], table[1]
    assert meta_off == 12 + 16 * 3
    assert data[meta_off : meta_off + meta_len] == sv.meta
    end = meta_off + meta_len
    for (off, length), buf in zip(
        zip(table[2::2], table[3::2], strict=True), sv.buffers, strict=True
    ):
        assert off % ALIGNMENT == 0
        assert data[end:off] == bytes(off - end)  # padding is zeros
        assert data[off : off + length] == bytes(buf)
        end = off + length
    assert end == sv.total_size


def test_write_into_and_chunks_match_to_bytes() -> None:
    sv = serialize([np.arange(5000), "x", np.ones((30, 30))])
    dest = bytearray(sv.total_size)
    sv.write_into(memoryview(dest))
    assert bytes(dest) == sv.to_bytes() == b"".join(bytes(c) for c in sv.chunks())
    with pytest.raises(ValueError, match="need"):
        sv.write_into(memoryview(bytearray(sv.total_size + 1)))


def test_small_buffers_stay_in_band_and_come_back_writable() -> None:
    small = np.arange(OOB_MIN_BYTES // 8 - 1, dtype=np.int64)
    sv = serialize(small)
    assert sv.buffers == []
    out = deserialize(sv.to_bytes())
    assert out.flags.writeable
    np.testing.assert_array_equal(out, small)


def test_arrays_from_bytes_share_the_bytes_and_are_read_only() -> None:
    data = serialize(np.arange(10_000, dtype=np.int64)).to_bytes()
    out = deserialize(data)
    assert not out.flags.writeable
    assert np.shares_memory(out, np.frombuffer(data, dtype=np.uint8))


def test_arrays_from_a_read_only_mapping_are_zero_copy_views(tmp_path) -> None:
    arr = np.arange(1_000_000, dtype=np.float64).reshape(1000, 1000)
    sv = serialize({"arr": arr, "tag": "t"})
    path = tmp_path / "obj"
    with open(path, "w+b") as f:
        f.truncate(sv.total_size)
        with mmap.mmap(f.fileno(), sv.total_size) as wmap:
            view = memoryview(wmap)
            sv.write_into(view)
            view.release()
    with open(path, "rb") as f:
        rmap = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)
    mv = memoryview(rmap)
    out = deserialize(mv)["arr"]

    np.testing.assert_array_equal(out, arr)
    assert out.flags.writeable is False
    assert np.shares_memory(out, np.frombuffer(mv, dtype=np.uint8))
    assert out.ctypes.data % ALIGNMENT == 0
    base = out
    while isinstance(base, np.ndarray):
        base = base.base
    assert isinstance(base, memoryview) and base.obj is rmap
    with pytest.raises(ValueError, match="read-only"):
        out[0, 0] = 1.0


@pytest.mark.parametrize(
    "data, match",
    [
        (b"", "too short"),
        (b"NBC1", "too short"),
        (b"XXXX" + bytes(8) + b"payload", "magic"),
        (b"NBC1\x09" + bytes(7), "version"),
        (struct.pack("<4sBBHI", MAGIC, 1, 0, 0, 1) + struct.pack("<4Q", 44, 10**9, 0, 0), "bounds"),
    ],
)
def test_corrupt_input_raises_value_error(data: bytes, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        deserialize(data)
    with pytest.raises(ValueError, match=match):
        deserialize(memoryview(data))


def test_function_hash_is_16_bytes_and_deterministic() -> None:
    payload = cloudpickle.dumps(lambda x: x)
    assert len(function_hash(payload)) == 16
    assert function_hash(payload) == function_hash(bytes(payload))
    assert function_hash(payload) != function_hash(payload + b"!")


# -- contained refs and the deserialization hook ------------------------------------------------


class FakeRef:
    """Mimics ObjectRef's pickling protocol."""

    def __init__(self, oid: bytes) -> None:
        self.oid = oid

    def __reduce__(self):
        note_contained_ref(self)
        return (_rebuild_fake_ref, (self.oid,))


def _rebuild_fake_ref(oid: bytes) -> FakeRef:
    ref = FakeRef(oid)
    ref.context = current_deserialize_context()
    serialization._ref_deserialized(ref)
    return ref


def test_contained_refs_are_collected_once_each() -> None:
    r1, r2 = FakeRef(b"1"), FakeRef(b"2")
    sv = serialize([r1, {"x": r2, "again": r1}, (lambda: r2)])
    assert sv.contained_refs == [r1, r2]
    assert list(serialize([1, 2]).contained_refs) == []


def test_note_contained_ref_outside_serialize_is_a_no_op() -> None:
    note_contained_ref(FakeRef(b"stray"))
    assert list(serialize("x").contained_refs) == []
    assert serialize([FakeRef(b"a")]).contained_refs[0].oid == b"a"


def test_contained_refs_are_per_thread() -> None:
    results: dict[int, list[bytes]] = {}
    barrier = threading.Barrier(4)

    def work(i: int) -> None:
        barrier.wait()
        for _ in range(200):
            refs = [FakeRef(bytes([i, j])) for j in range(3)]
            got = serialize([refs, i]).contained_refs
            assert [r.oid for r in got] == [r.oid for r in refs]
        results[i] = [r.oid for r in got]

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == [0, 1, 2, 3]


def test_ref_deserializer_hook_and_context() -> None:
    seen: list[FakeRef] = []
    previous = register_ref_deserializer_hook(seen.append)
    try:
        data = serialize({"r": FakeRef(b"abc")}).to_bytes()
        out = deserialize(data, context="client-1")
        assert out["r"].oid == b"abc" and out["r"].context == "client-1"
        assert seen == [out["r"]]
        assert current_deserialize_context() is None
        assert deserialize(data)["r"].context is None
        assert register_ref_deserializer_hook(None) == seen.append
        deserialize(data)
        assert len(seen) == 2
    finally:
        register_ref_deserializer_hook(previous)


# -- errors -----------------------------------------------------------------------------------


def _error_class() -> type[Exception]:
    try:
        from nbcluster.exceptions import SerializationError
    except ImportError:  # pragma: no cover
        return TypeError
    return SerializationError


def test_lock_nested_in_a_dict_names_its_path() -> None:
    value = {"cfg": {"lock": threading.Lock(), "n": 1}, "x": [1, 2]}
    with pytest.raises(_error_class()) as info:
        serialize(value, what="argument")
    assert isinstance(info.value, TypeError)
    assert type(info.value).__name__ == "SerializationError"
    assert str(info.value) == (
        "Could not serialize argument: value['cfg']['lock'] is a _thread.lock "
        "(TypeError: cannot pickle '_thread.lock' object). "
        "Pass something picklable, or create it inside the task."
    )


def test_generator_is_reported_with_a_hint() -> None:
    with pytest.raises(
        TypeError,
        match=r"^Could not serialize value: value is a generator "
        r"\(TypeError: cannot pickle 'generator' object\)\. Turn it into a list",
    ):
        serialize(x for x in range(3))


def test_closure_over_a_socket_names_the_variable() -> None:
    def make():
        sock = socket.socket()

        def task():
            return sock.fileno()

        return task, sock

    task, sock = make()
    try:
        with pytest.raises(
            TypeError,
            match=r"^Could not serialize remote function: task "
            r"\(closure variable 'sock'\) is a socket\.socket ",
        ):
            serialize(task, what="remote function", name="task")
    finally:
        sock.close()


GLOBAL_LOCK = threading.Lock()


def _uses_global_lock() -> bool:
    return GLOBAL_LOCK.locked()


def test_global_used_by_a_function_is_named() -> None:
    # By value, as if defined in a notebook, so cloudpickle must pickle its globals.
    func = type(_uses_global_lock)(
        _uses_global_lock.__code__, {"GLOBAL_LOCK": GLOBAL_LOCK}, "_uses_global_lock"
    )
    with pytest.raises(TypeError, match=r"f \(global 'GLOBAL_LOCK'\) is a _thread\.lock"):
        serialize(func, name="f")


class Holder:
    def __init__(self, inner: object) -> None:
        self.inner = inner


class Slotted:
    __slots__ = ("a", "b")

    def __init__(self, a: object, b: object) -> None:
        self.a, self.b = a, b


@pytest.mark.parametrize(
    "value, path",
    [
        ([Holder({"q": [1, threading.RLock()]})], r"args\[0\]\.inner\['q'\]\[1\]"),
        ((1, Slotted(2, threading.Lock())), r"args\[1\]\.b"),
        ([{threading.Lock()}], r"args\[0\] \(set element 0\)"),
        ([functools.partial(print, threading.Lock())], r"args\[0\]\.args\[0\]"),
        ([Holder(threading.Lock()).__init__], r"args\[0\]\.__self__\.inner"),
    ],
    ids=["attributes", "slots", "set", "partial", "method"],
)
def test_paths_through_objects(value: object, path: str) -> None:
    with pytest.raises(
        TypeError, match=rf"^Could not serialize value: {path} is a _thread\.(R)?[Ll]ock"
    ):
        serialize(value, name="args")


def test_cycles_do_not_hang_the_report() -> None:
    a: list[object] = []
    b: list[object] = [a]
    a.append(b)
    a.append(threading.Lock())
    with pytest.raises(TypeError, match=r"value\[1\] is a _thread\.lock"):
        serialize(a)


def test_failed_serialize_keeps_no_refs_and_resets_state() -> None:
    with pytest.raises(TypeError):
        serialize([FakeRef(b"x"), threading.Lock()])
    note_contained_ref(FakeRef(b"after"))  # must not be recorded anywhere
    assert list(serialize([1]).contained_refs) == []


DEEP_SCRIPT = textwrap.dedent(
    """
    import sys
    from nbcluster._runtime.serialization import deserialize, serialize
    sys.setrecursionlimit(int(sys.argv[1]))
    x = []
    for _ in range(100_000):
        x = [x]
    try:
        data = serialize(x).to_bytes()
    except TypeError as e:
        print(type(e).__name__, e)
    else:
        y = deserialize(data)
        depth = 0
        while y:
            y = y[0]
            depth += 1
        print("ROUNDTRIP", depth)
    """
)


@pytest.mark.parametrize("limit", [1000, 1_000_000])
def test_very_deep_nesting_never_crashes_the_process(limit: int) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", DEEP_SCRIPT, str(limit)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    if limit == 1000:
        assert proc.stdout.startswith(
            "SerializationError Could not serialize value: value is nested too deeply to pickle"
        ), proc.stdout
        assert "Flatten the structure" in proc.stdout
    else:  # a raised recursion limit: pickled on a big enough stack, or a clean error
        assert proc.stdout.startswith(("ROUNDTRIP 100000", "SerializationError")), proc.stdout


def test_functions_pickled_by_value_keep_their_file_name_for_tracebacks() -> None:
    # cloudpickle 3.1.3 writes "<dynamic-code>" instead; a task's traceback then shows no
    # file and no source line.
    def local_fn() -> None:
        raise ValueError("here")

    again = deserialize(serialize(local_fn).to_bytes())
    assert again.__code__.co_filename == __file__
    try:
        again()
    except ValueError:
        import traceback

        assert 'raise ValueError("here")' in traceback.format_exc()
