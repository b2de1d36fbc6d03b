"""The one throttled event feed that every live widget of a kernel listens to.

A :class:`Feed` holds **one subscription to the head's event stream**
(:func:`nbcluster.state.subscribe_events`) while at least one widget is subscribed, and at
most one background thread that hands the widgets what was pushed, a few times a second
at most (``interval`` seconds apart, 0.5 s = 2 Hz by default). The head pushes finished
task attempts and node changes (resources, load, store use) as they happen; nothing is
asked of the head while nothing changes, so an idle notebook with every widget open costs
the head no CPU (``benchmarks/events_bench.py`` compares it with polling).

Each tick gives every subscriber one :class:`FeedUpdate`: the task attempts that
finished since its previous update, and every live node's stats when they changed.
Widgets apply an update in one ``fig.batch_update()``, so the front end gets one message
per figure per tick however many tasks finished. A subscriber that asked for ``ticks``
(a progress bar, the object table: things that read this process's own state) is called
every ``interval`` while subscribed; the others only when something arrived.

A subscriber that joins later first gets the task attempts the head still keeps (its
bounded ring: one ``state.task_events()`` call, ``backfill=True``), without duplicates
of what was pushed meanwhile; so does every subscriber when the stream comes back from a
restarted head (what finished before the stream subscribed to the new head). When the head's stream reports that this feed fell behind
("dropped N"), ``FeedUpdate.dropped`` counts those events.

The thread and the subscription stop when the last subscriber leaves or the driver
disconnects (then every subscriber gets a final update with ``connected=False`` and is
dropped). Subscribers from an earlier connection are dropped the same way after
``shutdown()`` + ``init()``.

Tests drive a feed synchronously: ``Feed(autostart=False)`` never starts the tick thread
(the subscription still receives what the head pushes), and :meth:`Feed.poll_once` runs
one tick in the calling thread.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from nbcluster import state
from nbcluster.state import EventBatch, NodeStats, TaskEvent

__all__ = ["Feed", "FeedUpdate", "Subscription", "default_feed", "event_key"]

log = logging.getLogger(__name__)

#: The fastest a feed may tick (seconds between ticks): "a few times a second at most".
MIN_INTERVAL_S = 0.1
#: How long the thread may sleep while idle before it checks that the driver is connected.
IDLE_CHECK_S = 2.0
#: How long the first subscriber waits for the head's snapshot.
SUBSCRIBE_TIMEOUT_S = 10.0
#: How long pushed events are checked against a backfill (the two travel separately).
BACKFILL_OVERLAP_S = 10.0


@dataclasses.dataclass(frozen=True)
class FeedUpdate:
    """What one tick of the feed hands to one subscriber.

    ``events``: task attempts that finished since this subscriber's previous update
    (with ``backfill``: also every attempt the head still keeps), oldest first; empty
    when the subscriber did not ask for events. ``dropped``: how many task events this
    feed could not show (dropped by the head's ring or by a stream that fell behind).
    ``nodes``: every live node's stats, or None when not asked for or unchanged.
    ``autoscaler``: the autoscaler reported new events or demand (given to subscribers
    that asked for nodes). ``connected``: False in the last update a subscriber gets when the driver went away.
    """

    time: float
    events: Sequence[TaskEvent] = ()
    dropped: int = 0
    nodes: Sequence[NodeStats] | None = None
    backfill: bool = False
    autoscaler: bool = False
    connected: bool = True


Callback = Callable[[FeedUpdate], None]


@dataclasses.dataclass(eq=False)
class Subscription:
    """One subscriber: its callback and what it wants."""

    callback: Callback
    events: bool
    nodes: bool
    ticks: bool
    session: str | None
    needs_backfill: bool = True
    needs_nodes: bool = True
    #: Attempts a backfill gave it, which may still arrive pushed (skipped until the time).
    skip: frozenset[tuple[str, int, float]] = frozenset()
    skip_until: float = 0.0


def event_key(event: TaskEvent) -> tuple[str, int, float]:
    """The identity of one task attempt."""
    return (event.task_id, event.attempt, event.end_time)


def _current_session() -> str | None:
    """The job id of this process's connection, or None when disconnected."""
    if not state.is_connected():
        return None
    try:
        return str(state.session_info()["job_id"])
    except Exception:  # noqa: BLE001 - a shutdown racing with this call: treat as gone
        return None


class _Inbox:
    """What the event stream pushed since the last tick (filled on the stream's thread)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.events: list[TaskEvent] = []
        self.nodes: dict[str, NodeStats] = {}
        self.nodes_changed = False
        self.autoscaler = False
        self.dropped = 0
        self.arrived = threading.Event()
        self.head_id = ""
        #: The stream came back from another head process (a restarted head).
        self.head_changed = False

    def add(self, batch: EventBatch) -> None:
        with self.lock:
            if batch.snapshot:
                self.nodes = {}
                self.nodes_changed = True
                if batch.head_id and self.head_id and batch.head_id != self.head_id:
                    self.head_changed = True
                self.head_id = batch.head_id or self.head_id
            for e in batch.events:
                if e.kind == "task":
                    self.events.append(e.data)
                elif e.kind == "node":
                    change = e.data
                    if change.change == "died" or not change.node.alive:
                        self.nodes.pop(change.node.node_id, None)
                    else:
                        self.nodes[change.node.node_id] = change.node
                    self.nodes_changed = True
                elif e.kind == "autoscaler":
                    self.autoscaler = True
                elif e.kind == "dropped":
                    self.dropped += int(e.data)
        if batch.events or batch.snapshot:
            self.arrived.set()

    def take(self) -> tuple[list[TaskEvent], list[NodeStats] | None, bool, int]:
        with self.lock:
            events, self.events = self.events, []
            nodes = list(self.nodes.values()) if self.nodes_changed else None
            autoscaler, self.autoscaler = self.autoscaler, False
            self.nodes_changed = False
            self.arrived.clear()
            return events, nodes, autoscaler, self.dropped

    def take_head_change(self) -> bool:
        with self.lock:
            changed, self.head_changed = self.head_changed, False
            return changed

    def current_nodes(self) -> list[NodeStats]:
        with self.lock:
            return list(self.nodes.values())


Subscriber = Callable[..., Any]


class Feed:
    """The widgets' view of the head's event stream (see the module docstring).

    ``interval``: seconds between ticks at most (default 0.5 = 2 Hz; at least 0.1).
    ``autostart``: start the tick thread on the first subscription (False in tests,
    which call :meth:`poll_once` instead). ``subscribe``: the function that opens the
    event subscription (default :func:`nbcluster.state.subscribe_events`).
    """

    def __init__(
        self,
        interval: float = 0.5,
        *,
        autostart: bool = True,
        subscribe: Subscriber | None = None,
    ) -> None:
        self._interval = max(float(interval), MIN_INTERVAL_S)
        self._autostart = autostart
        self._subscribe = subscribe or state.subscribe_events
        self._lock = threading.Lock()  # guards _subs, _thread, _stream
        self._poll_lock = threading.Lock()  # one tick at a time (thread or poll_once)
        self._subs: list[Subscription] = []
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._stream: Any = None
        self._stream_session: str | None = None
        self._inbox = _Inbox()
        self._dropped = 0
        #: Ticks that delivered something (tests and the benchmark read it).
        self.ticks = 0
        #: Calls made to the head by this feed other than the stream (backfills).
        self.requests = 0

    # -- configuration ----------------------------------------------------------------------
    @property
    def interval(self) -> float:
        """Seconds between ticks at most."""
        return self._interval

    @interval.setter
    def interval(self, value: float) -> None:
        self._interval = max(float(value), MIN_INTERVAL_S)

    @property
    def running(self) -> bool:
        """True while the tick thread is alive."""
        thread = self._thread
        return thread is not None and thread.is_alive()

    @property
    def subscribed(self) -> bool:
        """True while the feed holds a subscription to the head's event stream."""
        return self._stream is not None

    @property
    def subscribers(self) -> int:
        """How many subscribers the feed has."""
        with self._lock:
            return len(self._subs)

    # -- subscribers ------------------------------------------------------------------------
    def subscribe(
        self,
        callback: Callback,
        *,
        events: bool = True,
        nodes: bool = True,
        ticks: bool | None = None,
    ) -> Subscription:
        """Call ``callback(update)`` when something arrives for it; start the feed if needed.

        ``events``/``nodes`` say what the subscriber needs; ``ticks`` (default: when it
        wants neither) makes it called every ``interval`` as well, for widgets that read
        this process's own state. Callbacks run on the feed thread and must be quick; one
        that raises is logged and unsubscribed.
        """
        want_ticks = (not events and not nodes) if ticks is None else ticks
        sub = Subscription(callback, events, nodes, want_ticks, _current_session())
        with self._lock:
            self._subs.append(sub)
            if self._autostart and (self._thread is None or not self._thread.is_alive()):
                self._stop.clear()
                self._thread = threading.Thread(
                    target=self._run, name="nbcluster-widget-feed", daemon=True
                )
                self._thread.start()
        self._inbox.arrived.set()  # the new subscriber's first update comes at once
        return sub

    def unsubscribe(self, sub: Subscription | Callback) -> None:
        """Stop calling a subscriber (a :class:`Subscription` or its callback); idempotent."""
        with self._lock:
            self._subs = [s for s in self._subs if s is not sub and s.callback != sub]
            last = not self._subs
        if last:
            self._inbox.arrived.set()  # the thread notices and ends the subscription

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the tick thread and the subscription (a new subscription restarts them)."""
        self._stop.set()
        self._inbox.arrived.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)
        self._close_stream()

    # -- the event stream -------------------------------------------------------------------
    def _ensure_stream(self, session: str) -> None:
        with self._lock:
            stream = self._stream
            if stream is not None and self._stream_session == session:
                return
        self._close_stream()
        inbox = _Inbox()
        stream = self._subscribe(inbox.add, kinds=("task", "node", "autoscaler"))
        if not stream.wait_ready(SUBSCRIBE_TIMEOUT_S):
            log.warning(
                "nbcluster widget feed: the head did not answer the event subscription (%s)",
                stream.error or f"no snapshot within {SUBSCRIBE_TIMEOUT_S}s",
            )
        with self._lock:
            self._stream, self._stream_session, self._inbox = stream, session, inbox
            self._dropped = 0
        # Subscribers that waited on the old inbox must see the new one.
        inbox.arrived.set()

    def _close_stream(self) -> None:
        with self._lock:
            stream, self._stream, self._stream_session = self._stream, None, None
        if stream is not None:
            stream.close()

    # -- ticks ------------------------------------------------------------------------------
    def _run(self) -> None:
        failing = False
        last = 0.0
        while not self._stop.is_set():
            with self._lock:
                if not self._subs:
                    self._thread = None
                    break
                ticking = any(s.ticks for s in self._subs)
            inbox = self._inbox
            inbox.arrived.wait(self._interval if ticking else IDLE_CHECK_S)
            if self._stop.is_set():
                break
            wait = last + self._interval - time.monotonic()
            if wait > 0 and self._stop.wait(wait):
                break
            last = time.monotonic()
            try:
                self.poll_once()
                failing = False
            except Exception:  # noqa: BLE001 - keep the feed alive across transient errors
                if _current_session() is not None and not failing:
                    log.warning("nbcluster widget feed: a tick failed; retrying", exc_info=True)
                failing = True
        with self._lock:
            if self._thread is threading.current_thread():
                self._thread = None
            idle = not self._subs
        if idle:
            self._close_stream()

    def poll_once(self) -> int:
        """Run one tick in the calling thread; return how many subscribers were updated."""
        with self._poll_lock:
            with self._lock:
                subs = list(self._subs)
            session = _current_session()
            if not subs or session is None:
                if subs:
                    self._drop(subs)
                self._close_stream()
                return 0
            stale = [s for s in subs if s.session is not None and s.session != session]
            if stale:
                self._drop(stale)
                subs = [s for s in subs if s not in stale]
                if not subs:
                    return 0
            for s in subs:
                if s.session is None:
                    s.session = session
            self._ensure_stream(session)
            if self._inbox.take_head_change():
                # A restarted head: what finished before the stream subscribed to it again
                # is only in its ring (without the subscription it would never be shown).
                for s in subs:
                    s.needs_backfill = True
            ring: list[TaskEvent] | None = None
            ring_dropped = 0
            if any(s.events and s.needs_backfill for s in subs):
                self.requests += 1
                ring, ring_dropped = state.task_events()
            # Taken after the ring was read, so nothing falls between the two.
            new, nodes, autoscaler, stream_dropped = self._inbox.take()
            dropped = self._dropped = max(self._dropped, stream_dropped + ring_dropped)
            now = time.time()
            mono = time.monotonic()
            if ring is not None:
                ring_keys = frozenset(event_key(e) for e in ring)
                ring = ring + [e for e in new if event_key(e) not in ring_keys]
            updated = 0
            for s in subs:
                backfill = s.events and s.needs_backfill
                events: Sequence[TaskEvent] = ()
                if backfill and ring is not None:
                    events = ring
                    s.needs_backfill = False
                    s.skip, s.skip_until = ring_keys, mono + BACKFILL_OVERLAP_S
                elif s.events:
                    events = new
                    if s.skip:
                        if mono < s.skip_until:
                            events = [e for e in new if event_key(e) not in s.skip]
                        else:
                            s.skip = frozenset()
                sub_nodes = None
                if s.nodes and (nodes is not None or s.needs_nodes):
                    sub_nodes = nodes if nodes is not None else self._inbox.current_nodes()
                    s.needs_nodes = False
                news = autoscaler and s.nodes
                if not (events or sub_nodes is not None or backfill or news or s.ticks):
                    continue
                update = FeedUpdate(
                    time=now,
                    events=events,
                    dropped=dropped,
                    nodes=sub_nodes,
                    backfill=backfill,
                    autoscaler=news,
                )
                if self._deliver(s, update):
                    updated += 1
            if updated:
                self.ticks += 1
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


_default: Feed | None = None
_default_lock = threading.Lock()


def default_feed() -> Feed:
    """The kernel's feed, created on first use (one per process)."""
    global _default
    with _default_lock:
        if _default is None:
            _default = Feed()
        return _default
