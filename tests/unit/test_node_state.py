"""NodeState: the node manager's resources, worker pool and leases, driven by events.

Every test feeds events (start, worker_registered, request_lease, return_lease, ...) and
checks the instructions that come out (Grant, Redirect, StartWorker, KillWorker) and the
resulting bookkeeping. No processes, no sockets, no clocks.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence

import pytest

from nbcluster._runtime.node import state as state_mod
from nbcluster._runtime.node.state import (
    Grant,
    Instruction,
    KillWorker,
    NodeState,
    Redirect,
    StartWorker,
    WorkerState,
)
from nbcluster._runtime.scheduling.policy import NodeView

LOCAL_ID = b"local-node"
LOCAL_ADDR = "10.0.0.1:7000"
OWNER = "10.0.0.9:5000"
JOB = b"job-1"


# --------------------------------------------------------------------------- helpers


def free_gpus(ns: NodeState) -> list[int]:
    """Indices of GPUs that are wholly free."""
    return sorted(g for g, share in ns.gpu_free.items() if share >= 1.0)


def counter_ids() -> Callable[[], bytes]:
    """Deterministic ids: b'id001', b'id002', ..."""
    n = itertools.count(1)
    return lambda: f"id{next(n):03d}".encode()


def make_node(
    total: dict[str, float] | None = None, *, prestart: int = 0, max_starting: int = 4
) -> NodeState:
    return NodeState(
        LOCAL_ID,
        LOCAL_ADDR,
        {"CPU": 2} if total is None else total,
        prestart=prestart,
        max_starting=max_starting,
        new_id=counter_ids(),
    )


def starts(out: Sequence[Instruction]) -> list[bytes]:
    return [i.worker_id for i in out if isinstance(i, StartWorker)]


def grants(out: Sequence[Instruction]) -> list[Grant]:
    return [i for i in out if isinstance(i, Grant)]


def register(ns: NodeState, worker_ids: Sequence[bytes]) -> list[Instruction]:
    """Register each started worker; return every instruction that results."""
    out: list[Instruction] = []
    for n, wid in enumerate(worker_ids):
        out += ns.worker_registered(wid, 1000 + n, f"127.0.0.1:{9000 + n}")
    return out


def warm_node(total: dict[str, float] | None = None, *, prestart: int = 2) -> NodeState:
    """A node whose ``prestart`` workers have all registered and are idle."""
    ns = make_node(total, prestart=prestart)
    assert register(ns, starts(ns.start())) == []
    return ns


def ask(ns: NodeState, rid: bytes, **resources: float) -> list[Instruction]:
    return ns.request_lease(rid, resources, OWNER, JOB)


def other(node_id: bytes, total: dict[str, float], available: dict[str, float]) -> NodeView:
    return NodeView(node_id, f"{node_id.decode()}:7000", total, available)


def only_grant(out: Sequence[Instruction]) -> Grant:
    assert len(out) == 1 and isinstance(out[0], Grant), out
    return out[0]


# --------------------------------------------------------------------------- pool


def test_start_prestarts_workers() -> None:
    ns = make_node(prestart=3)
    out = ns.start()
    assert out == [StartWorker(b"id001"), StartWorker(b"id002"), StartWorker(b"id003")]
    assert ns.starting_count() == 3
    assert [w.state for w in ns.workers.values()] == [WorkerState.STARTING] * 3
    assert list(ns.idle) == []


def test_start_with_zero_prestart_starts_nothing() -> None:
    ns = make_node(prestart=0)
    assert ns.start() == []
    assert ns.workers == {}


def test_worker_registered_becomes_idle() -> None:
    ns = make_node(prestart=1)
    ns.start()
    assert ns.worker_registered(b"id001", 4242, "127.0.0.1:9999") == []
    w = ns.workers[b"id001"]
    assert (w.state, w.pid, w.address) == (WorkerState.IDLE, 4242, "127.0.0.1:9999")
    assert list(ns.idle) == [b"id001"]
    assert ns.starting_count() == 0


def test_a_grant_carries_the_workers_task_channel_address() -> None:
    """The owner learns where the leased worker serves task channels from the grant, so it
    never has to ask the worker (which may have closed its gRPC: core/dormancy.py)."""
    ns = make_node(prestart=1)
    ns.start()
    assert ns.worker_registered(b"id001", 7, "127.0.0.1:9999", "127.0.0.1:9998") == []
    grant = only_grant(ask(ns, b"r1", CPU=1))
    assert grant.worker.channel_address == "127.0.0.1:9998"
    assert grant.worker.ctrl_address == ""  # a worker that serves no control channel


def test_a_grant_carries_the_workers_control_channel_address() -> None:
    """The head creates an actor on the worker's control channel, named in the grant."""
    ns = make_node(prestart=1)
    ns.start()
    assert (
        ns.worker_registered(b"id001", 7, "127.0.0.1:9999", "127.0.0.1:9998", "127.0.0.1:9997")
        == []
    )
    grant = only_grant(ask(ns, b"r1", CPU=0))
    assert (grant.worker.channel_address, grant.worker.ctrl_address) == (
        "127.0.0.1:9998",
        "127.0.0.1:9997",
    )


def test_unknown_worker_registration_is_killed() -> None:
    ns = make_node(prestart=1)
    ns.start()
    assert ns.worker_registered(b"ghost", 1, "x:1") == [
        KillWorker(b"ghost", "unknown worker registered")
    ]
    assert b"ghost" not in ns.workers


def test_second_registration_of_same_worker_is_refused() -> None:
    ns = warm_node(prestart=1)
    assert ns.worker_registered(b"id001", 1, "x:1") == [
        KillWorker(b"id001", "unknown worker registered")
    ]
    assert list(ns.idle) == [b"id001"]  # not queued twice


def test_registration_retried_after_a_lost_reply_changes_nothing() -> None:
    # The worker's RegisterWorker is retried when its reply is lost: the same process
    # (pid, address) asks again, maybe after it was leased. It must not be killed (a
    # max_restarts=0 actor placed on it died of SIGKILL under dropped replies).
    ns = warm_node(prestart=1)
    w = ns.workers[b"id001"]
    pid, address = w.pid, w.address
    assert ns.worker_registered(b"id001", pid, address) == []
    assert list(ns.idle) == [b"id001"]  # not queued twice
    g = only_grant(ask(ns, b"r1", CPU=1))
    assert ns.worker_registered(b"id001", pid, address) == []
    assert ns.workers[b"id001"].lease_id == g.lease.lease_id  # still leased, still alive


# --------------------------------------------------------------------------- grants


def test_request_granted_to_idle_worker() -> None:
    ns = warm_node({"CPU": 2}, prestart=2)
    g = only_grant(ask(ns, b"r1", CPU=1))
    assert g.request_id == b"r1"
    assert g.lease.lease_id == b"id003"  # the next id after the two workers
    assert g.lease.worker_id == b"id001"  # first idle worker
    assert g.lease.resources == {"CPU": 1.0}
    assert g.lease.gpu_ids == []
    assert (g.lease.owner, g.lease.job_id) == (OWNER, JOB)
    assert g.worker is ns.workers[b"id001"]
    assert g.worker.state is WorkerState.LEASED
    assert g.worker.lease_id == b"id003"
    assert ns.available == {"CPU": 1.0}
    assert ns.leases == {b"id003": g.lease}
    assert list(ns.idle) == [b"id002"]
    assert ns.pending == {}


def test_view_reflects_leases() -> None:
    ns = warm_node({"CPU": 2, "memory": 100}, prestart=1)
    ask(ns, b"r1", CPU=1, memory=30)
    v = ns.view()
    assert (v.node_id, v.address) == (LOCAL_ID, LOCAL_ADDR)
    assert v.total == {"CPU": 2.0, "memory": 100.0}
    assert v.available == {"CPU": 1.0, "memory": 70.0}


def test_zero_amounts_in_total_are_dropped() -> None:
    ns = make_node({"CPU": 2, "GPU": 0})
    assert ns.total == {"CPU": 2.0}
    assert free_gpus(ns) == []


def test_request_queued_when_busy_then_granted_on_return() -> None:
    ns = warm_node({"CPU": 1}, prestart=2)
    a = only_grant(ask(ns, b"a", CPU=1))
    assert ask(ns, b"b", CPU=1) == []  # an idle worker exists, but no CPU
    assert list(ns.pending) == [b"b"]
    assert ns.available == {"CPU": 0.0}

    g = only_grant(ns.return_lease(a.lease.lease_id))
    assert g.request_id == b"b"
    assert g.lease.worker_id == b"id002"  # idle order: id002 waited longer than id001
    assert ns.workers[b"id001"].state is WorkerState.IDLE
    assert ns.workers[b"id001"].lease_id is None
    assert ns.available == {"CPU": 0.0}
    assert ns.pending == {}


def test_pending_requests_granted_in_arrival_order() -> None:
    ns = warm_node({"CPU": 1}, prestart=1)
    a = only_grant(ask(ns, b"a", CPU=1))
    for rid in (b"b", b"c", b"d"):
        assert ask(ns, rid, CPU=1) == []
    g = only_grant(ns.return_lease(a.lease.lease_id))
    assert g.request_id == b"b"
    assert list(ns.pending) == [b"c", b"d"]


def test_smaller_request_not_blocked_behind_one_that_does_not_fit() -> None:
    ns = warm_node({"CPU": 2}, prestart=2)
    only_grant(ask(ns, b"a", CPU=1))
    assert ask(ns, b"big", CPU=2) == []  # could fit later
    g = only_grant(ask(ns, b"small", CPU=1))
    assert g.request_id == b"small"
    assert list(ns.pending) == [b"big"]


def test_return_unknown_or_already_returned_lease_is_a_noop() -> None:
    ns = warm_node({"CPU": 1}, prestart=1)
    a = only_grant(ask(ns, b"a", CPU=1))
    assert ns.return_lease(b"nope") == []
    assert ns.return_lease(a.lease.lease_id) == []
    assert ns.return_lease(a.lease.lease_id) == []
    assert ns.available == {"CPU": 1.0}
    assert list(ns.idle) == [b"id001"]


# --------------------------------------------------------------------------- starting workers


def test_start_worker_when_request_fits_but_no_idle_worker() -> None:
    ns = make_node({"CPU": 2}, prestart=0)
    assert ask(ns, b"r1", CPU=1) == [StartWorker(b"id002")]  # id001 is the lease id
    assert list(ns.pending) == [b"r1"]
    assert ns.available == {"CPU": 2.0}  # nothing taken until granted
    g = only_grant(ns.worker_registered(b"id002", 7, "127.0.0.1:1"))
    assert (g.request_id, g.lease.lease_id, g.lease.worker_id) == (b"r1", b"id001", b"id002")
    assert ns.available == {"CPU": 1.0}


def test_no_over_start_for_more_requests_than_cpus() -> None:
    ns = make_node({"CPU": 2}, prestart=0)
    started: list[bytes] = []
    for i in range(5):
        out = ask(ns, b"r%d" % i, CPU=1)
        assert grants(out) == []
        started += starts(out)
    assert len(started) == 2
    assert ns.starting_count() == 2
    assert len(ns.pending) == 5

    out = register(ns, started)
    assert [g.request_id for g in grants(out)] == [b"r0", b"r1"]
    assert starts(out) == []
    assert ns.available == {"CPU": 0.0}
    assert list(ns.pending) == [b"r2", b"r3", b"r4"]

    # A returned lease is reused by the next request; still no new workers.
    first = grants(out)[0]
    out = ns.return_lease(first.lease.lease_id)
    assert [g.request_id for g in grants(out)] == [b"r2"]
    assert starts(out) == []
    assert len(ns.workers) == 2


def test_prestarted_workers_count_towards_demand() -> None:
    ns = make_node({"CPU": 2}, prestart=2)
    assert len(ns.start()) == 2
    assert ask(ns, b"a", CPU=1) == []
    assert ask(ns, b"b", CPU=1) == []
    assert ns.starting_count() == 2


def test_max_starting_caps_concurrent_starts() -> None:
    ns = make_node({"CPU": 8}, prestart=0, max_starting=3)
    started: list[bytes] = []
    for i in range(5):
        started += starts(ask(ns, b"r%d" % i, CPU=1))
    assert len(started) == 3
    # One registers: it takes r0, and one more start is allowed (2 starting < 3, need 4).
    out = ns.worker_registered(started[0], 1, "127.0.0.1:1")
    assert [g.request_id for g in grants(out)] == [b"r0"]
    assert len(starts(out)) == 1
    assert ns.starting_count() == 3


def test_a_burst_of_requests_is_granted_in_order_with_a_scan_that_stops_early(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """1,000 zero-CPU requests (actors) on a node with no idle worker: 4 workers start at a
    time, every request is granted in arrival order as workers register, and each event
    scans only the head of the queue (the fit checks grow as N, not as N squared)."""
    checks = 0
    real_fits = state_mod.fits

    def counting_fits(request: Mapping[str, float], resources: Mapping[str, float]) -> bool:
        nonlocal checks
        checks += 1
        return real_fits(request, resources)

    monkeypatch.setattr(state_mod, "fits", counting_fits)
    ns = make_node({"CPU": 2}, prestart=0, max_starting=4)
    n = 1000
    started: list[bytes] = []
    for i in range(n):
        started += starts(ask(ns, b"r%04d" % i, CPU=0))
    assert len(started) == 4 and ns.starting_count() == 4
    granted: list[bytes] = []
    pid = itertools.count(1)
    while started:
        wid = started.pop(0)
        out = ns.worker_registered(wid, next(pid), "127.0.0.1:1")
        granted += [g.request_id for g in grants(out)]
        started += starts(out)
    assert granted == [b"r%04d" % i for i in range(n)]
    assert ns.pending == {} and len(ns.leases) == n
    assert checks < 10 * n, checks  # a full scan per event would be about n * n / 2


def test_a_request_deep_in_a_waiting_queue_still_spills_to_a_node_with_room() -> None:
    """With other nodes in view the scan does not stop early: a request behind many that
    wait for workers, which does not fit here, is redirected."""
    ns = make_node({"CPU": 2}, prestart=0, max_starting=2)
    for i in range(50):
        ask(ns, b"w%02d" % i, CPU=0)
    ns.update_cluster_view([other(b"gpu", {"CPU": 2, "GPU": 1}, {"CPU": 2, "GPU": 1})])
    out = ask(ns, b"g", GPU=1)
    assert [r.request_id for r in out if isinstance(r, Redirect)] == [b"g"]
    assert b"g" not in ns.pending and len(ns.pending) == 50


def test_worker_that_dies_while_starting_is_restarted_for_demand() -> None:
    ns = make_node({"CPU": 1}, prestart=0)
    [wid] = starts(ask(ns, b"r", CPU=1))
    out = ns.worker_exited(wid)
    assert len(starts(out)) == 1 and starts(out) != [wid]
    assert wid not in ns.workers
    assert list(ns.pending) == [b"r"]


# --------------------------------------------------------------------------- worker exits


def test_worker_exited_releases_lease_and_replaces_up_to_prestart() -> None:
    ns = warm_node({"CPU": 1, "memory": 10}, prestart=1)
    a = only_grant(ask(ns, b"a", CPU=1, memory=4))
    assert ask(ns, b"b", CPU=1) == []
    out = ns.worker_exited(b"id001")
    assert out == [StartWorker(b"id004")]  # id002, id003 were the two lease ids
    assert a.lease.lease_id not in ns.leases
    assert b"id001" not in ns.workers
    assert ns.available == {"CPU": 1.0, "memory": 10.0}
    g = only_grant(ns.worker_registered(b"id004", 5, "127.0.0.1:5"))
    assert (g.request_id, g.lease.worker_id) == (b"b", b"id004")


def test_idle_worker_exit_removes_it_from_the_pool() -> None:
    ns = warm_node({"CPU": 2}, prestart=2)
    assert ns.worker_exited(b"id002") == [StartWorker(b"id003")]
    assert list(ns.idle) == [b"id001"]
    g = only_grant(ask(ns, b"a", CPU=1))
    assert g.lease.worker_id == b"id001"


def test_worker_exit_not_replaced_above_prestart() -> None:
    ns = make_node({"CPU": 2}, prestart=0)
    [wid] = starts(ask(ns, b"a", CPU=1))
    only_grant(ns.worker_registered(wid, 1, "x:1"))
    assert ns.worker_exited(wid) == []
    assert ns.workers == {}
    assert ns.available == {"CPU": 2.0}


def test_unknown_worker_exit_is_a_noop() -> None:
    ns = warm_node(prestart=1)
    assert ns.worker_exited(b"ghost") == []
    assert list(ns.workers) == [b"id001"]


def test_return_lease_failed_kills_and_replaces_worker() -> None:
    ns = warm_node({"CPU": 1}, prestart=1)
    a = only_grant(ask(ns, b"a", CPU=1))
    out = ns.return_lease(a.lease.lease_id, worker_failed=True)
    assert out == [KillWorker(b"id001", "returned as failed"), StartWorker(b"id003")]
    assert b"id001" not in ns.workers
    assert list(ns.idle) == []
    assert ns.leases == {}
    assert ns.available == {"CPU": 1.0}
    # The exit report that follows the kill changes nothing.
    assert ns.worker_exited(b"id001") == []
    assert list(ns.workers) == [b"id003"]


def test_return_lease_failed_without_prestart_is_not_replaced() -> None:
    ns = make_node({"CPU": 1}, prestart=0)
    [wid] = starts(ask(ns, b"a", CPU=1))
    a = only_grant(ns.worker_registered(wid, 1, "x:1"))
    assert ns.return_lease(a.lease.lease_id, worker_failed=True) == [
        KillWorker(wid, "returned as failed")
    ]
    assert ns.workers == {}


# --------------------------------------------------------------------------- blocking in get


def test_blocked_worker_gives_cpus_back_and_another_request_is_granted() -> None:
    ns = warm_node({"CPU": 1}, prestart=2)
    a = only_grant(ask(ns, b"a", CPU=1))
    assert ask(ns, b"b", CPU=1) == []
    g = only_grant(ns.set_blocked(a.lease.worker_id, True))
    assert g.request_id == b"b"
    assert g.lease.worker_id == b"id002"
    assert ns.workers[b"id001"].blocked is True
    assert ns.available == {"CPU": 0.0}


def test_unblock_retakes_cpus_and_may_oversubscribe() -> None:
    ns = warm_node({"CPU": 1}, prestart=2)
    a = only_grant(ask(ns, b"a", CPU=1))
    ask(ns, b"b", CPU=1)
    b = only_grant(ns.set_blocked(a.lease.worker_id, True))
    assert ns.set_blocked(a.lease.worker_id, False) == []
    assert ns.available == {"CPU": -1.0}
    assert ns.workers[b"id001"].blocked is False
    ns.return_lease(a.lease.lease_id)
    assert ns.available == {"CPU": 0.0}
    ns.return_lease(b.lease.lease_id)
    assert ns.available == {"CPU": 1.0}


def test_return_while_blocked_does_not_double_count_cpus() -> None:
    ns = warm_node({"CPU": 1, "memory": 8}, prestart=2)
    a = only_grant(ask(ns, b"a", CPU=1, memory=2))
    ask(ns, b"b", CPU=1)
    b = only_grant(ns.set_blocked(a.lease.worker_id, True))
    assert ns.return_lease(a.lease.lease_id) == []
    assert ns.available == {"CPU": 0.0, "memory": 8.0}  # memory was never given back early
    assert ns.workers[b"id001"].blocked is False
    ns.return_lease(b.lease.lease_id)
    assert ns.available == {"CPU": 1.0, "memory": 8.0}


def test_blocked_only_gives_back_cpus() -> None:
    ns = warm_node({"CPU": 2, "GPU": 1}, prestart=1)
    a = only_grant(ask(ns, b"a", CPU=1, GPU=1))
    assert ns.set_blocked(a.lease.worker_id, True) == []
    assert ns.available == {"CPU": 2.0, "GPU": 0.0}


def test_set_blocked_is_idempotent_and_ignores_unleased_workers() -> None:
    ns = warm_node({"CPU": 2}, prestart=2)
    a = only_grant(ask(ns, b"a", CPU=1))
    assert ns.set_blocked(b"ghost", True) == []
    assert ns.set_blocked(b"id002", True) == []  # idle, no lease
    assert ns.workers[b"id002"].blocked is False
    assert ns.set_blocked(a.lease.worker_id, False) == []  # not blocked yet
    ns.set_blocked(a.lease.worker_id, True)
    assert ns.set_blocked(a.lease.worker_id, True) == []
    assert ns.available == {"CPU": 2.0}  # given back once, not twice


def test_worker_exit_while_blocked_does_not_double_count_cpus() -> None:
    ns = warm_node({"CPU": 1}, prestart=1)
    a = only_grant(ask(ns, b"a", CPU=1))
    ns.set_blocked(a.lease.worker_id, True)
    assert ns.available == {"CPU": 1.0}
    ns.worker_exited(a.lease.worker_id)
    assert ns.available == {"CPU": 1.0}


# --------------------------------------------------------------------------- GPUs


def test_gpu_ids_assigned_by_index_and_freed() -> None:
    ns = warm_node({"CPU": 4, "GPU": 2}, prestart=3)
    assert free_gpus(ns) == [0, 1]
    a = only_grant(ask(ns, b"a", GPU=1))
    b = only_grant(ask(ns, b"b", GPU=1))
    assert (a.lease.gpu_ids, b.lease.gpu_ids) == ([0], [1])
    assert free_gpus(ns) == []
    assert ns.available["GPU"] == 0.0

    assert ask(ns, b"c", GPU=2) == []  # queued: fits the node, not now
    ns.return_lease(b.lease.lease_id)
    assert free_gpus(ns) == [1]
    c = only_grant(ns.return_lease(a.lease.lease_id))
    assert c.lease.gpu_ids == [0, 1]  # freed ids are kept sorted
    assert free_gpus(ns) == []
    ns.return_lease(c.lease.lease_id)
    assert free_gpus(ns) == [0, 1]
    assert ns.available == {"CPU": 4.0, "GPU": 2.0}


def test_gpu_ids_freed_when_worker_exits() -> None:
    ns = warm_node({"CPU": 2, "GPU": 2}, prestart=1)
    a = only_grant(ask(ns, b"a", GPU=2))
    assert a.lease.gpu_ids == [0, 1]
    ns.worker_exited(a.lease.worker_id)
    assert free_gpus(ns) == [0, 1]
    assert ns.available == {"CPU": 2.0, "GPU": 2.0}


def test_fractional_gpu_request_gets_one_gpu_id() -> None:
    ns = warm_node({"CPU": 2, "GPU": 2}, prestart=1)
    a = only_grant(ask(ns, b"a", GPU=0.5))
    assert a.lease.gpu_ids == [0]
    assert ns.available["GPU"] == 1.5


def test_two_half_gpu_leases_both_get_a_gpu_id() -> None:
    ns = warm_node({"CPU": 2, "GPU": 1}, prestart=2)
    a = only_grant(ask(ns, b"a", GPU=0.5))
    b = only_grant(ask(ns, b"b", GPU=0.5))
    assert a.lease.gpu_ids == [0]
    assert b.lease.gpu_ids == [0]


# --------------------------------------------------------------------------- infeasible / spill


def test_infeasible_request_is_redirected_with_a_message() -> None:
    ns = warm_node({"CPU": 2}, prestart=1)
    [r] = ask(ns, b"big", CPU=4, GPU=1)
    assert isinstance(r, Redirect)
    assert (r.request_id, r.status, r.address) == (b"big", "INFEASIBLE", "")
    assert r.message.startswith(
        "no node can ever fit {CPU: 4, GPU: 1}; the largest node has {CPU: 2}. "
    )
    assert "add a node" in r.message
    assert ns.pending == {}
    assert ns.available == {"CPU": 2.0}


def test_infeasible_custom_resource_names_the_cluster_resources() -> None:
    ns = warm_node({"CPU": 2}, prestart=1)
    ns.update_cluster_view([other(b"n2", {"CPU": 8, "GPU": 1}, {"CPU": 8, "GPU": 1})])
    [r] = ask(ns, b"tpu", TPU=1)
    assert isinstance(r, Redirect) and r.status == "INFEASIBLE"
    assert r.message.startswith(
        "no node can ever fit {TPU: 1}; the largest node has {CPU: 8, GPU: 1}. "
    )


def test_spillback_on_request_when_local_full_and_other_has_room() -> None:
    ns = warm_node({"CPU": 1}, prestart=2)
    only_grant(ask(ns, b"a", CPU=1))
    ns.update_cluster_view(
        [
            other(b"busy", {"CPU": 4}, {"CPU": 0}),
            other(b"free", {"CPU": 4}, {"CPU": 3}),
        ]
    )
    [r] = ask(ns, b"b", CPU=1)
    assert r == Redirect(
        b"b", "SPILLBACK", "free:7000", "local node busy; least-loaded node with room"
    )
    assert ns.pending == {}


def test_spillback_from_update_cluster_view_for_queued_request() -> None:
    ns = warm_node({"CPU": 1}, prestart=2)
    a = only_grant(ask(ns, b"a", CPU=1))
    assert ask(ns, b"b", CPU=1) == []  # no other nodes yet: queue
    # A view where the other node is full changes nothing.
    assert ns.update_cluster_view([other(b"n2", {"CPU": 2}, {"CPU": 0})]) == []
    assert list(ns.pending) == [b"b"]
    out = ns.update_cluster_view([other(b"n2", {"CPU": 2}, {"CPU": 2})])
    assert out == [
        Redirect(b"b", "SPILLBACK", "n2:7000", "local node busy; least-loaded node with room")
    ]
    assert ns.pending == {}
    # The lease that was granted locally is untouched.
    assert a.lease.lease_id in ns.leases


def test_update_cluster_view_ignores_this_node() -> None:
    ns = warm_node({"CPU": 1}, prestart=2)
    only_grant(ask(ns, b"a", CPU=1))
    ask(ns, b"b", CPU=1)
    stale_self = NodeView(LOCAL_ID, LOCAL_ADDR, {"CPU": 1}, {"CPU": 1})
    assert ns.update_cluster_view([stale_self]) == []
    assert ns.others == []
    assert list(ns.pending) == [b"b"]


def test_request_that_only_another_node_can_fit_is_spilled() -> None:
    ns = warm_node({"CPU": 2}, prestart=1)
    ns.update_cluster_view([other(b"gpu", {"CPU": 2, "GPU": 1}, {"CPU": 2, "GPU": 0})])
    [r] = ask(ns, b"g", GPU=1)
    assert r == Redirect(b"g", "SPILLBACK", "gpu:7000", "only other nodes can fit this request")


def test_spread_strategy_spills_to_less_loaded_node() -> None:
    ns = warm_node({"CPU": 2}, prestart=2)
    only_grant(ask(ns, b"a", CPU=1))  # local load 0.5
    ns.update_cluster_view([other(b"n2", {"CPU": 2}, {"CPU": 2})])
    [r] = ns.request_lease(b"b", {"CPU": 1}, OWNER, JOB, strategy="SPREAD")
    assert r == Redirect(b"b", "SPILLBACK", "n2:7000", "least loaded node (SPREAD)")
    # DEFAULT keeps it local while it fits.
    g = only_grant(ns.request_lease(b"c", {"CPU": 1}, OWNER, JOB))
    assert g.request_id == b"c"


def test_allow_spill_false_is_refused_when_no_local_fit() -> None:
    ns = warm_node({"CPU": 2}, prestart=1)
    ns.update_cluster_view([other(b"gpu", {"GPU": 1}, {"GPU": 1})])
    [r] = ns.request_lease(b"g", {"GPU": 1}, OWNER, JOB, allow_spill=False)
    assert isinstance(r, Redirect) and r.status == "INFEASIBLE"


def test_allow_spill_false_request_is_never_spilled_later() -> None:
    ns = warm_node({"CPU": 1}, prestart=2)
    only_grant(ask(ns, b"a", CPU=1))
    ns.update_cluster_view([other(b"n2", {"CPU": 2}, {"CPU": 0})])
    assert ns.request_lease(b"b", {"CPU": 1}, OWNER, JOB, allow_spill=False) == []
    assert ns.update_cluster_view([other(b"n2", {"CPU": 2}, {"CPU": 2})]) == []
    assert list(ns.pending) == [b"b"]


def reported(node_id: bytes, cpus_free: float, stamp: float) -> NodeView:
    """A 2-CPU node as the head's view shows it: its last report and when that came in."""
    return NodeView(
        node_id, f"{node_id.decode()}:7000", {"CPU": 2}, {"CPU": cpus_free}, True, stamp
    )


def spilled_to(out: Sequence[Instruction]) -> list[str]:
    return [i.address for i in out if isinstance(i, Redirect) and i.status == "SPILLBACK"]


def test_a_view_older_than_our_spills_does_not_undo_their_charges() -> None:
    # The L01 finding (issue 12 item 6): six 1-CPU barrier tasks on three 2-CPU nodes.
    # The driver's node granted 2 and spilled 3; a heartbeat reply then brought the head's
    # view, in which neither target had reported its new leases yet. The charges were
    # dropped, the 6th request went to the node already holding 2 of our spills, and it
    # waited there (spilled requests do not spill again) while another node had a free CPU.
    ns = warm_node({"CPU": 2}, prestart=2)
    ns.update_cluster_view([reported(b"n2", 2, 1.0), reported(b"n3", 2, 1.0)])
    only_grant(ask(ns, b"a", CPU=1))
    only_grant(ask(ns, b"b", CPU=1))
    assert spilled_to(ask(ns, b"c", CPU=1)) == ["n2:7000"]
    assert spilled_to(ask(ns, b"d", CPU=1)) == ["n3:7000"]
    assert spilled_to(ask(ns, b"e", CPU=1)) == ["n2:7000"]  # n2 is now full for us
    # The head's view, unchanged since before the spills: it cannot show them yet.
    assert ns.update_cluster_view([reported(b"n2", 2, 1.0), reported(b"n3", 2, 1.0)]) == []
    assert [n.available["CPU"] for n in ns.others] == [0.0, 1.0]
    assert spilled_to(ask(ns, b"f", CPU=1)) == ["n3:7000"]  # not onto full n2
    # n2 reports one of its two leases (the report left before the second arrived): the
    # other spill stays counted. n3 has not reported: both spills there stay counted.
    assert ns.update_cluster_view([reported(b"n2", 1, 2.0), reported(b"n3", 2, 1.0)]) == []
    assert [n.available["CPU"] for n in ns.others] == [0.0, 0.0]
    assert ask(ns, b"g", CPU=1) == []  # no room anywhere: it waits here
    assert list(ns.pending) == [b"g"]
    # Reports that show every lease: nothing is counted twice.
    assert ns.update_cluster_view([reported(b"n2", 0, 3.0), reported(b"n3", 0, 2.0)]) == []
    assert ns.spills == []
    assert [n.available["CPU"] for n in ns.others] == [0.0, 0.0]
    # A CPU frees up on n3: the waiting request goes there.
    out = ns.update_cluster_view([reported(b"n2", 0, 3.0), reported(b"n3", 1, 4.0)])
    assert spilled_to(out) == ["n3:7000"] and ns.pending == {}


def test_a_spill_charge_ends_with_the_second_newer_report_or_the_node() -> None:
    ns = warm_node({"CPU": 1}, prestart=1)
    ns.update_cluster_view([reported(b"n2", 2, 1.0), reported(b"n3", 2, 1.0)])
    only_grant(ask(ns, b"a", CPU=1))
    assert spilled_to(ask(ns, b"b", CPU=1)) == ["n2:7000"]
    assert spilled_to(ask(ns, b"c", CPU=1)) == ["n3:7000"]
    # Newer reports that do not show the leases (other work ended there meanwhile, or the
    # request never arrived): counted until a second newer report.
    ns.update_cluster_view([reported(b"n2", 2, 2.0), reported(b"n3", 2, 2.0)])
    assert [n.available["CPU"] for n in ns.others] == [1.0, 1.0]
    ns.update_cluster_view([reported(b"n2", 2, 3.0)])  # n3 left the cluster
    assert ns.spills == []
    assert [(n.node_id, n.available["CPU"]) for n in ns.others] == [(b"n2", 2.0)]


def test_without_report_stamps_every_view_is_newer() -> None:
    ns = warm_node({"CPU": 1}, prestart=1)
    ns.update_cluster_view([other(b"n2", {"CPU": 2}, {"CPU": 2})])
    only_grant(ask(ns, b"a", CPU=1))
    assert spilled_to(ask(ns, b"b", CPU=1)) == ["n2:7000"]
    ns.update_cluster_view([other(b"n2", {"CPU": 2}, {"CPU": 2})])
    assert ns.others[0].available["CPU"] == 1.0  # one newer view that does not show it
    ns.update_cluster_view([other(b"n2", {"CPU": 2}, {"CPU": 2})])
    assert ns.others[0].available["CPU"] == 2.0 and ns.spills == []


# --------------------------------------------------------------------------- cancel


def test_cancel_pending_request() -> None:
    ns = warm_node({"CPU": 1}, prestart=1)
    a = only_grant(ask(ns, b"a", CPU=1))
    ask(ns, b"b", CPU=1)
    assert ns.cancel_request(b"b") == [Redirect(b"b", "CANCELLED")]
    assert ns.pending == {}
    assert ns.cancel_request(b"b") == []  # already gone
    assert ns.cancel_request(b"a") == []  # granted, not pending
    # The freed lease goes back to the pool, not to the cancelled request.
    assert ns.return_lease(a.lease.lease_id) == []
    assert list(ns.idle) == [b"id001"]


def test_cancel_request_waiting_for_a_worker() -> None:
    ns = make_node({"CPU": 1}, prestart=0)
    [wid] = starts(ask(ns, b"a", CPU=1))
    assert ns.cancel_request(b"a") == [Redirect(b"a", "CANCELLED")]
    assert ns.worker_registered(wid, 1, "x:1") == []
    assert list(ns.idle) == [wid]
    assert ns.available == {"CPU": 1.0}


# --------------------------------------------------------------------------- zero CPU


def test_zero_cpu_request_granted_without_consuming_cpu() -> None:
    ns = warm_node({"CPU": 1}, prestart=2)
    only_grant(ask(ns, b"a", CPU=1))
    assert ns.available == {"CPU": 0.0}
    g = only_grant(ask(ns, b"z", CPU=0))
    assert g.lease.resources == {}
    assert ns.available == {"CPU": 0.0}
    ns.return_lease(g.lease.lease_id)
    assert ns.available == {"CPU": 0.0}


def test_empty_request_starts_a_worker_when_none_idle() -> None:
    ns = make_node({"CPU": 1}, prestart=0)
    out = ns.request_lease(b"z", {}, OWNER, JOB)
    assert starts(out) == [b"id002"]
    g = only_grant(ns.worker_registered(b"id002", 1, "x:1"))
    assert g.lease.resources == {}
    assert ns.available == {"CPU": 1.0}


# --------------------------------------------------------------------------- death reports


def test_death_reports_are_kept_until_acked_with_backoff() -> None:
    from nbcluster._runtime.node.state import PendingReports

    q = PendingReports(base_delay=0.1, max_delay=0.4)
    q.add(b"w1", "r1")
    q.add(b"w2", "r2")
    assert q.pending() == [(b"w1", "r1"), (b"w2", "r2")]
    assert [q.failed(), q.failed(), q.failed(), q.failed()] == [0.1, 0.2, 0.4, 0.4]
    assert len(q) == 2  # a failure never drops a report
    q.acked(b"w1")
    assert q.pending() == [(b"w2", "r2")]
    assert q.failed() == 0.1  # an ack resets the backoff
    q.acked(b"w2")
    assert not q


def test_death_reports_are_bounded_dropping_the_oldest() -> None:
    from nbcluster._runtime.node.state import PendingReports

    q = PendingReports(limit=2)
    for i in range(4):
        q.add(bytes([i]), i)
    assert [k for k, _ in q.pending()] == [b"\x02", b"\x03"]
    assert q.dropped == 2
