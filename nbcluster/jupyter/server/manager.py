"""``ClusterManager``: the clusters the sidebar shows, and the ones it owns.

Three kinds of entries make up the list:

- clusters started from the panel: :class:`~nbcluster.LocalCluster` objects held here,
  with ``detached=False``, so they end with the server process even when it is killed
  (the parent-death watch of ``LocalCluster``); :meth:`ClusterManager.shutdown` stops
  them gracefully when the server stops;
- clusters found on this host: live session directories under the nbcluster temp dir,
  started by a kernel of this server (``origin="kernel"``) or by any other process
  (``"host"``); the panel shows them and gives their connect code but does not scale or
  stop them, because their owner would not know;
- addresses the user added: only listed and given a connect code. Without a token on
  this host the server never contacts them (no request to a user-given address).

Every method may block (starting processes, reading files, one status RPC): the HTTP
handlers call them on :attr:`ClusterManager.executor`, never on the event loop.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from nbcluster.cluster import LocalCluster
from nbcluster.exceptions import NbclusterError
from nbcluster.jupyter.server import sessions, status
from nbcluster.jupyter.server.models import (
    ClusterModel,
    ConnectCodeModel,
    Limits,
    LoadModel,
    Origin,
    connect_code,
    valid_address,
)

__all__ = [
    "ClusterManager",
    "ClusterManagerError",
    "ClusterNotFound",
    "LimitReached",
    "NotOwned",
    "OperationFailed",
]


class ClusterManagerError(Exception):
    """Base of the errors the handlers turn into HTTP statuses; the message is for users."""


class ClusterNotFound(ClusterManagerError):
    """No cluster with this id (404)."""


class NotOwned(ClusterManagerError):
    """The operation needs a cluster started from this panel (409)."""


class LimitReached(ClusterManagerError):
    """Too many clusters started from the panel (409)."""


class OperationFailed(ClusterManagerError):
    """Starting, scaling or stopping failed, or the head did not answer (503)."""


def cluster_id_for(key: str) -> str:
    """The stable id of a session directory (``session:<path>``) or address (``address:<a>``)."""
    return hashlib.sha256(key.encode()).hexdigest()[:12]


@dataclass
class _Owned:
    """A cluster started from the panel."""

    id: str
    cluster: LocalCluster
    num_cpus: int
    lock: threading.Lock = field(default_factory=threading.Lock)


@dataclass(frozen=True)
class _Entry:
    """One row of the list, before it becomes a :class:`ClusterModel`."""

    id: str
    origin: Origin
    address: str
    session: sessions.Session | None
    owned: _Owned | None = None
    kernel_id: str | None = None

    def model(self) -> ClusterModel:
        s = self.session
        return ClusterModel(
            id=self.id,
            address=self.address,
            origin=self.origin,
            nodes=s.nodes if s is not None else None,
            num_cpus=self.owned.num_cpus if self.owned is not None else None,
            session_dir=str(s.session_dir) if s is not None else None,
            kernel_id=self.kernel_id,
            owner_pid=s.owner_pid if s is not None else None,
            can_scale=self.owned is not None,
            can_stop=self.owned is not None,
            can_forget=self.origin == "address",
        )


class ClusterManager:
    """The clusters of one Jupyter server. Thread-safe; see the module docstring."""

    def __init__(
        self,
        temp_dir: str,
        *,
        limits: Limits | None = None,
        max_clusters: int = 8,
        status_reader: status.StatusReader | None = None,
        start_timeout: float = 60.0,
    ) -> None:
        self.temp_dir = temp_dir
        self.limits = limits or Limits()
        self.max_clusters = max_clusters
        self.start_timeout = start_timeout
        self._status_reader = status_reader
        self._lock = threading.Lock()
        self._owned: dict[str, _Owned] = {}
        self._starting = 0
        #: Clusters being started from the panel: their sessions may be live already.
        self._launching: list[LocalCluster] = []
        self._added: dict[str, str] = {}  # id -> address
        self._closed = False
        #: Where the handlers run the blocking calls (owned, shut down by :meth:`shutdown`).
        self.executor = ThreadPoolExecutor(max_workers=4, thread_name_prefix="nbcluster-server")

    # -- the list ------------------------------------------------------------------------
    def _entries(self, kernel_pids: Mapping[int, str]) -> list[_Entry]:
        with self._lock:
            owned = {str(o.cluster.session_dir): o for o in self._owned.values()}
            launching = {str(c.session_dir) for c in self._launching if c.session_dir is not None}
            added = dict(self._added)
        entries: list[_Entry] = []
        seen_addresses: set[str] = set()
        for s in sessions.live_sessions(self.temp_dir):
            o = owned.get(str(s.session_dir))
            kernel_id = kernel_pids.get(s.owner_pid) if s.owner_pid is not None else None
            panel = o is not None or str(s.session_dir) in launching
            origin: Origin = "panel" if panel else "kernel" if kernel_id else "host"
            entries.append(
                _Entry(
                    id=cluster_id_for(f"session:{s.session_dir}"),
                    origin=origin,
                    address=s.address,
                    session=s,
                    owned=o,
                    kernel_id=kernel_id,
                )
            )
            seen_addresses.add(s.address)
        for cid, address in added.items():
            if address not in seen_addresses:
                entries.append(_Entry(id=cid, origin="address", address=address, session=None))
        return entries

    def _find(self, cluster_id: str, kernel_pids: Mapping[int, str]) -> _Entry:
        for e in self._entries(kernel_pids):
            if e.id == cluster_id:
                return e
        with self._lock:
            added = self._added.get(cluster_id)
        if added is not None:  # an added address that is also a live session here
            return _Entry(id=cluster_id, origin="address", address=added, session=None)
        raise ClusterNotFound("no cluster with this id; GET /nbcluster/api/clusters lists them")

    def list(self, kernel_pids: Mapping[int, str] | None = None) -> list[ClusterModel]:
        """Every cluster: started here, found on this host, and added addresses."""
        return [e.model() for e in self._entries(kernel_pids or {})]

    def get(self, cluster_id: str, kernel_pids: Mapping[int, str] | None = None) -> ClusterModel:
        """One cluster by id (:class:`ClusterNotFound` when there is none)."""
        return self._find(cluster_id, kernel_pids or {}).model()

    # -- owned clusters --------------------------------------------------------------------
    def start(self, num_cpus: int, nodes: int) -> ClusterModel:
        """Start a cluster of ``nodes`` node managers with ``num_cpus`` CPUs each."""
        with self._lock:
            if self._closed:
                raise OperationFailed("the server is shutting down")
            if len(self._owned) + self._starting >= self.max_clusters:
                raise LimitReached(
                    f"this server already runs {self.max_clusters} clusters started from the "
                    "panel; stop one first (or raise NbclusterServerApp.max_clusters)"
                )
            self._starting += 1
        cluster: LocalCluster | None = None
        try:
            cluster = LocalCluster(num_cpus=num_cpus, nodes=nodes, temp_dir=self.temp_dir)
            with self._lock:
                self._launching.append(cluster)  # listed as the panel's once its session is
            try:
                cluster.start(timeout=self.start_timeout)
            except (RuntimeError, TimeoutError, OSError) as err:
                raise OperationFailed(f"the cluster did not start: {err}") from None
            owned = _Owned(
                id=cluster_id_for(f"session:{cluster.session_dir}"),
                cluster=cluster,
                num_cpus=num_cpus,
            )
            with self._lock:
                closed = self._closed
                if not closed:
                    self._owned[owned.id] = owned
        finally:
            with self._lock:
                self._starting -= 1
                self._launching = [c for c in self._launching if c is not cluster]
        if closed:
            cluster.stop()
            raise OperationFailed("the server is shutting down")
        return self._model_of(owned)

    def _model_of(self, owned: _Owned) -> ClusterModel:
        assert owned.cluster.session_dir is not None
        s = sessions.read_session(owned.cluster.session_dir)
        return _Entry(
            id=owned.id, origin="panel", address=owned.cluster.address, session=s, owned=owned
        ).model()

    def _owned_or_raise(self, cluster_id: str, what: str) -> _Owned:
        with self._lock:
            owned = self._owned.get(cluster_id)
        if owned is not None:
            return owned
        entry = self._find(cluster_id, {})  # raises ClusterNotFound for unknown ids
        if entry.origin == "address":
            raise NotOwned(f"cannot {what} a cluster that was only added by its address")
        owner = entry.session.owner_pid if entry.session is not None else None
        raise NotOwned(
            f"cannot {what} this cluster: it was started by another process"
            + (f" (PID {owner})" if owner else "")
            + "; use %cluster scale / %cluster stop in its kernel, or `nbcluster stop`"
        )

    def scale(self, cluster_id: str, nodes: int) -> ClusterModel:
        """Add or remove node managers of a panel cluster until it has ``nodes``."""
        owned = self._owned_or_raise(cluster_id, "scale")
        with owned.lock:
            with self._lock:
                if self._owned.get(cluster_id) is not owned:
                    raise ClusterNotFound("the cluster was stopped")
            try:
                owned.cluster.scale(nodes, timeout=self.start_timeout)
            except (RuntimeError, TimeoutError, OSError, ValueError) as err:
                raise OperationFailed(f"scaling failed: {err}") from None
            return self._model_of(owned)

    def stop(self, cluster_id: str) -> None:
        """Stop a panel cluster, or forget an added address."""
        with self._lock:
            if self._added.pop(cluster_id, None) is not None:
                return
        owned = self._owned_or_raise(cluster_id, "stop")
        with owned.lock:
            with self._lock:
                if self._owned.pop(cluster_id, None) is None:
                    raise ClusterNotFound("the cluster was already stopped")
            owned.cluster.stop()

    # -- added addresses -------------------------------------------------------------------
    def add_address(
        self, address: str, kernel_pids: Mapping[int, str] | None = None
    ) -> ClusterModel:
        """Remember ``address`` (``host:port``); a live cluster here keeps its own entry."""
        if not valid_address(address):
            raise ValueError(f"not a cluster address: {address!r}")
        cid = cluster_id_for(f"address:{address}")
        with self._lock:
            if len(self._added) >= 64 and cid not in self._added:
                raise LimitReached("64 addresses are already listed; remove one first")
            self._added[cid] = address
        for e in self._entries(kernel_pids or {}):
            if e.address == address:
                return e.model()
        return _Entry(id=cid, origin="address", address=address, session=None).model()

    # -- reading ---------------------------------------------------------------------------
    def connect_code(self, cluster_id: str) -> ConnectCodeModel:
        """The ``%cluster connect`` cell for a cluster."""
        entry = self._find(cluster_id, {})
        return ConnectCodeModel(
            cluster_id=entry.id, address=entry.address, code=connect_code(entry.address)
        )

    def load(self, cluster_id: str) -> LoadModel:
        """The cluster's load, read from its head (see :mod:`.status`)."""
        entry = self._find(cluster_id, {})
        if entry.session is None:  # an added address: no token here, never contacted
            return status.unknown_load(entry.id, entry.address)
        try:
            return status.read_load(
                entry.id, entry.address, entry.session.token_file, reader=self._status_reader
            )
        except (ConnectionError, TimeoutError, OSError, NbclusterError) as err:
            raise OperationFailed(f"the head at {entry.address} did not answer: {err}") from None

    def head_of(self, cluster_id: str) -> tuple[str, str]:
        """(head address, token file) of a cluster this server can talk to (issue 17: jobs).

        :class:`ClusterNotFound` for an unknown id; :class:`NotOwned` for an added address
        (no token on this host: such a cluster is never contacted).
        """
        entry = self._find(cluster_id, {})
        if entry.session is None:
            raise NotOwned(
                "this cluster was added by its address: without its token on this host the "
                "server does not contact it"
            )
        return entry.address, str(entry.session.token_file)

    # -- shutdown --------------------------------------------------------------------------
    def shutdown(self) -> None:
        """Stop every cluster started from the panel and the worker threads (idempotent)."""
        with self._lock:
            self._closed = True
            owned = list(self._owned.values())
            self._owned.clear()
        for o in owned:
            with o.lock:
                o.cluster.stop()
        self.executor.shutdown(wait=False, cancel_futures=True)

    def owned_clusters(self) -> dict[str, LocalCluster]:
        """The clusters started from the panel, by id (for tests and diagnostics)."""
        with self._lock:
            return {cid: o.cluster for cid, o in self._owned.items()}
