"""Ray Core names that need no cluster: ObjectRef ids and type hints, cloudpickle, custom
serializers, inspect_serializability, runtime-context id types (issue 20, item 4)."""

from __future__ import annotations

import io
import pickle
import threading
import typing

import pytest

import nbcluster
from nbcluster import ObjectRef
from nbcluster._runtime.serialization import deserialize, serialize
from nbcluster.exceptions import SerializationError
from nbcluster.runtime_context import HexId, _original_resources
from nbcluster.util import (
    deregister_serializer,
    inspect_serializability,
    register_serializer,
)


class Locked:
    """Holds a lock, so it cannot be pickled without a custom serializer."""

    def __init__(self, value: int) -> None:
        self.value = value
        self.lock = threading.Lock()


def _rebuild_locked(value: int) -> Locked:
    return Locked(value)


def test_object_ref_is_generic_in_type_hints() -> None:
    def f(x: ObjectRef[int]) -> ObjectRef[str]:
        raise NotImplementedError

    hints = typing.get_type_hints(f)
    assert hints["x"] == ObjectRef[int]
    assert typing.get_origin(hints["return"]) is ObjectRef
    assert typing.get_args(hints["return"]) == (str,)


def test_object_ref_from_bad_ids_names_the_fix() -> None:
    with pytest.raises(TypeError, match="from_hex"):
        ObjectRef("ab" * 20)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="20 bytes, got 3"):
        ObjectRef(b"abc")
    with pytest.raises(ValueError, match="ref.hex"):
        ObjectRef.from_hex("not hex")


def test_object_ref_nil_and_an_unknown_owner_warns() -> None:
    assert ObjectRef.nil().is_nil() and ObjectRef.nil().hex() == "00" * 20
    with pytest.warns(UserWarning, match="owner is unknown"):
        ref = ObjectRef.from_hex("ab" * 20)
    assert ref.hex() == "ab" * 20 and ref.binary() == bytes.fromhex("ab" * 20)
    with pytest.warns(UserWarning, match="owner is unknown"):
        assert not ref.is_nil() and ref == ObjectRef.from_binary(bytes.fromhex("ab" * 20))


def test_nbcluster_cloudpickle_pickles_lambdas_and_applies_registered_serializers() -> None:
    double = nbcluster.cloudpickle.loads(nbcluster.cloudpickle.dumps(lambda x: 2 * x))
    assert double(21) == 42
    buf = io.BytesIO()
    nbcluster.cloudpickle.dump({"a": 1}, buf)
    assert nbcluster.cloudpickle.loads(buf.getvalue()) == {"a": 1}
    with pytest.raises(TypeError):
        nbcluster.cloudpickle.dumps(Locked(1))
    register_serializer(Locked, serializer=lambda o: o.value, deserializer=_rebuild_locked)
    try:
        back = pickle.loads(nbcluster.cloudpickle.dumps(Locked(7)))
        assert isinstance(back, Locked) and back.value == 7
    finally:
        deregister_serializer(Locked)


def test_register_serializer_is_used_for_every_value_until_deregistered() -> None:
    with pytest.raises(SerializationError, match="lock"):
        serialize([Locked(1)])
    register_serializer(Locked, serializer=lambda o: o.value, deserializer=_rebuild_locked)
    try:
        back = deserialize(serialize({"x": [Locked(3)]}).to_bytes())
        assert isinstance(back["x"][0], Locked) and back["x"][0].value == 3
    finally:
        deregister_serializer(Locked)
    deregister_serializer(Locked)  # a second time: no effect, as in Ray
    with pytest.raises(SerializationError):
        serialize(Locked(1))
    with pytest.raises(TypeError, match="takes a class"):
        register_serializer(Locked(1), serializer=str, deserializer=str)  # type: ignore[arg-type]


def test_inspect_serializability_finds_the_innermost_culprit() -> None:
    lock = threading.Lock()

    def uses_lock() -> bool:
        return lock.locked()

    out = io.StringIO()
    ok, failures = inspect_serializability(uses_lock, name="uses_lock", print_file=out)
    assert ok is False
    ((failure,),) = [failures]
    assert failure.obj is lock and failure.name == "lock" and failure.parent is uses_lock
    assert "FAIL serialization of uses_lock" in out.getvalue()

    ok, failures = inspect_serializability({"a": [1, 2]}, print_file=io.StringIO())
    assert ok is True and failures == set()


def test_hex_ids_answer_the_ray_id_methods() -> None:
    node = HexId("0a" * 16)
    assert node == "0a" * 16 and node.hex() == "0a" * 16
    assert node.binary() == bytes.fromhex("0a" * 16)
    assert HexId("0000").is_nil() and not node.is_nil()


def test_assigned_resources_report_placement_group_names_as_asked() -> None:
    pg = "ab" * 8
    granted = {
        f"CPU_group_1_{pg}": 2.0,
        f"CPU_group_{pg}": 2.0,
        f"bundle_group_1_{pg}": 0.001,
        "memory": 0.0,
        "custom": 1.0,
    }
    assert _original_resources(granted) == {"CPU": 2.0, "custom": 1.0}
    assert _original_resources({f"GPU_group_{pg}": 1.0}) == {"GPU": 1.0}


def test_ctrl_c_inside_a_refs_finalizer_is_delivered_again() -> None:
    # Python prints and drops an exception raised in __del__; a KeyboardInterrupt that lands
    # while a ref is released must reach the main thread anyway (a lost Ctrl-C in a cell).
    import gc

    from nbcluster._refs import ObjectRef

    class Client:
        def add_local_ref(self, object_id: bytes, owner: str, borrowed: bool) -> None:
            pass

        def remove_local_ref(self, object_id: bytes) -> None:
            raise KeyboardInterrupt

    ref = ObjectRef._new(b"\x01" * 20, "owner", Client())  # type: ignore[arg-type]
    import time

    gc.collect()  # finalizers of earlier tests run now, not where the interrupt lands
    gc.disable()  # no collection (and no other finalizer) in this thread while it comes
    try:
        with pytest.raises(KeyboardInterrupt):
            del ref  # refcount zero: __del__ runs here, and raises inside it
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:  # the re-delivered interrupt arrives here
                time.sleep(0.01)
    finally:
        gc.enable()
