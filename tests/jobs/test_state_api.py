"""The state API, logs and internal KV against a real cluster (issue 17 item 3)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import nbcluster
from nbcluster import _connect
from nbcluster.experimental import internal_kv as kv
from nbcluster.job_submission import JobSubmissionClient
from nbcluster.testing import assert_no_processes, poll_for
from nbcluster.util import state

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def driver(env_cache: Any) -> Iterator[Any]:
    if nbcluster.is_initialized():
        nbcluster.shutdown()
    info = nbcluster.init(num_cpus=2)
    yield info
    nbcluster.shutdown()
    assert_no_processes(info.session_dir, timeout=15)


@nbcluster.remote
def fine(x: int) -> int:
    print(f"fine says {x}")
    return x


@nbcluster.remote
def raises() -> None:
    raise ValueError("boom in task")


@nbcluster.remote(max_retries=1)
def killed() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


@nbcluster.remote
class Greeter:
    def greet(self, name: str) -> str:
        print(f"greeting {name}")
        return f"hello {name}"


@pytest.fixture(scope="module")
def history(driver: Any) -> dict[str, Any]:
    """Some finished, failed and crashed tasks and a live actor."""
    # The crash first: a worker killed within a second of running other tasks takes their
    # not yet reported events with it (workers report once a second).
    crashed = killed.remote()
    with pytest.raises(nbcluster.exceptions.WorkerCrashedError):
        nbcluster.get(crashed)
    greeter = Greeter.options(name="greeter").remote()
    assert nbcluster.get(greeter.greet.remote("state")) == "hello state"
    assert nbcluster.get([fine.remote(i) for i in range(3)]) == [0, 1, 2]
    with pytest.raises(ValueError):
        nbcluster.get(raises.remote())
    # Workers report every second; owners half a second after a crash.
    poll_for(lambda: len(state.list_tasks(filters=[("name", "=", "killed")])) >= 2, timeout=15)
    poll_for(lambda: state.list_tasks(filters=[("name", "=", "raises")]), timeout=15)
    poll_for(lambda: len(state.list_tasks(filters=[("name", "=", "fine")])) == 3, timeout=15)
    return {"greeter": greeter, "crashed": crashed.task_id().hex()}


def test_a_killed_workers_task_is_failed_with_its_cause(history: dict[str, Any]) -> None:
    attempts = state.list_tasks(filters=[("task_id", "=", history["crashed"])])
    assert sorted(t.attempt_number for t in attempts) == [0, 1]  # max_retries=1: both recorded
    assert {t.state for t in attempts} == {"FAILED"}
    assert {t.error_type for t in attempts} == {"WORKER_DIED"}
    assert all("killed by SIGKILL" in (t.error_message or "") for t in attempts)
    latest = state.get_task(history["crashed"])
    assert latest is not None and latest.attempt_number == 1


def test_filters_limit_and_detail(history: dict[str, Any]) -> None:
    failed = state.list_tasks(filters=[("state", "=", "failed")])  # case-insensitive
    assert {t.name for t in failed} >= {"raises", "killed"}
    raised = [t for t in failed if t.name == "raises"][0]
    assert (
        raised.error_type == "TASK_EXECUTION_EXCEPTION" and "boom in task" in raised.error_message
    )
    assert all(t.state != "FAILED" for t in state.list_tasks(filters=[("state", "!=", "FAILED")]))
    assert len(state.list_tasks(limit=2)) == 2
    brief, full = state.list_actors()[0], state.list_actors(detail=True)[0]
    assert brief.worker_id is None and full.worker_id
    with pytest.raises(ValueError, match=r"Supported filter columns: actor_id, class_name"):
        state.list_actors(filters=[("colour", "=", "red")])
    with pytest.raises(ValueError, match=r"predicate must be '=' or '!='"):
        state.list_actors(filters=[("state", ">", "x")])


def test_actors_nodes_workers_jobs_and_summaries(history: dict[str, Any], driver: Any) -> None:
    actor_id = history["greeter"]._actor_id.hex()
    got = state.get_actor(actor_id)
    assert got is not None and (got.class_name, got.state, got.name) == (
        "Greeter",
        "ALIVE",
        "greeter",
    )
    assert state.get_actor(actor_id[:10]) == got  # a unique prefix works
    assert state.get_actor("ff" * 16) is None
    nodes = state.list_nodes()
    assert len(nodes) == 1 and nodes[0].state == "ALIVE" and nodes[0].is_head_node
    workers = state.list_workers(detail=True)
    assert any(w.pid == got.pid and w.state == "LEASED" for w in workers)
    jobs = state.list_jobs()
    assert any(j.job_id == driver.job_id and j.type == "DRIVER" for j in jobs)
    summary = state.summarize_tasks()["cluster"]["summary"]
    assert summary["fine"]["state_counts"] == {"FINISHED": 3}
    assert summary["killed"]["state_counts"] == {"FAILED": 1}  # by the latest attempt
    actors = state.summarize_actors()["cluster"]
    assert actors["summary"]["Greeter"]["state_counts"]["ALIVE"] == 1
    big = nbcluster.put(b"x" * 300_000)
    objects = state.list_objects(filters=[("object_id", "=", big.hex())])
    assert len(objects) == 1 and objects[0].object_size >= 300_000
    assert state.summarize_objects()["cluster"]["total_objects"] >= 1
    pg = nbcluster.util.placement_group([{"CPU": 0.1}])
    nbcluster.get(pg.ready())
    assert state.get_placement_group(pg.id.hex()).state == "CREATED"
    nbcluster.util.remove_placement_group(pg)


def test_logs_by_actor_task_node_and_job(history: dict[str, Any], driver: Any) -> None:
    actor_id = history["greeter"]._actor_id.hex()
    assert "greeting state" in "".join(state.get_log(actor_id=actor_id))
    task = state.list_tasks(filters=[("name", "=", "fine")])[0]
    assert "fine says" in "".join(state.get_log(task_id=task.task_id))
    listing = state.list_logs()
    assert "head.log" in listing["head"] and listing["worker"]
    node = state.list_nodes()[0].node_id
    worker_file = state.list_logs(node_id=node, glob_filter="worker-*")["worker"][0]
    assert isinstance("".join(state.get_log(node_id=node, filename=worker_file, tail=-1)), str)
    with pytest.raises(ValueError, match=r"not a log file name"):
        "".join(state.get_log(filename="../token"))
    with pytest.raises(LookupError, match=r"no log file 'nope.log'"):
        "".join(state.get_log(filename="nope.log"))
    with pytest.raises(ValueError, match=r"exactly one of"):
        list(state.get_log(actor_id=actor_id, task_id=task.task_id))
    client = JobSubmissionClient()
    sid = client.submit_job(entrypoint="python -c \"print('job output here')\"")
    client.wait_until_finished(sid, timeout=60)
    assert "job output here" in "".join(state.get_log(submission_id=sid))
    assert state.get_job(sid).status == "SUCCEEDED"


LOG_NAME_VARIANTS = [
    ("../token", ValueError),
    ("/etc/passwd", ValueError),
    ("{session}/token", ValueError),  # absolute, into the session
    ("../logs-evil/secret.log", ValueError),  # sibling prefix of the logs folder
    ("..\\token", ValueError),
    ("\\\\host\\share\\secret.log", ValueError),  # UNC
    ("head.log\0", ValueError),
    ("escape.log", ValueError),  # a symlink in the logs folder to a file outside it
    ("sibling.log", ValueError),  # a symlink into logs-evil
    ("..%2ftoken", LookupError),  # never decoded: a missing file of the folder
    ("%2e%2e%2ftoken", LookupError),
    ("%252e%252e%252ftoken", LookupError),
]


def test_log_names_that_leave_the_logs_folder_are_refused(driver: Any) -> None:
    """S06: through the head and through a node's agent, nothing outside ``logs/`` is read."""
    session = Path(driver.session_dir)
    secret = "S06 secret outside the logs folder"
    evil = session / "logs-evil"
    evil.mkdir()
    (evil / "secret.log").write_text(secret)
    (session / "token-copy").write_text(secret)
    links = [session / "logs" / "escape.log", session / "logs" / "sibling.log"]
    links[0].symlink_to(session / "token-copy")
    links[1].symlink_to(evil / "secret.log")
    node = state.list_nodes()[0].node_id
    try:
        for name, error in LOG_NAME_VARIANTS:
            filename = name.format(session=session)
            for where in ({}, {"node_id": node}):
                with pytest.raises(error, match=r"not a log file name|no log file") as info:
                    "".join(state.get_log(filename=filename, tail=-1, **where))
                assert secret not in str(info.value), (name, where)
        "".join(state.get_log(filename="head.log", tail=-1))  # a plain name is still served
        for glob in ("../*", "../logs-evil/*", "/etc/*", "*/../*", "..%2f*"):
            for where in ({}, {"node_id": node}):
                listing = state.list_logs(glob_filter=glob, **where)
                assert not any(listing.values()), (glob, where, listing)
    finally:
        for link in links:
            link.unlink()


def test_follow_streams_what_is_appended(history: dict[str, Any]) -> None:
    actor = history["greeter"]
    actor_id = actor._actor_id.hex()
    stream = state.get_log(actor_id=actor_id, follow=True, tail=0)
    next(stream)  # the (empty) tail
    nbcluster.get(actor.greet.remote("followed"))
    seen = ""
    deadline = time.monotonic() + 15
    while "greeting followed" not in seen and time.monotonic() < deadline:
        seen += next(stream)
    stream.close()
    assert "greeting followed" in seen


def test_internal_kv(driver: Any) -> None:
    assert kv._internal_kv_initialized()
    assert kv._internal_kv_put("k1", "v1") is False  # it did not exist
    assert kv._internal_kv_put(b"k1", b"v2", overwrite=False) is True
    assert kv._internal_kv_get("k1") == b"v1"
    assert kv._internal_kv_put("k2", "x", namespace="other") is False
    assert kv._internal_kv_exists("k2") is False and kv._internal_kv_exists("k2", namespace="other")
    kv._internal_kv_put("k10", "y")
    assert kv._internal_kv_list("k1") == [b"k1", b"k10"]
    assert kv._internal_kv_del("k1", del_by_prefix=True) == 2
    assert kv._internal_kv_get("k1") is None
    with pytest.raises(TypeError, match=r"key must be str or bytes"):
        kv._internal_kv_get(3)  # type: ignore[arg-type]


def test_cli_list_summary_get_and_logs(history: dict[str, Any], driver: Any) -> None:
    env = {**os.environ, "NBCLUSTER_ADDRESS": driver.address}

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "nbcluster.cli", *args],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
        )

    r = cli("list", "tasks", "--filter", "state=FAILED")
    assert r.returncode == 0 and "killed" in r.stdout and "WORKER_DIED" in r.stdout
    assert "fine" not in r.stdout
    r = cli("summary", "tasks")
    assert r.returncode == 0 and "FINISHED: 3" in r.stdout
    actor_id = history["greeter"]._actor_id.hex()
    r = cli("get", "actors", actor_id)
    assert r.returncode == 0 and '"class_name": "Greeter"' in r.stdout
    r = cli("logs", "actor", "--id", actor_id)
    assert r.returncode == 0 and "greeting state" in r.stdout
    r = cli("logs")
    assert "head.log" in r.stdout
    r = cli("list", "actors", "--filter", "nope=1")
    assert r.returncode == 1 and "Supported filter columns" in r.stderr


def test_the_state_rpcs_refuse_callers_without_the_token(driver: Any) -> None:
    from nbcluster._runtime.jobs.head_client import HeadJobsClient

    with HeadJobsClient(driver.address, "0" * 64) as wrong:
        with pytest.raises(nbcluster.exceptions.AuthenticationError):
            wrong.list_jobs()
        with pytest.raises(nbcluster.exceptions.AuthenticationError):
            wrong.list_logs()
    with _connect.connect(driver.address) as right:
        assert right.list_logs()
