"""The widget feed across a head restart (issue 12, item 5), with a scripted event stream.

When the stream comes back from a *restarted* head (another ``head_id`` in the snapshot),
the attempts that finished between the restart and the new subscription were never
pushed: they are only in the new head's ring. Every event subscriber gets them once (a
backfill), without duplicates of what is pushed after. No process is started: the head's
stream and ring are stand-ins.
"""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any

import pytest

from nbcluster.jupyter.widgets import _feed
from nbcluster.jupyter.widgets._feed import Feed, FeedUpdate
from nbcluster.state import ClusterEvent, EventBatch, TaskEvent


def attempt(n: int) -> TaskEvent:
    return TaskEvent(f"{n:032x}", "ab" * 16, "record", "cd" * 16, "ef" * 16, 1, "FINISHED",
                     float(n), float(n) + 0.5, "", 0)  # fmt: skip


class FakeStream:
    """What ``subscribe_events`` returns: ready at once; the test pushes batches."""

    error = None

    def wait_ready(self, timeout: float) -> bool:
        return True

    def close(self) -> None:
        pass


class FakeHead:
    """The head as the feed sees it: a ring of attempts and one pushed stream."""

    def __init__(self) -> None:
        self.ring: list[TaskEvent] = []
        self.push: Callable[[EventBatch], None] | None = None

    def subscribe(self, callback: Callable[[EventBatch], None], **kwargs: Any) -> FakeStream:
        self.push = callback
        return FakeStream()

    def pushed(self, *events: TaskEvent, snapshot_of: str = "") -> None:
        assert self.push is not None
        self.push(
            EventBatch(
                tuple(ClusterEvent(0, 0.0, "task", e) for e in events),
                snapshot=bool(snapshot_of),
                head_id=snapshot_of,
            )
        )


@pytest.fixture
def head(monkeypatch: pytest.MonkeyPatch) -> FakeHead:
    fake = FakeHead()
    monkeypatch.setattr(
        _feed,
        "state",
        types.SimpleNamespace(
            is_connected=lambda: True,
            session_info=lambda: {"job_id": "ab" * 16},
            task_events=lambda: (list(fake.ring), 0),
        ),
    )
    return fake


def test_attempts_that_finished_while_resubscribing_to_a_restarted_head_are_shown_once(
    head: FakeHead,
) -> None:
    feed = Feed(autostart=False, subscribe=head.subscribe)
    got: list[FeedUpdate] = []
    feed.subscribe(got.append, events=True, nodes=False)
    head.ring = [attempt(1)]
    feed.poll_once()  # subscribes; the first update is the backfill
    head.pushed(snapshot_of="head-1")
    head.pushed(attempt(2))
    feed.poll_once()

    # The head is killed and restarted; 3 finished before the stream subscribed again,
    # 4 after (pushed, and in the ring too).
    head.push(EventBatch((), connected=False))
    head.ring = [attempt(3), attempt(4)]
    head.pushed(snapshot_of="head-2")
    head.pushed(attempt(4))
    feed.poll_once()
    head.pushed(attempt(5))
    feed.poll_once()

    shown = [e.task_id for u in got for e in u.events]
    assert shown == [attempt(n).task_id for n in (1, 2, 3, 4, 5)]
