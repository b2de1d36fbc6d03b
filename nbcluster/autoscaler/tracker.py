"""The autoscaler's memory between decisions: a state machine with no I/O.

:class:`Tracker` keeps what :func:`~nbcluster.autoscaler.policy.decide` needs and cannot
see in one snapshot: which provider instances it launched and when, which of them joined
the cluster (matched by node name = instance id), launches asked of the provider whose
answer is not in yet, back-off after failed launches, nodes being removed, and which
infeasible shapes were already reported. Observations come in as method calls (what the
provider lists, what the head reports, a launch's result) with the time passed in; out
come a :class:`~nbcluster.autoscaler.policy.ClusterState` and :class:`Event` records
for the event stream. ``tests/autoscaler/test_tracker.py`` drives it without processes.

After a restart of the monitor (or of the head) nothing is lost: the provider's instances
carry their node type and launch time as tags, so :meth:`Tracker.observe` adopts them, and
nodes that joined before are matched again as they re-register.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Callable, Mapping, Sequence

from nbcluster.autoscaler.config import ClusterConfig
from nbcluster.autoscaler.policy import (
    Backoff,
    ClusterState,
    Decision,
    NodeStatus,
    ShapeKey,
    format_shape,
)
from nbcluster.autoscaler.providers.base import TAG_LAUNCH_TIME, TAG_NODE_TYPE

__all__ = ["HeadNode", "Instance", "Event", "Tracker"]


@dataclasses.dataclass(frozen=True)
class HeadNode:
    """A live node as the head reports it.

    ``busy`` says why it must not be removed ("" when idle); ``idle_s`` is how long it has
    been idle.
    """

    node_id: str
    name: str
    total: Mapping[str, float]
    available: Mapping[str, float]
    busy: str = ""
    idle_s: float = 0.0


@dataclasses.dataclass(frozen=True)
class Event:
    """One entry of the scaling event stream.

    ``kind`` is one of ``launch``, ``launch-failed``, ``joined``, ``terminate``,
    ``terminate-failed``, ``removed``, ``infeasible``, ``resumed``, ``lost``.
    """

    time: float
    kind: str
    message: str
    node_type: str = ""
    instance_id: str = ""
    count: int = 0
    shape: Mapping[str, float] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class Instance:
    """A node the provider runs for this autoscaler."""

    instance_id: str
    node_type: str
    launched_at: float
    joined_at: float | None = None
    missing_since: float | None = None
    terminating: str = ""


class Tracker:
    """Instances, launches in flight, back-offs and reports (see the module docstring)."""

    def __init__(self, config: ClusterConfig) -> None:
        self.config = config
        self.instances: dict[str, Instance] = {}
        self.in_flight: Counter[str] = Counter()
        self.backoff: dict[str, Backoff] = {}
        self.reported: dict[ShapeKey, float] = {}  # shape -> last time it was in demand
        self.events: list[Event] = []
        self.started = False

    def _event(self, ev: Event) -> None:
        self.events.append(ev)

    def take_events(self) -> list[Event]:
        """Events since the last call (oldest first)."""
        out, self.events = self.events, []
        return out

    # -- observations -------------------------------------------------------------------------
    def observe(
        self,
        now: float,
        listed: Mapping[str, Mapping[str, str]],
        head_nodes: Sequence[HeadNode],
        describe: Callable[[str], str] | None = None,
    ) -> ClusterState:
        """Merge what the provider lists (id -> tags) with the head's live nodes.

        ``describe(id)`` says more about a node that vanished (its exit code, its log)."""
        by_name = {n.name: n for n in head_nodes}
        adopted = 0
        for iid, tags in listed.items():
            if iid in self.instances:
                continue
            ntype = tags.get(TAG_NODE_TYPE, "")
            try:
                launched = float(tags.get(TAG_LAUNCH_TIME, now))
            except ValueError:
                launched = now
            inst = Instance(iid, ntype, launched)
            if iid in by_name:
                inst.joined_at = now
                if self.started:
                    # Launched while we run, and at the head before its launch was recorded
                    # here (a provider whose create returns after the node has joined).
                    self._event(
                        Event(
                            now,
                            "joined",
                            f"node {iid} ({ntype}) joined after {max(0.0, now - launched):.1f}s",
                            ntype,
                            iid,
                        )
                    )
            self.instances[iid] = inst
            adopted += 1
        if adopted and not self.started:
            self._event(
                Event(
                    now,
                    "resumed",
                    f"found {adopted} node(s) launched earlier; managing them again",
                    count=adopted,
                )
            )
        self.started = True
        for iid in list(self.instances):
            inst = self.instances[iid]
            if iid not in listed:
                del self.instances[iid]
                if inst.terminating:
                    self._event(
                        Event(
                            now,
                            "removed",
                            f"node {iid} is gone ({inst.terminating})",
                            inst.node_type,
                            iid,
                        )
                    )
                elif inst.joined_at is None:
                    detail = describe(iid) if describe is not None else iid
                    self._launch_failure(
                        inst.node_type, now, f"node exited before joining the cluster: {detail}"
                    )
                else:
                    self._event(
                        Event(
                            now,
                            "lost",
                            f"node {iid} ended without being removed",
                            inst.node_type,
                            iid,
                        )
                    )
                continue
            head = by_name.get(iid)
            if head is not None:
                inst.missing_since = None
                if inst.joined_at is None:
                    inst.joined_at = now
                    self.backoff.pop(inst.node_type, None)
                    self._event(
                        Event(
                            now,
                            "joined",
                            f"node {iid} ({inst.node_type}) joined after "
                            f"{now - inst.launched_at:.1f}s",
                            inst.node_type,
                            iid,
                        )
                    )
            elif inst.joined_at is not None and inst.missing_since is None:
                inst.missing_since = now
        return self.state(now, head_nodes)

    def state(self, now: float, head_nodes: Sequence[HeadNode]) -> ClusterState:
        """The :class:`ClusterState` for :func:`decide`."""
        by_name = {n.name: n for n in head_nodes}
        nodes: list[NodeStatus] = []
        for iid, inst in self.instances.items():
            t = self.config.available_node_types.get(inst.node_type)
            full = dict(t.resources) if t is not None else {}
            head = by_name.get(iid)
            if inst.terminating:
                nodes.append(NodeStatus(iid, inst.node_type, "draining", full, {}))
            elif head is not None:
                idle_since = None if head.busy else now - head.idle_s
                nodes.append(
                    NodeStatus(
                        iid,
                        inst.node_type,
                        "running",
                        dict(head.total),
                        dict(head.available),
                        busy=head.busy,
                        idle_since=idle_since,
                        launched_at=inst.launched_at,
                    )
                )
            else:
                # Not joined yet, or not seen since the head restarted: it counts as capacity
                # on its way; it is removed only after the launch timeout.
                since = inst.missing_since if inst.missing_since is not None else inst.launched_at
                nodes.append(
                    NodeStatus(iid, inst.node_type, "launching", full, full, launched_at=since)
                )
        for n in head_nodes:
            if n.name not in self.instances:
                nodes.append(
                    NodeStatus(
                        n.node_id,
                        None,
                        "running",
                        dict(n.total),
                        dict(n.available),
                        busy=n.busy or "not launched by the autoscaler",
                    )
                )
        return ClusterState(
            nodes=nodes,
            pending_launches={t: k for t, k in self.in_flight.items() if k > 0},
            backoff={t: b for t, b in self.backoff.items() if b.retry_at > now},
        )

    # -- launches -------------------------------------------------------------------------------
    def launch_started(self, node_type: str, count: int, now: float, reason: str) -> None:
        """``count`` nodes of ``node_type`` were asked of the provider."""
        self.in_flight[node_type] += count
        self._event(
            Event(
                now,
                "launch",
                f"launching {count} x {node_type} for {reason}",
                node_type,
                count=count,
            )
        )

    def launch_done(
        self,
        node_type: str,
        ids: Sequence[str],
        requested: int,
        now: float,
        started_at: float | None = None,
    ) -> None:
        """The provider created ``ids`` (fewer than asked counts as a failure for the rest).

        ``started_at``: when the launch was asked for (a provider may return only once its
        nodes run); the launch timeout and "joined after" count from it."""
        self.in_flight[node_type] -= requested
        for iid in ids:
            if iid not in self.instances:
                self.instances[iid] = Instance(iid, node_type, started_at or now)
        if len(ids) < requested:
            self._launch_failure(
                node_type, now, f"the provider created {len(ids)} of {requested} node(s)"
            )

    def launch_failed(self, node_type: str, requested: int, error: str, now: float) -> None:
        """The provider refused or failed to create nodes."""
        self.in_flight[node_type] -= requested
        self._launch_failure(node_type, now, error)

    def _launch_failure(self, node_type: str, now: float, error: str) -> None:
        old = self.backoff.get(node_type)
        failures = (old.failures if old else 0) + 1
        delay = min(
            self.config.launch_backoff_s * 2 ** (failures - 1), self.config.launch_backoff_max_s
        )
        self.backoff[node_type] = Backoff(failures, now + delay, error)
        self._event(
            Event(
                now,
                "launch-failed",
                f"{node_type}: {error}; failure {failures}, retrying in {delay:.0f}s",
                node_type,
            )
        )

    # -- removals ---------------------------------------------------------------------------------
    def terminate_started(self, instance_id: str, reason: str, now: float) -> None:
        """The node is being drained and removed."""
        inst = self.instances.get(instance_id)
        if inst is None:
            return
        if inst.joined_at is None and inst.missing_since is None:
            self._launch_failure(inst.node_type, now, f"node {instance_id} {reason}")
        inst.terminating = reason
        self._event(
            Event(
                now,
                "terminate",
                f"removing {instance_id} ({inst.node_type}): {reason}",
                inst.node_type,
                instance_id,
            )
        )

    def terminate_failed(self, instance_id: str, error: str, now: float) -> None:
        """The provider could not remove the node: try again on a later tick."""
        inst = self.instances.get(instance_id)
        if inst is not None:
            inst.terminating = ""
        self._event(
            Event(
                now,
                "terminate-failed",
                f"removing {instance_id} failed: {error}",
                inst.node_type if inst else "",
                instance_id,
            )
        )

    # -- reports --------------------------------------------------------------------------------
    def note_decision(self, decision: Decision, now: float, forget_after_s: float = 60.0) -> None:
        """Report each infeasible shape once, not again while it stays in demand (or comes
        back within ``forget_after_s``)."""
        for inf in decision.infeasible:
            seen = inf.shape in self.reported
            self.reported[inf.shape] = now
            if seen:
                continue
            self._event(
                Event(
                    now,
                    "infeasible",
                    f"{inf.count} request(s) for {format_shape(inf.shape)}: {inf.message}",
                    count=inf.count,
                    shape=dict(inf.shape),
                )
            )
        for shape, last in list(self.reported.items()):
            if now - last > forget_after_s:
                del self.reported[shape]

    def counts(self) -> dict[str, tuple[int, int]]:
        """Per node type: (running, launching) nodes, launches in flight included."""
        out: dict[str, list[int]] = {}
        for inst in self.instances.values():
            if inst.terminating:
                continue
            row = out.setdefault(inst.node_type, [0, 0])
            row[0 if inst.joined_at is not None and inst.missing_since is None else 1] += 1
        for t, k in self.in_flight.items():
            if k > 0:
                out.setdefault(t, [0, 0])[1] += k
        return {t: (r[0], r[1]) for t, r in out.items()}
