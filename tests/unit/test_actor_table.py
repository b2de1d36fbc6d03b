"""ActorTable: the head's actor state machine, driven by events with no I/O.

Every test feeds events (register, placed, created, worker_died, ...) and checks both the
record and the instructions the table hands back (Place, StopWorker, Changed).
"""

from __future__ import annotations

import pytest

from nbcluster._runtime.head.actors import (
    ALIVE,
    DEAD,
    PENDING,
    RESTARTING,
    ActorRecord,
    ActorTable,
    Changed,
    NameTakenError,
    Place,
    StopWorker,
    Verify,
)

NODE_ID, NODE_ADDR = b"node-1", "127.0.0.1:7001"
OWNER, OTHER_OWNER = "127.0.0.1:5000", "127.0.0.1:5001"
JOB, OTHER_JOB = b"job-1", b"job-2"


def make(
    actor_id: bytes,
    *,
    name: str = "",
    namespace: str = "ns",
    max_restarts: int = 0,
    detached: bool = False,
    owner: str = OWNER,
    job: bytes = JOB,
) -> ActorRecord:
    return ActorRecord(
        actor_id=actor_id,
        spec=None,
        resources={"CPU": 1.0},
        name=name,
        namespace=namespace,
        class_name="Counter",
        detached=detached,
        max_restarts=max_restarts,
        owner_address=owner,
        job_id=job,
    )


def place(
    table: ActorTable, actor_id: bytes, worker: bytes, node: bytes = NODE_ID, addr: str = NODE_ADDR
) -> list:
    return table.placed(
        actor_id,
        node_id=node,
        node_address=addr,
        worker_id=worker,
        worker_pid=1000 + worker[-1],
        lease_id=b"lease-" + worker,
        address=f"127.0.0.1:{9000 + worker[-1]}",
    )


def alive(table: ActorTable, actor_id: bytes, worker: bytes, **kw: object) -> ActorRecord:
    """Register, place on ``worker`` and create: an ALIVE actor."""
    table.register(make(actor_id, **kw))  # type: ignore[arg-type]
    assert place(table, actor_id, worker) == []
    table.created(actor_id, now=1.0)
    rec = table.actors[actor_id]
    assert rec.state == ALIVE
    return rec


@pytest.fixture
def table() -> ActorTable:
    return ActorTable()


# --------------------------------------------------------------------------- registration


def test_register_places_the_actor_and_announces_it(table: ActorTable) -> None:
    rec, existed, ins = table.register(make(b"a1"))
    assert existed is False
    assert rec.state == PENDING and rec.version == 1
    assert ins == [Place(b"a1"), Changed(b"a1")]
    assert table.actors[b"a1"] is rec


def test_names_are_per_namespace_and_lookup_finds_them(table: ActorTable) -> None:
    a, _, _ = table.register(make(b"a1", name="svc", namespace="ns1"))
    b, _, _ = table.register(make(b"a2", name="svc", namespace="ns2"))
    assert table.lookup("svc", "ns1") is a
    assert table.lookup("svc", "ns2") is b
    assert table.lookup("svc", "other") is None
    assert table.lookup("nope", "ns1") is None
    # unnamed actors take no name
    table.register(make(b"a3"))
    assert ("ns1", "") not in table.names and ("ns", "") not in table.names


def test_a_taken_name_raises_name_taken_error(table: ActorTable) -> None:
    table.register(make(b"a1", name="svc"))
    with pytest.raises(NameTakenError, match=r"'svc' already exists in namespace 'ns'") as info:
        table.register(make(b"a2", name="svc"))
    assert isinstance(info.value, ValueError)
    assert "get_if_exists=True" in str(info.value)
    assert b"a2" not in table.actors
    assert table.lookup("svc", "ns").actor_id == b"a1"  # type: ignore[union-attr]


def test_get_if_exists_returns_the_live_actor_without_instructions(table: ActorTable) -> None:
    first, _, _ = table.register(make(b"a1", name="svc"))
    rec, existed, ins = table.register(make(b"a2", name="svc"), get_if_exists=True)
    assert rec is first and existed is True and ins == []
    assert b"a2" not in table.actors


def test_get_if_exists_creates_when_the_name_is_free(table: ActorTable) -> None:
    rec, existed, ins = table.register(make(b"a1", name="svc"), get_if_exists=True)
    assert rec.actor_id == b"a1" and existed is False
    assert Place(b"a1") in ins


@pytest.mark.parametrize(
    "how",
    ["killed", "init_failed", "died", "owner_gone", "node_died"],
)
def test_dead_actors_free_their_names(table: ActorTable, how: str) -> None:
    alive(table, b"a1", b"w1", name="svc")
    if how == "killed":
        table.kill(b"a1", True, "killed", now=2.0)
    elif how == "init_failed":
        table.init_failed(b"a1", b"err", now=2.0)
    elif how == "died":
        table.worker_died(b"w1", "SIGKILL", now=2.0)
    elif how == "owner_gone":
        table.owner_gone(owner_address=OWNER, now=2.0)
    else:
        table.node_died(NODE_ID, "heartbeats stopped", now=2.0)
    assert table.actors[b"a1"].state == DEAD
    assert table.lookup("svc", "ns") is None
    # The name can be taken again, without get_if_exists, and get_if_exists does not
    # hand back the dead one.
    rec, existed, _ = table.register(make(b"a2", name="svc"), get_if_exists=True)
    assert rec.actor_id == b"a2" and existed is False
    assert table.lookup("svc", "ns").actor_id == b"a2"  # type: ignore[union-attr]


# --------------------------------------------------------------------------- creation


def test_placed_records_where_the_actor_lives(table: ActorTable) -> None:
    table.register(make(b"a1"))
    assert place(table, b"a1", b"w1") == []
    rec = table.actors[b"a1"]
    assert rec.state == PENDING  # not ALIVE until __init__ returns
    assert (rec.node_id, rec.node_address, rec.worker_id) == (NODE_ID, NODE_ADDR, b"w1")
    assert rec.worker_pid == 1000 + ord("1") and rec.lease_id == b"lease-w1"
    assert rec.address == f"127.0.0.1:{9000 + ord('1')}"


def test_created_makes_the_actor_alive_and_bumps_the_version(table: ActorTable) -> None:
    table.register(make(b"a1"))
    place(table, b"a1", b"w1")
    v = table.actors[b"a1"].version
    assert table.created(b"a1", now=5.0) == [Changed(b"a1")]
    rec = table.actors[b"a1"]
    assert rec.state == ALIVE and rec.version == v + 1 and rec.start_time == 5.0


def test_unknown_actor_ids_are_ignored(table: ActorTable) -> None:
    assert table.created(b"zz", now=1.0) == []
    assert table.init_failed(b"zz", b"err", now=1.0) == []
    assert place(table, b"zz", b"w1") == []
    assert table.kill(b"zz", True, "x", now=1.0) == []
    assert table.worker_died(b"w-unknown", "x", now=1.0) == []
    assert table.node_died(b"n-unknown", "x", now=1.0) == []
    assert table.owner_gone(owner_address="nobody", now=1.0) == []


def test_init_failed_kills_the_actor_for_good_even_with_restarts_left(table: ActorTable) -> None:
    table.register(make(b"a1", max_restarts=5, name="svc"))
    place(table, b"a1", b"w1")
    ins = table.init_failed(b"a1", b"<pickled TaskError>", now=3.0)
    assert StopWorker(NODE_ADDR, b"w1") in ins and Changed(b"a1") in ins
    assert not any(isinstance(i, Place) for i in ins)  # Ray's rule: no restart
    rec = table.actors[b"a1"]
    assert rec.state == DEAD and rec.death_kind == "init_failed"
    assert rec.init_error == b"<pickled TaskError>"
    assert "creation task" in rec.death_cause
    assert rec.num_restarts == 0 and rec.end_time == 3.0


def test_an_actor_killed_while_being_placed_stops_its_worker(table: ActorTable) -> None:
    table.register(make(b"a1"))
    assert table.kill(b"a1", True, "killed", now=1.0) == [Changed(b"a1")]  # no worker yet
    assert table.actors[b"a1"].state == DEAD
    assert place(table, b"a1", b"w1") == [StopWorker(NODE_ADDR, b"w1")]
    assert table.actors[b"a1"].state == DEAD


# --------------------------------------------------------------------------- process deaths


def test_worker_died_without_restarts_is_final(table: ActorTable) -> None:
    alive(table, b"a1", b"w1")
    v = table.actors[b"a1"].version
    ins = table.worker_died(b"w1", "killed by SIGKILL", now=4.0)
    assert ins == [Changed(b"a1")]
    rec = table.actors[b"a1"]
    assert rec.state == DEAD and rec.death_kind == "process_died"
    assert "process died" in rec.death_cause and "killed by SIGKILL" in rec.death_cause
    assert rec.version == v + 1 and rec.end_time == 4.0
    assert rec.worker_id == b"" and rec.address == ""
    assert table.worker_died(b"w1", "again", now=5.0) == []  # reported twice: ignored


def test_worker_died_with_restarts_left_restarts_then_dies(table: ActorTable) -> None:
    alive(table, b"a1", b"w1", max_restarts=2)
    ins = table.worker_died(b"w1", "crash 1", now=2.0)
    assert Place(b"a1") in ins and Changed(b"a1") in ins
    rec = table.actors[b"a1"]
    assert rec.state == RESTARTING and rec.num_restarts == 1
    assert rec.worker_id == b"" and rec.address == "" and rec.lease_id == b""
    # The second incarnation
    place(table, b"a1", b"w2")
    table.created(b"a1", now=3.0)
    assert rec.state == ALIVE and rec.start_time == 1.0  # the first start is kept
    table.worker_died(b"w2", "crash 2", now=4.0)
    assert rec.state == RESTARTING and rec.num_restarts == 2
    place(table, b"a1", b"w3")
    table.created(b"a1", now=5.0)
    ins = table.worker_died(b"w3", "crash 3", now=6.0)
    assert not any(isinstance(i, Place) for i in ins)
    assert rec.state == DEAD and rec.num_restarts == 2
    assert "after 2 restart(s)" in rec.death_cause and "crash 3" in rec.death_cause


def test_a_worker_death_finds_its_actor_among_many_and_leaves_no_index_behind(
    table: ActorTable,
) -> None:
    for i in range(50):
        alive(table, b"a%d" % i, b"w%d" % i, max_restarts=1)
    assert table.worker_died(b"task-worker", "idle", now=2.0) == []  # hosted no actor
    ins = table.worker_died(b"w7", "crash", now=2.0)
    assert Place(b"a7") in ins and table.actors[b"a7"].state == RESTARTING
    assert [aid for aid, rec in table.actors.items() if rec.state != ALIVE] == [b"a7"]
    place(table, b"a7", b"w7-again")
    table.created(b"a7", now=3.0)
    assert table.worker_died(b"w7", "late report", now=4.0) == []  # the old worker
    assert table.actors[b"a7"].state == ALIVE
    assert b"w7" not in table.by_worker and table.by_worker[b"w7-again"] == b"a7"


def test_max_restarts_minus_one_restarts_forever(table: ActorTable) -> None:
    alive(table, b"a1", b"w0", max_restarts=-1)
    for i in range(1, 51):
        ins = table.worker_died(b"w%d" % (i - 1), f"crash {i}", now=float(i))
        assert Place(b"a1") in ins
        place(table, b"a1", b"w%d" % i)
        table.created(b"a1", now=float(i))
    rec = table.actors[b"a1"]
    assert rec.state == ALIVE and rec.num_restarts == 50


def test_the_death_of_another_worker_does_not_touch_the_actor(table: ActorTable) -> None:
    alive(table, b"a1", b"w1", max_restarts=1)
    assert table.worker_died(b"w9", "other", now=2.0) == []
    assert table.actors[b"a1"].state == ALIVE and table.actors[b"a1"].num_restarts == 0


def test_a_process_that_dies_during_first_init_counts_as_a_restart(table: ActorTable) -> None:
    table.register(make(b"a1", max_restarts=1))
    place(table, b"a1", b"w1")  # PENDING: __init__ runs
    ins = table.worker_died(b"w1", "died in __init__", now=2.0)
    assert Place(b"a1") in ins
    assert table.actors[b"a1"].state == RESTARTING


def test_a_process_that_dies_during_a_restart_init_restarts_again(table: ActorTable) -> None:
    alive(table, b"a1", b"w1", max_restarts=2)
    table.worker_died(b"w1", "crash 1", now=2.0)
    place(table, b"a1", b"w2")  # the restart's __init__ runs in w2 ...
    ins = table.worker_died(b"w2", "crash in __init__", now=3.0)  # ... and w2 dies
    rec = table.actors[b"a1"]
    assert Place(b"a1") in ins
    assert rec.state == RESTARTING and rec.num_restarts == 2
    place(table, b"a1", b"w3")
    ins = table.worker_died(b"w3", "crash in __init__ again", now=4.0)  # restarts used up
    assert not any(isinstance(i, Place) for i in ins)
    assert rec.state == DEAD and "after 2 restart(s)" in rec.death_cause


def test_node_died_during_a_restart_init_counts_too(table: ActorTable) -> None:
    alive(table, b"a1", b"w1", max_restarts=2)
    table.worker_died(b"w1", "crash 1", now=2.0)
    place(table, b"a1", b"w2")
    ins = table.node_died(NODE_ID, "heartbeats stopped", now=3.0)
    assert Place(b"a1") in ins
    assert table.actors[b"a1"].num_restarts == 2


def test_node_died_loses_every_actor_on_the_node(table: ActorTable) -> None:
    alive(table, b"a1", b"w1")  # no restarts
    alive(table, b"a2", b"w2", max_restarts=1)
    table.register(make(b"a3"))  # elsewhere
    table.placed(
        b"a3",
        node_id=b"node-2",
        node_address="127.0.0.1:7002",
        worker_id=b"w3",
        worker_pid=3,
        lease_id=b"l3",
        address="127.0.0.1:9003",
    )
    table.created(b"a3", now=1.0)
    ins = table.node_died(NODE_ID, "heartbeats stopped", now=9.0)
    assert Place(b"a2") in ins and Place(b"a1") not in ins
    a1, a2, a3 = (table.actors[a] for a in (b"a1", b"a2", b"a3"))
    assert a1.state == DEAD and a1.death_kind == "node_died"
    assert "node died" in a1.death_cause and "heartbeats stopped" in a1.death_cause
    assert a2.state == RESTARTING and a2.num_restarts == 1
    assert a3.state == ALIVE


# --------------------------------------------------------------------------- kill


def test_kill_with_no_restart_is_final_and_stops_the_worker(table: ActorTable) -> None:
    alive(table, b"a1", b"w1", max_restarts=-1, name="svc")
    ins = table.kill(b"a1", True, "it was killed with nbcluster.kill()", now=7.0)
    assert StopWorker(NODE_ADDR, b"w1") in ins and Changed(b"a1") in ins
    assert not any(isinstance(i, Place) for i in ins)
    rec = table.actors[b"a1"]
    assert rec.state == DEAD and rec.death_kind == "killed" and rec.end_time == 7.0
    assert rec.death_cause == "it was killed with nbcluster.kill()"
    # its process's death report that follows changes nothing
    assert table.worker_died(b"w1", "SIGKILL", now=8.0) == []
    assert rec.state == DEAD and rec.death_kind == "killed"
    assert table.kill(b"a1", True, "again", now=9.0) == []


def test_kill_allowing_restart_stops_the_worker_and_its_death_restarts(table: ActorTable) -> None:
    alive(table, b"a1", b"w1", max_restarts=1)
    ins = table.kill(b"a1", False, "killed", now=2.0)
    assert ins == [StopWorker(NODE_ADDR, b"w1")]
    assert table.actors[b"a1"].state == ALIVE  # until the process is gone
    ins = table.worker_died(b"w1", "killed by SIGKILL", now=2.1)
    assert Place(b"a1") in ins
    assert table.actors[b"a1"].state == RESTARTING and table.actors[b"a1"].num_restarts == 1


def test_kill_allowing_restart_without_restarts_left_ends_it(table: ActorTable) -> None:
    alive(table, b"a1", b"w1")  # max_restarts=0
    assert table.kill(b"a1", False, "killed", now=2.0) == [StopWorker(NODE_ADDR, b"w1")]
    table.worker_died(b"w1", "killed by SIGKILL", now=2.1)
    assert table.actors[b"a1"].state == DEAD


# --------------------------------------------------------------------------- owners


def test_owner_gone_by_address_kills_its_non_detached_actors(table: ActorTable) -> None:
    alive(table, b"mine", b"w1", max_restarts=-1)
    alive(table, b"detached", b"w2", detached=True)
    alive(table, b"theirs", b"w3", owner=OTHER_OWNER)
    ins = table.owner_gone(owner_address=OWNER, now=5.0)
    assert StopWorker(NODE_ADDR, b"w1") in ins
    assert StopWorker(NODE_ADDR, b"w2") not in ins and StopWorker(NODE_ADDR, b"w3") not in ins
    assert not any(isinstance(i, Place) for i in ins)  # restarts do not apply
    mine = table.actors[b"mine"]
    assert mine.state == DEAD and mine.death_kind == "owner_died"
    assert "owner" in mine.death_cause
    assert table.actors[b"detached"].state == ALIVE
    assert table.actors[b"theirs"].state == ALIVE


def test_owner_gone_by_job_kills_the_jobs_non_detached_actors(table: ActorTable) -> None:
    alive(table, b"j1", b"w1")
    alive(table, b"j1-child", b"w2", owner="127.0.0.1:6000")  # created by one of j1's workers
    alive(table, b"j1-detached", b"w3", detached=True)
    alive(table, b"j2", b"w4", job=OTHER_JOB, owner=OTHER_OWNER)
    table.owner_gone(job_id=JOB, now=5.0)
    assert table.actors[b"j1"].state == DEAD
    assert table.actors[b"j1-child"].state == DEAD
    assert table.actors[b"j1"].death_kind == "owner_died"
    assert table.actors[b"j1-detached"].state == ALIVE
    assert table.actors[b"j2"].state == ALIVE


def test_at_a_jobs_end_actors_owned_by_its_detached_actors_stay(table: ActorTable) -> None:
    """Ray's ownership: a detached actor's children share its fate, not the job's (a
    detached Tune controller's trial runners go on after the driver that started it)."""
    ctrl = alive(table, b"ctrl", b"w1", detached=True)
    alive(table, b"runner", b"w2", owner=ctrl.address)
    grandchild_owner = table.actors[b"runner"].address
    alive(table, b"grandchild", b"w3", owner=grandchild_owner)
    alive(table, b"plain", b"w4")
    table.owner_gone(job_id=JOB, now=5.0)
    assert table.actors[b"plain"].state == DEAD
    assert table.actors[b"runner"].state == ALIVE
    assert table.actors[b"grandchild"].state == ALIVE
    # ...until their detached owner's process ends
    table.owner_gone(owner_address=ctrl.address, now=6.0)
    assert table.actors[b"runner"].state == DEAD


def test_owner_gone_with_neither_address_nor_job_does_nothing(table: ActorTable) -> None:
    alive(table, b"a1", b"w1")
    assert table.owner_gone(now=1.0) == []
    assert table.actors[b"a1"].state == ALIVE


def test_owner_gone_leaves_dead_actors_alone(table: ActorTable) -> None:
    alive(table, b"a1", b"w1")
    table.kill(b"a1", True, "killed", now=1.0)
    assert table.owner_gone(owner_address=OWNER, now=2.0) == []
    assert table.actors[b"a1"].death_kind == "killed"


def test_every_change_bumps_the_version(table: ActorTable) -> None:
    table.register(make(b"a1", max_restarts=1))
    versions = [table.actors[b"a1"].version]
    place(table, b"a1", b"w1")
    table.created(b"a1", now=1.0)
    versions.append(table.actors[b"a1"].version)
    table.worker_died(b"w1", "x", now=2.0)
    versions.append(table.actors[b"a1"].version)
    place(table, b"a1", b"w2")
    table.created(b"a1", now=3.0)
    versions.append(table.actors[b"a1"].version)
    table.kill(b"a1", True, "killed", now=4.0)
    versions.append(table.actors[b"a1"].version)
    assert versions == sorted(set(versions)), versions


# --------------------------------------------------------------------------- head restart


def _copy(rec: ActorRecord) -> ActorRecord:
    """What the restarted head reads back from its database."""
    import dataclasses

    return dataclasses.replace(rec)


def test_a_restored_alive_actor_is_verified_not_trusted(table: ActorTable) -> None:
    rec = alive(table, b"a1", b"w1", name="n", max_restarts=1)
    fresh = ActorTable()
    ins = fresh.restore(_copy(rec), now=5.0)
    assert ins == [Verify(b"a1", rec.address, b"w1")]
    assert fresh.lookup("n", "ns") is not None  # named actors are found again at once
    # An actor that a1 created (its owner is a1's worker) dies with it.
    child = make(b"c1", owner=rec.address)
    child.state, child.worker_id, child.address = ALIVE, b"w9", "127.0.0.1:9999"
    fresh.restore(child, now=5.0)
    # The worker did not answer: the actor restarts (restarts remain).
    ins = fresh.verify_failed(b"a1", b"w1", "no answer", now=6.0)
    assert Place(b"a1") in ins
    assert fresh.actors[b"a1"].state == RESTARTING
    assert fresh.actors[b"a1"].num_restarts == 1
    assert fresh.actors[b"c1"].state == DEAD
    assert fresh.actors[b"c1"].death_kind == "owner_died"


def test_a_failed_verification_without_restarts_left_kills_the_actor(table: ActorTable) -> None:
    rec = alive(table, b"a1", b"w1")
    fresh = ActorTable()
    fresh.restore(_copy(rec), now=5.0)
    fresh.verify_failed(b"a1", b"w1", "no answer", now=6.0)
    assert fresh.actors[b"a1"].state == DEAD
    assert "no answer" in fresh.actors[b"a1"].death_cause


def test_a_late_verification_after_a_death_report_changes_nothing(table: ActorTable) -> None:
    rec = alive(table, b"a1", b"w1", max_restarts=1)
    fresh = ActorTable()
    fresh.restore(_copy(rec), now=5.0)
    # The node's retried death report arrives first: the actor is restarted.
    assert Place(b"a1") in fresh.worker_died(b"w1", "SIGKILL", now=5.5)
    place(fresh, b"a1", b"w2")
    fresh.created(b"a1", now=5.8)
    # Then the ping of the old worker fails: it must not restart the new instance.
    assert fresh.verify_failed(b"a1", b"w1", "no answer", now=6.0) == []
    assert fresh.actors[b"a1"].state == ALIVE
    assert fresh.actors[b"a1"].num_restarts == 1


def test_restored_pending_actors_are_placed_again_and_a_half_made_one_stopped(
    table: ActorTable,
) -> None:
    table.register(make(b"a1"))
    place(table, b"a1", b"w1")  # leased, __init__ running when the head died
    rec = _copy(table.actors[b"a1"])
    fresh = ActorTable()
    assert fresh.restore(rec, now=5.0) == [StopWorker(NODE_ADDR, b"w1"), Place(b"a1")]
    assert fresh.actors[b"a1"].worker_id == b""


def test_restored_dead_actors_need_nothing_and_free_their_name(table: ActorTable) -> None:
    alive(table, b"a1", b"w1", name="n")
    table.kill(b"a1", True, "killed", now=2.0)
    fresh = ActorTable()
    assert fresh.restore(_copy(table.actors[b"a1"]), now=5.0) == []
    assert fresh.lookup("n", "ns") is None


def test_killing_an_owner_actor_ends_the_actors_it_created_at_once(table: ActorTable) -> None:
    """Ray's owner fate-sharing: the head ends an owner's actors in the same step as the
    owner (not when its process's death report arrives), and theirs in turn."""
    owner = alive(table, b"owner", b"w1")
    alive(table, b"child", b"w2", owner=owner.address, max_restarts=-1)
    alive(table, b"grandchild", b"w3", owner=table.actors[b"child"].address)
    alive(table, b"detached-child", b"w4", owner=owner.address, detached=True)
    ins = table.kill(b"owner", True, "it was killed with nbcluster.kill()", now=3.0)
    for worker in (b"w1", b"w2", b"w3"):
        assert StopWorker(NODE_ADDR, worker) in ins
    assert StopWorker(NODE_ADDR, b"w4") not in ins
    assert not any(isinstance(i, Place) for i in ins)  # owned actors are not restarted
    for aid in (b"child", b"grandchild"):
        rec = table.actors[aid]
        assert rec.state == DEAD and rec.death_kind == "owner_died" and Changed(aid) in ins
    assert table.actors[b"detached-child"].state == ALIVE


def test_an_owner_killed_with_restarts_allowed_still_ends_its_actors(table: ActorTable) -> None:
    owner = alive(table, b"owner", b"w1", max_restarts=1)
    alive(table, b"child", b"w2", owner=owner.address)
    ins = table.kill(b"owner", False, "killed", now=2.0)
    assert StopWorker(NODE_ADDR, b"w1") in ins and StopWorker(NODE_ADDR, b"w2") in ins
    assert table.actors[b"child"].state == DEAD
    assert table.actors[b"owner"].state == ALIVE  # its death report drives the restart


def test_an_actor_that_exits_itself_is_dead_for_good_and_ends_its_own_process(
    table: ActorTable,
) -> None:
    """exit_actor() / sys.exit(0): the worker reports kind "exited" and then exits by
    itself (after its atexit handlers), so the head does not stop it."""
    alive(table, b"a1", b"w1", max_restarts=-1)
    ins = table.kill(b"a1", True, "it exited: exit_actor() was called", now=4.0, kind="exited")
    assert not any(isinstance(i, (StopWorker, Place)) for i in ins) and Changed(b"a1") in ins
    rec = table.actors[b"a1"]
    assert rec.state == DEAD and rec.death_kind == "exited"
    assert table.worker_died(b"w1", "exit code 0", now=5.0) == []  # no restart follows


def test_placement_records_the_workers_task_channel_and_a_restart_replaces_it() -> None:
    """Callers open the actor's task channel from the head's record, without asking the
    worker (core/dormancy.py: it may have closed its gRPC)."""
    from nbcluster._runtime.head.actor_service import actor_info

    table = ActorTable()
    table.register(make(b"a1", max_restarts=1))
    table.placed(
        b"a1", node_id=NODE_ID, node_address=NODE_ADDR, worker_id=b"w1", worker_pid=1,
        lease_id=b"l1", address="127.0.0.1:9001", channel_address="127.0.0.1:8001",
    )  # fmt: skip
    table.created(b"a1", now=1.0)
    assert actor_info(table.actors[b"a1"]).channel_address == "127.0.0.1:8001"
    table.worker_died(b"w1", "crashed", now=2.0)
    assert table.actors[b"a1"].state == RESTARTING
    table.placed(
        b"a1", node_id=NODE_ID, node_address=NODE_ADDR, worker_id=b"w2", worker_pid=2,
        lease_id=b"l2", address="127.0.0.1:9002", channel_address="127.0.0.1:8002",
    )  # fmt: skip
    assert actor_info(table.actors[b"a1"]).channel_address == "127.0.0.1:8002"
