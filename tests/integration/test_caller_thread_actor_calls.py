"""Actor calls written by the caller's own thread (core/actor_submitter.py ``_send_direct``):
order against calls that go the loop's way, a full socket handed to the loop, cancel, and
refs dropped on the caller's thread. Real cluster, real sockets."""

from __future__ import annotations

import sys
import threading
import time

import cloudpickle
import pytest

import nbcluster
from nbcluster._runtime import client_slot

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # workers cannot import tests/


@nbcluster.remote
class Log:
    def __init__(self) -> None:
        self.seen: list[object] = []

    def add(self, x: object, pause: float = 0.0) -> int:
        if pause:
            time.sleep(pause)
        self.seen.append(x if not isinstance(x, bytes) else len(x))
        return len(self.seen)

    def seen_list(self) -> list[object]:
        return list(self.seen)

    def sleep(self, s: float) -> str:
        time.sleep(s)
        return "slept"


@nbcluster.remote
def later(x: int, s: float) -> int:
    time.sleep(s)
    return x


def _submitter():  # noqa: ANN202 - the runtime's actor submitter of this driver
    client = client_slot.current_client()
    assert client is not None
    return client.actor_submitter


def test_calls_keep_order_across_both_paths(shared_cluster: object) -> None:
    """A call waiting for an argument holds back later calls: none of them may pass it by
    going out from the caller's thread."""
    log = Log.remote()
    nbcluster.get(log.add.remote(-1))  # the actor is up and its channel open
    sub = _submitter()
    before = sub.sent_direct
    refs = []
    expected: list[int] = []
    for i in range(40):
        if i % 10 == 5:  # an argument still being made: this call waits on the loop
            refs.append(log.add.remote(later.remote(i, 0.2)))
        else:
            refs.append(log.add.remote(i))
        expected.append(i)
    assert nbcluster.get(refs, timeout=60) == list(range(2, 42))
    assert nbcluster.get(log.seen_list.remote(), timeout=30) == [-1, *expected]
    assert sub.sent_direct > before  # the caller's thread did write some of them


def test_full_socket_is_handed_to_the_loop(shared_cluster: object, monkeypatch) -> None:
    """When the socket takes only part of a frame (as when it is full), the loop writes the
    rest, and calls made meanwhile go out after it: whole and in order."""
    from nbcluster._runtime.core.channel import TaskChannel

    log = Log.remote()
    nbcluster.get(log.add.remote(-1))
    sub = _submitter()
    real = TaskChannel.send_from_thread

    def half(self: TaskChannel, frame: bytes) -> int:  # the socket took only half of it
        return real(self, frame[: len(frame) // 2])

    monkeypatch.setattr(TaskChannel, "send_from_thread", half)
    before = sub.handoffs
    blob = b"x" * (60 * 1024)
    for round_ in range(5):
        refs = [log.add.remote(blob if i % 2 else round_) for i in range(20)]
        nbcluster.get(refs, timeout=60)
    assert sub.handoffs >= before + 5  # each round's first call was cut in two
    seen = nbcluster.get(log.seen_list.remote(), timeout=30)
    assert seen == [-1] + [len(blob) if i % 2 else round_ for round_ in range(5) for i in range(20)]


def test_cancel_and_force_on_a_call_sent_from_the_thread(shared_cluster: object) -> None:
    log = Log.remote()
    nbcluster.get(log.add.remote(-1))
    sub = _submitter()
    before = sub.sent_direct
    ref = log.sleep.remote(0.5)
    assert sub.sent_direct == before + 1
    with pytest.raises(ValueError, match=r"^force=True is not supported for actor tasks"):
        nbcluster.cancel(ref, force=True)
    nbcluster.cancel(ref)
    try:
        out = nbcluster.get(ref, timeout=60)
    except nbcluster.exceptions.TaskCancelledError:
        out = "cancelled"
    assert out in ("slept", "cancelled")  # a sync actor's call sees is_canceled() only
    assert nbcluster.get(log.add.remote(1), timeout=30) == 2  # the actor still serves


def test_threads_calling_one_actor(shared_cluster: object) -> None:
    """Several threads of the driver call one actor at once: every call is answered, and
    each thread's calls arrive in that thread's order."""
    log = Log.remote()
    nbcluster.get(log.add.remote(-1))
    errors: list[BaseException] = []

    def caller(t: int) -> None:
        try:
            refs = [log.add.remote((t, i)) for i in range(200)]
            nbcluster.get(refs, timeout=120)
        except BaseException as err:  # noqa: BLE001 - reported below
            errors.append(err)

    threads = [threading.Thread(target=caller, args=(t,)) for t in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(180)
    assert not errors
    seen = nbcluster.get(log.seen_list.remote(), timeout=30)[1:]
    assert len(seen) == 800
    for t in range(4):
        assert [i for (tt, i) in seen if tt == t] == list(range(200))


def test_dropped_refs_are_released(shared_cluster: object) -> None:
    """Refs dropped on the caller's thread free their objects (at once for small owned
    ones, through the loop for the rest)."""
    client = client_slot.current_client()
    assert client is not None
    log = Log.remote()
    ids = []
    for i in range(50):
        ref = log.add.remote(i)
        nbcluster.get(ref, timeout=30)
        ids.append(ref.binary())
        del ref
    big = nbcluster.put(b"y" * (2 * 1024 * 1024))  # in the store: freed by the loop
    big_id = big.binary()
    del big
    client.flush_derefs()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and (
        any(client.table.get(oid) is not None for oid in ids) or client.table.get(big_id)
    ):
        time.sleep(0.05)
    assert all(client.table.get(oid) is None for oid in ids)
    assert client.table.get(big_id) is None
