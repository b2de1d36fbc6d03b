"""F13 on the task stream: cut mid-batch, lost reply batches, lost actor-creation replies.

One cluster for the module, started with the fault injector on (``NBCLUSTER_TESTING=1``):
every worker's ``PushTasks`` stream is cut on every 4th incoming batch (after delivering
part of it) and loses every 3rd batch of replies; half of the ``CreateActor`` replies are
lost. Each test checks that faults fired (the injector's records) and counts executions
by side effects (one file per execution):

- tasks (at-least-once, ``max_retries`` system failures): every result right, each ran;
- ``max_retries=0``: each ran at most once, and a failure is ``WorkerCrashedError``;
- actor constructors: once per (re)start;
- actor calls, ``max_task_retries=0``: each ran at most once, failures are actor errors,
  and the actor (alive all along) keeps serving;
- actor calls, ``max_task_retries>0``: every call gets its result.
"""

from __future__ import annotations

import collections
import os
import signal
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import nbcluster
from nbcluster import exceptions as exc
from nbcluster._runtime.protocol import faults
from nbcluster.testing import assert_no_processes, poll_for

SPEC = "PushTasks.cut=every4,PushTasks.drop=every3,CreateActor=0:0.5"


def test_a_stray_fault_variable_is_ignored_outside_tests(monkeypatch, cluster) -> None:
    # Every rule at its worst: if the injector ran, no call could ever succeed.
    monkeypatch.delenv(faults.TESTING_ENV, raising=False)
    monkeypatch.setenv(faults.RULES_ENV, "*=1:1,PushTasks.cut=every1,PushTasks.drop=every1")
    info = cluster(num_cpus=1)

    @nbcluster.remote
    def f(x: int) -> int:
        return x + 1

    @nbcluster.remote
    class A:
        def g(self) -> int:
            return 7

    assert nbcluster.get([f.remote(i) for i in range(20)], timeout=60) == list(range(1, 21))
    assert nbcluster.get(A.remote().g.remote(), timeout=60) == 7
    head_log = Path(info.session_dir) / "logs" / "head.log"
    assert "ignored: RPC fault injection runs only in tests" in head_log.read_text()


@pytest.fixture(scope="module")
def faults_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A cluster whose processes inject faults and record them in the returned folder."""
    record = tmp_path_factory.mktemp("faults")
    if nbcluster.is_initialized():
        nbcluster.shutdown()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(faults.TESTING_ENV, "1")
        mp.setenv(faults.RULES_ENV, SPEC)
        mp.setenv(faults.FAULTS_DIR_ENV, str(record))
        session = nbcluster.init(num_cpus=2).session_dir
        try:
            yield record
        finally:
            nbcluster.shutdown()
    assert_no_processes(session, timeout=10)


class _Runs:
    """One file per execution in a folder; counts per key."""

    def __init__(self, root: Path) -> None:
        self.path = str(root)
        root.mkdir()

    def count(self) -> collections.Counter[int]:
        return collections.Counter(int(n.split("-")[0]) for n in os.listdir(self.path))


def _fired_since(record: Path, before: collections.Counter[Any], kind: str) -> int:
    return faults.fired(record)[("PushTasks", kind)] - before[("PushTasks", kind)]


def test_tasks_with_default_retries_all_succeed_through_cut_streams_and_lost_replies(
    faults_dir: Path, tmp_path: Path
) -> None:
    runs = _Runs(tmp_path / "runs")
    before = faults.fired(faults_dir)

    # Default retries (3); the injector charges each task at most one (faults.py), so
    # every result is due however often faults fire.
    @nbcluster.remote
    def work(path: str, i: int) -> int:
        open(os.path.join(path, f"{i}-{uuid.uuid4().hex}"), "w").close()
        return i * i

    # Rounds of 60 until both kinds have fired: they count batches per worker process, and
    # how 60 tasks fall into batches depends on timing (a loaded machine sends fewer,
    # larger batches, and a rehearsal once saw no 4th batch in any worker).
    n = 0
    for _ in range(8):
        ids = range(n, n + 60)
        assert nbcluster.get([work.remote(runs.path, i) for i in ids], timeout=120) == [
            i * i for i in ids
        ]
        n += 60
        if _fired_since(faults_dir, before, "cut") and _fired_since(faults_dir, before, "drop"):
            break
    assert _fired_since(faults_dir, before, "cut") > 0
    assert _fired_since(faults_dir, before, "drop") > 0
    counts = runs.count()
    assert set(counts) == set(range(n)), "a task never ran"
    reran = {i: c for i, c in counts.items() if c > 1}
    assert reran, "faults fired but no task ran twice: were they on the task path at all?"


def test_tasks_with_max_retries_0_run_at_most_once(faults_dir: Path, tmp_path: Path) -> None:
    runs = _Runs(tmp_path / "runs")
    before = faults.fired(faults_dir)

    @nbcluster.remote(max_retries=0)
    def once(path: str, i: int) -> int:
        open(os.path.join(path, f"{i}-{uuid.uuid4().hex}"), "w").close()
        return i

    n = 100
    refs = [once.remote(runs.path, i) for i in range(n)]
    ok, crashed = [], []
    for i, ref in enumerate(refs):
        try:
            assert nbcluster.get(ref, timeout=60) == i
            ok.append(i)
        except exc.WorkerCrashedError:
            crashed.append(i)
    fired = _fired_since(faults_dir, before, "cut") + _fired_since(faults_dir, before, "drop")
    assert fired > 0
    assert crashed, "faults fired but no max_retries=0 task failed"
    counts = runs.count()
    assert max(counts.values()) == 1, f"ran twice: {[i for i, c in counts.items() if c > 1]}"
    assert all(counts[i] == 1 for i in ok)  # a result means it ran, once


def test_actor_constructors_run_once_per_start(faults_dir: Path, tmp_path: Path) -> None:
    inits = _Runs(tmp_path / "inits")
    before = faults.fired(faults_dir)[("CreateActor", "reply")]

    @nbcluster.remote(num_cpus=0, max_restarts=2, max_task_retries=-1)
    class Phoenix:
        def __init__(self, path: str, i: int) -> None:
            open(os.path.join(path, f"{i}-{uuid.uuid4().hex}"), "w").close()

        def pid(self) -> int:
            return os.getpid()

    actors = [Phoenix.remote(inits.path, i) for i in range(4)]
    for _ in range(2):
        pids = nbcluster.get([a.pid.remote() for a in actors], timeout=60)
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
        # the calls wait for the restart (max_task_retries=-1) and land in new processes
        poll_for(
            lambda pids=pids: not set(pids) & set(nbcluster.get([a.pid.remote() for a in actors])),
            timeout=60,
        )
    assert faults.fired(faults_dir)[("CreateActor", "reply")] > before
    assert inits.count() == {i: 3 for i in range(4)}  # the first start and two restarts
    for a in actors:
        nbcluster.kill(a)


def _recorder() -> Any:
    """An actor class that leaves one file per call it runs (defined here: the test module
    cannot be imported by workers, so classes must be pickled by value)."""

    @nbcluster.remote(num_cpus=0, max_task_retries=0)
    class Recorder:
        def __init__(self, path: str) -> None:
            self.path = path

        def run(self, i: int) -> int:
            open(os.path.join(self.path, f"{i}-{uuid.uuid4().hex}"), "w").close()
            return i

        def pid(self) -> int:
            return os.getpid()

    return Recorder


def _pid(actor: Any) -> int:
    """The actor's pid (asked again when the call itself meets an injected fault)."""
    for _ in range(20):
        try:
            return nbcluster.get(actor.pid.remote(), timeout=30)
        except exc.ActorUnavailableError:
            continue
        except exc.ActorDiedError as e:
            if "connection to it broke" not in str(e):
                raise
    raise AssertionError("the actor never answered")


def _calls(actor: Any, n: int, start: int, burst: bool) -> dict[int, Any]:
    """Make n calls (one at a time, or all at once); return each one's value or error."""
    out: dict[int, Any] = {}
    keys = range(start, start + n)
    refs = {i: actor.run.remote(i) for i in keys} if burst else {}
    for i in keys:
        ref = refs[i] if burst else actor.run.remote(i)
        try:
            out[i] = nbcluster.get(ref, timeout=30)
        except exc.ActorError as e:
            out[i] = e
    return out


def test_actor_calls_without_retries_run_at_most_once(faults_dir: Path, tmp_path: Path) -> None:
    runs = _Runs(tmp_path / "runs")
    before = faults.fired(faults_dir)
    actor = _recorder().remote(runs.path)
    pid = _pid(actor)
    results = _calls(actor, 24, 0, burst=False) | _calls(actor, 60, 100, burst=True)
    assert _fired_since(faults_dir, before, "cut") > 0
    assert _fired_since(faults_dir, before, "drop") > 0
    failed = [i for i, r in results.items() if isinstance(r, BaseException)]
    assert failed, "faults fired but every call succeeded"
    assert all(results[i] == i for i in results if i not in failed)
    counts = runs.count()
    assert max(counts.values()) == 1, f"ran twice: {[i for i, c in counts.items() if c > 1]}"
    assert all(counts[i] == 1 for i in results if i not in failed)
    # The actor never died: a broken stream is not a dead actor, and it keeps serving.
    assert _pid(actor) == pid
    nbcluster.kill(actor)


def test_actor_calls_with_retries_all_get_results(faults_dir: Path, tmp_path: Path) -> None:
    runs = _Runs(tmp_path / "runs")
    before = faults.fired(faults_dir)
    actor = _recorder().options(max_task_retries=-1).remote(runs.path)
    results = _calls(actor, 24, 0, burst=False) | _calls(actor, 60, 100, burst=True)
    assert _fired_since(faults_dir, before, "cut") + _fired_since(faults_dir, before, "drop") > 0
    assert results == {i: i for i in results}
    assert set(runs.count()) == set(results)
    nbcluster.kill(actor)
