"""``ClusterWatcher``: the clusters and their loads, kept current by the heads' event streams.

The lab extension's status bar and panel long-poll ``GET /nbcluster/api/updates`` (see
:mod:`.handlers`) instead of asking for every cluster's load every few seconds. Behind
that route, the server holds **one event subscription per cluster** on this host
(:func:`nbcluster.state.subscribe_events` with the session's address and token file):
the heads push node changes (resources, queued and running tasks, store use) and
autoscaler news, the watcher folds them into a :class:`~.models.LoadModel` per cluster,
and every change bumps :attr:`ClusterWatcher.version`, which wakes the waiting requests.
An idle cluster pushes nothing, so open browsers cost its head nothing.

The list of clusters comes from the session directories on this host, which only this
server reads (no head is asked): the watcher rescans them every ``scan_interval`` seconds
while someone listens, and at once after a start, scale or stop from the panel
(:meth:`ClusterWatcher.poke`). When nobody has asked for ``idle_after`` seconds, it stops
scanning and closes its subscriptions. Clusters known only by an added address are never
contacted (their load stays unknown).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from nbcluster.jupyter.server import status
from nbcluster.jupyter.server.manager import ClusterManager
from nbcluster.jupyter.server.models import ClusterModel, LoadModel, UpdatesModel

__all__ = ["ClusterWatcher"]

log = logging.getLogger(__name__)


@dataclass
class _Watched:
    """One cluster's subscription and what it pushed."""

    cluster_id: str
    address: str
    token_file: str
    subscription: Any = None
    nodes: dict[str, Any] = field(default_factory=dict)  # node id -> NodeChange
    autoscaler: dict[str, Any] | None = None
    load: LoadModel | None = None
    error: str | None = None


def _autoscaler_info(address: str, token_file: str) -> dict[str, Any] | None:
    """``{"summary", "events"}`` like ``state.cluster_status`` gives, or None (no autoscaler)."""
    from nbcluster import state

    try:
        st = state.autoscaler_status(address, token_file)
    except Exception:  # noqa: BLE001 - the head may be going away; the load stays without it
        return None
    if not st.enabled:
        return None
    events = [{"time": e.time, "kind": e.kind, "message": e.message} for e in st.events[-5:]]
    return {"summary": st.summary(), "events": events}


def head_status(address: str, nodes: Mapping[str, Any], autoscaler: Any) -> dict[str, Any]:
    """A :class:`~.status.HeadStatus` built from pushed ``NodeChange`` events."""
    live = [c for c in nodes.values() if c.node.alive]
    total: dict[str, float] = {}
    available: dict[str, float] = {}
    for c in live:
        for k, v in c.node.total.items():
            total[k] = total.get(k, 0.0) + v
        for k, v in c.node.available.items():
            available[k] = available.get(k, 0.0) + v
    return {
        "address": address,
        "session_dir": "",
        "nodes": [
            {
                "node_id": c.node.node_id,
                "name": c.node.name,
                "address": c.node.address,
                "alive": True,
                "total": dict(c.node.total),
                "available": dict(c.node.available),
                "store_used": c.node.store_used,
                "store_capacity": c.node.store_capacity,
            }
            for c in live
        ],
        "total": total,
        "available": available,
        "store_used": sum(c.node.store_used for c in live),
        "store_capacity": sum(c.node.store_capacity for c in live),
        "num_workers": sum(c.node.num_workers for c in live),
        "actors": 0,
        "pending_leases": sum(c.pending_leases for c in live),
        "running_tasks": sum(c.running_tasks for c in live),
        "autoscaler": autoscaler,
    }


Subscribe = Callable[..., Any]


class ClusterWatcher:
    """Keeps :class:`UpdatesModel` current for the long-poll route (see the module doc).

    ``kernel_pids()``: the server's kernels by PID (to mark clusters a kernel started);
    it is called from the watcher's thread. ``subscribe``: opens an event subscription
    (default :func:`nbcluster.state.subscribe_events`).
    """

    def __init__(
        self,
        manager: ClusterManager,
        kernel_pids: Callable[[], Mapping[int, str]] = dict,
        *,
        scan_interval: float = 2.0,
        idle_after: float = 60.0,
        subscribe: Subscribe | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if subscribe is None:
            from nbcluster import state

            subscribe = state.subscribe_events
        self.manager = manager
        self.kernel_pids = kernel_pids
        self.scan_interval = scan_interval
        self.idle_after = idle_after
        self._subscribe = subscribe
        self._clock = clock
        self._lock = threading.Lock()
        self._watched: dict[str, _Watched] = {}
        self._clusters: list[ClusterModel] = []
        self._scanned = False
        self._version = 0
        self._waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []
        self._last_request = clock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        #: Scans done (tests and the benchmark read it).
        self.scans = 0

    # -- what the route reads ------------------------------------------------------------------
    @property
    def version(self) -> int:
        """Increases with every change of the list or of a load."""
        with self._lock:
            return self._version

    @property
    def subscriptions(self) -> int:
        """Event subscriptions open (one per cluster on this host, while someone listens)."""
        with self._lock:
            return sum(1 for w in self._watched.values() if w.subscription is not None)

    def model(self) -> UpdatesModel:
        """The current list and loads."""
        with self._lock:
            loads = [w.load for w in self._watched.values() if w.load is not None]
            return UpdatesModel(version=self._version, clusters=list(self._clusters), loads=loads)

    async def wait(self, after: int, timeout: float) -> UpdatesModel:
        """The model once ``version > after``, or at ``timeout`` seconds (unchanged then)."""
        self._touch()
        if not self._scanned:
            await asyncio.get_running_loop().run_in_executor(self.manager.executor, self.scan)
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        with self._lock:
            ready = self._version > after
            if not ready:
                self._waiters.append((loop, fut))
        if not ready:
            try:
                await asyncio.wait_for(fut, timeout)
            except TimeoutError:
                pass
            finally:
                with self._lock:
                    self._waiters = [(lp, f) for lp, f in self._waiters if f is not fut]
        self._touch()
        return self.model()

    def poke(self) -> None:
        """Rescan now (the panel started, scaled or stopped a cluster)."""
        self._wake.set()

    def close(self) -> None:
        """Stop the thread and every subscription."""
        self._stop.set()
        self._wake.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(10)
        self._unwatch(list(self._watched))
        with self._lock:
            waiters, self._waiters = self._waiters, []
        for loop, fut in waiters:
            with contextlib.suppress(RuntimeError):  # its loop is closed
                loop.call_soon_threadsafe(_set, fut)

    # -- the thread ----------------------------------------------------------------------------
    def _touch(self) -> None:
        with self._lock:
            self._last_request = self._clock()
            if self._stop.is_set() or (self._thread is not None and self._thread.is_alive()):
                return
            self._thread = threading.Thread(
                target=self._run, name="nbcluster-server-watch", daemon=True
            )
            self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            with self._lock:
                idle = self._clock() - self._last_request > self.idle_after
            if idle:
                break
            try:
                self.scan()
            except Exception:  # noqa: BLE001 - keep watching; the next scan tries again
                log.warning("nbcluster: scanning the clusters failed", exc_info=True)
            self._wake.wait(self.scan_interval)
            self._wake.clear()
        # Nobody listens (or the server stops): no subscriptions stay open.
        self._unwatch(list(self._watched))
        with self._lock:
            self._scanned = False
            if self._thread is threading.current_thread():
                self._thread = None

    def scan(self) -> None:
        """Read the list of clusters; subscribe to new ones, drop vanished ones."""
        self.scans += 1
        clusters = self.manager.list(self.kernel_pids())
        wanted: dict[str, tuple[str, str]] = {}
        for c in clusters:
            if c["session_dir"] is not None and c["origin"] != "address":
                wanted[c["id"]] = (c["address"], f"{c['session_dir']}/token")
        with self._lock:
            gone = [cid for cid in self._watched if cid not in wanted]
            new = [cid for cid in wanted if cid not in self._watched]
            for cid in new:
                address, token_file = wanted[cid]
                self._watched[cid] = _Watched(cid, address, token_file)
            changed = clusters != self._clusters or not self._scanned  # version 0: never read
            self._clusters = clusters
            self._scanned = True
        self._unwatch(gone)
        for cid in new:
            self._watch(cid)
        if changed or gone:
            self._bump()

    def _watch(self, cluster_id: str) -> None:
        with self._lock:
            w = self._watched.get(cluster_id)
        if w is None:
            return
        w.autoscaler = _autoscaler_info(w.address, w.token_file)
        try:
            w.subscription = self._subscribe(
                lambda batch, w=w: self._on_batch(w, batch),
                kinds=("node", "autoscaler"),
                address=w.address,
                token_file=w.token_file,
            )
        except (OSError, ValueError) as err:  # the token file vanished with the cluster
            w.error = str(err)

    def _unwatch(self, cluster_ids: list[str]) -> None:
        for cid in cluster_ids:
            with self._lock:
                w = self._watched.pop(cid, None)
            if w is not None and w.subscription is not None:
                w.subscription.close()

    def _on_batch(self, w: _Watched, batch: Any) -> None:
        """Fold a pushed batch into the cluster's load (on the subscription's thread)."""
        if not batch.connected:
            return  # it resubscribes by itself, with a fresh snapshot
        if batch.snapshot:
            w.nodes = {}
        news = False
        for e in batch.events:
            if e.kind == "node":
                if e.data.change == "died":
                    w.nodes.pop(e.data.node.node_id, None)
                else:
                    w.nodes[e.data.node.node_id] = e.data
            elif e.kind == "autoscaler":
                news = True
        if news:
            w.autoscaler = _autoscaler_info(w.address, w.token_file)
        load = status.load_from_status(w.cluster_id, head_status(w.address, w.nodes, w.autoscaler))
        with self._lock:
            if self._watched.get(w.cluster_id) is not w:
                return
            old, w.load = w.load, load
        if old is None or _without_time(old) != _without_time(load):
            self._bump()

    def _bump(self) -> None:
        with self._lock:
            self._version += 1
            waiters, self._waiters = self._waiters, []
        for loop, fut in waiters:
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(_set, fut)


def _without_time(load: LoadModel) -> dict[str, Any]:
    return {k: v for k, v in load.items() if k != "time"}


def _set(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)
