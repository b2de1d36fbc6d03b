"""HeadState: node liveness with a fake clock, jobs, function table, KV and task events."""

from __future__ import annotations

import pytest

from nbcluster._runtime.head.state import HeadState, JobRecord, NodeDied, NodeRecord
from nbcluster._runtime.protocol.rpc import pb

TIMEOUT = 30.0


def make_node(node_id: bytes, now: float = 0.0, **kw: object) -> NodeRecord:
    fields: dict[str, object] = {
        "node_id": node_id,
        "node_name": node_id.decode(),
        "address": f"{node_id.decode()}:7000",
        "hostname": "host",
        "store_dir": "/dev/shm/x",
        "total": {"CPU": 4.0},
        "available": {"CPU": 4.0},
        "store_capacity": 1 << 30,
        "pid": 123,
        "start_time": now,
        "last_heartbeat": now,
    }
    fields.update(kw)
    return NodeRecord(**fields)  # type: ignore[arg-type]


def make_job(job_id: bytes, now: float = 0.0) -> JobRecord:
    return JobRecord(job_id, "127.0.0.1:5000", 42, "default", "python nb.ipynb", now)


@pytest.fixture
def head() -> HeadState:
    return HeadState(node_death_timeout_s=TIMEOUT, task_events_capacity=5)


# --------------------------------------------------------------------------- nodes


def test_register_and_live_nodes_in_registration_order(head: HeadState) -> None:
    head.register_node(make_node(b"n2"))
    head.register_node(make_node(b"n1"))
    assert [n.node_id for n in head.live_nodes()] == [b"n2", b"n1"]
    assert head.nodes[b"n1"].alive is True
    assert head.nodes[b"n1"].death_reason == ""


def test_heartbeat_updates_the_record(head: HeadState) -> None:
    head.register_node(make_node(b"n1"))
    available = {"CPU": 1.5, "GPU": 0.0}
    ok = head.heartbeat(
        b"n1",
        now=7.0,
        available=available,
        store_used=100,
        num_workers=3,
        store_spilled=50,
        pending_leases=2,
    )
    assert ok is True
    n = head.nodes[b"n1"]
    assert n.last_heartbeat == 7.0
    assert n.available == {"CPU": 1.5, "GPU": 0.0}
    assert n.available is not available  # copied, not aliased
    assert (n.store_used, n.store_spilled, n.num_workers, n.pending_leases) == (100, 50, 3, 2)


def test_tick_keeps_nodes_alive_within_the_timeout(head: HeadState) -> None:
    head.register_node(make_node(b"n1", now=100.0))
    assert head.tick(100.0 + TIMEOUT) == []  # exactly at the timeout: still alive
    assert head.nodes[b"n1"].alive


def test_tick_declares_a_silent_node_dead_with_a_reason(head: HeadState) -> None:
    head.register_node(make_node(b"n1", now=0.0))
    head.register_node(make_node(b"n2", now=0.0))
    assert head.heartbeat(b"n2", 20.0, {"CPU": 4.0}, 0, 1)

    died = head.tick(31.5)
    assert died == [NodeDied(b"n1", "no heartbeat for 31.5s (timeout 30.0s)")]
    assert head.nodes[b"n1"].alive is False
    assert head.nodes[b"n1"].death_reason == "no heartbeat for 31.5s (timeout 30.0s)"
    assert [n.node_id for n in head.live_nodes()] == [b"n2"]

    # A dead node is reported once, not at every tick.
    assert head.tick(40.0) == []
    assert head.tick(50.5) == [NodeDied(b"n2", "no heartbeat for 30.5s (timeout 30.0s)")]
    assert head.live_nodes() == []


def test_heartbeat_keeps_a_node_alive(head: HeadState) -> None:
    head.register_node(make_node(b"n1", now=0.0))
    for t in range(10, 200, 10):
        assert head.heartbeat(b"n1", float(t), {"CPU": 4.0}, 0, 1)
        assert head.tick(float(t) + 25.0) == []
    assert head.nodes[b"n1"].alive


def test_heartbeat_from_dead_node_is_fenced(head: HeadState) -> None:
    head.register_node(make_node(b"n1", now=0.0))
    head.tick(60.0)
    assert head.heartbeat(b"n1", 61.0, {"CPU": 0.0}, 999, 9) is False
    n = head.nodes[b"n1"]
    assert n.alive is False
    assert (n.last_heartbeat, n.available, n.store_used) == (0.0, {"CPU": 4.0}, 0)
    # It re-joins under a fresh id.
    head.register_node(make_node(b"n1-again", now=61.0))
    assert head.heartbeat(b"n1-again", 62.0, {"CPU": 4.0}, 0, 1) is True
    assert [n.node_id for n in head.live_nodes()] == [b"n1-again"]


def test_heartbeat_from_unknown_node_is_fenced(head: HeadState) -> None:
    assert head.heartbeat(b"never-registered", 1.0, {"CPU": 4.0}, 0, 1) is False
    assert head.nodes == {}


def test_unregister_node(head: HeadState) -> None:
    head.register_node(make_node(b"n1"))
    assert head.unregister_node(b"n1", "shutdown requested") == NodeDied(
        b"n1", "shutdown requested"
    )
    assert head.nodes[b"n1"].alive is False
    assert head.nodes[b"n1"].death_reason == "shutdown requested"
    assert head.live_nodes() == []
    # Second time, unknown node, and the tick afterwards: nothing more to report.
    assert head.unregister_node(b"n1", "again") is None
    assert head.nodes[b"n1"].death_reason == "shutdown requested"
    assert head.unregister_node(b"ghost", "x") is None
    assert head.tick(1000.0) == []
    assert head.heartbeat(b"n1", 1.0, {}, 0, 0) is False


def test_unregister_after_timeout_reports_nothing(head: HeadState) -> None:
    head.register_node(make_node(b"n1"))
    [died] = head.tick(TIMEOUT + 1)
    assert head.unregister_node(b"n1", "late goodbye") is None
    assert head.nodes[b"n1"].death_reason == died.reason


# --------------------------------------------------------------------------- jobs


def test_register_and_finish_job(head: HeadState) -> None:
    job = make_job(b"j1", now=5.0)
    head.register_job(job)
    assert head.jobs == {b"j1": job}
    assert job.alive and job.end_time == 0.0

    finished = head.finish_job(b"j1", now=12.5)
    assert finished is job
    assert (job.alive, job.end_time) == (False, 12.5)
    # Finishing twice keeps the first end time; unknown jobs are ignored.
    assert head.finish_job(b"j1", now=99.0) is None
    assert job.end_time == 12.5
    assert head.finish_job(b"ghost", now=1.0) is None


# --------------------------------------------------------------------------- functions


def test_export_function_dedups_by_id(head: HeadState) -> None:
    assert head.export_function(b"h1", "mod.f", b"payload-1") is True
    assert head.export_function(b"h1", "mod.f", b"payload-other") is False
    assert head.functions[b"h1"] == ("mod.f", b"payload-1")  # first export wins
    assert head.export_function(b"h2", "mod.g", b"payload-2") is True
    assert len(head.functions) == 2


# --------------------------------------------------------------------------- KV


def test_kv_put_get_and_overwrite(head: HeadState) -> None:
    assert head.kv_get("ns", b"k") is None
    assert head.kv_put("ns", b"k", b"v1", overwrite=False) is True
    assert head.kv_get("ns", b"k") == b"v1"

    assert head.kv_put("ns", b"k", b"v2", overwrite=False) is False
    assert head.kv_get("ns", b"k") == b"v1"  # not overwritten

    assert head.kv_put("ns", b"k", b"v3", overwrite=True) is False  # replaced, not added
    assert head.kv_get("ns", b"k") == b"v3"

    assert head.kv_put("ns", b"new", b"x", overwrite=True) is True


def test_kv_namespaces_are_separate(head: HeadState) -> None:
    head.kv_put("a", b"k", b"in-a", overwrite=False)
    assert head.kv_get("b", b"k") is None
    assert head.kv_put("b", b"k", b"in-b", overwrite=False) is True
    assert (head.kv_get("a", b"k"), head.kv_get("b", b"k")) == (b"in-a", b"in-b")
    assert head.kv_del("a", b"k") == [b"k"]
    assert head.kv_get("b", b"k") == b"in-b"


def test_kv_del_single_key(head: HeadState) -> None:
    head.kv_put("ns", b"job:1", b"x", overwrite=False)
    head.kv_put("ns", b"job:10", b"y", overwrite=False)
    assert head.kv_del("ns", b"job:1") == [b"job:1"]  # exact key only
    assert head.kv_get("ns", b"job:10") == b"y"
    assert head.kv_del("ns", b"job:1") == []
    assert head.kv_del("ns", b"missing") == []


def test_kv_del_prefix(head: HeadState) -> None:
    for key in (b"job:1", b"job:2", b"jobs", b"actor:1"):
        head.kv_put("ns", key, b"v", overwrite=False)
    head.kv_put("other", b"job:3", b"v", overwrite=False)
    assert sorted(head.kv_del("ns", b"job:", prefix=True)) == [b"job:1", b"job:2"]
    assert head.kv_keys("ns", b"") == [b"actor:1", b"jobs"]
    assert head.kv_keys("other", b"") == [b"job:3"]
    assert head.kv_del("ns", b"zzz", prefix=True) == []


def test_kv_keys_sorted_by_prefix(head: HeadState) -> None:
    for key in (b"b:2", b"a:1", b"b:1", b"c"):
        head.kv_put("ns", key, b"", overwrite=False)
    head.kv_put("other", b"b:9", b"", overwrite=False)
    assert head.kv_keys("ns", b"b:") == [b"b:1", b"b:2"]
    assert head.kv_keys("ns", b"") == [b"a:1", b"b:1", b"b:2", b"c"]
    assert head.kv_keys("ns", b"zz") == []
    assert head.kv_keys("empty", b"") == []


# --------------------------------------------------------------------------- task events


def _finished(numbers: range) -> list[pb.TaskEvent]:
    return [pb.TaskEvent(task_id=b"t", attempt=i, state="FINISHED") for i in numbers]


def test_task_events_ring_is_bounded_and_counts_drops(head: HeadState) -> None:
    head.add_task_events(_finished(range(3)))
    assert [e.attempt for e in head.task_events] == [0, 1, 2]
    assert head.dropped_events == 0
    head.add_task_events(iter(_finished(range(3, 5))))  # exactly full
    assert head.dropped_events == 0
    head.add_task_events(_finished(range(5, 12)))
    assert [e.attempt for e in head.task_events] == [7, 8, 9, 10, 11]  # oldest dropped first
    assert head.dropped_events == 7
    head.add_task_events([])
    assert head.dropped_events == 7


def test_default_task_events_capacity() -> None:
    h = HeadState(1.0)
    assert h.task_events.maxlen == 100_000


# --------------------------------------------------------------------------- head restart


def test_a_restored_node_gets_no_work_until_it_shows_up(head: HeadState) -> None:
    head.restore_node(make_node(b"n1", now=0.0), now=100.0)
    assert head.live_nodes() == []  # unconfirmed: nothing is placed on it
    assert head.nodes[b"n1"].alive  # but not dead yet
    assert head.heartbeat(b"n1", now=101.0, available={"CPU": 4.0}, store_used=0, num_workers=0)
    assert [n.node_id for n in head.live_nodes()] == [b"n1"]
    assert head.tick(now=101.0 + TIMEOUT / 2) == []


def test_a_restored_node_that_stays_silent_is_declared_dead(head: HeadState) -> None:
    head.restore_node(make_node(b"n1", now=0.0), now=100.0)
    head.restore_node(make_node(b"n2", now=0.0), now=100.0)
    head.heartbeat(b"n2", now=110.0, available={"CPU": 4.0}, store_used=0, num_workers=0)
    # The death timeout counts from the restart, not from the last heartbeat before it.
    assert head.tick(now=100.0 + TIMEOUT - 1) == []
    died = head.tick(now=100.0 + TIMEOUT + 1)
    assert [d.node_id for d in died] == [b"n1"]
    assert "after the head restarted" in died[0].reason
    assert head.nodes[b"n1"].alive is False
    assert [n.node_id for n in head.live_nodes()] == [b"n2"]


def test_a_restored_dead_node_stays_dead(head: HeadState) -> None:
    head.restore_node(make_node(b"n1", alive=False, death_reason="gone"), now=100.0)
    assert head.tick(now=1000.0) == []
    assert head.nodes[b"n1"].death_reason == "gone"
    assert not head.heartbeat(b"n1", now=1001.0, available={}, store_used=0, num_workers=0)


def test_a_restored_node_that_registers_again_is_confirmed(head: HeadState) -> None:
    head.restore_node(make_node(b"n1"), now=100.0)
    head.register_node(make_node(b"n1", now=101.0))
    assert [n.node_id for n in head.live_nodes()] == [b"n1"]
