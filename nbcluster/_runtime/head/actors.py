"""The head's actor table as a state machine: events in, instructions out, no I/O.

An actor is PENDING while the head places it (leases a worker) and runs ``__init__``,
ALIVE once created, RESTARTING after its process died while restarts remain, and DEAD
for good. Every change bumps ``version`` so callers can long-poll for the next one.
"""

from __future__ import annotations

import dataclasses
from typing import Any

PENDING, ALIVE, RESTARTING, DEAD = 0, 1, 2, 3
#: The states of an actor that a process may host (or be about to).
ACTIVE = (PENDING, ALIVE, RESTARTING)
STATE_NAMES = {PENDING: "PENDING", ALIVE: "ALIVE", RESTARTING: "RESTARTING", DEAD: "DEAD"}


@dataclasses.dataclass
class ActorRecord:
    """Everything the head knows about one actor."""

    actor_id: bytes
    spec: Any  # the creation TaskSpec (opaque payloads)
    resources: dict[str, float]
    name: str
    namespace: str
    class_name: str
    detached: bool
    max_restarts: int
    owner_address: str
    job_id: bytes
    preferred_node: str = ""
    strategy: str = "DEFAULT"
    handle_meta: bytes = b""
    state: int = PENDING
    version: int = 1
    address: str = ""
    channel_address: str = ""  # the hosting worker's task channel (from its lease)
    node_id: bytes = b""
    node_address: str = ""
    worker_id: bytes = b""
    worker_pid: int = 0
    lease_id: bytes = b""
    num_restarts: int = 0
    death_cause: str = ""
    death_kind: str = ""
    init_error: bytes = b""
    start_time: float = 0.0
    end_time: float = 0.0


@dataclasses.dataclass(frozen=True)
class Place:
    """Lease a worker for the actor and run its creation task there."""

    actor_id: bytes


@dataclasses.dataclass(frozen=True)
class StopWorker:
    """Kill the worker that hosts (hosted) an actor."""

    node_address: str
    worker_id: bytes


@dataclasses.dataclass(frozen=True)
class Changed:
    """The actor's record changed: wake long-polls, persist it."""

    actor_id: bytes


@dataclasses.dataclass(frozen=True)
class Verify:
    """Ask the actor's worker whether it is still there (after a head restart)."""

    actor_id: bytes
    address: str
    worker_id: bytes


ActorInstruction = Place | StopWorker | Changed | Verify


class NameTakenError(ValueError):
    """An actor with this name already exists in the namespace."""


class ActorTable:
    """All actors of the cluster, their names and their life cycle."""

    def __init__(self) -> None:
        self.actors: dict[bytes, ActorRecord] = {}
        self.names: dict[tuple[str, str], bytes] = {}
        #: Owner address -> ids of the actors it created (an owner's death touches only
        #: those: a kill or a worker death is not a walk over every actor ever made).
        self.owned: dict[str, list[bytes]] = {}
        #: Worker id -> the actor placed on it (a worker hosts one actor in its life; an
        #: entry is checked against the record when used, and dropped then).
        self.by_worker: dict[bytes, bytes] = {}

    def register(
        self, rec: ActorRecord, get_if_exists: bool = False
    ) -> tuple[ActorRecord, bool, list[ActorInstruction]]:
        """A new actor. Returns (record, existed, instructions)."""
        same = self.actors.get(rec.actor_id)
        if same is not None:  # a retried registration (its reply was lost)
            return same, False, []
        if rec.name:
            key = (rec.namespace, rec.name)
            existing_id = self.names.get(key)
            if existing_id is not None:
                existing = self.actors[existing_id]
                if existing.state != DEAD:
                    if get_if_exists:
                        return existing, True, []
                    raise NameTakenError(
                        f"an actor named {rec.name!r} already exists in namespace {rec.namespace!r}; "
                        "pick another name, kill it first, or pass get_if_exists=True to reuse it"
                    )
            self.names[key] = rec.actor_id
        self._add(rec)
        return rec, False, [Place(rec.actor_id), Changed(rec.actor_id)]

    def _add(self, rec: ActorRecord) -> None:
        if rec.actor_id not in self.actors:
            self.owned.setdefault(rec.owner_address, []).append(rec.actor_id)
        self.actors[rec.actor_id] = rec
        if rec.worker_id:
            self.by_worker[rec.worker_id] = rec.actor_id

    def restore(self, rec: ActorRecord, now: float) -> list[ActorInstruction]:
        """An actor read back from disk after a head restart.

        Its recorded state is not trusted: one that was being placed or restarted is placed
        again, and one recorded ALIVE is verified (its worker may have died while the head
        was away, and the report of that death may be lost).
        """
        self._add(rec)
        if rec.name and rec.state != DEAD:
            self.names[(rec.namespace, rec.name)] = rec.actor_id
        if rec.state in (PENDING, RESTARTING):
            # A worker leased for it before the restart may hold a half-made instance.
            stale: list[ActorInstruction] = (
                [StopWorker(rec.node_address, rec.worker_id)] if rec.worker_id else []
            )
            rec.address, rec.worker_id, rec.lease_id, rec.worker_pid = "", b"", b"", 0
            return [*stale, Place(rec.actor_id)]
        if rec.state == ALIVE:
            if not rec.address or not rec.worker_id:
                return self._lost(
                    rec, "its worker was unknown after a head restart", now, "process_died"
                )
            return [Verify(rec.actor_id, rec.address, rec.worker_id)]
        return []

    def verify_failed(
        self, actor_id: bytes, worker_id: bytes, detail: str, now: float
    ) -> list[ActorInstruction]:
        """The worker of a restored actor did not answer: treat it as dead, like a death
        report would (its actor restarts; actors that worker created die with it)."""
        rec = self.actors.get(actor_id)
        if rec is None or rec.worker_id != worker_id:  # moved on meanwhile (death report)
            return []
        address = rec.address
        out = self.worker_died(worker_id, detail, now)
        return out + self.owner_gone(owner_address=address, now=now)

    def lookup(self, name: str, namespace: str) -> ActorRecord | None:
        """A live (not DEAD) actor by name."""
        aid = self.names.get((namespace, name))
        if aid is None:
            return None
        rec = self.actors.get(aid)
        return rec if rec is not None and rec.state != DEAD else None

    def _bump(self, rec: ActorRecord) -> Changed:
        rec.version += 1
        return Changed(rec.actor_id)

    def placed(
        self,
        actor_id: bytes,
        *,
        node_id: bytes,
        node_address: str,
        worker_id: bytes,
        worker_pid: int,
        lease_id: bytes,
        address: str,
        channel_address: str = "",
    ) -> list[ActorInstruction]:
        """A worker was leased for the actor; its creation task is about to run there."""
        rec = self.actors.get(actor_id)
        if rec is None:
            return []
        if rec.state == DEAD:  # killed while being placed
            return [StopWorker(node_address, worker_id)]
        rec.node_id, rec.node_address, rec.worker_id = node_id, node_address, worker_id
        self.by_worker[worker_id] = actor_id
        rec.worker_pid, rec.lease_id, rec.address = worker_pid, lease_id, address
        rec.channel_address = channel_address
        return []

    def created(self, actor_id: bytes, now: float) -> list[ActorInstruction]:
        """``__init__`` returned: the actor serves calls."""
        rec = self.actors.get(actor_id)
        if rec is None:
            return []
        if rec.state == DEAD:
            return [StopWorker(rec.node_address, rec.worker_id)]
        rec.state = ALIVE
        if not rec.start_time:
            rec.start_time = now
        return [self._bump(rec)]

    def init_failed(self, actor_id: bytes, error: bytes, now: float) -> list[ActorInstruction]:
        """``__init__`` raised: the actor is dead, without restarts (Ray's rule)."""
        rec = self.actors.get(actor_id)
        if rec is None:
            return []
        out: list[ActorInstruction] = (
            [StopWorker(rec.node_address, rec.worker_id)] if rec.worker_id else []
        )
        self._die(
            rec,
            "init_failed",
            "the actor died because of an error raised in its creation task",
            now,
        )
        rec.init_error = error
        return [*out, self._bump(rec)]

    def unschedulable(self, actor_id: bytes, reason: str, now: float) -> list[ActorInstruction]:
        """The actor can never be placed (e.g. hard affinity to a dead node)."""
        rec = self.actors.get(actor_id)
        if rec is None or rec.state == DEAD:
            return []
        self._die(rec, "unschedulable", reason, now)
        return [self._bump(rec)]

    def worker_died(
        self, worker_id: bytes, detail: str, now: float, kind: str = "process_died"
    ) -> list[ActorInstruction]:
        """The process hosting an actor ended: restart it if restarts remain. (Most workers
        that end hosted no actor: this looks up one entry, not every actor.)"""
        actor_id = self.by_worker.pop(worker_id, None)
        rec = self.actors.get(actor_id) if actor_id is not None else None
        if rec is not None and rec.worker_id == worker_id and rec.state in ACTIVE:
            return self._lost(rec, detail, now, kind)
        return []

    def node_died(self, node_id: bytes, detail: str, now: float) -> list[ActorInstruction]:
        """Every actor on a dead node is lost."""
        out: list[ActorInstruction] = []
        for rec in list(self.actors.values()):
            if rec.node_id == node_id and rec.state in (PENDING, ALIVE, RESTARTING):
                out += self._lost(rec, f"its node died ({detail})", now, "node_died")
        return out

    def _lost(self, rec: ActorRecord, detail: str, now: float, kind: str) -> list[ActorInstruction]:
        rec.address, rec.worker_id, rec.lease_id, rec.worker_pid = "", b"", b"", 0
        if rec.max_restarts == -1 or rec.num_restarts < rec.max_restarts:
            rec.num_restarts += 1
            rec.state = RESTARTING
            rec.death_cause = detail
            return [Place(rec.actor_id), self._bump(rec)]
        restarts = f" after {rec.num_restarts} restart(s)" if rec.num_restarts else ""
        self._die(rec, kind, f"the actor's process died{restarts}: {detail}", now)
        return [self._bump(rec)]

    def kill(
        self, actor_id: bytes, no_restart: bool, reason: str, now: float, kind: str = "killed"
    ) -> list[ActorInstruction]:
        """``nbcluster.kill`` (or out of scope / owner gone): stop the process; maybe restart."""
        rec = self.actors.get(actor_id)
        if rec is None or rec.state == DEAD:
            return []
        out: list[ActorInstruction] = []
        if rec.worker_id and kind != "exited":  # an actor that exits itself ends its process
            out.append(StopWorker(rec.node_address, rec.worker_id))
        # Its process ends: the actors it created end with it now (Ray's owner fate-sharing),
        # so a call on their handles made after this kill fails at once.
        owned = self.owner_gone(owner_address=rec.address, now=now) if rec.address else []
        if no_restart:
            self._die(rec, kind, reason, now)
            rec.address, rec.worker_id = "", b""
            return [*out, self._bump(rec), *owned]
        # a kill that allows restarts: the worker death report drives the restart
        return [*out, *owned]

    def owner_gone(
        self, owner_address: str = "", job_id: bytes = b"", now: float = 0.0
    ) -> list[ActorInstruction]:
        """The creator of non-detached actors died (or its job ended): they die too.

        At a job's end, actors created by a live detached actor (or by their children)
        stay: they share their owner's fate, not the job's (Ray's ownership)."""
        out: list[ActorInstruction] = []
        kept = self._detached_owned_addresses() if job_id else set()
        if job_id:
            recs = list(self.actors.values())
        else:
            recs = [self.actors[aid] for aid in self.owned.get(owner_address, ())]
        for rec in recs:
            if rec.detached or rec.state == DEAD:
                continue
            if (owner_address and rec.owner_address == owner_address) or (
                job_id and rec.job_id == job_id and rec.owner_address not in kept
            ):
                out += self.kill(
                    rec.actor_id,
                    True,
                    "the process that created it (its owner) has exited",
                    now,
                    "owner_died",
                )
        return out

    def _detached_owned_addresses(self) -> set[str]:
        """Addresses of live detached actors and of the live actors they own, transitively."""
        live = [r for r in self.actors.values() if r.state != DEAD and r.address]
        kept = {r.address for r in live if r.detached}
        grew = True
        while grew:
            more = {r.address for r in live if r.owner_address in kept} - kept
            grew = bool(more)
            kept |= more
        return kept

    def _die(self, rec: ActorRecord, kind: str, cause: str, now: float) -> None:
        rec.state = DEAD
        rec.death_kind = kind
        rec.death_cause = cause
        rec.end_time = now
