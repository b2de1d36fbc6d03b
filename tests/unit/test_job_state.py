"""The job state machine and the per-runtime_env worker pools, without processes."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from nbcluster._runtime.jobs import logfiles
from nbcluster._runtime.jobs.state import (
    STOP_GRACE_S,
    BadJobRequest,
    DuplicateJob,
    JobTable,
    NotTerminal,
    UnknownJob,
)
from nbcluster._runtime.node.state import Grant, KillWorker, NodeState, Redirect, StartWorker


def _submit(table: JobTable, sid: str = "", entrypoint: str = "python x.py", **kw: object) -> str:
    ids = iter(f"gen{i}" for i in itertools.count())
    job = table.submit(
        entrypoint=entrypoint,
        submission_id=sid,
        runtime_env="",
        metadata={},
        num_cpus=float(kw.get("num_cpus", 0)),  # type: ignore[arg-type]
        num_gpus=0.0,
        resources=kw.get("resources", {}),  # type: ignore[arg-type]
        now=100.0,
        new_id=lambda: next(ids),
    )
    return job.submission_id


def test_a_job_goes_pending_running_succeeded() -> None:
    t = JobTable()
    sid = _submit(t)
    assert t.get(sid).status == "PENDING" and sid == "gen0"
    t.update(sid, "RUNNING", 101.0, driver_pid=42)
    job = t.update(sid, "SUCCEEDED", 105.0, exit_code=0)
    assert (job.status, job.run_time, job.end_time, job.driver_pid) == (
        "SUCCEEDED",
        101.0,
        105.0,
        42,
    )
    assert job.has_exit_code and job.message == "Job finished successfully."
    # A finished job never changes again.
    assert t.update(sid, "FAILED", 106.0).status == "SUCCEEDED"


def test_failure_keeps_exit_code_message_and_type() -> None:
    t = JobTable()
    sid = _submit(t, "mine")
    job = t.update(
        sid,
        "FAILED",
        3.0,
        message="exit 3 ...",
        exit_code=3,
        error_type="JOB_ENTRYPOINT_COMMAND_ERROR",
    )
    assert (job.exit_code, job.message, job.error_type) == (
        3,
        "exit 3 ...",
        "JOB_ENTRYPOINT_COMMAND_ERROR",
    )


def test_bad_submissions_are_refused_with_the_fix() -> None:
    t = JobTable()
    _submit(t, "dup")
    with pytest.raises(DuplicateJob, match=r"^Job with submission_id 'dup' already exists"):
        _submit(t, "dup")
    with pytest.raises(BadJobRequest, match=r"entrypoint is empty"):
        _submit(t, entrypoint="  ")
    with pytest.raises(BadJobRequest, match=r"submission_id '../x' is not valid"):
        _submit(t, "../x")
    with pytest.raises(BadJobRequest, match=r"use entrypoint_num_cpus"):
        _submit(t, resources={"CPU": 1})
    with pytest.raises(BadJobRequest, match=r"non-negative"):
        _submit(t, num_cpus=-1)
    with pytest.raises(UnknownJob, match=r"Job 'nope' does not exist"):
        t.get("nope")


def test_stop_marks_the_job_and_a_kill_counts_as_stopped() -> None:
    t = JobTable()
    sid = _submit(t)
    t.update(sid, "RUNNING", 1.0)
    assert t.stop(sid, 10.0)
    assert t.overdue(10.0 + STOP_GRACE_S - 0.1) == []
    assert [j.submission_id for j in t.overdue(10.0 + STOP_GRACE_S)] == [sid]
    assert t.update(sid, "FAILED", 11.0, exit_code=-15).status == "STOPPED"
    assert not t.stop(sid, 12.0)  # already ended


def test_a_vanished_supervisor_fails_the_job_and_delete_needs_an_end() -> None:
    t = JobTable()
    sid = _submit(t)
    with pytest.raises(NotTerminal, match=r"is PENDING; stop it first"):
        t.delete(sid)
    job = t.supervisor_gone(sid, 5.0, "exit code -9")
    assert job is not None and job.status == "FAILED" and "exit code -9" in job.message
    assert job.error_type == "SUPERVISOR_DIED"
    assert t.supervisor_gone(sid, 6.0, "again") is None
    t.delete(sid)
    assert sid not in t.jobs


def test_log_names_cannot_escape_the_logs_folder(tmp_path: Path) -> None:
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs2").mkdir()
    (tmp_path / "logs" / "head.log").write_text("x")
    assert logfiles.safe_path(tmp_path / "logs", "head.log").name == "head.log"
    for bad in ("../logs2/x", "/etc/passwd", "..", "a/b", "..%2Fx/..", "x\0y", "~root", ""):
        with pytest.raises(logfiles.BadLogName):
            logfiles.safe_path(tmp_path / "logs", bad)
    (tmp_path / "logs" / "link").symlink_to(tmp_path / "logs2")
    with pytest.raises(logfiles.BadLogName):
        logfiles.safe_path(tmp_path / "logs", "link")


# -- workers pooled per runtime_env ---------------------------------------------------------------


def _node(cpus: float = 2, prestart: int = 2) -> NodeState:
    ids = (bytes([i]) * 16 for i in itertools.count(1))
    return NodeState(
        b"n" * 16, "node:1", {"CPU": cpus}, prestart=prestart, new_id=lambda: next(ids)
    )


def _register_all(st: NodeState, out: list) -> list:
    res = []
    for ins in out:
        if isinstance(ins, StartWorker):
            res += st.worker_registered(ins.worker_id, 1, f"w{ins.worker_id[0]}")
    return res


def test_a_runtime_env_request_gets_a_worker_of_its_own_env() -> None:
    st = _node()
    _register_all(st, st.start())
    out = st.request_lease(b"r1", {"CPU": 1}, "owner", b"j", env="envA")
    starts = [i for i in out if isinstance(i, StartWorker)]
    # The pool is full of plain workers: one is evicted for the envA worker.
    assert [s.env for s in starts] == ["envA"]
    assert any(isinstance(i, KillWorker) for i in out)
    grants = [i for i in st.worker_registered(starts[0].worker_id, 7, "wA") if isinstance(i, Grant)]
    assert grants and grants[0].worker.env == "envA"
    # Returned, it waits in the pool; the next envA request reuses it, a plain one does not.
    st.return_lease(grants[0].lease.lease_id)
    again = [
        i
        for i in st.request_lease(b"r2", {"CPU": 1}, "o", b"j", env="envA")
        if isinstance(i, Grant)
    ]
    assert again and again[0].worker.worker_id == starts[0].worker_id
    plain = [i for i in st.request_lease(b"r3", {"CPU": 1}, "o", b"j") if isinstance(i, Grant)]
    assert plain and plain[0].worker.env == ""


def test_a_failed_env_setup_fails_its_requests_only() -> None:
    st = _node(cpus=4, prestart=0)
    out = st.request_lease(b"r1", {"CPU": 1}, "o", b"j", env="bad")
    out += st.request_lease(b"r2", {"CPU": 1}, "o", b"j", env="bad")
    out += st.request_lease(b"r3", {"CPU": 1}, "o", b"j")
    starts = {i.env: i for i in out if isinstance(i, StartWorker)}
    failed = st.worker_start_failed(starts["bad"].worker_id, "pip failed")
    redirects = {r.request_id: r for r in failed if isinstance(r, Redirect)}
    assert set(redirects) == {b"r1", b"r2"}
    assert all(
        r.status == "RUNTIME_ENV_FAILED" and r.message == "pip failed" for r in redirects.values()
    )
    assert b"r3" in st.pending and not any(w.env == "bad" for w in st.workers.values())
