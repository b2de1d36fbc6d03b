"""The caller's actor-call state machine (``_runtime/core/actor_state.py``), without
processes: call order, restarts and retries, death, cancel, release."""

from __future__ import annotations

import itertools
from typing import Any

from nbcluster import exceptions as exc
from nbcluster._runtime.core import instructions as ins
from nbcluster._runtime.core.actor_state import ActorCallState, death_error
from nbcluster._runtime.core.records import TaskRecord
from nbcluster._runtime.protocol.protos import nbcluster_pb2 as pb

AID = b"actor-1"
_ids = itertools.count(1)


def _call(retries: int = 0, resolved: bool = True) -> TaskRecord:
    rec = TaskRecord()
    rec.task_id = next(_ids).to_bytes(8, "big")
    rec.spec = pb.TaskSpec(task_id=rec.task_id, actor_id=AID)
    rec.actor = True
    rec.retries_left = retries
    rec.resolved = resolved
    rec.name = "C.f"
    return rec


def _info(version: int, state: int = pb.ActorInfo.ALIVE, address: str = "w:1", **kw: Any):
    return pb.ActorInfo(actor_id=AID, version=version, state=state, address=address, **kw)


def _of(out: list[Any], kind: type) -> list[Any]:
    return [i for i in out if type(i) is kind]


def _alive(st: ActorCallState, *calls: TaskRecord) -> Any:
    for c in calls or (_call(resolved=False),):
        st.enqueue(c)
    conn = st.conns[AID]
    return conn, st.actor_info(conn, _info(1))


def test_the_first_call_starts_one_watch_and_waits_until_the_actor_is_alive() -> None:
    st = ActorCallState()
    a, b = _call(), _call()
    out = st.enqueue(a)
    conn = st.conns[AID]
    assert out == [ins.WatchActor(conn)]
    assert st.enqueue(b) == [] and st.ready(a) == []  # no second watch; not alive yet
    out = st.actor_info(conn, _info(1))
    assert out == [ins.ConnectActor(conn, "w:1", 1), ins.SendActorCalls(conn, [a, b])]
    assert list(conn.inflight.values()) == [a, b]


def test_an_actor_registered_here_is_watched_from_the_version_the_head_answered() -> None:
    """The registration's reply is the head's record at version 1 (PENDING): the first
    watch waits for a later version instead of fetching that one again."""
    st = ActorCallState()
    st.registered(AID, 1)
    a = _call()
    out = st.enqueue(a)
    conn = st.conns[AID]
    assert out == [ins.WatchActor(conn)] and conn.version == 1
    assert st.actor_info(conn, _info(1, pb.ActorInfo.PENDING, "")) == []  # not news
    out = st.actor_info(conn, _info(2))
    assert out == [ins.ConnectActor(conn, "w:1", 1), ins.SendActorCalls(conn, [a])]


def test_a_registration_seen_after_the_watch_began_changes_nothing() -> None:
    st = ActorCallState()
    a = _call()
    st.enqueue(a)
    conn = st.conns[AID]
    st.actor_info(conn, _info(2))  # alive already
    st.registered(AID, 1)
    assert conn.version == 2 and conn.state == pb.ActorInfo.ALIVE


def test_calls_go_out_in_submission_order_even_when_a_later_one_is_ready_first() -> None:
    st = ActorCallState()
    a, b = _call(resolved=False), _call()
    conn, out = _alive(st, a, b)
    assert _of(out, ins.SendActorCalls) == []  # b waits behind a
    a.resolved = True
    assert st.ready(a) == [ins.SendActorCalls(conn, [a, b])]


def test_a_reply_completes_its_call_and_frees_its_place() -> None:
    st = ActorCallState()
    a = _call()
    conn, _ = _alive(st, a)
    reply = pb.TaskReply(task_id=a.task_id)
    assert st.replies(conn, 1, [reply]) == [ins.CallDone(a), ins.Complete(a, reply)]
    assert not conn.inflight and not st.running()


def test_a_restart_retries_sent_calls_first_and_in_order_when_retries_allow() -> None:
    st = ActorCallState()
    a, b = _call(retries=1), _call(retries=1)
    conn, _ = _alive(st, a, b)
    later = _call(retries=1)
    st.enqueue(later)
    assert st.stream_ended(conn, 1) == [ins.RecheckActor(conn, 1)]  # maybe only the link
    assert conn.state == pb.ActorInfo.RESTARTING and list(conn.queue) == [a, b, later]
    assert (a.retries_left, a.spec.attempt) == (0, 1)
    assert st.actor_info(conn, _info(2, pb.ActorInfo.RESTARTING, address="")) == []
    out = st.actor_info(conn, _info(3, address="w:2"))
    assert out == [ins.ConnectActor(conn, "w:2", 2), ins.SendActorCalls(conn, [a, b, later])]


def test_without_retries_a_call_in_flight_when_the_actor_died_fails() -> None:
    st = ActorCallState()
    a = _call(retries=0)
    conn, _ = _alive(st, a)
    out = st.stream_ended(conn, 1)
    assert out[0] == ins.CallDone(a)
    assert isinstance(out[1].error, exc.ActorDiedError) and "max_task_retries" in str(out[1].error)
    assert out[2] == ins.RecheckActor(conn, 1)


def test_a_stream_that_never_opened_puts_its_calls_back_without_spending_retries() -> None:
    st = ActorCallState()
    a, b = _call(retries=0), _call(retries=0)
    conn, _ = _alive(st, a, b)  # sent to stream 1, which then fails to connect
    later = _call(retries=0)
    st.enqueue(later)
    assert st.open_failed(conn, 1) == [ins.RecheckActor(conn, 1)]
    assert list(conn.queue) == [a, b, later] and not conn.inflight
    assert (a.retries_left, a.spec.attempt) == (0, 0)  # nothing went out: no retry spent
    assert conn.state == pb.ActorInfo.RESTARTING and conn.stream == 0
    out = st.reconnect(conn, 1, "w:1")  # the ping answered: the same incarnation again
    assert out == [ins.ConnectActor(conn, "w:1", 2), ins.SendActorCalls(conn, [a, b, later])]
    assert st.open_failed(conn, 1) == []  # an old stream's news changes nothing


def test_the_end_of_an_old_stream_is_ignored() -> None:
    st = ActorCallState()
    a = _call(retries=0)
    conn, _ = _alive(st, a)
    st.actor_info(conn, _info(2, address="w:2"))  # moved: stream 2 replaces stream 1
    assert conn.stream == 2
    assert st.stream_ended(conn, 1) == [] and conn.state == pb.ActorInfo.ALIVE


def test_stale_news_is_ignored_but_death_is_never_stale() -> None:
    st = ActorCallState()
    conn, _ = _alive(st)
    st.actor_info(conn, _info(5))
    assert st.actor_info(conn, _info(4, address="w:9")) == [] and conn.address == "w:1"
    out = st.actor_info(conn, _info(3, pb.ActorInfo.DEAD, death_kind="killed"))
    assert out[0] == ins.CloseActorStream(conn) and conn.state == pb.ActorInfo.DEAD


def test_a_dead_actor_fails_its_queued_and_sent_calls_and_every_later_call_at_once() -> None:
    st = ActorCallState()
    sent, waiting = _call(), _call(resolved=False)
    conn, _ = _alive(st, sent, waiting)
    out = st.actor_info(conn, _info(2, pb.ActorInfo.DEAD, death_kind="killed", class_name="C"))
    fails = _of(out, ins.Fail)
    assert [f.record for f in fails] == [sent, waiting]
    assert "killed with nbcluster.kill()" in str(fails[0].error)
    assert len(_of(out, ins.CallDone)) == 2
    late = _call()
    out = st.enqueue(late)
    assert out == [ins.CallDone(late), ins.Fail(late, conn.death)]  # and no new watch


def test_an_actor_the_head_does_not_know_is_dead() -> None:
    st = ActorCallState()
    a = _call()
    st.enqueue(a)
    out = st.actor_unknown(st.conns[AID])
    assert "no such actor" in str(_of(out, ins.Fail)[0].error)


def test_cancel_asks_the_actor_for_a_sent_call_and_fails_a_queued_one() -> None:
    st = ActorCallState()
    sent, queued = _call(), _call(resolved=False)
    conn, _ = _alive(st, sent, queued)
    assert st.cancel(sent) == [ins.CancelActorRemote("w:1", sent.task_id)]
    out = st.cancel(queued)
    assert isinstance(out[0].error, exc.TaskCancelledError)
    queued.done = True  # the shell placed the error; the queue drops it when it gets there
    assert st.ready(queued) == [ins.CallDone(queued)] and not conn.queue


def test_the_last_handle_gone_ends_the_actor_once_its_calls_are_done() -> None:
    pending = {AID: 1}
    st = ActorCallState(pending=lambda aid: pending.get(aid, 0))
    a = _call()
    conn, _ = _alive(st, a)
    assert st.release_when_idle(AID) == []  # a call is still out
    out = st.replies(conn, 1, [pb.TaskReply(task_id=a.task_id)])
    assert out[-1] == ins.KillActor(AID)
    assert st.release_when_idle(b"never-called") == [ins.KillActor(b"never-called")]


def test_calls_still_on_their_way_keep_the_actor() -> None:
    st = ActorCallState(pending=lambda aid: 1)  # a call made but not yet enqueued
    conn, _ = _alive(st)
    assert st.release_when_idle(AID) == []


def test_close_closes_every_stream() -> None:
    st = ActorCallState()
    conn, _ = _alive(st)
    assert st.close() == [ins.CloseActorStream(conn)]
    conn.watching = False
    assert st.enqueue(_call()) == []  # no new watch after close


def test_death_errors_name_how_the_actor_ended() -> None:
    err = death_error(_info(1, pb.ActorInfo.DEAD, death_kind="out_of_scope", class_name="C"))
    assert isinstance(err, exc.ActorDiedError) and "out of scope" in str(err)
    unsched = death_error(_info(1, pb.ActorInfo.DEAD, death_kind="unschedulable"))
    assert isinstance(unsched, exc.ActorUnschedulableError)


def test_when_the_head_stays_away_calls_waiting_for_placement_fail_but_connected_ones_go_on() -> (
    None
):
    st = ActorCallState()
    waiting = _call()
    st.enqueue(waiting)
    conn = st.conns[AID]
    err = exc.HeadUnavailableError("the head cannot be reached")
    out = st.head_unreachable(conn, err)
    assert out == [ins.CallDone(waiting), ins.Fail(waiting, err)] and not conn.queue
    sent = _call()
    conn2, _ = _alive(ActorCallState(), sent)
    assert ActorCallState().head_unreachable(conn2, err) == []


def test_a_broken_link_to_a_live_actor_is_reconnected_to_the_same_incarnation() -> None:
    st = ActorCallState()
    a = _call(retries=0)
    conn, _ = _alive(st, a)
    st.stream_ended(conn, 1)
    later = _call()
    st.enqueue(later)
    out = st.reconnect(conn, 1, "w:1")
    assert out == [ins.ConnectActor(conn, "w:1", 2), ins.SendActorCalls(conn, [later])]
    assert st.reconnect(conn, 1, "w:1") == []  # connected already
    st.stream_ended(conn, 2)
    st.actor_info(conn, _info(2, pb.ActorInfo.RESTARTING, address=""))
    assert st.reconnect(conn, 1, "w:1") == []  # a newer incarnation is on its way


def test_moving_to_a_new_address_retries_or_fails_what_the_old_stream_carried() -> None:
    st = ActorCallState()
    once, again = _call(retries=0), _call(retries=1)
    conn, _ = _alive(st, once, again)
    out = st.actor_info(conn, _info(2, address="w:2"))
    fails = [i for i in out if type(i) is ins.Fail]
    assert [f.record for f in fails] == [once]
    assert ins.ConnectActor(conn, "w:2", 2) in out
    assert ins.SendActorCalls(conn, [again]) in out and again.spec.attempt == 1


def test_a_stream_broken_by_our_own_kill_says_the_actor_was_killed() -> None:
    st = ActorCallState()
    running = _call(retries=3)  # retries do not apply: the kill is no_restart
    conn, _ = _alive(st, running)
    st.killing(AID)  # nbcluster.kill() queued this before asking the head
    out = st.stream_ended(conn, 1)  # the worker died before the head's news came
    fail = [i for i in out if type(i) is ins.Fail][0]
    assert fail.record is running and "killed with nbcluster.kill()" in str(fail.error)
    other = ActorCallState()
    conn2, _ = _alive(other, _call())
    other.killing(AID)
    other.kill_aborted(AID)  # the kill never reached the head
    out = other.stream_ended(conn2, 1)
    assert "died, or the connection to it broke" in str(out[1].error)
