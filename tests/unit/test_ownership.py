"""OwnershipTable: reference counts of owned and borrowed objects, and what to release."""

from __future__ import annotations

import sys
import threading

from nbcluster._runtime.core.ownership import (
    PENDING,
    READY,
    Entry,
    OwnershipTable,
    Release,
    Waiter,
)

ME = "10.0.0.1:5000"
OWNER = "10.0.0.2:5000"
NODE = "10.0.0.1:7000"
OID = b"obj-1"


def owned_in_store(table: OwnershipTable, oid: bytes = OID, node: str = NODE) -> Entry:
    """An owned object whose bytes are sealed in ``node``'s store, with one local ref."""
    entry = table.create_owned(oid)
    entry.set_ready(in_store=True, size=4096, node_id=b"node-1", node_address=node)
    table.add_local_ref(oid, ME, borrowed=False)
    return entry


def registered_borrow(table: OwnershipTable, oid: bytes = OID) -> Entry:
    table.add_local_ref(oid, OWNER, borrowed=True)
    entry = table.get(oid)
    assert entry is not None
    entry.registered = True
    return entry


# --------------------------------------------------------------------------- entries


def test_create_owned_entry_defaults() -> None:
    table = OwnershipTable(ME)
    task = object()
    entry = table.create_owned(OID, task=task)
    assert table.get(OID) is entry
    assert len(table) == 1
    assert (entry.owned, entry.owner, entry.task) == (True, ME, task)
    assert entry.state == PENDING
    assert (entry.local, entry.submitted, entry.borrowers, entry.escaped) == (0, 0, None, False)


def test_a_calls_return_is_created_with_its_ref_counted_and_dropping_it_frees_it() -> None:
    table = OwnershipTable(ME)
    entry = table.create_owned(OID, refs=1)  # (what ObjectRef._adopt relies on)
    assert entry.local == 1
    entry.set_ready(data=b"x")
    assert table.try_drop_local(OID)
    assert table.get(OID) is None


def test_set_ready_records_location_and_size() -> None:
    entry = Entry(True, ME)
    entry.set_ready(data=b"12345")
    assert entry.state == READY
    assert (entry.data, entry.size, entry.in_store) == (b"12345", 5, False)
    entry.set_ready(in_store=True, size=10, node_id=b"n", node_address=NODE)
    assert (entry.data, entry.size, entry.node_id, entry.node_address) == (None, 10, b"n", NODE)
    err = RuntimeError("lost")
    entry.set_ready(is_error=True, exc=err)
    assert (entry.is_error, entry.exc, entry.size) == (True, err, 0)


def test_release_is_falsy_when_empty() -> None:
    out = Release()
    assert not out
    out.unborrow.append((OWNER, OID))
    assert out


# --------------------------------------------------------------------------- local refs


def test_local_refs_are_counted() -> None:
    table = OwnershipTable(ME)
    table.add_local_ref(OID, ME, borrowed=False)
    table.add_local_ref(OID, ME, borrowed=False)
    entry = table.get(OID)
    assert entry is not None
    assert (entry.owned, entry.local) == (True, 2)
    assert not table.remove_local_ref(OID)
    assert entry.local == 1
    assert table.get(OID) is entry
    assert not table.remove_local_ref(OID)
    assert table.get(OID) is None
    assert len(table) == 0


def test_remove_ref_of_unknown_object_is_a_noop() -> None:
    table = OwnershipTable(ME)
    out = table.remove_local_ref(b"ghost")
    assert (out.free_in_store, out.unborrow) == ([], [])


def test_ref_to_an_object_owned_elsewhere_is_not_owned() -> None:
    table = OwnershipTable(ME)
    table.add_local_ref(b"a", OWNER, borrowed=False)
    table.add_local_ref(b"b", ME, borrowed=True)
    assert table.entries[b"a"].owned is False
    assert table.entries[b"a"].owner == OWNER
    assert table.entries[b"b"].owned is False


def test_owned_object_in_store_is_freed_with_the_last_ref() -> None:
    table = OwnershipTable(ME)
    entry = owned_in_store(table)
    entry.buffer = memoryview(b"bytes")
    table.add_local_ref(OID, ME, borrowed=False)
    assert not table.remove_local_ref(OID)
    out = table.remove_local_ref(OID)
    assert out.free_in_store == [(NODE, OID)]
    assert out.unborrow == []
    assert table.get(OID) is None
    assert entry.buffer is None  # the mapped view is dropped with the entry


def test_owned_inline_object_needs_no_store_free() -> None:
    table = OwnershipTable(ME)
    table.create_owned(OID).set_ready(data=b"small")
    table.add_local_ref(OID, ME, borrowed=False)
    out = table.remove_local_ref(OID)
    assert not out
    assert table.get(OID) is None


def test_owned_pending_object_is_forgotten_without_free() -> None:
    table = OwnershipTable(ME)
    table.create_owned(OID)
    table.add_local_ref(OID, ME, borrowed=False)
    assert not table.remove_local_ref(OID)
    assert table.get(OID) is None


# --------------------------------------------------------------------------- submitted tasks


def test_submitted_tasks_keep_the_object_alive() -> None:
    table = OwnershipTable(ME)
    owned_in_store(table)
    table.add_submitted([OID, b"unknown"])
    table.add_submitted([OID])
    assert table.entries[OID].submitted == 2
    assert not table.remove_local_ref(OID)
    assert table.get(OID) is not None
    assert not table.remove_submitted([OID])
    assert table.get(OID) is not None
    out = table.remove_submitted([OID, b"unknown"])
    assert out.free_in_store == [(NODE, OID)]
    assert table.get(OID) is None


def test_remove_submitted_frees_several_objects_at_once() -> None:
    table = OwnershipTable(ME)
    owned_in_store(table, b"a", "n1:1")
    owned_in_store(table, b"b", "n2:1")
    table.add_submitted([b"a", b"b"])
    table.remove_local_ref(b"a")
    table.remove_local_ref(b"b")
    out = table.remove_submitted([b"a", b"b"])
    assert out.free_in_store == [("n1:1", b"a"), ("n2:1", b"b")]
    assert len(table) == 0


# --------------------------------------------------------------------------- borrowers


def test_borrowers_keep_the_object_alive() -> None:
    table = OwnershipTable(ME)
    owned_in_store(table)
    assert not table.update_borrowers([OID], "w1:1", add=True)
    assert not table.update_borrowers([OID], "w2:1", add=True)
    assert table.entries[OID].borrowers == {"w1:1", "w2:1"}
    assert not table.remove_local_ref(OID)
    assert not table.update_borrowers([OID], "w1:1", add=False)
    assert not table.update_borrowers([OID], "w1:1", add=False)  # removing twice is harmless
    assert table.get(OID) is not None
    out = table.update_borrowers([OID], "w2:1", add=False)
    assert out.free_in_store == [(NODE, OID)]
    assert table.get(OID) is None


def test_a_borrower_leaving_that_never_came_frees_the_object_as_usual() -> None:
    table = OwnershipTable(ME)
    owned_in_store(table)
    assert not table.update_borrowers([OID], "w1:1", add=False)  # (no borrower set yet)
    assert table.entries[OID].borrowers is None
    out = table.remove_local_ref(OID)
    assert out.free_in_store == [(NODE, OID)]
    assert table.get(OID) is None


def test_borrowers_of_objects_we_do_not_own_are_ignored() -> None:
    table = OwnershipTable(ME)
    entry = registered_borrow(table)
    assert not table.update_borrowers([OID, b"unknown"], "w1:1", add=True)
    assert entry.borrowers is None  # (made on a first borrower only)


def test_borrower_leaving_while_local_refs_remain_frees_nothing() -> None:
    table = OwnershipTable(ME)
    owned_in_store(table)
    table.update_borrowers([OID], "w1:1", add=True)
    assert not table.update_borrowers([OID], "w1:1", add=False)
    assert table.entries[OID].local == 1


# --------------------------------------------------------------------------- escaped


def test_escaped_objects_are_never_released_by_refcount() -> None:
    table = OwnershipTable(ME)
    owned_in_store(table)
    table.add_submitted([OID])
    table.update_borrowers([OID], "w1:1", add=True)
    table.mark_escaped([OID, b"unknown"])
    assert not table.remove_local_ref(OID)
    assert not table.remove_submitted([OID])
    assert not table.update_borrowers([OID], "w1:1", add=False)
    entry = table.get(OID)
    assert entry is not None and entry.escaped


def test_mark_escaped_ignores_borrowed_objects() -> None:
    table = OwnershipTable(ME)
    entry = registered_borrow(table)
    table.mark_escaped([OID])
    assert entry.escaped is False
    assert table.remove_local_ref(OID).unborrow == [(OWNER, OID)]


# --------------------------------------------------------------------------- borrowed objects


def test_registered_borrow_is_unborrowed_on_last_ref() -> None:
    table = OwnershipTable(ME)
    entry = registered_borrow(table)
    entry.set_ready(in_store=True, node_address=NODE)  # borrowed bytes are never freed by us
    table.add_local_ref(OID, OWNER, borrowed=True)
    assert not table.remove_local_ref(OID)
    out = table.remove_local_ref(OID)
    assert out.unborrow == [(OWNER, OID)]
    assert out.free_in_store == []
    assert table.get(OID) is None


def test_unregistered_borrow_releases_nothing() -> None:
    table = OwnershipTable(ME)
    table.add_local_ref(OID, OWNER, borrowed=True)
    out = table.remove_local_ref(OID)
    assert (out.free_in_store, out.unborrow) == ([], [])
    assert table.get(OID) is None


# --------------------------------------------------------------------------- drop_all


def test_drop_all_releases_everything() -> None:
    table = OwnershipTable(ME)
    owned_in_store(table, b"owned", "n1:1")
    owned_in_store(table, b"escaped", "n2:1")
    table.mark_escaped([b"escaped"])
    table.update_borrowers([b"escaped"], "w1:1", add=True)
    registered_borrow(table, b"borrowed")
    table.add_local_ref(b"unregistered", OWNER, borrowed=True)
    table.create_owned(b"inline").set_ready(data=b"x")

    out = table.drop_all()
    assert sorted(out.free_in_store) == [("n1:1", b"owned"), ("n2:1", b"escaped")]
    assert out.unborrow == [(OWNER, b"borrowed")]
    assert len(table) == 0
    assert not table.drop_all()


# --------------------------------------------------------------------------- wake


def test_wake_sets_event_and_waiters() -> None:
    table = OwnershipTable(ME)
    entry = table.create_owned(OID)
    entry.event = threading.Event()
    w1, w2 = Waiter(1), Waiter(2)
    entry.waiters = [w1, w2]
    entry.set_ready(data=b"v")
    table.wake(entry)
    assert entry.event.is_set()
    assert w1.event.is_set()  # needed one object: done
    assert not w2.event.is_set() and w2.remaining == 1  # needs one more
    assert entry.waiters is None
    table.wake(entry)  # waking again is harmless


def test_waiter_counts_down_and_set_wakes_at_once() -> None:
    w = Waiter(3)
    w.hit()
    w.hit()
    assert not w.event.is_set()
    w.hit()
    assert w.event.is_set()
    w0 = Waiter(0)
    assert w0.event.is_set()
    w5 = Waiter(5)
    w5.set()
    assert w5.event.is_set()


def test_wake_without_waiters_is_harmless() -> None:
    table = OwnershipTable(ME)
    entry = table.create_owned(OID)
    table.wake(entry)
    assert entry.event is None and entry.waiters is None


# --------------------------------------------------------------------------- threads


def test_concurrent_add_remove_leaves_an_empty_table() -> None:
    table = OwnershipTable(ME)
    n_threads, rounds = 8, 10_000
    barrier = threading.Barrier(n_threads)
    errors: list[BaseException] = []
    finished: list[int] = []

    def work(i: int) -> None:
        try:
            barrier.wait()
            oid = b"shared" if i % 2 else b"shared-too"
            for _ in range(rounds):
                table.add_local_ref(oid, ME, borrowed=False)
                table.remove_local_ref(oid)
            finished.append(i)
        except BaseException as e:  # report any failure to the main thread
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(n_threads)]
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)  # switch threads often, so unlocked updates would collide
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=30)
    finally:
        sys.setswitchinterval(interval)
    assert not any(t.is_alive() for t in threads)
    assert errors == []
    assert sorted(finished) == list(range(n_threads))
    assert len(table) == 0
    assert table.entries == {}


# --------------------------------------------------------------------------- unregistered borrows


def test_borrowed_objects_are_handed_out_once_for_registration() -> None:
    table = OwnershipTable(ME)
    table.add_local_ref(b"b1", OWNER, borrowed=True)
    table.add_local_ref(b"b1", OWNER, borrowed=True)  # a second ref: the same object
    table.add_local_ref(b"b2", OWNER, borrowed=True)
    table.add_local_ref(b"mine", ME, borrowed=False)  # owned here: no owner to tell
    table.create_owned(b"put")
    assert sorted(table.take_unregistered()) == [b"b1", b"b2"]
    assert table.take_unregistered() == []  # (the caller registered them)
    table.add_local_ref(b"b3", OWNER, borrowed=True)
    assert table.take_unregistered() == [b"b3"]


def test_a_borrow_gone_or_registered_before_it_is_taken_is_not_handed_out() -> None:
    table = OwnershipTable(ME)
    table.add_local_ref(b"gone", OWNER, borrowed=True)
    registered_borrow(table, b"told")  # registered by another path meanwhile
    out = table.remove_local_ref(b"gone")  # released unregistered: nothing to unborrow
    assert out.unborrow == []
    assert table.unregistered == {b"told"}
    assert table.take_unregistered() == []
    assert table.unregistered == set()
