"""The one throttled event feed that every live widget of a kernel listens to.

A :class:`Feed` owns at most one background thread. While at least one widget is
subscribed, the thread polls :mod:`nbcluster.state` a few times a second at most
(``interval`` seconds apart, 0.5 s = 2 Hz by default) and hands every subscriber one
:class:`FeedUpdate` per tick: the task attempts that finished since the previous tick, and
the nodes' resources and object-store use. Widgets apply an update in one
``fig.batch_update()``, so the front end gets one message per figure per tick however many
tasks finished.

Task events are fetched incrementally. The head keeps them in a bounded ring, oldest
first, in the order they arrived (not sorted by time, and the oldest are dropped when the
ring is full). The feed remembers the last event it has seen (its ``(task_id, attempt,
end_time)`` key) and asks for the newest few events (twice as many as were new last time,
64 to ``batch``); if the remembered event is among them, only what follows it is new,
otherwise it asks for more (x8 each round, then the whole ring). A subscriber that joins
later gets the whole ring once (``backfill=True``).

The thread stops when the last subscriber leaves or the driver disconnects (then every
subscriber gets a final update with ``connected=False`` and is dropped). Subscribers from
an earlier connection are dropped the same way after ``shutdown()`` + ``init()``.

Tests drive a feed synchronously: ``Feed(autostart=False)`` never starts a thread, and
:meth:`Feed.poll_once` runs one tick in the calling thread.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Sequence

from nbcluster import state
from nbcluster.state import NodeStats, TaskEvent

__all__ = ["Feed", "FeedUpdate", "Subscription", "default_feed", "event_key"]

log = logging.getLogger(__name__)

#: The fastest a feed may tick (seconds between polls): "a few times a second at most".
MIN_INTERVAL_S = 0.1


@dataclasses.dataclass(frozen=True)
class FeedUpdate:
    """What one tick of the feed hands to one subscriber.

    ``events``: task attempts that finished since this subscriber's previous update
    (the whole ring when ``backfill`` is true), oldest first; empty when the subscriber
    did not ask for events. ``dropped``: how many events the head's ring has dropped in
    total. ``nodes``: every live node's stats, or None when not asked for.
    ``connected``: False in the last update a subscriber gets when the driver went away.
    """

    time: float
    events: Sequence[TaskEvent] = ()
    dropped: int = 0
    nodes: Sequence[NodeStats] | None = None
    backfill: bool = False
    connected: bool = True


Callback = Callable[[FeedUpdate], None]


@dataclasses.dataclass(eq=False)
class Subscription:
    """One subscriber: its callback and what it wants polled for it."""

    callback: Callback
    events: bool
    nodes: bool
    session: str | None
    needs_backfill: bool = True


def event_key(event: TaskEvent) -> tuple[str, int, float]:
    """The identity of one task attempt in the head's ring."""
    return (event.task_id, event.attempt, event.end_time)


def _current_session() -> str | None:
    """The job id of this process's connection, or None when disconnected."""
    if not state.is_connected():
        return None
    try:
        return str(state.session_info()["job_id"])
    except Exception:  # noqa: BLE001 - a shutdown racing with this call: treat as gone
        return None


class Feed:
    """A poller of :mod:`nbcluster.state` shared by live widgets (see the module docstring).

    ``interval``: seconds between polls (default 0.5 = 2 Hz; at least 0.1).
    ``batch``: the most events one incremental poll asks for before widening its search.
    ``autostart``: start the background thread on the first subscription (False in tests,
    which call :meth:`poll_once` instead).
    """

    def __init__(self, interval: float = 0.5, *, batch: int = 1024, autostart: bool = True) -> None:
        self._interval = max(float(interval), MIN_INTERVAL_S)
        self._batch = max(int(batch), 1)
        self._autostart = autostart
        self._lock = threading.Lock()  # guards _subs and _thread
        self._poll_lock = threading.Lock()  # one tick at a time (thread or poll_once)
        self._subs: list[Subscription] = []
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._cursor: tuple[str, int, float] | None = None
        self._cursor_session: str | None = None
        self._last_new = 0
        self.ticks = 0

    # -- configuration ----------------------------------------------------------------------
    @property
    def interval(self) -> float:
        """Seconds between polls."""
        return self._interval

    @interval.setter
    def interval(self, value: float) -> None:
        self._interval = max(float(value), MIN_INTERVAL_S)

    @property
    def running(self) -> bool:
        """True while the background thread is alive."""
        thread = self._thread
        return thread is not None and thread.is_alive()

    @property
    def subscribers(self) -> int:
        """How many subscribers the feed has."""
        with self._lock:
            return len(self._subs)

    # -- subscribers ------------------------------------------------------------------------
    def subscribe(
        self, callback: Callback, *, events: bool = True, nodes: bool = True
    ) -> Subscription:
        """Call ``callback(update)`` on every tick; start the thread if needed.

        ``events``/``nodes`` say what the subscriber needs polled; a subscriber that wants
        neither (a progress bar) just gets a tick. Callbacks run on the feed thread and
        must be quick; one that raises is logged and unsubscribed.
        """
        sub = Subscription(callback, events, nodes, _current_session())
        with self._lock:
            self._subs.append(sub)
            if self._autostart and (self._thread is None or not self._thread.is_alive()):
                self._stop.clear()
                self._thread = threading.Thread(
                    target=self._run, name="nbcluster-widget-feed", daemon=True
                )
                self._thread.start()
        return sub

    def unsubscribe(self, sub: Subscription | Callback) -> None:
        """Stop calling a subscriber (a :class:`Subscription` or its callback); idempotent."""
        with self._lock:
            self._subs = [s for s in self._subs if s is not sub and s.callback != sub]

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the background thread (subscribers stay; a new subscription restarts it)."""
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    # -- polling ----------------------------------------------------------------------------
    def _run(self) -> None:
        failing = False
        while not self._stop.is_set():
            with self._lock:
                if not self._subs:
                    self._thread = None
                    return
            try:
                self.poll_once()
                failing = False
            except Exception:  # noqa: BLE001 - keep the feed alive across transient RPC errors
                # A shutdown racing with a poll is not worth a word: the next tick sees it.
                # Otherwise warn once per run of failures, not a few times a second.
                if _current_session() is not None and not failing:
                    log.warning("nbcluster widget feed: poll failed; retrying", exc_info=True)
                failing = True
            self._stop.wait(self._interval)
        with self._lock:
            if self._thread is threading.current_thread():
                self._thread = None

    def poll_once(self) -> int:
        """Run one tick in the calling thread; return how many subscribers were updated."""
        with self._poll_lock:
            with self._lock:
                subs = list(self._subs)
            if not subs:
                return 0
            session = _current_session()
            stale = [
                s
                for s in subs
                if session is None or (s.session is not None and s.session != session)
            ]
            if stale:
                self._drop(stale)
                subs = [s for s in subs if s not in stale]
            if session is None or not subs:
                return 0
            for s in subs:
                if s.session is None:
                    s.session = session
            if self._cursor_session != session:
                self._cursor, self._cursor_session = None, session
            now = time.time()
            new: list[TaskEvent] = []
            ring: list[TaskEvent] | None = None
            dropped = 0
            if any(s.events for s in subs):
                full = any(s.events and s.needs_backfill for s in subs)
                new, ring, dropped = self._fetch_events(full)
            nodes = state.node_stats() if any(s.nodes for s in subs) else None
            self.ticks += 1
            updated = 0
            for s in subs:
                backfill = s.events and s.needs_backfill
                if s.events:
                    s.needs_backfill = False
                update = FeedUpdate(
                    time=now,
                    events=(ring if backfill and ring is not None else new) if s.events else (),
                    dropped=dropped,
                    nodes=nodes if s.nodes else None,
                    backfill=backfill,
                )
                if self._deliver(s, update):
                    updated += 1
            return updated

    def _deliver(self, sub: Subscription, update: FeedUpdate) -> bool:
        try:
            sub.callback(update)
        except Exception:  # noqa: BLE001 - one broken widget must not stop the others
            log.warning(
                "nbcluster widget feed: a subscriber failed; unsubscribing it", exc_info=True
            )
            self.unsubscribe(sub)
            return False
        return True

    def _drop(self, subs: list[Subscription]) -> None:
        """Tell subscribers of a connection that is gone, then forget them."""
        for s in subs:
            self.unsubscribe(s)
            try:
                s.callback(FeedUpdate(time=time.time(), connected=False))
            except Exception:  # noqa: BLE001 - it is being dropped anyway
                log.debug("nbcluster widget feed: disconnect notice failed", exc_info=True)

    def _fetch_events(self, full: bool) -> tuple[list[TaskEvent], list[TaskEvent] | None, int]:
        """(events after the cursor, the whole ring if it was fetched, dropped count)."""
        # Ask for a little more than last time's news (at least 64, at most ``batch``).
        guess = min(self._batch, max(64, 2 * self._last_new))
        limit = 0 if full or self._cursor is None else guess
        while True:
            events, dropped = state.task_events(limit=limit)
            start = self._after_cursor(events)
            if start is None and limit and len(events) >= limit:
                limit = limit * 8 if limit * 8 < 1_000_000 else 0
                continue
            new = events[start or 0 :]
            self._last_new = len(new)
            if events:
                self._cursor = event_key(events[-1])
            return new, (events if limit == 0 else None), dropped

    def _after_cursor(self, events: list[TaskEvent]) -> int | None:
        """Index just after the cursor event in ``events`` (None if it is not there)."""
        if self._cursor is None:
            return None
        for i in range(len(events) - 1, -1, -1):
            if event_key(events[i]) == self._cursor:
                return i + 1
        return None


_default: Feed | None = None
_default_lock = threading.Lock()


def default_feed() -> Feed:
    """The kernel's feed, created on first use (one per process)."""
    global _default
    with _default_lock:
        if _default is None:
            _default = Feed()
        return _default
