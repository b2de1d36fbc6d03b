"""The owner's task lifecycle state machine (``_runtime/core/owner_state.py``), without
processes: events in, instructions out, for every transition the submitter relies on."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from nbcluster import exceptions as exc
from nbcluster._runtime.core import instructions as ins
from nbcluster._runtime.core.owner_state import MAX_LEASE_REQUESTS, OwnerState
from nbcluster._runtime.core.records import FAST_TASK_S, TaskRecord
from nbcluster._runtime.protocol.protos import nbcluster_pb2 as pb
from nbcluster._runtime.running_mark import encode as encode_mark

LOCAL = "127.0.0.1:7001"
OTHER = "127.0.0.1:7002"


def _state(**kw: Any) -> OwnerState:
    ids = (i.to_bytes(4, "big") for i in itertools.count(1))
    return OwnerState(local_address=lambda: LOCAL, new_id=lambda: next(ids), **kw)


_tids = itertools.count(1)


def _rec(
    *,
    fn: bytes = b"f",
    key: tuple[Any, ...] = ("cpu1",),
    retries: int = 3,
    route: tuple[Any, ...] | None = None,
    max_calls: int = 0,
    actor: bool = False,
    locality: str = "",
) -> TaskRecord:
    rec = TaskRecord()
    rec.task_id = next(_tids).to_bytes(8, "big")
    rec.spec = pb.TaskSpec(task_id=rec.task_id, function_id=fn, max_calls=max_calls)
    rec.key = key
    rec.resources = {"CPU": 1.0}
    rec.strategy = "DEFAULT"
    rec.return_ids = [rec.task_id + b"r"]
    rec.retries_left = retries
    rec.dep_ids = []
    rec.nested_ids = []
    rec.name = f"task{rec.task_id.hex()}"
    rec.route = route
    rec.actor = actor
    rec.locality = locality
    return rec


def _submit(st: OwnerState, *recs: TaskRecord) -> list[Any]:
    for rec in recs:
        st.add(rec)
    return st.ready(recs)


def _grant(n: int = 1, node: bytes = b"n1") -> pb.LeaseReply:
    return pb.LeaseReply(
        status=pb.LeaseReply.GRANTED,
        lease_id=b"L%d" % n,
        worker_id=b"W%d" % n,
        worker_address=f"127.0.0.1:90{n:02d}",
        worker_pid=1000 + n,
        node_id=node,
    )


def _reply(rec: TaskRecord, **kw: Any) -> pb.TaskReply:
    kw.setdefault("start_time", 1.0)
    kw.setdefault("end_time", 1.5)
    return pb.TaskReply(task_id=rec.task_id, **kw)


def _of(out: list[Any], kind: type) -> list[Any]:
    return [i for i in out if type(i) is kind]


def _apply_outcomes(st: OwnerState, out: list[Any]) -> None:
    """What the shell does with Complete/Fail: place the outcome, then ``finish``."""
    for i in out:
        if type(i) in (ins.Complete, ins.Fail):
            st.finish(i.record)


def _granted_lease(st: OwnerState, rec: TaskRecord, n: int = 1, node: bytes = b"n1") -> Any:
    out = _submit(st, rec)
    req = _of(out, ins.RequestLease)[0]
    out = st.lease_reply(req.kq, req.request_id, req.address, req.spill, _grant(n, node))
    lease = _of(out, ins.OpenStream)[0].lease
    return lease, out


# -- submission and leases ----------------------------------------------------------------------
def test_a_ready_task_asks_the_local_node_for_a_lease_with_spillback_allowed() -> None:
    st = _state()
    rec = _rec()
    out = _submit(st, rec)
    assert out == [ins.RequestLease(st.keys[rec.key], b"\0\0\0\1", LOCAL, True)]
    assert list(st.keys[rec.key].queue) == [rec]
    assert st.tasks[rec.task_id] is rec


def test_a_task_cancelled_before_it_was_ready_fails_instead_of_queueing() -> None:
    st = _state()
    rec = _rec()
    rec.cancelled = True
    out = _submit(st, rec)
    assert len(out) == 1 and isinstance(out[0].error, exc.TaskCancelledError)
    assert not st.keys or not st.keys[rec.key].queue


def test_a_grant_opens_a_stream_watches_nodes_and_sends_the_task() -> None:
    st = _state()
    rec = _rec()
    lease, out = _granted_lease(st, rec)
    assert [type(i) for i in out] == [ins.OpenStream, ins.WatchNodes, ins.Send]
    assert out[2] == ins.Send(lease, [rec])
    assert rec.lease is lease and lease.inflight == {rec.task_id: rec}
    assert lease.worker_address == "127.0.0.1:9001" and lease.node_address == LOCAL
    assert not st.keys[rec.key].requests  # the request is answered


def test_large_arguments_pull_the_lease_request_to_their_node() -> None:
    st = _state()
    out = _submit(st, _rec(locality=OTHER))
    assert _of(out, ins.RequestLease)[0].address == OTHER


def test_lease_requests_per_key_are_capped() -> None:
    st = _state()
    out = _submit(st, *[_rec() for _ in range(100)])
    assert len(_of(out, ins.RequestLease)) == MAX_LEASE_REQUESTS
    # More tasks of the same key ask for nothing more while the requests are out.
    assert _of(_submit(st, _rec()), ins.RequestLease) == []


def test_an_unknown_function_is_not_pipelined_behind_another_task() -> None:
    st = _state()
    a, b = _rec(), _rec()
    st.add(a)
    st.add(b)
    out = st.ready([a, b])
    req = _of(out, ins.RequestLease)[0]
    out = st.lease_reply(req.kq, req.request_id, req.address, req.spill, _grant())
    sends = _of(out, ins.Send)
    assert [s.records for s in sends] == [[a]]  # b waits for its own lease or for a
    assert list(st.keys[a.key].queue) == [b]


def test_fast_functions_are_pipelined_up_to_the_depth() -> None:
    st = _state(max_depth=4)
    first = _rec()
    lease, _ = _granted_lease(st, first)
    fast = dict(start_time=1.0, end_time=1.0 + FAST_TASK_S / 10)
    st.replies(lease, [_reply(first, **fast)])
    recs = [_rec() for _ in range(6)]
    out = _submit(st, *recs)
    sends = _of(out, ins.Send)
    assert len(sends) == 1 and sends[0].records == recs[:4]
    assert len(lease.inflight) == 4


def test_a_lease_gets_only_its_share_of_the_queue() -> None:
    st = _state(max_depth=8)
    a, b, c = _rec(), _rec(), _rec()
    reqs = _of(_submit(st, a, b, c), ins.RequestLease)
    assert len(reqs) == 3
    out = st.lease_reply(reqs[0].kq, reqs[0].request_id, LOCAL, True, _grant())
    lease = _of(out, ins.OpenStream)[0].lease
    assert _of(out, ins.Send) == [ins.Send(lease, [a])]  # b, c: not known to be fast yet
    # a was fast. Two lease requests are still out, so this lease takes its share of the
    # queue (1 of 2), not the whole queue: the workers on their way get the rest.
    out = st.replies(lease, [_reply(a, start_time=1.0, end_time=1.0)])
    assert _of(out, ins.Send) == [ins.Send(lease, [b])]
    recs = [_rec() for _ in range(4)]
    out = _submit(st, *recs)  # share: ceil((5 queued + 1 running) / 3) = 2, one running
    assert _of(out, ins.Send) == [ins.Send(lease, [c])]
    assert list(st.keys[a.key].queue) == recs


def test_a_spillback_asks_the_named_node_without_further_spilling() -> None:
    st = _state()
    rec = _rec()
    req = _of(_submit(st, rec), ins.RequestLease)[0]
    out = st.lease_reply(
        req.kq,
        req.request_id,
        req.address,
        True,
        pb.LeaseReply(status=pb.LeaseReply.SPILLBACK, spill_address=OTHER),
    )
    assert [(i.address, i.spill) for i in _of(out, ins.RequestLease)] == [(OTHER, False)]
    assert req.request_id not in req.kq.requests


def test_infeasible_warns_once_and_tries_again_later() -> None:
    st = _state()
    rec = _rec()
    req = _of(_submit(st, rec), ins.RequestLease)[0]
    infeasible = pb.LeaseReply(status=pb.LeaseReply.INFEASIBLE, message="needs 64 CPUs")
    out = st.lease_reply(req.kq, req.request_id, req.address, True, infeasible)
    warn = _of(out, ins.WarnInfeasible)
    assert len(warn) == 1 and "needs 64 CPUs" in warn[0].text and rec.name in warn[0].text
    assert _of(out, ins.PumpLater) == [ins.PumpLater(req.kq, 1.0)]
    again = st.pump(req.kq)
    req2 = _of(again, ins.RequestLease)[0]
    out = st.lease_reply(req.kq, req2.request_id, req2.address, True, infeasible)
    assert _of(out, ins.WarnInfeasible) == [] and _of(out, ins.PumpLater)


def test_infeasible_on_a_soft_affinity_node_goes_elsewhere_directly() -> None:
    st = _state()
    rec = _rec(route=("node", b"n2", True))
    out = _submit(st, rec)
    route = _of(out, ins.ResolveRoute)[0]
    out = st.route_resolved(route.kq, route.request_id, [OTHER], False)
    req = _of(out, ins.RequestLease)[0]
    assert (req.address, req.spill) == (OTHER, False)
    out = st.lease_reply(
        req.kq, req.request_id, OTHER, False, pb.LeaseReply(status=pb.LeaseReply.INFEASIBLE)
    )
    # Not routed again (that would pick the same node): straight to the local node, spilling.
    assert _of(out, ins.ResolveRoute) == []
    assert [(i.address, i.spill) for i in _of(out, ins.RequestLease)] == [(LOCAL, True)]


def test_infeasible_in_a_placement_group_forgets_the_cached_group() -> None:
    st = _state()
    rec = _rec(route=("pg", b"pg1", 0))
    route = _of(_submit(st, rec), ins.ResolveRoute)[0]
    req = _of(st.route_resolved(route.kq, route.request_id, [OTHER], False), ins.RequestLease)[0]
    out = st.lease_reply(
        req.kq, req.request_id, OTHER, False, pb.LeaseReply(status=pb.LeaseReply.INFEASIBLE)
    )
    assert ins.ForgetPlacementGroup(b"pg1") in out


def test_routed_requests_go_round_robin_over_the_nodes_found() -> None:
    st = _state()
    recs = [_rec(route=("spread",), key=("spread",)) for _ in range(3)]
    routes = _of(_submit(st, *recs), ins.ResolveRoute)
    assert len(routes) == 3
    picked = [
        _of(st.route_resolved(r.kq, r.request_id, [LOCAL, OTHER], False), ins.RequestLease)[0]
        for r in routes
    ]
    assert [p.address for p in picked] == [LOCAL, OTHER, LOCAL]


def test_an_unschedulable_route_fails_the_queue_and_an_unreachable_one_waits() -> None:
    st = _state()
    recs = [_rec(route=("node", b"gone", False), key=("hard",)) for _ in range(2)]
    routes = _of(_submit(st, *recs), ins.ResolveRoute)
    err = exc.TaskUnschedulableError("node gone")
    out = st.route_unschedulable(routes[0].kq, routes[0].request_id, err)
    assert [i.record for i in _of(out, ins.Fail)] == recs and all(i.error is err for i in out)
    assert st.route_unreachable(routes[1].kq, routes[1].request_id) == [
        ins.PumpLater(routes[1].kq, 0.5)
    ]
    assert not routes[1].kq.requests


def test_a_runtime_env_failure_fails_every_queued_task_with_its_message() -> None:
    st = _state()
    recs = [_rec(key=("env",)) for _ in range(3)]
    req = _of(_submit(st, *recs), ins.RequestLease)[0]
    out = st.lease_reply(
        req.kq,
        req.request_id,
        req.address,
        True,
        pb.LeaseReply(status=pb.LeaseReply.RUNTIME_ENV_FAILED, message="pip failed"),
    )
    fails = _of(out, ins.Fail)
    assert [f.record for f in fails] == recs
    assert all(isinstance(f.error, exc.RuntimeEnvSetupError) for f in fails)
    assert "pip failed" in str(fails[0].error)


def test_a_failed_lease_request_is_tried_again_later_unless_closed() -> None:
    st = _state()
    req = _of(_submit(st, _rec()), ins.RequestLease)[0]
    assert st.lease_request_failed(req.kq, req.request_id) == [ins.PumpLater(req.kq, 0.5)]
    assert not req.kq.requests
    st.close()
    assert st.lease_request_failed(req.kq, b"x") == []


# -- replies ------------------------------------------------------------------------------------
def test_a_reply_completes_the_task_and_an_idle_lease_gets_a_timer() -> None:
    st = _state(idle_timeout_s=0.5)
    rec = _rec()
    lease, _ = _granted_lease(st, rec)
    reply = _reply(rec)
    out = st.replies(lease, [reply])
    assert out == [ins.Complete(rec, reply), ins.StartIdleTimer(lease, 1, 0.5)]
    _apply_outcomes(st, out)
    assert rec.done and rec.task_id not in st.tasks and not lease.inflight


def test_an_idle_lease_is_returned_when_its_timer_fires_unless_it_found_work() -> None:
    st = _state()
    rec = _rec()
    lease, _ = _granted_lease(st, rec)
    st.replies(lease, [_reply(rec)])
    gen = lease.idle_gen
    # New work first: the timer stops, the task goes to the same worker.
    nxt = _rec()
    out = _submit(st, nxt)
    assert out == [ins.StopIdleTimer(lease), ins.Send(lease, [nxt])]
    assert st.idle_expired(lease, gen) == []  # the stale timer does nothing
    out = st.replies(lease, [_reply(nxt)])
    timer = _of(out, ins.StartIdleTimer)[0]
    assert st.idle_expired(lease, timer.gen) == [ins.ReturnLease(lease, False)]
    assert lease.returned and lease not in st.keys[rec.key].leases


# -- thread writes (send_now) --------------------------------------------------------------------
def test_send_now_puts_a_task_in_flight_on_an_idle_lease_and_its_timer_goes_stale() -> None:
    st = _state(idle_timeout_s=0.5)
    first = _rec()
    lease, _ = _granted_lease(st, first)
    timer = _of(st.replies(lease, [_reply(first)]), ins.StartIdleTimer)[0]
    _apply_outcomes(st, [ins.Complete(first, None)])
    nxt = _rec()
    assert st.send_now(nxt, lambda le: True) is lease
    assert lease.inflight == {nxt.task_id: nxt} and nxt.lease is lease
    assert st.tasks[nxt.task_id] is nxt and not lease.idle
    assert st.idle_expired(lease, timer.gen) == []  # the timer it had does nothing now
    # Its reply completes it as any other, and the lease goes idle with a new timer.
    reply = _reply(nxt)
    out = st.replies(lease, [reply])
    assert out == [ins.Complete(nxt, reply), ins.StartIdleTimer(lease, timer.gen + 2, 0.5)]


def test_send_now_declines_what_must_take_the_usual_way() -> None:
    st = _state()
    first = _rec()
    lease, _ = _granted_lease(st, first)
    assert st.send_now(_rec(), lambda le: True) is None  # its only lease is busy
    assert st.send_now(_rec(key=("other",)), lambda le: True) is None  # no lease of its shape
    st.replies(lease, [_reply(first)])
    assert st.send_now(_rec(), lambda le: False) is None  # its channel takes no write now
    cancelled = _rec()
    cancelled.cancelled = True
    assert st.send_now(cancelled, lambda le: True) is None
    lease.blocked = True
    assert st.send_now(_rec(), lambda le: True) is None
    lease.blocked = False
    queued = _rec()
    st.keys[first.key].queue.append(queued)  # something is queued on its key: it goes first
    assert st.send_now(_rec(), lambda le: True) is None
    st.keys[first.key].queue.clear()
    st.close()
    assert st.send_now(_rec(), lambda le: True) is None
    assert not lease.inflight


def test_send_now_skips_leases_it_may_not_use_and_takes_the_next() -> None:
    st = _state()
    a, b = _rec(), _rec()
    out = _submit(st, a, b)
    kq = st.keys[a.key]
    reqs = _of(out, ins.RequestLease)
    first = _of(st.lease_reply(kq, reqs[0].request_id, LOCAL, True, _grant(1)), ins.OpenStream)
    second = _of(st.lease_reply(kq, reqs[1].request_id, LOCAL, True, _grant(2)), ins.OpenStream)
    one, two = first[0].lease, second[0].lease
    st.replies(one, [_reply(a)])
    st.replies(two, [_reply(b)])
    one.exiting = True
    rec = _rec()
    assert st.send_now(rec, lambda le: True) is two
    assert rec.task_id in two.inflight and not one.inflight


def test_release_idle_gives_back_idle_leases_only_and_stops_their_timers() -> None:
    st = _state(idle_timeout_s=0.5)
    idle_rec, busy_rec = _rec(), _rec(key=("cpu2",))
    idle, _ = _granted_lease(st, idle_rec)
    st.replies(idle, [_reply(idle_rec)])
    gen = idle.idle_gen
    busy, _ = _granted_lease(st, busy_rec)  # its task still runs
    assert busy.inflight
    assert st.release_idle() == [ins.StopIdleTimer(idle), ins.ReturnLease(idle, False)]
    assert idle.returned and not busy.returned and busy in st.keys[busy_rec.key].leases
    assert st.idle_expired(idle, gen) == []  # its timer, if it fires anyway, does nothing
    assert st.release_idle() == []


def test_an_idle_lease_is_returned_at_once_when_another_key_waits_for_leases() -> None:
    st = _state(idle_timeout_s=0.5)
    rec = _rec()
    lease, _ = _granted_lease(st, rec)
    _submit(st, _rec(key=("gpu",)))  # another shape is asking for a worker
    timer = _of(st.replies(lease, [_reply(rec)]), ins.StartIdleTimer)[0]
    assert timer.delay == 0.0


def test_a_retriable_error_is_retried_on_the_same_lease_until_retries_run_out() -> None:
    st = _state()
    rec = _rec(retries=1)
    lease, _ = _granted_lease(st, rec)
    out = st.replies(lease, [_reply(rec, is_error=True, retryable=True)])
    assert out == [ins.Send(lease, [rec])]
    assert rec.retries_left == 0 and rec.spec.attempt == 1
    final = _reply(rec, is_error=True, retryable=True)
    out = st.replies(lease, [final])
    assert out[0] == ins.Complete(rec, final)  # the error is the result now


def test_a_requeued_task_goes_back_in_front_uncharged() -> None:
    st = _state()
    rec = _rec()
    lease, _ = _granted_lease(st, rec)
    out = st.replies(lease, [_reply(rec, requeued=True)])
    assert out == [ins.Send(lease, [rec])]
    assert rec.retries_left == 3 and rec.spec.attempt == 0


def test_a_task_requeued_behind_a_blocked_one_goes_to_another_worker_not_back() -> None:
    # ``running`` blocks in get on ``behind``, pipelined to its worker: the worker answers
    # ``behind`` "requeued". Sent back there it would bounce until ``running`` timed out.
    st = _state(max_depth=4)
    first = _rec()
    lease, _ = _granted_lease(st, first)
    st.replies(lease, [_reply(first, start_time=1.0, end_time=1.0 + FAST_TASK_S / 10)])
    running, behind = _rec(), _rec()
    assert _of(_submit(st, running), ins.Send)[0].records == [running]
    assert _of(_submit(st, behind), ins.Send)[0].records == [behind]  # fast: pipelined
    out = st.replies(lease, [_reply(behind, requeued=True)])
    assert _of(out, ins.Send) == [] and len(_of(out, ins.RequestLease)) == 1  # elsewhere
    assert list(st.keys[behind.key].queue) == [behind] and behind.retries_left == 3
    later = _rec()
    assert _of(_submit(st, later), ins.Send) == []  # nothing more behind the blocked one
    # Once what it ran is done, the worker takes tasks again.
    out = st.replies(lease, [_reply(running, start_time=1.0, end_time=1.0 + FAST_TASK_S / 10)])
    sent = [r for s in _of(out, ins.Send) for r in s.records]
    assert sent[0] is behind and not lease.blocked  # (``later`` waits for its share)


def test_a_cancelled_reply_fails_the_task_as_cancelled() -> None:
    st = _state()
    rec = _rec()
    lease, _ = _granted_lease(st, rec)
    out = st.replies(lease, [_reply(rec, cancelled=True, is_error=True)])
    assert isinstance(out[0].error, exc.TaskCancelledError) and out[0].record is rec


def test_an_exiting_worker_is_returned_as_failed_once_its_tasks_are_done() -> None:
    st = _state()
    rec = _rec(max_calls=1, key=("once",))
    lease, _ = _granted_lease(st, rec)
    out = st.replies(lease, [_reply(rec, worker_exiting=True)])
    assert ins.ReturnLease(lease, True) in out and lease.returned
    nxt = _rec(max_calls=1, key=("once",))
    out = _submit(st, nxt)
    assert _of(out, ins.Send) == [] and _of(out, ins.RequestLease)  # a new worker


def test_spread_returns_each_lease_after_its_task() -> None:
    st = _state()
    rec = _rec(route=("spread",), key=("spread",))
    route = _of(_submit(st, rec), ins.ResolveRoute)[0]
    req = _of(st.route_resolved(route.kq, route.request_id, [OTHER], False), ins.RequestLease)[0]
    out = st.lease_reply(req.kq, req.request_id, OTHER, False, _grant())
    lease = _of(out, ins.OpenStream)[0].lease
    out = st.replies(lease, [_reply(rec)])
    assert ins.ReturnLease(lease, False) in out


# -- crashes ------------------------------------------------------------------------------------
def _crash(st: OwnerState, n: int, max_depth: int = 4) -> tuple[Any, list[TaskRecord]]:
    first = _rec()
    lease, _ = _granted_lease(st, first)
    st.replies(lease, [_reply(first, start_time=1.0, end_time=1.0)])  # fast: pipelined
    recs = [_rec() for _ in range(n)]
    _submit(st, *recs)
    assert list(lease.inflight.values()) == recs
    return lease, recs


def test_a_broken_stream_returns_the_lease_as_failed_and_asks_why() -> None:
    st = _state()
    lease, recs = _crash(st, 3)
    out = st.stream_broken(lease)
    assert out[0] == ins.ReturnLease(lease, True)
    assert ins.AskExitInfo(lease, recs) in out
    assert lease.dead and not lease.inflight
    assert st.stream_broken(lease) == []  # reported once


def test_the_crashed_task_is_charged_a_retry_and_those_behind_it_are_not() -> None:
    st = _state()
    lease, recs = _crash(st, 3)
    st.stream_broken(lease)
    out = st.crash_explained(lease, recs, "worker (pid 5) died: SIGKILL")
    # The attempt that died is recorded as it was, though the record is retried at once.
    assert out[0] == ins.RecordCrashedAttempt(recs[0], "worker (pid 5) died: SIGKILL", False, 0)
    assert [r.retries_left for r in recs] == [2, 3, 3]
    assert [r.spec.attempt for r in recs] == [1, 0, 0]
    assert list(st.keys[recs[0].key].queue) == recs  # in order, in front
    assert _of(out, ins.RequestLease)  # a new worker is asked for


def test_the_task_the_worker_marked_as_begun_is_charged_not_the_first_sent() -> None:
    # The first task finished but its reply died with the worker; the second crashed it.
    st = _state()
    lease, recs = _crash(st, 3)
    st.stream_broken(lease)
    started = encode_mark(recs[1].task_id, recs[1].spec.attempt)
    out = st.crash_explained(lease, recs, "worker (pid 5) died: SIGKILL", started=started)
    assert out[0] == ins.RecordCrashedAttempt(recs[1], "worker (pid 5) died: SIGKILL", False, 0)
    assert [r.retries_left for r in recs] == [3, 2, 3]
    assert [r.spec.attempt for r in recs] == [0, 1, 0]
    assert list(st.keys[recs[0].key].queue) == recs  # all go again, in order


def test_a_mark_naming_no_task_in_flight_charges_the_first_sent() -> None:
    # A mark of an answered task, of another attempt, or unreadable: the first sent is
    # charged, so a crash is never left uncharged (no endless retries).
    def stale(recs: list[TaskRecord]) -> bytes:
        return encode_mark(recs[0].task_id, recs[0].spec.attempt + 1)

    for mark in (lambda _: encode_mark(b"x" * 16, 0), stale, lambda _: b"torn"):
        st = _state()
        lease, recs = _crash(st, 2)
        st.stream_broken(lease)
        out = st.crash_explained(lease, recs, "died", started=mark(recs))
        assert out[0].record is recs[0]
        assert [r.retries_left for r in recs] == [2, 3]


def test_a_crash_without_retries_left_fails_with_worker_crashed() -> None:
    st = _state()
    rec = _rec(retries=0)
    lease, _ = _granted_lease(st, rec)
    st.stream_broken(lease)
    out = st.crash_explained(lease, [rec], "worker (pid 9) died: SIGSEGV")
    fail = _of(out, ins.Fail)[0]
    assert fail.record is rec and isinstance(fail.error, exc.WorkerCrashedError)
    assert "SIGSEGV" in str(fail.error) and "max_retries" in str(fail.error)


def test_memory_monitor_kills_use_their_own_budget() -> None:
    st = _state(oom_retries=1)
    rec = _rec(retries=0)
    lease, _ = _granted_lease(st, rec)
    st.stream_broken(lease)
    detail = "worker killed by the memory monitor"
    out = st.crash_explained(lease, [rec], detail)
    assert out[0] == ins.RecordCrashedAttempt(rec, detail, True, 0)
    assert _of(out, ins.Fail) == [] and rec.oom_retries_left == 0 and rec.retries_left == 0
    lease2 = _of(out, ins.RequestLease)[0]
    out = st.lease_reply(lease2.kq, lease2.request_id, LOCAL, True, _grant(2))
    lease2 = _of(out, ins.OpenStream)[0].lease
    st.stream_broken(lease2)
    fail = _of(st.crash_explained(lease2, [rec], detail), ins.Fail)[0]
    assert isinstance(fail.error, exc.OutOfMemoryError)


def test_a_cancelled_task_on_a_crashed_worker_fails_as_cancelled_and_done_ones_are_skipped() -> (
    None
):
    st = _state()
    lease, recs = _crash(st, 3)
    recs[1].cancelled = True
    recs[2].done = True
    st.stream_broken(lease)
    out = st.crash_explained(lease, recs, "died")
    fails = _of(out, ins.Fail)
    assert [f.record for f in fails] == [recs[1]]
    assert isinstance(fails[0].error, exc.TaskCancelledError)
    assert list(st.keys[recs[0].key].queue) == [recs[0]]


def test_a_stream_that_never_opened_puts_its_tasks_back_uncharged() -> None:
    st = _state()
    rec = _rec()
    lease, _ = _granted_lease(st, rec)
    out = st.stream_open_failed(lease)
    assert out[0] == ins.ReturnLease(lease, True)
    assert rec.retries_left == 3 and rec.lease is None
    assert list(st.keys[rec.key].queue) == [rec] and _of(out, ins.RequestLease)


def test_a_dead_node_breaks_only_its_own_leases() -> None:
    st = _state()
    a, b = _rec(key=("a",)), _rec(key=("b",))
    lease_a, _ = _granted_lease(st, a, 1, node=b"n1")
    lease_b, _ = _granted_lease(st, b, 2, node=b"n2")
    out = st.node_died(b"n1", "127.0.0.1:1")
    assert ins.ReturnLease(lease_a, True) in out and ins.AskExitInfo(lease_a, [a]) in out
    assert not lease_b.dead and lease_b.inflight


# -- cancellation -------------------------------------------------------------------------------
def test_cancel_a_queued_task_removes_it_and_fails_it() -> None:
    st = _state()
    rec = _rec()
    _submit(st, rec)
    out = st.cancel(rec.task_id, force=False)
    assert len(out) == 1 and out[0].record is rec
    assert isinstance(out[0].error, exc.TaskCancelledError)
    assert not st.keys[rec.key].queue and rec.retries_left == 0


def test_cancel_a_running_task_asks_its_worker_and_force_is_passed_on() -> None:
    st = _state()
    rec = _rec()
    lease, _ = _granted_lease(st, rec)
    assert st.cancel(rec.task_id, force=True) == [ins.CancelRunning(lease, rec.task_id, True)]
    assert rec.cancelled and rec.force_cancel and rec.retries_left == 0


def test_cancel_an_actor_call_is_left_to_the_actor_queue_and_unknown_ids_do_nothing() -> None:
    st = _state()
    call = _rec(actor=True)
    st.add(call)
    assert st.cancel(call.task_id, force=False) == [ins.CancelActorCall(call)]
    assert st.cancel(b"unknown", force=False) == []
    st.finish(call)
    assert st.cancel(call.task_id, force=False) == []


def test_when_the_queue_empties_outstanding_lease_requests_are_cancelled_once() -> None:
    st = _state()
    recs = [_rec() for _ in range(3)]
    reqs = _of(_submit(st, *recs), ins.RequestLease)
    out = st.lease_reply(
        reqs[0].kq, reqs[0].request_id, reqs[0].address, True, _grant()
    )  # one worker takes the first task
    for r in recs[1:]:
        _apply_outcomes(st, st.cancel(r.task_id, force=False))
    out = st.pump(reqs[0].kq)
    cancels = _of(out, ins.CancelLeaseRequest)
    assert {c.request_id for c in cancels} == {r.request_id for r in reqs[1:]}
    assert _of(st.pump(reqs[0].kq), ins.CancelLeaseRequest) == []


# -- lineage and shutdown -----------------------------------------------------------------------
def test_reopen_charges_a_retry_and_tracks_the_task_again() -> None:
    st = _state()
    rec = _rec(retries=2)
    lease, _ = _granted_lease(st, rec)
    _apply_outcomes(st, st.replies(lease, [_reply(rec)]))
    assert rec.done
    st.reopen(rec)
    assert not rec.done and rec.retries_left == 1 and rec.spec.attempt == 1
    assert st.tasks[rec.task_id] is rec and rec.lease is None


def test_close_returns_every_lease_cancels_requests_and_refuses_late_grants() -> None:
    st = _state()
    busy = _rec(key=("a",))
    lease, _ = _granted_lease(st, busy)
    req = _of(_submit(st, _rec(key=("b",))), ins.RequestLease)[0]
    out = st.close()
    assert ins.ReturnLease(lease, True) in out
    assert ins.CancelLeaseRequest(req.address, req.request_id) in out
    late = st.lease_reply(req.kq, req.request_id, req.address, True, _grant(7))
    assert late == [ins.ReturnGrant(req.address, b"L7")]
    assert st.pump(req.kq) == [] and st.ready([_rec(key=("c",))]) == []


def test_running_and_work_out() -> None:
    st = _state()
    assert not st.running() and not st.has_work_out()
    rec = _rec()
    lease, _ = _granted_lease(st, rec)
    assert st.running() and st.has_work_out()
    _apply_outcomes(st, st.replies(lease, [_reply(rec)]))
    assert not st.running() and st.has_work_out()  # it still holds the lease
    timer = [i for i in st.pump(lease.kq)]
    assert timer == []
    st.idle_expired(lease, lease.idle_gen)
    assert not st.has_work_out()


@pytest.mark.parametrize("status", ["GRANTED", "SPILLBACK", "INFEASIBLE", "RUNTIME_ENV_FAILED"])
def test_every_reply_answers_its_request(status: str) -> None:
    st = _state()
    req = _of(_submit(st, _rec()), ins.RequestLease)[0]
    reply = pb.LeaseReply(status=getattr(pb.LeaseReply, status), spill_address=OTHER)
    st.lease_reply(req.kq, req.request_id, req.address, True, reply)
    assert req.request_id not in req.kq.requests


def test_a_task_that_must_not_run_twice_never_waits_behind_another_on_a_worker() -> None:
    st = _state(max_depth=4)
    first = _rec()
    lease, _ = _granted_lease(st, first)
    st.replies(lease, [_reply(first, start_time=1.0, end_time=1.0)])  # fast
    busy = _rec()
    _submit(st, busy)
    once = _rec(retries=0)
    out = _submit(st, once)
    # Behind `busy` it would not be charged if the stream broke, and could run twice.
    assert _of(out, ins.Send) == [] and list(st.keys[once.key].queue) == [once]
    out = st.replies(lease, [_reply(busy, start_time=1.0, end_time=1.0)])
    assert ins.Send(lease, [once]) in out
