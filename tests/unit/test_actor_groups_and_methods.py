"""Concurrency groups and per-method options, without processes (issue 20 item 3).

``GroupQueues`` is the worker's decision of which actor calls start: events in (a call
arrives, ends, is cancelled, the actor exits), the calls to start out. The option checks
run where the user wrote the mistake: ``@nbcluster.method``, ``@nbcluster.remote``,
``.options()``.
"""

from __future__ import annotations

import asyncio
import types

import cloudpickle
import pytest

import nbcluster
from nbcluster import exceptions as exc
from nbcluster._actor_methods import check_call_group
from nbcluster._runtime.core import instructions as ins
from nbcluster._runtime.core.actor_state import ActorCallState, ActorConn
from nbcluster._runtime.protocol.rpc import pb
from nbcluster._runtime.worker.concurrency import DEFAULT_GROUP, GroupQueues, group_limits
from nbcluster.options import ActorOptions


def ids(*names: str) -> list[bytes]:
    return [n.encode() for n in names]


# --------------------------------------------------------------------------- GroupQueues


def test_default_limits_follow_ray() -> None:
    assert group_limits({}, 0, is_async=False) == {DEFAULT_GROUP: 1}
    assert group_limits({}, 0, is_async=True) == {DEFAULT_GROUP: 1000}
    assert group_limits({"io": 2, "compute": 4}, 3, is_async=False) == {
        DEFAULT_GROUP: 3,
        "io": 2,
        "compute": 4,
    }


def test_each_group_runs_at_most_its_limit_and_groups_do_not_wait_for_each_other() -> None:
    q = GroupQueues({DEFAULT_GROUP: 1, "io": 2, "compute": 4})
    started = []
    for i in range(5):
        started += q.submit(f"io{i}".encode(), "io")
    assert started == ids("io0", "io1")
    assert (q.running("io"), q.waiting("io")) == (2, 3)
    started = []
    for i in range(6):
        started += q.submit(f"c{i}".encode(), "compute")
    assert started == ids("c0", "c1", "c2", "c3")
    # the default group is free although io and compute are full
    assert q.submit(b"d0", DEFAULT_GROUP) == [b"d0"]
    assert q.submit(b"d1", DEFAULT_GROUP) == []
    assert q.running() == 7 and q.waiting() == 6


def test_a_finished_call_starts_the_next_of_its_own_group_in_arrival_order() -> None:
    q = GroupQueues({DEFAULT_GROUP: 1, "io": 1})
    assert q.submit(b"a", "io") == [b"a"]
    assert q.submit(b"b", "io") == []
    assert q.submit(b"c", "io") == []
    assert q.submit(b"x", DEFAULT_GROUP) == [b"x"]
    assert q.finished(b"x") == []  # nothing waits in the default group
    assert q.finished(b"a") == [b"b"]
    assert q.finished(b"b") == [b"c"]
    assert q.finished(b"c") == []
    assert q.finished(b"unknown") == []
    assert q.running() == 0 and q.waiting() == 0


def test_cancel_drops_a_waiting_call_but_not_a_running_one() -> None:
    q = GroupQueues({DEFAULT_GROUP: 1})
    q.submit(b"run", DEFAULT_GROUP)
    q.submit(b"wait", DEFAULT_GROUP)
    q.submit(b"after", DEFAULT_GROUP)
    assert q.cancel(b"run") is False
    assert q.cancel(b"wait") is True
    assert q.cancel(b"wait") is False
    assert q.cancel(b"never-seen") is False
    assert q.finished(b"run") == [b"after"]  # the cancelled call never starts


def test_drain_takes_every_waiting_call_when_the_actor_exits() -> None:
    q = GroupQueues({DEFAULT_GROUP: 1, "io": 1})
    for name, group in (("a", "io"), ("b", "io"), ("c", ""), ("d", ""), ("e", "io")):
        q.submit(name.encode(), group)
    assert sorted(q.drain()) == ids("b", "d", "e")
    assert q.waiting() == 0 and q.running() == 2
    assert q.finished(b"a") == [] and q.finished(b"c") == []


def test_bad_group_state_is_refused() -> None:
    with pytest.raises(ValueError, match="default group"):
        GroupQueues({"io": 1})
    with pytest.raises(ValueError, match="limits must be >= 1"):
        GroupQueues({DEFAULT_GROUP: 0})
    q = GroupQueues({DEFAULT_GROUP: 1})
    with pytest.raises(KeyError):
        q.submit(b"a", "io")
    q.submit(b"a", DEFAULT_GROUP)
    with pytest.raises(ValueError, match="submitted twice"):
        q.submit(b"a", DEFAULT_GROUP)
    assert "io" not in q and DEFAULT_GROUP in q


# --------------------------------------------------------------------------- @nbcluster.method


def test_method_works_bare_and_with_options() -> None:
    @nbcluster.remote(concurrency_groups={"io": 2})
    class Svc:
        @nbcluster.method
        def bare(self) -> int:
            return 1

        @nbcluster.method()
        def empty_parens(self) -> int:
            return 1

        @nbcluster.method(num_returns=2, concurrency_group="io", enable_task_events=False)
        def pair(self) -> tuple[int, int]:
            return 1, 2

        @nbcluster.method(max_task_retries=3)
        async def retried(self) -> None:
            pass

    meta = Svc._meta
    assert meta["bare"] == {"num_returns": 1, "is_async": False}
    assert meta["empty_parens"] == {"num_returns": 1, "is_async": False}
    assert meta["pair"] == {
        "num_returns": 2,
        "is_async": False,
        "concurrency_group": "io",
        "enable_task_events": False,
    }
    assert meta["retried"] == {"num_returns": 1, "is_async": True, "max_task_retries": 3}


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        (
            {"num_returns": -1},
            ValueError,
            r'^num_returns must be an integer >= 0, "streaming" or "dynamic", got -1$',
        ),
        ({"concurrency_group": ""}, TypeError, r"concurrency_group must be the name of one"),
        ({"concurrency_group": 3}, TypeError, r"a non-empty string\), got 3$"),
        ({"enable_task_events": "no"}, TypeError, r"^enable_task_events must be True or False"),
        ({"max_task_retries": -2}, ValueError, r"^max_task_retries must be an integer >= -1"),
        ({"num_return": 2}, ValueError, r"^Unexpected option 'num_return' for @nbcluster\.method"),
    ],
)
def test_bad_method_options_raise_at_decoration(kwargs, error, match) -> None:
    with pytest.raises(error, match=match):
        nbcluster.method(**kwargs)


def test_method_refuses_positional_arguments_other_than_the_function() -> None:
    with pytest.raises(TypeError, match=r"takes no positional arguments"):
        nbcluster.method(2)  # type: ignore[call-overload]


# --------------------------------------------------------------------------- groups on classes


def _io_class() -> type:
    class Svc:
        @nbcluster.method(concurrency_group="io")
        def fetch(self) -> None:
            pass

        def other(self) -> None:
            pass

    return Svc


def test_a_method_in_an_undefined_group_is_refused_when_the_class_is_decorated() -> None:
    with pytest.raises(
        ValueError,
        match=r"^Method _io_class\.<locals>\.Svc\.fetch is in concurrency group 'io', which the actor does not "
        r"define \(defined: none\)\. Define it with "
        r"@nbcluster\.remote\(concurrency_groups=\{'io': <max calls at once>\}\)\.$",
    ):
        nbcluster.remote(_io_class())
    with pytest.raises(ValueError, match=r"\(defined: 'compute'\)"):
        nbcluster.remote(concurrency_groups={"compute": 1})(_io_class())


def test_options_may_change_the_groups_but_must_keep_the_methods_groups() -> None:
    Svc = nbcluster.remote(concurrency_groups={"io": 2})(_io_class())
    assert Svc.options(concurrency_groups={"io": 5, "x": 1})._options.concurrency_groups == {
        "io": 5,
        "x": 1,
    }
    with pytest.raises(ValueError, match=r"Svc\.fetch is in concurrency group 'io'"):
        Svc.options(concurrency_groups={"x": 1})
    with pytest.raises(ValueError, match=r"Svc\.fetch is in"):
        Svc.options(num_cpus=1).options(concurrency_groups={})


@pytest.mark.parametrize(
    ("groups", "error", "match"),
    [
        ({"io": 0}, ValueError, r"^concurrency_groups\['io'\] must be an integer >= 1, got 0$"),
        ({"io": 1.5}, TypeError, r"^concurrency_groups\['io'\] must be an integer >= 1"),
        ({"": 1}, TypeError, r"group names must be non-empty strings, got ''$"),
        (["io"], TypeError, r"^concurrency_groups must be a dict of group name"),
    ],
)
def test_bad_concurrency_groups_are_refused_by_the_options(groups, error, match) -> None:
    with pytest.raises(error, match=match):
        ActorOptions(concurrency_groups=groups)


def test_concurrency_groups_options_are_frozen_and_pickle() -> None:
    opts = ActorOptions(concurrency_groups={"io": 2})
    assert hash(opts) == hash(ActorOptions(concurrency_groups={"io": 2}))
    assert cloudpickle.loads(cloudpickle.dumps(opts)) == opts
    assert ActorOptions().concurrency_groups is None


def test_a_call_naming_an_undefined_group_is_refused_in_options() -> None:
    meta = {"concurrency_groups": {"io": 2}}
    check_call_group("Svc", "fetch", "io", meta)
    check_call_group("Svc", "fetch", None, meta)
    with pytest.raises(
        ValueError,
        match=r"^Svc\.fetch\.options\(concurrency_group='nope'\): the actor has no concurrency "
        r"group 'nope' \(defined: 'io'\)\.",
    ):
        check_call_group("Svc", "fetch", "nope", meta)
    with pytest.raises(TypeError, match=r"concurrency_group must be the name"):
        check_call_group("Svc", "fetch", 7, meta)


# --------------------------------------------------------------------------- errors


def test_a_cancelled_call_error_is_both_a_task_error_and_task_cancelled() -> None:
    try:
        raise exc.TaskCancelledError("ab12")
    except exc.TaskCancelledError as e:
        err = exc.TaskError.from_exception(e, "Svc.slow", task_id="ab12")
    raised = cloudpickle.loads(cloudpickle.dumps(err)).as_instanceof_cause()
    assert isinstance(raised, exc.TaskError)
    assert isinstance(raised, exc.TaskCancelledError)
    assert raised.task_id == "ab12"
    assert "Svc.slow raised an exception" in str(raised)
    # other nbcluster errors as causes stay plain TaskErrors
    other = exc.TaskError.from_exception(exc.NbclusterSystemError("x"), "f").as_instanceof_cause()
    assert type(other) is exc.TaskError


def test_asyncio_actor_exit_is_an_nbcluster_error() -> None:
    assert issubclass(exc.AsyncioActorExit, exc.NbclusterError)
    assert not issubclass(exc.AsyncioActorExit, asyncio.CancelledError)


def test_exit_actor_outside_an_actor_is_a_type_error() -> None:
    with pytest.raises(TypeError, match=r"^exit_actor\(\) can only be called inside an actor"):
        nbcluster.actor.exit_actor()


# --------------------------------------------------------------------------- the caller's view


def _conn(st: ActorCallState, aid: bytes, address: str, owner: str, detached: bool = False):
    conn = st.conns[aid] = ActorConn(aid)
    conn.state = pb.ActorInfo.ALIVE
    conn.address = address
    conn.info = pb.ActorInfo(
        actor_id=aid,
        state=pb.ActorInfo.ALIVE,
        address=address,
        owner_address=owner,
        class_name="C",
        detached=detached,
    )
    return conn


def test_after_kill_the_caller_holds_the_actor_and_its_descendants_dead_at_once() -> None:
    """What ``nbcluster.kill`` does on the I/O loop before any later call is queued."""
    st = ActorCallState()
    parent = _conn(st, b"parent", "w:1", owner="driver")
    child = _conn(st, b"child", "w:2", owner="w:1")
    grandchild = _conn(st, b"grandchild", "w:3", owner="w:2")
    detached = _conn(st, b"detached", "w:4", owner="w:1", detached=True)
    other = _conn(st, b"other", "w:5", owner="driver")
    queued = types.SimpleNamespace(done=False, spec=pb.TaskSpec(actor_id=b"child"))
    child.queue.append(queued)  # a call waiting for the child fails now
    out = st.killed(b"parent", no_restart=True)
    assert parent.state == child.state == grandchild.state == pb.ActorInfo.DEAD
    assert "killed with nbcluster.kill()" in str(parent.death)
    assert "(its owner) was killed" in str(child.death)
    assert "(its owner) was killed" in str(grandchild.death)
    assert detached.state == other.state == pb.ActorInfo.ALIVE
    assert [(i.record, i.error) for i in out if type(i) is ins.Fail] == [(queued, child.death)]
    assert ins.CallDone(queued) in out
    # a kill that allows a restart leaves the actor to the head, but its children die
    st2 = ActorCallState()
    p2 = _conn(st2, b"p", "w:1", owner="driver")
    c2 = _conn(st2, b"c", "w:2", owner="w:1")
    st2.killed(b"p", no_restart=False)
    assert p2.state == pb.ActorInfo.ALIVE and c2.state == pb.ActorInfo.DEAD


def test_a_kill_whose_actor_the_heads_news_ended_first_still_ends_its_children() -> None:
    """The head's news that the killed actor died may reach the caller before ``kill``
    returns: its children must still be held dead at once (their own news comes later,
    and a call sent to a child not yet stopped would be answered)."""
    st = ActorCallState()
    parent = _conn(st, b"parent", "w:1", owner="driver")
    child = _conn(st, b"child", "w:2", owner="w:1")
    st.actor_info(
        parent,
        pb.ActorInfo(
            actor_id=b"parent",
            state=pb.ActorInfo.DEAD,
            address="w:1",
            owner_address="driver",
            death_cause="killed",
            version=2,
        ),
    )
    assert parent.state == pb.ActorInfo.DEAD and child.state == pb.ActorInfo.ALIVE
    st.killed(b"parent", no_restart=True)
    assert child.state == pb.ActorInfo.DEAD
    assert "(its owner) was killed" in str(child.death)


def test_an_actor_that_ended_itself_says_so_and_survives_pickling() -> None:
    err = exc.ActorDiedError("ab", reason="exit_actor() was called in stop", exited=True)
    again = cloudpickle.loads(cloudpickle.dumps(err))
    assert str(again) == (
        "The actor ended itself before finishing this task (actor_id=ab). Reason: "
        "exit_actor() was called in stop. It is not restarted; create a new actor to go on."
    )
    assert "died unexpectedly" in str(exc.ActorDiedError("ab", reason="its node died"))
