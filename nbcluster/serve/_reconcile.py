"""The controller's decisions for one deployment, as a state machine with no I/O.

:class:`DeploymentState` holds a deployment's target (code version, replica count,
lightweight config) and its replicas. Events come in as method calls (``on_started``,
``on_start_failed``, ``on_died``, ``on_stopped``, ``on_reconfigured``, ``on_recovered``);
:meth:`DeploymentState.step` returns the instructions that move the replicas towards the
target (:class:`Start`, :class:`Stop`, :class:`Reconfigure`). The controller carries
them out (creates and kills actors) and reports back with events. Time comes in as
``now``; replica ids come from an injected factory. Tests drive it without processes
(``tests/serve/test_reconcile.py``).

Rules (Ray Serve's semantics; DESIGN §9):

- **Versions.** A change of code, constructor arguments or actor options is a new
  *version*: replicas are replaced. A change of ``user_config`` or
  ``max_ongoing_requests`` is a *config version*: running replicas are reconfigured in
  place (Ray's "lightweight update").
- **Rolling update.** New-version replicas start first when the cluster has room for
  them (``spare``, computed by the controller from free resources); an old replica is
  retired (drained, then stopped) each time a new one is running. Without room, one old
  replica is drained first and one new one started in its place, one at a time. Either
  way requests never fail: routers only ever see RUNNING replicas, and a draining
  replica sends back requests that reach it late (the router re-routes them).
- **Failures.** A constructor that raises counts a start failure; after
  ``min(max_constructor_retry_count, 3 × replicas)`` failures of a version that never
  ran, the deployment is DEPLOY_FAILED with the last traceback as its message, and no
  replica of that version is left. Older replicas keep serving. A running replica that
  dies or fails its health check is removed and replaced; the deployment is UNHEALTHY
  until the replacement runs.
- **Scale-down** drains first, preferring replicas still starting, then the newest.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from nbcluster.serve.config import DeploymentConfig
from nbcluster.serve.schema import (
    ApplicationStatus,
    DeploymentStatus,
    DeploymentStatusTrigger,
    ReplicaState,
)

__all__ = [
    "Action",
    "DeploymentState",
    "ReplicaRecord",
    "Reconfigure",
    "Start",
    "Stop",
    "Target",
    "MAX_PER_REPLICA_RETRY_COUNT",
    "app_status",
]

MAX_PER_REPLICA_RETRY_COUNT = 3
#: A new replica still starting after this long, beside old ones, is taken to be waiting
#: for room: one old replica is retired to make it.
STALL_S = 2.0
_ROUTABLE = (ReplicaState.RUNNING, ReplicaState.UPDATING, ReplicaState.RECOVERING)


@dataclasses.dataclass(frozen=True)
class Target:
    """What a deployment should be: code version, config (and its version), replicas."""

    version: str
    config: DeploymentConfig
    config_version: int
    num_replicas: int


@dataclasses.dataclass
class ReplicaRecord:
    """The controller's record of one replica."""

    replica_id: str
    version: str
    state: ReplicaState
    config_version: int
    since: float
    pid: int | None = None
    node_id: str | None = None
    ongoing: float = 0.0
    health_failures: int = 0


@dataclasses.dataclass(frozen=True)
class Start:
    """Create a replica of ``version`` with id ``replica_id``."""

    replica_id: str
    version: str


@dataclasses.dataclass(frozen=True)
class Stop:
    """Stop a replica: drain it first when ``graceful``, else kill it now."""

    replica_id: str
    graceful: bool


@dataclasses.dataclass(frozen=True)
class Reconfigure:
    """Apply the target's lightweight config (``user_config``...) to a running replica."""

    replica_id: str
    config_version: int


Action = Start | Stop | Reconfigure


class DeploymentState:
    """One deployment's target and replicas; see the module docstring."""

    def __init__(self, app: str, name: str, new_id: Callable[[], str]) -> None:
        self.app = app
        self.name = name
        self._new_id = new_id
        self.target: Target | None = None
        self.replicas: dict[str, ReplicaRecord] = {}
        self.deleting = False
        self.start_failures = 0
        self.version_started = False
        self.last_error = ""
        self.unhealthy_reason = ""
        self.trigger = DeploymentStatusTrigger.CONFIG_UPDATE_STARTED
        self.retry_at = 0.0
        self.autoscaled = 0  # +1 / -1 while an autoscaling decision is being carried out

    # -- targets ------------------------------------------------------------------------------
    def set_target(self, target: Target) -> None:
        """A deploy: a new version restarts the failure count; same version only reconfigures."""
        old = self.target
        self.target = target
        self.deleting = False
        self.autoscaled = 0
        if old is None or old.version != target.version:
            self.start_failures = 0
            self.version_started = False
            self.last_error = ""
            self.retry_at = 0.0
            self.trigger = DeploymentStatusTrigger.CONFIG_UPDATE_STARTED
        elif old != target:
            self.trigger = DeploymentStatusTrigger.CONFIG_UPDATE_STARTED

    def scale_to(self, num_replicas: int) -> None:
        """The autoscaler's new replica count (same version and config)."""
        if self.target is None or self.target.num_replicas == num_replicas:
            return
        self.autoscaled = 1 if num_replicas > self.target.num_replicas else -1
        self.target = dataclasses.replace(self.target, num_replicas=num_replicas)
        self.trigger = DeploymentStatusTrigger.AUTOSCALING

    def delete(self) -> None:
        """Stop every replica (draining running ones); the deployment goes when none is left."""
        self.deleting = True
        self.trigger = DeploymentStatusTrigger.DELETING

    @property
    def gone(self) -> bool:
        """Deleted and no replica left."""
        return self.deleting and not self.replicas

    # -- events -------------------------------------------------------------------------------
    def on_started(
        self, replica_id: str, now: float, pid: int | None = None, node_id: str | None = None
    ) -> None:
        """The replica's constructor returned."""
        r = self.replicas.get(replica_id)
        if r is None or r.state != ReplicaState.STARTING:
            return
        r.state = ReplicaState.RUNNING
        r.since = now
        r.pid, r.node_id = pid, node_id
        if self.target is not None and r.version == self.target.version:
            self.version_started = True
            self.start_failures = 0

    def on_start_failed(self, replica_id: str, error: str, now: float) -> None:
        """The constructor raised (the replica's actor is gone)."""
        r = self.replicas.get(replica_id)
        if r is None or r.state != ReplicaState.STARTING:
            return  # stopped while starting: not a failure
        del self.replicas[replica_id]
        if self.target is not None and r.version == self.target.version:
            self.start_failures += 1
            self.last_error = error
            self.trigger = DeploymentStatusTrigger.REPLICA_STARTUP_FAILED
            self.retry_at = now + min(0.05 * 2 ** min(self.start_failures, 6), 2.0)

    def on_died(self, replica_id: str, reason: str) -> None:
        """A running replica crashed or failed its health check: it is replaced."""
        r = self.replicas.get(replica_id)
        if r is None:
            return
        if r.state == ReplicaState.STOPPING:
            return
        r.state = ReplicaState.STOPPING
        self.unhealthy_reason = reason
        self.trigger = DeploymentStatusTrigger.HEALTH_CHECK_FAILED

    def on_stopped(self, replica_id: str) -> None:
        """The replica's actor is gone (after a stop or a death)."""
        self.replicas.pop(replica_id, None)

    def on_reconfigured(self, replica_id: str, config_version: int) -> None:
        """A reconfigure finished."""
        r = self.replicas.get(replica_id)
        if r is not None and r.state == ReplicaState.UPDATING:
            r.state = ReplicaState.RUNNING
            r.config_version = config_version

    def on_recovered(self, replica_id: str, alive: bool, now: float) -> None:
        """After a controller restart: the replica was found alive (or not)."""
        r = self.replicas.get(replica_id)
        if r is None or r.state != ReplicaState.RECOVERING:
            return
        if alive:
            r.state = ReplicaState.RUNNING
            r.since = now
            if self.target is not None and r.version == self.target.version:
                self.version_started = True
        else:
            self.replicas.pop(replica_id, None)

    def adopt(self, record: ReplicaRecord) -> None:
        """A replica listed in the checkpoint, to be confirmed with :meth:`on_recovered`."""
        record.state = ReplicaState.RECOVERING
        self.replicas[record.replica_id] = record

    # -- decisions ----------------------------------------------------------------------------
    @property
    def failed(self) -> bool:
        """True when the target version failed to start too often (DEPLOY_FAILED)."""
        t = self.target
        if t is None or t.num_replicas == 0 or self.version_started:
            return False
        limit = min(
            t.config.max_constructor_retry_count, t.num_replicas * MAX_PER_REPLICA_RETRY_COUNT
        )
        return self.start_failures >= limit

    def has_target_replicas(self) -> bool:
        """True while any replica of the target version exists (in any state, stopping
        included: its actor is not known to be gone yet)."""
        t = self.target
        return t is not None and any(r.version == t.version for r in self.replicas.values())

    def step(self, now: float, spare: int = 1 << 30) -> list[Action]:
        """Instructions that move the replicas towards the target.

        ``spare``: how many more replicas the cluster has room for right now (decides
        between starting new replicas beside old ones and replacing old ones one by one).
        """
        actions: list[Action] = []
        live = [r for r in self.replicas.values() if r.state != ReplicaState.STOPPING]
        t = self.target
        if self.deleting or t is None:
            for r in live:
                actions.append(self._stop(r, now))
            return actions
        new = [r for r in live if r.version == t.version]
        old = sorted(
            (r for r in live if r.version != t.version),
            key=lambda r: (r.state in _ROUTABLE, r.since),
        )  # the first to retire come first: not yet running, then the oldest
        new_running = [r for r in new if r.state in _ROUTABLE]
        starting = [r for r in new if r.state == ReplicaState.STARTING]
        if self.failed:
            for r in starting:  # no replica of the failed version may linger
                actions.append(self._stop(r, now))
            return actions
        missing = t.num_replicas - len(new)
        if missing > 0 and now >= self.retry_at:
            if not old:
                actions += [self._start(t.version, now) for _ in range(missing)]
            else:
                surge = min(missing, max(spare, 0))
                actions += [self._start(t.version, now) for _ in range(surge)]
                if surge == 0 and not starting:
                    # No room to run old and new side by side: replace one old replica.
                    actions.append(self._stop(old.pop(0), now))
                    actions.append(self._start(t.version, now))
        elif missing < 0:
            extra = sorted(new, key=lambda r: (r.state in _ROUTABLE, -r.since))[:-missing]
            for r in extra:
                actions.append(self._stop(r, now))
                if r in new_running:
                    new_running.remove(r)
                if r in starting:
                    starting.remove(r)
        stopping = any(r.state == ReplicaState.STOPPING for r in self.replicas.values())
        if old and starting and not stopping and all(now - r.since > STALL_S for r in starting):
            # The new replicas wait for resources the old ones hold: retire one old replica.
            actions.append(self._stop(old.pop(0), now))
        # Retire old replicas as new ones run (never below the target while both exist).
        keep_old = max(0, t.num_replicas - len(new_running))
        while len(old) > keep_old:
            actions.append(self._stop(old.pop(0), now))
        # Lightweight config changes: reconfigure running replicas in place.
        for r in new_running:
            if r.state == ReplicaState.RUNNING and r.config_version < t.config_version:
                r.state = ReplicaState.UPDATING
                actions.append(Reconfigure(r.replica_id, t.config_version))
        return actions

    def _start(self, version: str, now: float) -> Start:
        rid = self._new_id()
        t = self.target
        assert t is not None
        self.replicas[rid] = ReplicaRecord(
            rid, version, ReplicaState.STARTING, t.config_version, now
        )
        return Start(rid, version)

    def _stop(self, r: ReplicaRecord, now: float) -> Stop:
        graceful = r.state in _ROUTABLE
        r.state = ReplicaState.STOPPING
        r.since = now
        return Stop(r.replica_id, graceful)

    # -- views --------------------------------------------------------------------------------
    def routable(self) -> list[str]:
        """Ids of the replicas routers may send requests to, oldest first."""
        rs = [r for r in self.replicas.values() if r.state in _ROUTABLE]
        return [r.replica_id for r in sorted(rs, key=lambda r: (r.since, r.replica_id))]

    def counts(self) -> dict[ReplicaState, int]:
        """Replicas per state (states with none are left out)."""
        out: dict[ReplicaState, int] = {}
        for r in self.replicas.values():
            out[r.state] = out.get(r.state, 0) + 1
        return out

    def status(self) -> tuple[DeploymentStatus, DeploymentStatusTrigger, str]:
        """Status, trigger and message, Ray's way."""
        t = self.target
        if t is None:
            return DeploymentStatus.UPDATING, self.trigger, "waiting for a target"
        if self.failed:
            return (
                DeploymentStatus.DEPLOY_FAILED,
                DeploymentStatusTrigger.REPLICA_STARTUP_FAILED,
                f"The deployment failed to start {self.start_failures} time(s) in a row. "
                f"Error:\n{self.last_error}",
            )
        live = [r for r in self.replicas.values() if r.state != ReplicaState.STOPPING]
        new_running = [r for r in live if r.version == t.version and r.state in _ROUTABLE]
        done = len(new_running) == t.num_replicas and len(live) == t.num_replicas
        if done and all(r.config_version >= t.config_version for r in new_running):
            self.unhealthy_reason = ""
            if self.trigger == DeploymentStatusTrigger.AUTOSCALING:
                self.trigger = (
                    DeploymentStatusTrigger.UPSCALE_COMPLETED
                    if self.autoscaled > 0
                    else DeploymentStatusTrigger.DOWNSCALE_COMPLETED
                )
                self.autoscaled = 0
            elif self.trigger not in (
                DeploymentStatusTrigger.UPSCALE_COMPLETED,
                DeploymentStatusTrigger.DOWNSCALE_COMPLETED,
            ):
                self.trigger = DeploymentStatusTrigger.CONFIG_UPDATE_COMPLETED
            return DeploymentStatus.HEALTHY, self.trigger, ""
        progress = f"{len(new_running)}/{t.num_replicas} replica(s) of the target version running"
        if self.unhealthy_reason:
            return DeploymentStatus.UNHEALTHY, self.trigger, f"{self.unhealthy_reason}; {progress}"
        if self.start_failures:
            return (
                DeploymentStatus.UPDATING,
                self.trigger,
                f"{progress}; a replica failed to start ({self.start_failures} time(s)), retrying. "
                f"Error:\n{self.last_error}",
            )
        if self.autoscaled:
            kind = (
                DeploymentStatus.UPSCALING if self.autoscaled > 0 else DeploymentStatus.DOWNSCALING
            )
            return kind, self.trigger, progress
        return DeploymentStatus.UPDATING, self.trigger, progress


def app_status(
    statuses: dict[str, tuple[DeploymentStatus, str]], deleting: bool
) -> tuple[ApplicationStatus, str]:
    """An application's status from its deployments' (Ray's precedence)."""
    if deleting:
        return ApplicationStatus.DELETING, "the application is being deleted"
    failed = [(n, m) for n, (s, m) in statuses.items() if s == DeploymentStatus.DEPLOY_FAILED]
    if failed:
        name, message = failed[0]
        return ApplicationStatus.DEPLOY_FAILED, f"Deployment {name!r} failed to deploy: {message}"
    if not statuses or any(s == DeploymentStatus.UPDATING for s, _ in statuses.values()):
        waiting = [n for n, (s, _) in statuses.items() if s == DeploymentStatus.UPDATING]
        return ApplicationStatus.DEPLOYING, (
            f"Deploying: {', '.join(waiting)} updating" if waiting else "Deploying"
        )
    unhealthy = [(n, m) for n, (s, m) in statuses.items() if s == DeploymentStatus.UNHEALTHY]
    if unhealthy:
        name, message = unhealthy[0]
        return ApplicationStatus.UNHEALTHY, f"Deployment {name!r} is unhealthy: {message}"
    return ApplicationStatus.RUNNING, ""
