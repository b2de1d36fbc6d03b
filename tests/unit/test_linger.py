"""The timer that drops kept mappings left unused (objects/linger.py), without processes."""

from __future__ import annotations

import threading
import time

from nbcluster._runtime.objects.linger import Linger


class Item:
    def __init__(self, lock: threading.Lock, closed: list[tuple[Item, bool]]) -> None:
        self.lock = lock
        self.closed = closed

    def close(self) -> None:
        free = self.lock.acquire(blocking=False)  # closed outside the owner's lock
        if free:
            self.lock.release()
        self.closed.append((self, free))


def test_it_sweeps_once_per_arm_closes_outside_the_lock_and_rearms_while_things_are_left() -> None:
    lock = threading.Lock()
    closed: list[tuple[Item, bool]] = []
    items = [Item(lock, closed) for _ in range(3)]
    sweeps: list[tuple[float, bool]] = []
    done = threading.Event()

    def sweep(now: float) -> tuple[list[Item], bool]:
        held = lock.locked()
        sweeps.append((now, held))
        out = [items.pop(0)]
        if not items:
            done.set()
        return out, bool(items)

    linger = Linger(0.02, lock, sweep)
    start = time.monotonic()
    with lock:
        linger.arm()
        linger.arm()  # one timer, however often it is armed
    assert linger.armed
    assert done.wait(10)
    time.sleep(0.1)  # (a timer armed twice would sweep a fourth time, and fail on pop)
    assert len(sweeps) == 3
    assert all(held for _, held in sweeps)  # under the owner's lock
    assert sweeps[0][0] - start >= 0.02
    assert [free for _, free in closed] == [True, True, True]
    assert not linger.armed  # nothing left: no timer


def test_a_cancelled_timer_never_sweeps_and_a_forked_child_starts_unarmed() -> None:
    lock = threading.Lock()
    sweeps: list[float] = []

    def sweep(now: float) -> tuple[list[Item], bool]:
        sweeps.append(now)
        return [], False

    linger = Linger(0.02, lock, sweep)
    with lock:
        linger.arm()
        linger.cancel()
    assert not linger.armed
    time.sleep(0.1)
    assert sweeps == []

    with lock:
        linger.arm()
    parents = linger._timer
    assert parents is not None
    new_lock = threading.Lock()
    linger.after_fork(new_lock)  # as a child sees it: the parent's timer thread is not there
    parents.cancel()  # (not forked here: the "parent's" timer must not fire in this test)
    assert not linger.armed
    fired = threading.Event()
    linger._sweep = lambda now: (fired.set(), ([], False))[1]  # type: ignore[assignment]
    with new_lock:
        linger.arm()
    assert fired.wait(10)
