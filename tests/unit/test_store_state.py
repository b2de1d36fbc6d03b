"""StoreState: events in, decisions out. No files, no processes."""

from __future__ import annotations

import random

import pytest

from nbcluster._runtime.objects.state import (
    AccessDecision,
    Decision,
    Location,
    StoreState,
)

MiB = 1 << 20


def oid(n: int) -> bytes:
    return n.to_bytes(4, "big")


def put(state: StoreState, n: int, size: int, owner: str = "driver", **kw) -> Decision:
    """create + seal, completing any spills the decision asks for."""
    decision = state.create(oid(n), size, owner, **kw)
    assert decision.ok, decision.message
    for victim in decision.spill:
        assert state.mark_spilled(victim)
    assert state.seal(oid(n))
    return decision


# -- create -----------------------------------------------------------------------------------


def test_create_that_fits_is_ok_and_counted() -> None:
    s = StoreState(100 * MiB)
    d = s.create(oid(1), 10 * MiB, "driver")
    assert d == Decision("ok") and d.ok and d.spill == () and d.evict == ()
    assert s.stats().used == 10 * MiB and s.stats().num_objects == 1
    assert s.location(oid(1)) is Location.MEMORY
    assert oid(1) in s and len(s) == 1


def test_create_bigger_than_the_store_is_full_with_advice() -> None:
    s = StoreState(100 * MiB)
    d = s.create(oid(1), 120 * MiB, "driver")
    assert d.status == "full" and not d.ok
    assert d.message == (
        "object of 120.0 MiB does not fit in the 100.0 MiB store (it is larger than the whole "
        "store); raise object_store_memory, or split the value into smaller objects"
    )
    assert s.stats().used == 0 and oid(1) not in s


def test_full_without_spilling_says_what_to_do() -> None:
    s = StoreState(100 * MiB, spilling_enabled=False)
    for n in range(7):
        put(s, n, 95 * MiB // 7 + (95 * MiB % 7 if n == 0 else 0))
    assert s.stats().used == 95 * MiB
    d = s.create(oid(99), 10 * MiB, "driver")
    assert d.status == "full"
    assert d.message == (
        "object of 10.0 MiB does not fit in the 100.0 MiB store (95.0 MiB used by 7 objects); "
        "free references with `del`, raise object_store_memory, or enable spilling"
    )
    assert s.stats().used == 95 * MiB  # nothing changed


def test_duplicate_create_reports_exists_and_reserves_nothing() -> None:
    s = StoreState(100 * MiB)
    s.create(oid(1), 10 * MiB, "a")
    d = s.create(oid(1), 10 * MiB, "a")
    assert d.status == "exists" and d.ok
    assert s.stats().used == 10 * MiB


def test_negative_size_and_capacity_are_rejected() -> None:
    with pytest.raises(ValueError):
        StoreState(0)
    with pytest.raises(ValueError):
        StoreState(10).create(oid(1), -1, "a")


# -- spilling ----------------------------------------------------------------------------------


def test_spills_least_recently_used_first() -> None:
    s = StoreState(100 * MiB)
    for n in (1, 2, 3, 4):
        put(s, n, 25 * MiB)
    assert s.access(oid(1)) == AccessDecision("ok", 25 * MiB)  # 1 becomes most recent
    d = s.create(oid(5), 40 * MiB, "driver")
    assert d.status == "ok" and d.spill == (oid(2), oid(3)) and d.evict == ()
    # room is promised at once: the spilled objects still count until mark_spilled
    assert s.stats().used == 140 * MiB
    assert s.location(oid(2)) is Location.MEMORY
    assert s.mark_spilled(oid(2)) and s.mark_spilled(oid(3))
    st = s.stats()
    assert st.used == 90 * MiB and st.num_objects == 3
    assert st.spilled_bytes == 50 * MiB and st.num_spilled == 2
    assert st.spilled_bytes_total == 50 * MiB and st.num_spilled_total == 2
    assert s.location(oid(2)) is Location.SPILLED


def test_pending_spills_are_not_chosen_twice() -> None:
    s = StoreState(100 * MiB)
    for n in (1, 2, 3, 4):
        put(s, n, 25 * MiB)
    first = s.create(oid(5), 25 * MiB, "driver")
    second = s.create(oid(6), 25 * MiB, "driver")
    assert first.spill == (oid(1),) and second.spill == (oid(2),)


def test_objects_being_written_are_never_spilled() -> None:
    s = StoreState(100 * MiB)
    s.create(oid(1), 60 * MiB, "writer")  # not sealed
    put(s, 2, 30 * MiB)
    d = s.create(oid(3), 50 * MiB, "driver")
    assert d.status == "full"
    assert d.message == (
        "object of 50.0 MiB does not fit in the 100.0 MiB store (90.0 MiB used by 2 objects, "
        "60.0 MiB of it being written, spilled or restored); wait for running tasks, free "
        "references with `del`, or raise object_store_memory"
    )
    assert s.location(oid(2)) is Location.MEMORY  # the failed attempt spilled nothing
    d = s.create(oid(3), 30 * MiB, "driver")
    assert d.spill == (oid(2),)


def test_cancel_spill_keeps_the_object_in_memory() -> None:
    s = StoreState(100 * MiB)
    put(s, 1, 60 * MiB)
    d = s.create(oid(2), 60 * MiB, "driver")
    assert d.spill == (oid(1),)
    assert s.cancel_spill(oid(1))
    assert s.location(oid(1)) is Location.MEMORY
    assert s.stats().used == 120 * MiB  # over capacity until the caller gives up oid(2)
    assert s.free([oid(2)]) == [(oid(2), Location.MEMORY)]
    assert s.stats().used == 60 * MiB
    assert s.access(oid(1)).status == "ok"


def test_phase_violations_raise() -> None:
    s = StoreState(100 * MiB)
    put(s, 1, 10 * MiB)
    with pytest.raises(ValueError, match="is sealed, not spilling"):
        s.mark_spilled(oid(1))
    with pytest.raises(ValueError, match="not restoring"):
        s.mark_restored(oid(1))


# -- eviction of secondary copies --------------------------------------------------------------


def test_secondary_copies_are_evicted_before_anything_is_spilled() -> None:
    s = StoreState(100 * MiB)
    put(s, 1, 30 * MiB)  # primary, oldest
    put(s, 2, 30 * MiB, primary=False)
    put(s, 3, 30 * MiB, primary=False)
    d = s.create(oid(4), 40 * MiB, "driver")
    assert d.evict == (oid(2),) and d.spill == ()
    assert oid(2) not in s
    st = s.stats()
    assert st.evicted_bytes == 30 * MiB and st.num_evicted == 1
    d = s.create(oid(5), 60 * MiB, "driver")
    assert d.evict == (oid(3),) and d.spill == (oid(1),)


def test_eviction_works_with_spilling_disabled() -> None:
    s = StoreState(100 * MiB, spilling_enabled=False)
    put(s, 1, 50 * MiB, primary=False)
    put(s, 2, 50 * MiB)
    d = s.create(oid(3), 50 * MiB, "driver")
    assert d.status == "ok" and d.evict == (oid(1),)
    assert s.create(oid(4), 10 * MiB, "driver").status == "full"


# -- access and restore ------------------------------------------------------------------------


def test_access_states() -> None:
    s = StoreState(100 * MiB)
    assert s.access(oid(1)) is None
    s.create(oid(1), 10 * MiB, "a")
    assert s.access(oid(1)) == AccessDecision("pending", 10 * MiB)
    s.seal(oid(1))
    a = s.access(oid(1))
    assert a.status == "ok" and a.ok and not a.restore and a.size == 10 * MiB


def test_restore_makes_room_and_counts() -> None:
    s = StoreState(100 * MiB)
    put(s, 1, 60 * MiB)
    put(s, 2, 60 * MiB)  # spills 1
    assert s.location(oid(1)) is Location.SPILLED
    a = s.access(oid(1))
    assert a.status == "restore" and a.restore and a.ok
    assert a.spill == (oid(2),) and a.size == 60 * MiB
    assert s.access(oid(1)).status == "pending"  # a second reader waits for the restore
    assert s.mark_spilled(oid(2))
    assert s.mark_restored(oid(1))
    st = s.stats()
    assert st.used == 60 * MiB and st.spilled_bytes == 60 * MiB
    assert st.restored_bytes == 60 * MiB and st.num_restored == 1
    assert s.location(oid(1)) is Location.MEMORY


def test_restore_without_room_is_full() -> None:
    s = StoreState(100 * MiB)
    put(s, 1, 60 * MiB)
    put(s, 2, 60 * MiB)  # spills 1
    s.create(oid(3), 40 * MiB, "writer")  # being written: never spilled
    d = s.create(oid(4), 60 * MiB, "writer")
    assert d.spill == (oid(2),)
    s.mark_spilled(oid(2))
    a = s.access(oid(1))  # needs 60 MiB; everything in memory is still being written
    assert a.status == "full" and not a.ok and not a.restore
    assert a.message.startswith("object of 60.0 MiB does not fit in the 100.0 MiB store (100.0")
    assert s.location(oid(1)) is Location.SPILLED and s.stats().used == 100 * MiB


def test_cancel_restore_leaves_it_spilled() -> None:
    s = StoreState(100 * MiB)
    put(s, 1, 60 * MiB)
    put(s, 2, 60 * MiB)  # spills 1
    a = s.access(oid(1))
    assert a.restore and a.spill == (oid(2),)
    assert s.cancel_restore(oid(1))  # the restore failed, and so the spill is not needed
    assert s.cancel_spill(oid(2))
    assert s.location(oid(1)) is Location.SPILLED and s.location(oid(2)) is Location.MEMORY
    st = s.stats()
    assert st.used == 60 * MiB and st.spilled_bytes == 60 * MiB and st.num_restored == 0


# -- free --------------------------------------------------------------------------------------


def test_free_reports_where_each_object_was() -> None:
    s = StoreState(100 * MiB)
    put(s, 1, 60 * MiB)
    put(s, 2, 60 * MiB)  # spills 1
    s.create(oid(3), 10 * MiB, "writer")
    out = s.free([oid(1), oid(2), oid(3), oid(404)])
    assert out == [(oid(1), Location.SPILLED), (oid(2), Location.MEMORY), (oid(3), Location.MEMORY)]
    assert out[0][1] == "spilled" and out[1][1] == "memory"  # str-compatible
    st = s.stats()
    assert st.used == 0 and st.spilled_bytes == 0 and st.num_objects == 0 and len(s) == 0
    assert s.free([oid(1)]) == []  # idempotent


def test_free_while_spilling_or_restoring_or_writing() -> None:
    s = StoreState(100 * MiB)
    put(s, 1, 60 * MiB)
    d = s.create(oid(2), 60 * MiB, "w")
    assert d.spill == (oid(1),)
    assert s.free([oid(1)]) == [(oid(1), Location.MEMORY)]
    assert s.mark_spilled(oid(1)) is False  # caller deletes the spill file it just wrote
    assert s.seal(oid(2))
    assert s.stats().used == 60 * MiB

    put(s, 3, 60 * MiB)  # spills 2
    a = s.access(oid(2))
    assert a.restore and a.spill == (oid(3),)
    assert s.free([oid(2)]) == [(oid(2), Location.SPILLED)]
    assert s.mark_restored(oid(2)) is False  # caller deletes the restored file
    assert s.mark_spilled(oid(3))
    st = s.stats()
    assert st.used == 0 and st.spilled_bytes == 60 * MiB

    s.create(oid(4), 1 * MiB, "w")
    s.free([oid(4)])
    assert s.seal(oid(4)) is False  # freed before it was sealed: delete what was written


def test_seal_is_idempotent() -> None:
    s = StoreState(100 * MiB)
    s.create(oid(1), 1, "a")
    assert s.seal(oid(1)) and s.seal(oid(1))
    assert s.access(oid(1)).status == "ok"


def test_largest_and_stats_fields() -> None:
    s = StoreState(100 * MiB)
    put(s, 1, 10 * MiB, owner="a")
    put(s, 2, 30 * MiB, owner="b")
    put(s, 3, 20 * MiB, owner="c")
    assert s.largest(2) == [
        (oid(2), 30 * MiB, "b", Location.MEMORY),
        (oid(3), 20 * MiB, "c", "memory"),
    ]
    st = s.stats()
    assert st.capacity == 100 * MiB and st.spilling_enabled is True


# -- a long random run: the L03 workload, accounting invariants checked at every step ----------


def test_random_workload_keeps_the_books_balanced() -> None:
    rng = random.Random(1234)
    capacity = 100 * MiB
    s = StoreState(capacity)
    sizes: dict[bytes, int] = {}
    where: dict[bytes, str] = {}  # what a simulated node manager would have on disk
    restores = 0

    def check() -> None:
        st = s.stats()
        assert st.used == sum(sizes[o] for o, w in where.items() if w == "memory")
        assert st.spilled_bytes == sum(sizes[o] for o, w in where.items() if w == "spilled")
        assert st.used <= capacity
        assert st.num_objects + st.num_spilled == len(where) == len(s)

    def apply_room(decision) -> None:
        assert decision.evict == ()  # no secondary copies in this run
        for victim in decision.spill:
            assert where[victim] == "memory"
            assert s.mark_spilled(victim)
            where[victim] = "spilled"

    n = 0
    written = 0
    while written < 800 * MiB:  # put 800 MiB of 8-24 MiB arrays into a 100 MiB store
        size = rng.randint(8, 24) * MiB
        d = s.create(oid(n), size, "driver")
        assert d.status == "ok", d.message
        apply_room(d)
        assert s.seal(oid(n))
        sizes[oid(n)], where[oid(n)] = size, "memory"
        written += size
        n += 1
        check()
    for _ in range(1000):
        o = rng.choice(sorted(where))
        a = s.access(o)
        assert a is not None and a.ok, a
        if a.restore:
            apply_room(a)
            assert s.mark_restored(o)
            where[o] = "memory"
            restores += 1
        check()
        if rng.random() < 0.05:  # the owner frees something now and then
            victim = rng.choice(sorted(where))
            for freed, loc in s.free([victim, oid(10**6)]):
                assert loc == where.pop(freed)
            check()
    st = s.stats()
    assert st.restored_bytes > 0 and st.num_restored == restores
    assert st.num_spilled_total >= n - 10  # most objects were spilled at least once
    assert restores <= 1000  # at most one restore per read: no thrashing loops


def test_owned_by_lists_an_owners_objects_in_memory_and_spilled() -> None:
    s = StoreState(100 * MiB)
    put(s, 1, 40 * MiB, owner="worker-a")
    put(s, 2, 40 * MiB, owner="driver")
    put(s, 3, 40 * MiB, owner="worker-a")  # spills 1 (least recently used)
    assert s.location(oid(1)) is Location.SPILLED
    assert sorted(s.owned_by("worker-a")) == [oid(1), oid(3)]
    assert s.owned_by("nobody") == []
    freed = s.free(s.owned_by("worker-a"))
    assert sorted(freed) == [(oid(1), Location.SPILLED), (oid(3), Location.MEMORY)]
    st = s.stats()
    assert st.used == 40 * MiB and st.spilled_bytes == 0 and st.num_objects == 1
    assert s.owned_by("driver") == [oid(2)]
