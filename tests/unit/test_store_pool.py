"""The warm-pool policy: which pre-allocated files the node keeps for the next writes."""

from __future__ import annotations

import pytest

from nbcluster._runtime.objects.pool import WarmPool, usable

MiB = 1 << 20
GiB = 1 << 30
PLENTY = 100 * GiB


def test_initial_files_fit_the_limit() -> None:
    assert WarmPool(GiB).initial() == [128 * MiB, 128 * MiB]
    assert WarmPool(200 * MiB).initial() == [128 * MiB]
    assert WarmPool(10 * MiB).initial() == []


def test_nothing_is_planned_before_a_large_write() -> None:
    pool = WarmPool(GiB)
    pool.wrote(1000)  # small objects never use the pool
    assert pool.plan([], PLENTY) == ([], [])


def test_files_of_the_recent_size_rounded_up_to_a_mib() -> None:
    pool = WarmPool(GiB)
    pool.wrote(100 * MiB + 5)
    assert pool.plan([], PLENTY)[0] == [101 * MiB, 101 * MiB]
    assert pool.plan([101 * MiB], PLENTY)[0] == [101 * MiB]
    assert pool.plan([200 * MiB, 101 * MiB], PLENTY)[0] == []  # two files already fit one
    assert pool.plan([100 * MiB + 5, 101 * MiB], PLENTY)[0] == []  # a recycled one fits too
    assert pool.plan([50 * MiB, 60 * MiB], PLENTY)[0] == [101 * MiB, 101 * MiB]  # too small


def test_the_largest_recent_size_wins_and_old_sizes_age_out() -> None:
    pool = WarmPool(4 * GiB, history=2)
    pool.wrote(300 * MiB)
    pool.wrote(10 * MiB)
    assert pool.plan([], PLENTY)[0] == [300 * MiB, 300 * MiB]
    pool.wrote(20 * MiB)  # 300 MiB is no longer among the last two
    assert pool.plan([], PLENTY)[0] == [20 * MiB, 20 * MiB]


def test_the_byte_limit_and_the_promised_room_are_respected() -> None:
    pool = WarmPool(250 * MiB)
    pool.wrote(100 * MiB)
    assert pool.plan([], PLENTY)[0] == [100 * MiB, 100 * MiB]
    assert pool.plan([100 * MiB], PLENTY)[0] == [100 * MiB]
    assert pool.plan([60 * MiB, 60 * MiB], PLENTY)[0] == [100 * MiB]  # 220 + 100 > 250: one
    assert pool.plan([], 150 * MiB)[0] == [100 * MiB]  # only room for one file
    assert pool.plan([], 50 * MiB)[0] == []
    off = WarmPool(0)
    off.wrote(100 * MiB)
    assert off.plan([], PLENTY)[0] == []


def test_files_no_recent_write_would_use_are_dropped() -> None:
    pool = WarmPool(GiB)
    for _ in range(4):
        pool.wrote(MiB)  # small writes only: the initial 128 MiB files are too big to use
    allocate, drop = pool.plan([128 * MiB, 128 * MiB, 2 * MiB, 3 * MiB], PLENTY)
    assert drop == [128 * MiB, 128 * MiB]
    assert allocate == []  # the 2 and 3 MiB files serve the next 1 MiB writes
    pool.wrote(100 * MiB)
    assert pool.plan([128 * MiB], PLENTY) == ([100 * MiB], [])  # 128 MiB can take 100 MiB
    assert usable(128 * MiB, 100 * MiB) and not usable(128 * MiB, 10 * MiB)
    assert usable(MiB, 8) and usable(MiB - 1, MiB)  # smaller files are kept (part fits)


def test_files_are_allocated_only_once_large_writes_pause() -> None:
    pool = WarmPool(GiB, quiet_s=0.25)
    assert pool.wait_s(now=100.0) == 0.0  # nothing written yet (the node's initial files)
    pool.wrote(1000, now=100.0)  # small writes never hold it back
    assert pool.wait_s(now=100.0) == 0.0
    pool.writing(100 * MiB, now=100.0)  # a large write reserved its room
    assert pool.wait_s(now=100.1) == pytest.approx(0.15)
    pool.wrote(100 * MiB, now=100.2)  # ... and was sealed: the quiet period starts again
    assert pool.wait_s(now=100.3) == pytest.approx(0.15)
    assert pool.wait_s(now=100.45) == 0.0
    assert pool.plan([], PLENTY)[0] == [100 * MiB, 100 * MiB]
