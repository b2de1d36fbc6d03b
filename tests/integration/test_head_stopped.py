"""F11(b)/J03 for an ordinary driver with a *stopped* head (SIGSTOP: the process lives and
its sockets stay open, so nothing resets and calls time out rather than fail).

A stop shorter than the grace period is only a pause: calls made meanwhile go through once
the head continues (J03(a)). For a longer stop, what needs the head fails with ``HeadUnavailableError`` within the grace period (not after
each RPC's own timeout, up to a minute for creating an actor); what does not (tasks on
leased workers, calls to connected actors) keeps working; once the head continues, the
same driver carries on and nothing ran twice (executions are counted with files).
"""

from __future__ import annotations

import os
import signal
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

import nbcluster
from nbcluster.state import local_cluster
from nbcluster.testing import pid_alive, poll_for

GRACE_S = 3
HANG_S = 30  # far above the grace period, far below the RPC timeouts a hang would wait for


def _runs(path: Path, tag: str) -> int:
    return len(list(path.glob(f"{tag}.*")))


def test_f11b_a_stopped_head_fails_calls_that_need_it_within_the_grace_period(
    cluster, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("NBCLUSTER_HEAD_GRACE_PERIOD_S", str(GRACE_S))
    cluster(num_cpus=2)
    runs = str(tmp_path)

    def mark(path: str, tag: str) -> None:  # one file per execution
        (Path(path) / f"{tag}.{uuid.uuid4().hex}").touch()

    @nbcluster.remote
    def work(path: str, tag: str) -> str:
        mark(path, tag)
        return tag

    @nbcluster.remote
    class Counter:
        def __init__(self, path: str, tag: str) -> None:
            self.path = path
            mark(path, tag)
            self.n = 0

        def inc(self, tag: str) -> int:
            mark(self.path, tag)
            self.n += 1
            return self.n

    assert nbcluster.get(work.remote(runs, "before"), timeout=60) == "before"
    counter = Counter.remote(runs, "init-counter")
    assert nbcluster.get(counter.inc.remote("inc-1"), timeout=60) == 1

    head = local_cluster().head
    # J03(a): a stop shorter than the grace period is a pause, not a failure: the calls
    # made meanwhile wait for the head and go through once it continues.
    os.kill(head.pid, signal.SIGSTOP)
    resume = threading.Timer(GRACE_S / 3, os.kill, (head.pid, signal.SIGCONT))
    resume.start()
    try:
        short = Counter.remote(runs, "init-short")
        assert nbcluster.get(short.inc.remote("inc-short"), timeout=60) == 1
    finally:
        resume.cancel()
        os.kill(head.pid, signal.SIGCONT)

    # The task below runs on a worker that already has ``work``'s code.
    assert nbcluster.get(work.remote(runs, "warm"), timeout=60) == "warm"

    @nbcluster.remote
    def never_run_before() -> int:  # its code goes to the head on the first call
        return 1

    # J03(b): a stop longer than the grace period.
    os.kill(head.pid, signal.SIGSTOP)
    try:
        needs_head: list[tuple[str, Callable[[], object]]] = [
            ("named-actor lookup", lambda: nbcluster.get_actor("anything")),
            (
                "actor creation",
                lambda: nbcluster.get(
                    Counter.remote(runs, "init-during").inc.remote("inc-during"), timeout=60
                ),
            ),
            (
                "placement group",
                lambda: nbcluster.get(
                    nbcluster.util.placement_group([{"CPU": 0.01}]).ready(), timeout=60
                ),
            ),
            ("state query", lambda: nbcluster.state.task_events()),
            ("new function", lambda: nbcluster.get(never_run_before.remote(), timeout=60)),
            ("node list", lambda: nbcluster.nodes()),
        ]
        for what, call in needs_head:
            start = time.monotonic()
            with pytest.raises(nbcluster.exceptions.HeadUnavailableError, match="head"):
                call()
            waited = time.monotonic() - start
            assert waited < HANG_S, f"{what} hung for {waited:.0f}s on a stopped head"
        # Neither needs the head: a task on the leased worker, a call to a connected actor.
        assert nbcluster.get(work.remote(runs, "during"), timeout=60) == "during"
        assert nbcluster.get(counter.inc.remote("inc-2"), timeout=60) == 2
    finally:
        os.kill(head.pid, signal.SIGCONT)

    def head_answers() -> bool:
        try:
            nbcluster.get_actor("anything")
        except nbcluster.exceptions.HeadUnavailableError:
            return False
        except ValueError:  # "no such actor": the head answered
            return True
        return False

    poll_for(head_answers, timeout=30, message="the driver did not get the head back")
    # The same driver carries on: new actors and tasks, the old actor.
    fresh = Counter.remote(runs, "init-after")
    assert nbcluster.get(fresh.inc.remote("inc-after"), timeout=60) == 1
    assert nbcluster.get(work.remote(runs, "after"), timeout=60) == "after"
    assert nbcluster.get(counter.inc.remote("inc-3"), timeout=60) == 3
    for tag in (
        "before",
        "init-counter",
        "inc-1",
        "init-short",
        "inc-short",
        "warm",
        "during",
        "inc-2",
    ):
        assert _runs(tmp_path, tag) == 1, tag
    for tag in ("init-after", "after", "inc-after", "inc-3"):
        assert _runs(tmp_path, tag) == 1, tag
    # The call that failed never ran. (The head may still act on the creation request it
    # read after SIGCONT: at most one constructor run, never two.)
    assert _runs(tmp_path, "inc-during") == 0
    assert _runs(tmp_path, "init-during") <= 1


def test_an_actor_dropped_while_the_head_is_stopped_still_ends(
    cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The owner asks the head to end an actor whose last handle went away. A request the
    # head cannot take in time (stopped here for twice the grace period; in CI, 500 of
    # them at once on a loaded head) is asked again until the head takes it: once given
    # up, the actor's process would run until the cluster stops.
    monkeypatch.setenv("NBCLUSTER_HEAD_GRACE_PERIOD_S", str(GRACE_S))
    cluster(num_cpus=2)

    @nbcluster.remote(num_cpus=0)
    class Idle:
        def pid(self) -> int:
            return os.getpid()

    actor = Idle.remote()
    pid = nbcluster.get(actor.pid.remote(), timeout=60)
    head = local_cluster().head
    os.kill(head.pid, signal.SIGSTOP)
    try:
        del actor  # the owner's request to end it waits on the stopped head
        time.sleep(2 * GRACE_S + 1)  # past the grace period: the first request failed
    finally:
        os.kill(head.pid, signal.SIGCONT)

    poll_for(
        lambda: not pid_alive(pid),
        timeout=30,
        interval=0.1,
        message=f"the dropped actor (pid {pid}) still runs",
    )
