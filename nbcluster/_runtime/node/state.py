"""The node manager's logic as a state machine: resources, worker pool and leases.

Events come in as method calls (a lease request, a worker registering or exiting, a lease
returned, a worker blocking in ``get``); each returns a list of instructions for the
gRPC shell to carry out (grant a lease, redirect a request, start or kill a worker).
No sockets, no processes, no clocks: ``tests/unit/test_node_state.py`` drives it directly.
"""

from __future__ import annotations

import collections
import dataclasses
import enum
from collections.abc import Mapping, Sequence

from nbcluster._runtime.scheduling.policy import (
    EPS,
    Action,
    NodeView,
    bundle_resource_names,
    fits,
    pick_node,
)


class WorkerState(enum.Enum):
    """Life cycle of one worker process."""

    STARTING = "starting"
    IDLE = "idle"
    LEASED = "leased"
    DEAD = "dead"


@dataclasses.dataclass
class WorkerRecord:
    """A worker process of this node."""

    worker_id: bytes
    state: WorkerState = WorkerState.STARTING
    pid: int = 0
    address: str = ""
    channel_address: str = ""  # where it serves task channels (told to its lease holders)
    ctrl_address: str = ""  # its control channel (the head creates an actor there)
    lease_id: bytes | None = None
    blocked: bool = False
    env: str = ""  # runtime_env key ("" = the plain environment); workers are pooled per env


@dataclasses.dataclass
class Lease:
    """A worker granted to one owner for tasks of one resource shape."""

    lease_id: bytes
    worker_id: bytes
    resources: dict[str, float]
    gpu_ids: list[int]
    owner: str
    job_id: bytes
    gpu_share: float = 0.0  # per-id share held when the request was fractional


@dataclasses.dataclass
class PendingLease:
    """A lease request waiting for resources or a worker."""

    request_id: bytes
    resources: dict[str, float]
    owner: str
    job_id: bytes
    lease_id: bytes
    strategy: str = "DEFAULT"
    allow_spill: bool = True
    env: str = ""


@dataclasses.dataclass
class SpillCharge:
    """A request this node spilled to another node, counted against our view of that node
    until a report from it shows the lease (see :meth:`NodeState.update_cluster_view`)."""

    node_id: bytes
    request: dict[str, float]
    stamp: float  # the target's report our view held when we spilled
    base: dict[str, float]  # what that report said was available
    seen: float = 0.0  # the newest report stamp looked at since
    newer: int = 0  # how many newer reports of the target came in since


# -- instructions -------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Grant:
    """Answer ``request_id``: the worker is yours."""

    request_id: bytes
    lease: Lease
    worker: WorkerRecord


@dataclasses.dataclass(frozen=True)
class Redirect:
    """Answer ``request_id`` with SPILLBACK (to ``address``), INFEASIBLE or CANCELLED."""

    request_id: bytes
    status: str
    address: str = ""
    message: str = ""


@dataclasses.dataclass(frozen=True)
class StartWorker:
    """Start a worker process with this id (in runtime_env ``env``; "" = the plain one)."""

    worker_id: bytes
    env: str = ""


@dataclasses.dataclass(frozen=True)
class KillWorker:
    """End this worker process."""

    worker_id: bytes
    reason: str


Instruction = Grant | Redirect | StartWorker | KillWorker


class NodeState:
    """Resources, worker pool and leases of one node."""

    def __init__(
        self,
        node_id: bytes,
        address: str,
        total: Mapping[str, float],
        *,
        prestart: int,
        max_starting: int = 4,
        new_id: collections.abc.Callable[[], bytes] | None = None,
    ) -> None:
        import secrets

        self.node_id = node_id
        self.address = address
        self.total = {k: float(v) for k, v in total.items() if v > 0}
        self.available = dict(self.total)
        # Free share of each GPU by index: whole GPUs go to one lease; fractions share an index.
        self.gpu_free: dict[int, float] = {i: 1.0 for i in range(int(self.total.get("GPU", 0)))}
        self.prestart = prestart
        self.max_starting = max_starting
        self.new_id = new_id or (lambda: secrets.token_bytes(16))
        self.workers: dict[bytes, WorkerRecord] = {}
        self.idle: collections.deque[bytes] = collections.deque()
        self.leases: dict[bytes, Lease] = {}
        self.pending: dict[bytes, PendingLease] = {}
        self.others: list[NodeView] = []  # the head's view of the other nodes, less spills
        self.reported: dict[bytes, NodeView] = {}  # that view as the head sent it
        self.spills: list[SpillCharge] = []  # spills the head's view may not show yet
        self.bundles: dict[tuple[bytes, int], tuple[dict[str, float], bool]] = {}

    # -- views ------------------------------------------------------------------------------
    def view(self) -> NodeView:
        """This node as the scheduler sees it."""
        return NodeView(self.node_id, self.address, self.total, self.available)

    def update_cluster_view(self, nodes: Sequence[NodeView]) -> list[Instruction]:
        """New view of the other nodes (from the head's heartbeat reply).

        The view is only as new as each node's last report to the head, so it may not show
        the leases our own recent spills took there yet: each spill stays counted against
        its target until a newer report of the target shows it was taken (its free
        resources dropped by at least the spilled amounts since the report we spilled on)
        or a second newer report came in (a target reports at most once per heartbeat
        interval, so that one was sent after the lease). Without this a view older than
        our spills undid their charges, and the next request was spilled onto a node that
        our earlier spills had already filled, where it waited although another had room.
        """
        fresh = [n for n in nodes if n.node_id != self.node_id]
        self.reported = {n.node_id: n for n in fresh}
        kept: list[SpillCharge] = []
        taken: dict[tuple[bytes, float], dict[str, float]] = {}  # per target and base report
        for spill in self.spills:
            node = self.reported.get(spill.node_id)
            if node is None or not node.alive:
                continue  # gone from the view: nothing to count against
            if node.stamp != spill.seen or not node.stamp:
                spill.seen, spill.newer = node.stamp, spill.newer + 1
            group = taken.setdefault((spill.node_id, spill.stamp), {})
            for k, v in spill.request.items():
                group[k] = group.get(k, 0.0) + v
            if spill.newer >= 2:
                continue
            if spill.newer == 1 and all(
                node.available.get(k, 0.0) <= spill.base.get(k, 0.0) - v + EPS
                for k, v in group.items()
            ):
                continue  # the report shows this spill (and the earlier ones on its base)
            kept.append(spill)
        self.spills = kept
        self.others = [self._less_spills(n) for n in fresh]
        return self._dispatch()

    def _less_spills(self, node: NodeView) -> NodeView:
        """``node`` as reported, less the spills to it that its report may not show yet."""
        charges = [s for s in self.spills if s.node_id == node.node_id]
        if not charges:
            return node
        avail = dict(node.available)
        for spill in charges:
            for k, v in spill.request.items():
                avail[k] = avail.get(k, 0.0) - v
        return dataclasses.replace(node, available=avail)

    def starting_count(self) -> int:
        return sum(1 for w in self.workers.values() if w.state is WorkerState.STARTING)

    # -- events -----------------------------------------------------------------------------
    def start(self) -> list[Instruction]:
        """Fill the pool with ``prestart`` warm workers."""
        return [self._new_worker() for _ in range(self.prestart)]

    def request_lease(
        self,
        request_id: bytes,
        resources: Mapping[str, float],
        owner: str,
        job_id: bytes,
        *,
        strategy: str = "DEFAULT",
        allow_spill: bool = True,
        env: str = "",
    ) -> list[Instruction]:
        """A client asks for a worker with ``resources`` (in runtime_env ``env``)."""
        request = {k: float(v) for k, v in resources.items() if v > 0}
        decision = pick_node(request, self.view(), self.others, strategy, allow_spill)
        if decision.action is Action.INFEASIBLE:
            return [Redirect(request_id, "INFEASIBLE", message=decision.reason)]
        if decision.action is Action.SPILL:
            assert decision.node is not None
            self._charge(decision.node, request)
            return [Redirect(request_id, "SPILLBACK", decision.node.address, decision.reason)]
        self.pending[request_id] = PendingLease(
            request_id, request, owner, job_id, self.new_id(), strategy, allow_spill, env
        )
        return self._dispatch()

    def cancel_request(self, request_id: bytes) -> list[Instruction]:
        """The client gave up on a pending request."""
        if self.pending.pop(request_id, None) is None:
            return []
        return [Redirect(request_id, "CANCELLED")]

    def worker_registered(
        self,
        worker_id: bytes,
        pid: int,
        address: str,
        channel_address: str = "",
        ctrl_address: str = "",
    ) -> list[Instruction]:
        """A started worker is ready to take tasks (``channel_address``: its task channels;
        ``ctrl_address``: its control channel)."""
        w = self.workers.get(worker_id)
        if (
            w is not None
            and w.state is not WorkerState.STARTING
            and (w.pid, w.address) == (pid, address)
        ):
            # The same process asking again: its first reply was lost and the call retried.
            # It is registered already (maybe leased since): nothing changes.
            return []
        if w is None or w.state is not WorkerState.STARTING:
            return [KillWorker(worker_id, "unknown worker registered")]
        w.state, w.pid, w.address = WorkerState.IDLE, pid, address
        w.channel_address, w.ctrl_address = channel_address, ctrl_address
        self.idle.append(worker_id)
        return self._dispatch()

    def worker_exited(self, worker_id: bytes) -> list[Instruction]:
        """A worker process ended (crash, kill, or max_calls)."""
        w = self.workers.get(worker_id)
        if w is None:
            return []
        if w.state is WorkerState.IDLE:
            self.idle.remove(worker_id)
        if w.lease_id is not None:
            self._release(w.lease_id)  # while the record still says whether it was blocked
        del self.workers[worker_id]
        w.state = WorkerState.DEAD
        # Leases this worker held as an owner (of nested tasks) die with it.
        out_owner = self._owner_gone(w.address)
        out: list[Instruction] = out_owner
        if self._pool_size() < self.prestart:
            out.append(self._new_worker())
        return out + self._dispatch()

    def worker_start_failed(self, worker_id: bytes, message: str) -> list[Instruction]:
        """A worker could not be started; for a runtime_env worker its env setup failed.

        Every request waiting for that environment fails with ``message`` (a new request
        tries the setup again: a failed environment is never kept).
        """
        w = self.workers.get(worker_id)
        if w is None or not w.env:
            return self.worker_exited(worker_id)
        for wid, other in list(self.workers.items()):  # the same setup failed for them too
            if other.env == w.env and other.state is WorkerState.STARTING:
                del self.workers[wid]
        out: list[Instruction] = []
        for rid, req in list(self.pending.items()):
            if req.env == w.env:
                del self.pending[rid]
                out.append(Redirect(rid, "RUNTIME_ENV_FAILED", message=message))
        return out + self._dispatch()

    def return_lease(self, lease_id: bytes, worker_failed: bool = False) -> list[Instruction]:
        """The owner is done with a lease; the worker goes back to the pool (or is killed)."""
        lease = self.leases.get(lease_id)
        if lease is None:
            return []
        self._release(lease_id)
        w = self.workers.get(lease.worker_id)
        out: list[Instruction] = []
        if w is not None:
            w.lease_id = None
            w.blocked = False
            if worker_failed:
                out.append(KillWorker(w.worker_id, "returned as failed"))
                w.state = WorkerState.DEAD
                del self.workers[w.worker_id]
                out += self._owner_gone(w.address)  # its exit will find no record later
                if self._pool_size() < self.prestart:
                    out.append(self._new_worker())
            else:
                w.state = WorkerState.IDLE
                self.idle.append(w.worker_id)
        return out + self._dispatch()

    def set_blocked(self, worker_id: bytes, blocked: bool) -> list[Instruction]:
        """A leased worker blocks in ``get`` (its CPUs go back to the pool) or resumes."""
        w = self.workers.get(worker_id)
        if w is None or w.lease_id is None or w.blocked == blocked:
            return []
        lease = self.leases[w.lease_id]
        cpus = lease.resources.get("CPU", 0.0)
        w.blocked = blocked
        if blocked:
            self.available["CPU"] = self.available.get("CPU", 0.0) + cpus
            return self._dispatch()
        self.available["CPU"] = self.available.get("CPU", 0.0) - cpus  # may oversubscribe
        return []

    # -- placement-group bundles (two-phase: prepare, then commit or cancel) -----------------
    def prepare_bundle(self, pg_id: bytes, index: int, resources: Mapping[str, float]) -> bool:
        """Reserve a bundle's resources; False when they are not free now."""
        key = (pg_id, index)
        if key in self.bundles:
            return True
        req = {k: float(v) for k, v in resources.items() if v > 0}
        if not fits(req, self.available):
            return False
        for k, v in req.items():
            self.available[k] = self.available.get(k, 0.0) - v
        self.bundles[key] = (req, False)
        return True

    def prepare_bundles(
        self, pg_id: bytes, bundles: Sequence[tuple[int, Mapping[str, float]]]
    ) -> bool:
        """Reserve several bundles of one group on this node: all of them, or none."""
        fresh = [(i, r) for i, r in bundles if (pg_id, i) not in self.bundles]
        need: dict[str, float] = {}
        for _, resources in fresh:
            for k, v in resources.items():
                if v > 0:
                    need[k] = need.get(k, 0.0) + float(v)
        if not fits(need, self.available):
            return False
        for index, resources in fresh:
            ok = self.prepare_bundle(pg_id, index, resources)
            assert ok, "fits as a whole, so each part fits"
        return True

    def commit_bundles(self, pg_id: bytes, indexes: Sequence[int]) -> list[Instruction]:
        """Commit several prepared bundles of one group."""
        out: list[Instruction] = []
        for index in indexes:
            out += self.commit_bundle(pg_id, index)
        return out

    def cancel_bundles(self, pg_id: bytes, indexes: Sequence[int]) -> list[Instruction]:
        """Release several bundles of one group (prepared or committed)."""
        out: list[Instruction] = []
        for index in indexes:
            out += self.cancel_bundle(pg_id, index)
        return out

    def commit_bundle(self, pg_id: bytes, index: int) -> list[Instruction]:
        """Make a prepared bundle's resources usable under their placement-group names."""
        entry = self.bundles.get((pg_id, index))
        if entry is None or entry[1]:
            return []
        req, _ = entry
        self.bundles[(pg_id, index)] = (req, True)
        for k, v in bundle_resource_names(pg_id.hex(), index, req).items():
            self.total[k] = self.total.get(k, 0.0) + v
            self.available[k] = self.available.get(k, 0.0) + v
        return self._dispatch()

    def cancel_bundle(self, pg_id: bytes, index: int) -> list[Instruction]:
        """Release a prepared or committed bundle; end the work that runs in it."""
        entry = self.bundles.pop((pg_id, index), None)
        if entry is None:
            return []
        req, committed = entry
        out: list[Instruction] = []
        if committed:
            names = bundle_resource_names(pg_id.hex(), index, req)
            for lease in list(self.leases.values()):
                if any(k in names for k in lease.resources):
                    out.append(KillWorker(lease.worker_id, "its placement group was removed"))
            for k, v in names.items():
                self.total[k] = self.total.get(k, 0.0) - v
                self.available[k] = self.available.get(k, 0.0) - v
                if self.total[k] <= EPS:
                    self.total.pop(k, None)
                    self.available.pop(k, None)
            for rid, req_pending in list(self.pending.items()):
                if any(k in names for k in req_pending.resources):
                    del self.pending[rid]
                    out.append(
                        Redirect(rid, "INFEASIBLE", message="its placement group was removed")
                    )
        for k, v in req.items():
            self.available[k] = self.available.get(k, 0.0) + v
        return out + self._dispatch()

    # -- internals ---------------------------------------------------------------------------
    def _pool_size(self, env: str = "") -> int:
        return sum(
            1 for w in self.workers.values() if w.state is not WorkerState.DEAD and w.env == env
        )

    def _new_worker(self, env: str = "") -> StartWorker:
        wid = self.new_id()
        self.workers[wid] = WorkerRecord(wid, env=env)
        return StartWorker(wid, env)

    def _idle_worker(self, env: str) -> bytes | None:
        """The longest-idle worker of runtime_env ``env`` (None if there is none)."""
        for wid in self.idle:
            if self.workers[wid].env == env:
                self.idle.remove(wid)
                return wid
        return None

    def _evict_for(self, env: str) -> list[Instruction]:
        """Make room for a worker of ``env``: end an idle worker of another environment when
        the pool is at its size (one per CPU, at least ``prestart``); other envs' first."""
        cap = max(self.prestart, int(self.total.get("CPU", 0.0) + EPS), 1)
        alive = sum(1 for w in self.workers.values() if w.state is not WorkerState.DEAD)
        if alive < cap:
            return []
        others = [wid for wid in self.idle if self.workers[wid].env != env]
        if not others:
            return []
        victim = next((wid for wid in others if self.workers[wid].env), others[0])
        self.idle.remove(victim)
        w = self.workers.pop(victim)
        w.state = WorkerState.DEAD
        return [KillWorker(victim, "idle worker of another runtime_env evicted")]

    def _release(self, lease_id: bytes) -> None:
        lease = self.leases.pop(lease_id)
        w = self.workers.get(lease.worker_id)
        blocked = w is not None and w.blocked
        for name, amount in lease.resources.items():
            if name == "CPU" and blocked:
                continue  # already given back while blocked
            if name not in self.total:
                continue  # a placement-group resource that was removed meanwhile
            self.available[name] = self.available.get(name, 0.0) + amount
        share = lease.gpu_share or 1.0
        for gid in lease.gpu_ids:
            self.gpu_free[gid] = min(1.0, self.gpu_free.get(gid, 0.0) + share)

    def _owner_gone(self, address: str) -> list[Instruction]:
        """A worker that owned leases or lease requests is gone: release and cancel them."""
        out: list[Instruction] = []
        if not address:
            return out
        for lease in [le for le in self.leases.values() if le.owner == address]:
            out += self.return_lease(lease.lease_id)
        for rid in [r for r, p in self.pending.items() if p.owner == address]:
            del self.pending[rid]  # nobody is left to use what it asked for
            out.append(Redirect(rid, "CANCELLED"))
        return out

    def _charge(self, node: NodeView, request: Mapping[str, float]) -> None:
        """Count a spilled request against our (heartbeat-old) view of that node, so a
        burst of spills is shared among the free nodes instead of piling onto one; it
        stays counted across view updates until a report of that node shows it."""
        for i, other in enumerate(self.others):
            if other.node_id == node.node_id:
                avail = dict(other.available)
                for k, v in request.items():
                    avail[k] = avail.get(k, 0.0) - v
                self.others[i] = dataclasses.replace(other, available=avail)
                report = self.reported.get(other.node_id, other)
                self.spills.append(
                    SpillCharge(
                        other.node_id,
                        dict(request),
                        report.stamp,
                        dict(report.available),
                        seen=report.stamp,
                    )
                )
                return

    def _take_gpus(self, amount: float) -> tuple[list[int], float]:
        """Pick GPU indices: whole GPUs for amounts >= 1, a shared index for a fraction."""
        if amount <= 0:
            return [], 0.0
        if amount < 1.0 - EPS:
            for gid in sorted(self.gpu_free):
                if self.gpu_free[gid] >= amount - EPS:
                    self.gpu_free[gid] -= amount
                    return [gid], amount
            return [], 0.0
        whole = [gid for gid in sorted(self.gpu_free) if self.gpu_free[gid] >= 1.0 - EPS]
        ids = whole[: int(amount + EPS)]
        for gid in ids:
            self.gpu_free[gid] = 0.0
        return ids, 0.0

    def _dispatch(self) -> list[Instruction]:
        """Grant pending requests in arrival order where resources and a worker allow.

        A request that waits for a worker holds its resources back from the requests behind
        it. Once no worker is idle, no other node could take a request, and the requests
        seen already need as many workers as may start at once, the rest of the queue can
        change nothing: the scan stops there, so a burst of N requests (1,000 actors) costs
        O(N) per event, not O(N) per request.
        """
        out: list[Instruction] = []
        need_workers: dict[str, int] = {}  # per runtime_env
        needed = 0
        room = dict(self.available)  # less what requests waiting for a worker hold back
        starting: dict[str, int] = {}  # workers starting, per runtime_env
        for w in self.workers.values():
            if w.state is WorkerState.STARTING:
                starting[w.env] = starting.get(w.env, 0) + 1
        for req in list(self.pending.values()):
            if needed >= self.max_starting and not self.idle and not self.others:
                break
            if not fits(req.resources, room):
                # Could another node take it now? Redirect rather than wait here.
                if self.others and req.allow_spill:
                    decision = pick_node(req.resources, self.view(), self.others, req.strategy)
                    if decision.action is Action.SPILL and decision.node is not None:
                        del self.pending[req.request_id]
                        self._charge(decision.node, req.resources)
                        out.append(
                            Redirect(
                                req.request_id, "SPILLBACK", decision.node.address, decision.reason
                            )
                        )
                continue
            wid = self._idle_worker(req.env) if self.idle else None
            if wid is None:
                need_workers[req.env] = need_workers.get(req.env, 0) + 1
                needed += 1
                for name, amount in req.resources.items():
                    room[name] = room.get(name, 0.0) - amount
                continue
            w = self.workers[wid]
            gpu_ids, share = self._take_gpus(_gpu_amount(req.resources))
            for name, amount in req.resources.items():
                self.available[name] = self.available.get(name, 0.0) - amount
                room[name] = room.get(name, 0.0) - amount
            lease = Lease(req.lease_id, wid, req.resources, gpu_ids, req.owner, req.job_id, share)
            self.leases[lease.lease_id] = lease
            w.state, w.lease_id = WorkerState.LEASED, lease.lease_id
            del self.pending[req.request_id]
            out.append(Grant(req.request_id, lease, w))
        total_starting = sum(starting.values())
        for env, need in need_workers.items():
            have = starting.get(env, 0)
            while need > have and total_starting < self.max_starting:
                out += self._evict_for(env)
                out.append(self._new_worker(env))
                have += 1
                total_starting += 1
        return out


def _gpu_amount(resources: Mapping[str, float]) -> float:
    """GPUs a request needs, also when it draws on a placement-group bundle's GPUs."""
    if resources.get("GPU", 0.0) > 0:
        return resources["GPU"]
    bundle = [v for k, v in resources.items() if k.startswith("GPU_group_")]
    return max(bundle) if bundle else 0.0


class PendingReports:
    """Reports the head must receive (worker and actor deaths): kept until acknowledged.

    The shell sends :meth:`pending` in order; :meth:`acked` drops one, :meth:`failed`
    returns how long to wait before the next try (doubling up to ``max_delay``). The head
    may be restarting, so nothing is ever given up on; only the oldest reports are
    dropped past ``limit`` (a head gone for good).
    """

    def __init__(self, limit: int = 10_000, base_delay: float = 0.05, max_delay: float = 2.0):
        self.limit = limit
        self.base_delay = base_delay
        self.max_delay = max_delay
        self.delay = base_delay
        self.reports: collections.OrderedDict[bytes, object] = collections.OrderedDict()
        self.dropped = 0

    def add(self, key: bytes, report: object) -> None:
        """Queue a report (a newer one for the same key replaces it)."""
        self.reports.pop(key, None)
        self.reports[key] = report
        while len(self.reports) > self.limit:
            self.reports.popitem(last=False)
            self.dropped += 1

    def pending(self) -> list[tuple[bytes, object]]:
        """The reports still to send, oldest first."""
        return list(self.reports.items())

    def acked(self, key: bytes) -> None:
        """The head acknowledged ``key``'s report."""
        self.reports.pop(key, None)
        self.delay = self.base_delay

    def failed(self) -> float:
        """A send failed: the delay before the next attempt."""
        delay = self.delay
        self.delay = min(self.delay * 2, self.max_delay)
        return delay

    def __len__(self) -> int:
        return len(self.reports)
