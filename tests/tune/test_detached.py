"""Detached Tune runs: the controller in a detached actor outlives the driver that started it.

One 2-CPU cluster for the module, started with ``LocalCluster(detached=True)`` so it
outlives any driver; this test process connects to it as a driver, and the first test
starts another driver as a subprocess and kills it by PID. Trials wait on gate files the
test creates, so what happens before and after a driver's end is decided by the test, not
by timing.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from collections.abc import Iterator
from typing import Any

import cloudpickle
import pytest

import nbcluster
from nbcluster import LocalCluster, tune
from nbcluster.testing import assert_no_processes, poll_for
from nbcluster.tune.execution.detached import NAMESPACE, controller_actor_name, read_status

pytestmark = pytest.mark.integration

# The workers cannot import this test module: send its functions by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


@pytest.fixture(scope="module")
def head() -> Iterator[LocalCluster]:
    """A cluster that outlives its drivers; this process connects to it."""
    if nbcluster.is_initialized():
        nbcluster.shutdown()
    lc = LocalCluster(num_cpus=2, detached=True).start()
    try:
        yield lc
    finally:
        if nbcluster.is_initialized():
            nbcluster.shutdown()
        lc.stop()
        assert lc.session_dir is not None
        assert_no_processes(lc.session_dir, timeout=15)


@pytest.fixture
def driver(head: LocalCluster) -> Iterator[LocalCluster]:
    """This process, connected to ``head`` as a driver."""
    if not nbcluster.is_initialized():
        nbcluster.init(address=head.address)
    yield head


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/status") as f:
            return "zombie" not in f.read()
    except OSError:
        return False


def _controller_gone(name: str) -> bool:
    try:
        nbcluster.get_actor(controller_actor_name(name), namespace=NAMESPACE)
    except ValueError:
        return True
    return False


def gated_trainable(config: dict[str, Any], offset: list[int] | None = None) -> None:
    """Reports 4 times; waits for ``config['gate']`` to exist before the third report.
    ``offset`` (``tune.with_parameters``) is added to the score."""
    for i in range(4):
        if i == 2:
            deadline = time.monotonic() + 120
            while not os.path.exists(config["gate"]) and time.monotonic() < deadline:
                time.sleep(0.02)
        extra = sum(offset) if offset is not None else 0
        tune.report({"score": config["x"] * (i + 1) + extra, "pid": os.getpid()})


def endless_trainable(config: dict[str, Any]) -> None:
    """Reports (with a checkpoint) until stopped, or until ``config['gate']`` exists."""
    ckpt = tune.get_checkpoint()
    i = 0
    if ckpt is not None:
        with open(os.path.join(ckpt.path, "i")) as f:
            i = int(f.read())
    while not (i >= 3 and os.path.exists(config["gate"])):
        i += 1
        time.sleep(0.05)
        d = tempfile.mkdtemp()
        with open(os.path.join(d, "i"), "w") as f:
            f.write(str(i))
        tune.report(
            {"score": float(i), "pid": os.getpid()}, checkpoint=tune.Checkpoint.from_directory(d)
        )


DRIVER = textwrap.dedent(
    """
    import json, os, sys, time
    import cloudpickle
    import nbcluster
    from nbcluster import tune

    address, storage, gate, trainable = sys.argv[1:5]
    nbcluster.init(address=address)

    @nbcluster.remote(num_cpus=0)
    class Canary:  # a non-detached actor of this driver: it ends when the driver's job ends
        def pid(self):
            return os.getpid()

    canary = Canary.remote()
    # with_parameters: this driver puts the object; the run needs it after the driver is gone
    trainable = tune.with_parameters(cloudpickle.loads(bytes.fromhex(trainable)), offset=[60, 40])
    tuner = tune.Tuner(
        trainable,
        param_space={"x": tune.grid_search([1, 2, 3, 4]), "gate": gate},
        tune_config=tune.TuneConfig(metric="score", mode="max"),
        run_config=tune.RunConfig(name="outlives", storage_path=storage, verbose=0),
    )
    run = tuner.fit_detached()
    print(json.dumps({"name": run.name, "path": run.experiment_path,
                      "canary": nbcluster.get(canary.pid.remote())}), flush=True)
    time.sleep(600)  # the test kills this driver by PID
    """
)


def test_a_detached_run_outlives_its_driver_and_another_driver_gets_every_trial(
    driver: LocalCluster, tmp_path: Any
) -> None:
    gate = str(tmp_path / "gate")
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    args = [driver.address, str(tmp_path), gate, cloudpickle.dumps(gated_trainable).hex()]
    proc = subprocess.Popen(
        [sys.executable, "-c", DRIVER, *args],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        line = " "
        while line and not line.startswith("{"):
            line = proc.stdout.readline()  # type: ignore[union-attr]
        assert line, f"the driver exited: {proc.stderr.read()[-3000:]}"  # type: ignore[union-attr]
        started = json.loads(line)
    finally:
        os.kill(proc.pid, signal.SIGKILL)  # the first driver ends, by its PID
        proc.wait(30)
        proc.stdout.close()  # type: ignore[union-attr]
        proc.stderr.close()  # type: ignore[union-attr]
    # The head ended the dead driver's job (its non-detached actor is gone): the search
    # has not finished (every trial waits for the gate) and goes on without it.
    poll_for(lambda: not _alive(started["canary"]), 60, 0.05, "the killed driver's job never ended")
    run = tune.attach("outlives")
    assert run.is_running() and run.experiment_path == started["path"]
    assert read_status(run.experiment_path)["state"] == "RUNNING"  # type: ignore[index]
    controller_pid = nbcluster.get(run._handle.info.remote())["pid"]

    open(gate, "w").close()
    grid = run.get_results(timeout=120, verbose=0)
    assert len(grid) == 4 and grid.num_errors == 0 and grid.num_terminated == 4
    assert sorted(r.config["x"] for r in grid) == [1, 2, 3, 4]
    assert all(r.metrics["training_iteration"] == 4 for r in grid)
    assert sorted(r.metrics["score"] for r in grid) == [104, 108, 112, 116]
    assert all(len(r.metrics_dataframe) == 4 for r in grid)
    assert grid.get_best_result().config["x"] == 4
    assert grid.experiment_path == started["path"]
    # The actor ended itself, and its runners went with it: nothing detached is left.
    assert _controller_gone("outlives") and not run.is_running()
    poll_for(lambda: not _alive(controller_pid), 30, 0.05, "the controller's process lives on")
    runner_pids = {int(r.metrics["pid"]) for r in grid}
    poll_for(lambda: not any(map(_alive, runner_pids)), 30, 0.05, "runner processes live on")
    assert read_status(run.experiment_path)["state"] == "FINISHED"  # type: ignore[index]
    # Attaching to the ended run (by name or folder) reads the saved experiment.
    again = tune.attach(run.experiment_path).get_results(verbose=0)
    assert [r.metrics["score"] for r in again] == [r.metrics["score"] for r in grid]
    assert tune.Tuner.can_restore(run.experiment_path)


def test_stopping_a_detached_run_ends_its_trials_and_its_actor(
    driver: LocalCluster, tmp_path: Any
) -> None:
    gate = str(tmp_path / "gate")
    run_config = tune.RunConfig(name="stoppable", storage_path=str(tmp_path), verbose=0)
    space = {"x": tune.grid_search([1, 2]), "gate": gate}
    run = tune.Tuner(endless_trainable, param_space=space, run_config=run_config).fit_detached()

    def both_reporting() -> bool:
        trials = run._fetch_trials()
        return len(trials) == 2 and all(t.last_result for t in trials)

    poll_for(both_reporting, 60, 0.1, f"the trials did not start: {run.status()}")
    assert run.status()["trials"] == {"RUNNING": 2}
    # A second controller for the same experiment is refused; a restored Tuner attaches.
    poll_for(lambda: tune.Tuner.can_restore(run.experiment_path), 30, 0.05, "no state saved")
    with pytest.raises(tune.TuneError, match=r"is being run by a detached controller"):
        tune.Tuner(endless_trainable, param_space=space, run_config=run_config).fit_detached()
    same = tune.Tuner.restore(run.experiment_path, endless_trainable).fit_detached()
    assert same.actor_name == run.actor_name and same.is_running()
    controller_pid = nbcluster.get(run._handle.info.remote())["pid"]
    runner_pids = {int(t.last_result["pid"]) for t in run._fetch_trials()}

    grid = run.stop(timeout=120)
    assert len(grid) == 2 and grid.num_errors == 0 and grid.stop_reason == "stopped"
    assert {r.metrics["training_iteration"] > 0 for r in grid} == {True}
    assert run.status()["state"] == "STOPPED"
    assert [t.status for t in run._saved_trials()] == ["PAUSED", "PAUSED"]
    assert _controller_gone("stoppable") and not run.is_running()
    poll_for(lambda: not _alive(controller_pid), 30, 0.05, "the controller's process lives on")
    poll_for(lambda: not any(map(_alive, runner_pids)), 30, 0.05, "runner processes live on")
    assert run.stop() is not None  # stopping an ended run just returns its grid

    # The stopped experiment continues like an interrupted one.
    open(gate, "w").close()
    final = tune.Tuner.restore(run.experiment_path, endless_trainable).fit()
    assert final.num_terminated == 2 and final.num_errors == 0
    for result in final:
        iterations = list(result.metrics_dataframe["training_iteration"])
        assert iterations == list(range(1, len(iterations) + 1))  # resumed, not restarted


def test_fit_on_a_restored_tuner_attaches_to_the_live_run(
    driver: LocalCluster, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    gate = str(tmp_path / "gate")
    run_config = tune.RunConfig(name="reattach", storage_path=str(tmp_path), verbose=0)
    space = {"x": tune.grid_search([1, 2]), "gate": gate}
    run = tune.Tuner(gated_trainable, param_space=space, run_config=run_config).fit_detached()
    poll_for(lambda: tune.Tuner.can_restore(run.experiment_path), 30, 0.05, "no state saved")
    watched: list[str] = []
    get_results = tune.DetachedRun.get_results

    def watch(self: tune.DetachedRun, *args: Any, **kwargs: Any) -> tune.ResultGrid:
        watched.append(self.name)
        open(gate, "w").close()  # the trials finish only once fit() is watching the live run
        return get_results(self, *args, **kwargs)

    monkeypatch.setattr(tune.DetachedRun, "get_results", watch)
    restored = tune.Tuner.restore(run.experiment_path, gated_trainable)
    grid = restored.fit()
    assert watched == ["reattach"] and restored._controller is None  # no second controller
    assert grid.num_terminated == 2 and all(len(r.metrics_dataframe) == 4 for r in grid)
    assert _controller_gone("reattach")


def test_a_killed_controller_takes_its_runners_and_the_run_can_be_restored(
    driver: LocalCluster, tmp_path: Any
) -> None:
    gate = str(tmp_path / "gate")
    run_config = tune.RunConfig(name="crashing", storage_path=str(tmp_path), verbose=0)
    space = {"x": tune.grid_search([1, 2]), "gate": gate}
    run = tune.Tuner(endless_trainable, param_space=space, run_config=run_config).fit_detached()

    def both_checkpointed() -> bool:
        trials = run._fetch_trials()
        return len(trials) == 2 and all(t.latest_checkpoint for t in trials)

    poll_for(both_checkpointed, 60, 0.1, f"the trials did not checkpoint: {run.status()}")
    runner_pids = {int(t.last_result["pid"]) for t in run._fetch_trials()}
    controller_pid = nbcluster.get(run._handle.info.remote())["pid"]
    os.kill(controller_pid, signal.SIGKILL)
    with pytest.raises(tune.TuneError, match=r"died before the run ended; continue it with Tuner"):
        run.get_results(timeout=120, verbose=0)
    assert run.status()["state"] == "DIED" and _controller_gone("crashing")
    poll_for(lambda: not any(map(_alive, runner_pids)), 30, 0.05, "runners outlived their owner")

    open(gate, "w").close()
    final = tune.Tuner.restore(run.experiment_path, endless_trainable).fit()
    assert final.num_terminated == 2 and final.num_errors == 0


def test_bad_input_fails_clearly_and_leaves_nothing_running(
    driver: LocalCluster, tmp_path: Any
) -> None:
    with pytest.raises(ValueError, match=r"tune.attach\('no-such-run'\): no detached Tune run"):
        tune.attach("no-such-run", storage_path=str(tmp_path))
    with pytest.raises(TypeError, match=r"tune.attach\(\) needs the experiment's name"):
        tune.attach(42)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"tune.attach\(\) needs the experiment's name"):
        tune.attach("")

    lock = threading.Lock()

    def unpicklable(config: dict[str, Any]) -> None:
        with lock:
            tune.report({"score": 1})

    rc = tune.RunConfig(name="bad", storage_path=str(tmp_path), verbose=0)
    with pytest.raises(tune.TuneError, match=r"cannot be sent to its controller actor"):
        tune.Tuner(unpicklable, run_config=rc).fit_detached()
    too_big = tune.with_resources(gated_trainable, {"CPU": 64})
    with pytest.raises(tune.TuneError, match=r"Each trial needs"):
        tune.Tuner(too_big, run_config=rc).fit_detached()
    assert _controller_gone("bad")

    # A run that ends badly: its error reaches the watcher, and its actor still ends.
    def failing(config: dict[str, Any]) -> None:
        raise RuntimeError("boom")

    run = tune.Tuner(failing, run_config=rc).fit_detached()
    with pytest.raises(ValueError, match=r"get_results\(timeout=\) must be >= 0"):
        run.get_results(timeout=-1)
    with pytest.raises(tune.TuneError, match=r"failed: TuneError: All 1 trials failed") as info:
        run.get_results(timeout=120, verbose=0)
    assert info.value.result_grid is not None and info.value.result_grid.num_errors == 1
    assert _controller_gone("bad")
    assert read_status(run.experiment_path)["state"] == "ERROR"  # type: ignore[index]
