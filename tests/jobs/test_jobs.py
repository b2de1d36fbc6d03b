"""Jobs end to end against a real cluster (issue 17 items 1 and 5).

Submitted entrypoints run under a supervisor on the cluster, as drivers of it; status and
logs live with the head; bad input is refused early and leaves nothing behind; stop ends
the whole process group; a head restart loses neither status nor logs.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from nbcluster import LocalCluster, _connect
from nbcluster.job_submission import JobStatus, JobSubmissionClient, JobType

pytestmark = pytest.mark.integration

PY = "python"  # the supervisor puts the cluster's interpreter first on PATH


def _script(tmp_path: Path, name: str, body: str) -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return path


def _driver_pid(cluster: LocalCluster, sid: str) -> int:
    with _connect.connect(cluster.address) as head:
        return int(head.get_job(sid).driver_pid)


def test_entrypoint_is_a_driver_of_the_cluster_and_succeeds(jobs, tmp_path, wait_job) -> None:
    script = _script(
        tmp_path,
        "job.py",
        """
        import nbcluster
        nbcluster.init()
        @nbcluster.remote
        def square(x):
            return x * x
        print("squares", nbcluster.get([square.remote(i) for i in range(4)]))
        """,
    )
    sid = jobs.submit_job(entrypoint=f"{PY} {script}", metadata={"owner": "test"})
    assert sid.startswith("nbcsubmit_")
    assert wait_job(jobs, sid, {JobStatus.SUCCEEDED, JobStatus.FAILED}) == JobStatus.SUCCEEDED
    assert "squares [0, 1, 4, 9]" in jobs.get_job_logs(sid)
    info = jobs.get_job_info(sid)
    assert info.driver_exit_code == 0 and info.message == "Job finished successfully."
    assert info.metadata == {"owner": "test"} and info.type is JobType.SUBMISSION
    assert info.start_time <= info.end_time
    assert info.job_id and info.driver_info is not None  # its init() registered as this job
    listed = {j.submission_id: j for j in jobs.list_jobs() if j.type is JobType.SUBMISSION}
    assert listed[sid].status is JobStatus.SUCCEEDED


def test_failing_entrypoint_is_failed_with_exit_code_and_last_lines(jobs, wait_job) -> None:
    sid = jobs.submit_job(entrypoint=f"{PY} -c \"print('about to fail'); import sys; sys.exit(3)\"")
    assert wait_job(jobs, sid, {JobStatus.FAILED, JobStatus.SUCCEEDED}) == JobStatus.FAILED
    info = jobs.get_job_info(sid)
    assert info.driver_exit_code == 3 and info.error_type == "JOB_ENTRYPOINT_COMMAND_ERROR"
    assert info.message.startswith("Job entrypoint command failed with exit code 3")
    assert "about to fail" in info.message


def test_an_entrypoint_that_cannot_start_fails_with_the_reason(jobs, wait_job) -> None:
    sid = jobs.submit_job(entrypoint="no-such-command-xyz --flag")
    assert wait_job(jobs, sid, {JobStatus.FAILED}) == JobStatus.FAILED
    info = jobs.get_job_info(sid)
    assert info.error_type == "JOB_ENTRYPOINT_COMMAND_START_ERROR"
    assert "no-such-command-xyz" in info.message and "sh -c" in info.message


def test_bad_input_is_refused_and_leaves_nothing_behind(
    jobs, job_cluster, tmp_path, monkeypatch
) -> None:
    before = {j.submission_id for j in jobs.list_jobs()}
    for call in (jobs.get_job_info, jobs.stop_job, jobs.delete_job, jobs.get_job_logs):
        with pytest.raises(RuntimeError, match=r"Job 'nope' does not exist"):
            call("nope")
    sid = jobs.submit_job(entrypoint="true", submission_id="dup-1")
    with pytest.raises(RuntimeError, match=r"submission_id 'dup-1' already exists"):
        jobs.submit_job(entrypoint="true", submission_id="dup-1")
    with pytest.raises(ValueError, match=r"working_dir.*does not exist"):
        jobs.submit_job(entrypoint="true", runtime_env={"working_dir": str(tmp_path / "missing")})
    with pytest.raises(ValueError, match=r"unknown runtime_env key 'colour'"):
        jobs.submit_job(entrypoint="true", runtime_env={"colour": "red"})
    big = tmp_path / "big"
    (big / "data").mkdir(parents=True)
    (big / "data" / "blob.bin").write_bytes(os.urandom(300_000))
    (big / "main.py").write_text("print(1)\n")
    monkeypatch.setenv("NBCLUSTER_RUNTIME_ENV_MAX_PACKAGE_BYTES", "100000")
    small = JobSubmissionClient(job_cluster.address)
    with pytest.raises(ValueError, match=r"over the 0 MiB limit.*data/ \(0\.3 MiB\).*excludes"):
        small.submit_job(entrypoint="true", runtime_env={"working_dir": str(big)})
    # Excluding the data makes it fit.
    ok = small.submit_job(
        entrypoint=f"{PY} main.py", runtime_env={"working_dir": str(big), "excludes": ["data/"]}
    )
    small.close()
    after = {j.submission_id for j in jobs.list_jobs()}
    assert after - before == {sid, ok}  # the refused ones left no record
    packages = list((job_cluster.session_dir / "runtime_env" / "packages").iterdir())
    assert len(packages) == 1 and packages[0].stat().st_size < 100_000


def test_stop_ends_the_whole_process_group_within_5s(
    jobs, job_cluster, wait_job, alive_group
) -> None:
    # The entrypoint ignores SIGTERM and has a child: only SIGKILL of the group ends both.
    code = (
        "import signal, subprocess, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        "subprocess.Popen(['sleep', '300']); print('ready', flush=True); time.sleep(300)"
    )
    sid = jobs.submit_job(entrypoint=f'{PY} -c "{code}"')
    wait_job(jobs, sid, {JobStatus.RUNNING})
    deadline = time.monotonic() + 30
    while "ready" not in jobs.get_job_logs(sid) and time.monotonic() < deadline:
        time.sleep(0.05)
    pgid = _driver_pid(job_cluster, sid)
    assert pgid > 0 and alive_group(pgid)
    start = time.monotonic()
    assert jobs.stop_job(sid) is True
    while alive_group(pgid) and time.monotonic() - start < 5.0:
        time.sleep(0.02)
    assert not alive_group(pgid), "the job's process group outlived stop_job by 5 s"
    assert wait_job(jobs, sid, {JobStatus.STOPPED}, timeout=10) == JobStatus.STOPPED
    assert jobs.stop_job(sid) is False  # already ended
    assert jobs.delete_job(sid) is True
    assert not (job_cluster.session_dir / "logs" / f"job-driver-{sid}.log").exists()


def test_a_running_job_cannot_be_deleted(jobs, wait_job) -> None:
    sid = jobs.submit_job(entrypoint="sleep 30")
    wait_job(jobs, sid, {JobStatus.RUNNING})
    with pytest.raises(RuntimeError, match=r"is RUNNING; stop it first"):
        jobs.delete_job(sid)
    jobs.stop_job(sid)
    wait_job(jobs, sid, {JobStatus.STOPPED})


def test_the_job_outlives_its_submitter(job_cluster, jobs, tmp_path, wait_job) -> None:
    flag = tmp_path / "go"
    script = _script(
        tmp_path,
        "waits.py",
        f"""
        import os, time
        while not os.path.exists({str(flag)!r}):
            time.sleep(0.05)
        print("released")
        """,
    )
    submitter = (
        "from nbcluster.job_submission import JobSubmissionClient; "
        f"print(JobSubmissionClient({job_cluster.address!r}).submit_job("
        f"entrypoint='{PY} {script}', submission_id='outlives'))"
    )
    out = subprocess.run(
        [sys.executable, "-c", submitter], capture_output=True, text=True, timeout=60, check=True
    )
    assert out.stdout.strip() == "outlives"  # the submitter has exited
    wait_job(jobs, "outlives", {JobStatus.RUNNING})
    flag.touch()
    assert (
        wait_job(jobs, "outlives", {JobStatus.SUCCEEDED, JobStatus.FAILED}) == JobStatus.SUCCEEDED
    )
    assert "released" in jobs.get_job_logs("outlives")


def test_logs_follow_until_the_job_ends(jobs, tmp_path) -> None:
    script = _script(
        tmp_path,
        "lines.py",
        """
        import time
        for i in range(3):
            print("line", i, flush=True)
            time.sleep(0.2)
        """,
    )
    sid = jobs.submit_job(entrypoint=f"{PY} {script}")

    async def collect() -> str:
        return "".join([text async for text in jobs.tail_job_logs(sid)])

    text = asyncio.run(collect())
    assert [ln for ln in text.splitlines() if ln.startswith("line")] == [
        "line 0",
        "line 1",
        "line 2",
    ]
    assert jobs.get_job_status(sid) is JobStatus.SUCCEEDED


def test_entrypoint_resources_are_held_while_it_runs(jobs, tmp_path, wait_job) -> None:
    flag = tmp_path / "release"
    script = _script(
        tmp_path,
        "hold.py",
        f"""
        import os, time
        while not os.path.exists({str(flag)!r}):
            time.sleep(0.05)
        """,
    )
    first = jobs.submit_job(entrypoint=f"{PY} {script}", entrypoint_num_cpus=2)
    wait_job(jobs, first, {JobStatus.RUNNING})
    second = jobs.submit_job(entrypoint="true", entrypoint_num_cpus=1)
    time.sleep(1.0)
    info = jobs.get_job_info(second)
    assert info.status is JobStatus.PENDING and "Waiting for resources" in info.message
    flag.touch()
    assert wait_job(jobs, first, {JobStatus.SUCCEEDED, JobStatus.FAILED}) == JobStatus.SUCCEEDED
    assert wait_job(jobs, second, {JobStatus.SUCCEEDED, JobStatus.FAILED}) == JobStatus.SUCCEEDED


def test_head_restart_while_a_job_runs_keeps_status_and_logs(
    job_cluster, tmp_path, wait_job
) -> None:
    flag = tmp_path / "after-restart"
    script = _script(
        tmp_path,
        "long.py",
        f"""
        import os, time
        print("before restart", flush=True)
        while not os.path.exists({str(flag)!r}):
            time.sleep(0.05)
        print("after restart", flush=True)
        """,
    )
    client = JobSubmissionClient(job_cluster.address)
    sid = client.submit_job(entrypoint=f"{PY} {script}", submission_id="survivor")
    wait_job(client, sid, {JobStatus.RUNNING})
    deadline = time.monotonic() + 30
    while "before restart" not in client.get_job_logs(sid) and time.monotonic() < deadline:
        time.sleep(0.05)
    client.close()
    job_cluster.restart_head()
    client = JobSubmissionClient(job_cluster.address)
    try:
        assert client.get_job_status(sid) is JobStatus.RUNNING
        assert "before restart" in client.get_job_logs(sid)
        flag.touch()
        assert wait_job(client, sid, {JobStatus.SUCCEEDED, JobStatus.FAILED}) == JobStatus.SUCCEEDED
        logs = client.get_job_logs(sid)
        assert logs.index("before restart") < logs.index("after restart")
    finally:
        client.close()


def test_cli_submit_follows_logs_and_reports_the_outcome(job_cluster, tmp_path) -> None:
    env = {**os.environ, "NBCLUSTER_ADDRESS": job_cluster.address}
    (tmp_path / "wd").mkdir()
    (tmp_path / "wd" / "hello.py").write_text("import os; print('hi from', os.environ['WHO'])\n")

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "nbcluster.cli", "job", *args],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
        )

    r = cli(
        "submit",
        "--working-dir",
        str(tmp_path / "wd"),
        "--runtime-env-json",
        '{"env_vars": {"WHO": "cli"}}',
        "--submission-id",
        "cli-1",
        "--",
        PY,
        "hello.py",
    )
    assert r.returncode == 0, r.stderr
    assert "Job 'cli-1' submitted successfully" in r.stdout and "hi from cli" in r.stdout
    assert "Job 'cli-1' succeeded" in r.stdout
    r = cli(
        "submit", "--no-wait", "--submission-id", "cli-2", "--", "sh", "-c", "echo oops; exit 4"
    )
    assert r.returncode == 0 and "nbcluster job logs cli-2 --follow" in r.stdout
    r = cli("logs", "cli-2", "--follow")
    assert "oops" in r.stdout
    r = cli("status", "cli-2")
    assert "FAILED" in r.stdout and "exit code 4" in r.stdout
    r = cli("list")
    assert "cli-1" in r.stdout and "SUCCEEDED" in r.stdout
    r = cli("submit", "--submission-id", "cli-1", "--", "true")
    assert r.returncode == 1 and "already exists" in r.stderr
    r = cli("delete", "cli-2")
    assert r.returncode == 0
    r = cli("status", "cli-2")
    assert r.returncode == 1 and "does not exist" in r.stderr


def test_the_jobs_environment_reaches_its_tasks_merged_with_inits(jobs, tmp_path, wait_job) -> None:
    """A job's runtime_env is inherited by its tasks; init(runtime_env=) merges into it, and
    a conflicting value is an error unless NBCLUSTER_OVERRIDE_JOB_RUNTIME_ENV=1 (as Ray)."""
    wd = tmp_path / "wd"
    wd.mkdir()
    (wd / "shared.py").write_text("NAME = 'from the job working_dir'\n")
    (wd / "main.py").write_text(
        textwrap.dedent(
            """
            import os, sys
            import nbcluster
            from nbcluster.exceptions import NbclusterError
            extra = {"env_vars": {"FROM_INIT": "init"}}
            if sys.argv[1] == "conflict":
                extra = {"env_vars": {"FROM_JOB": "other"}}
            try:
                nbcluster.init(runtime_env=extra)
            except ValueError as err:
                print("REFUSED", err)
                raise SystemExit(0)

            @nbcluster.remote
            def probe():
                import shared
                return shared.NAME, os.environ.get("FROM_JOB"), os.environ.get("FROM_INIT")

            print("TASK SAW", nbcluster.get(probe.remote()))
            """
        )
    )
    env = {"working_dir": str(wd), "env_vars": {"FROM_JOB": "job"}}
    sid = jobs.submit_job(entrypoint=f"{PY} main.py merge", runtime_env=env)
    status = wait_job(jobs, sid, {JobStatus.SUCCEEDED, JobStatus.FAILED})
    assert status == JobStatus.SUCCEEDED, (jobs.get_job_info(sid), jobs.get_job_logs(sid))
    assert "TASK SAW ('from the job working_dir', 'job', 'init')" in jobs.get_job_logs(sid)
    sid = jobs.submit_job(entrypoint=f"{PY} main.py conflict", runtime_env=env)
    status = wait_job(jobs, sid, {JobStatus.SUCCEEDED, JobStatus.FAILED})
    assert status == JobStatus.SUCCEEDED, (jobs.get_job_info(sid), jobs.get_job_logs(sid))
    assert "REFUSED" in jobs.get_job_logs(sid) and "env_vars['FROM_JOB']" in jobs.get_job_logs(sid)
