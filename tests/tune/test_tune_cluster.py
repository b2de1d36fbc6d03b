"""Tune on a real 2-CPU cluster: trainables, checkpoints, failures, schedulers, continuing.

One cluster for the module (``shared_cluster``); every experiment writes under the
test's ``tmp_path``. Trials are short synthetic loops so the module stays fast.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

import cloudpickle
import numpy as np
import pytest

from nbcluster import train, tune
from nbcluster.testing import kill_process, poll_for
from nbcluster.tune.schedulers import ASHAScheduler, HyperBandScheduler, PopulationBasedTraining
from nbcluster.tune.search import ConcurrencyLimiter
from nbcluster.tune.search.optuna import OptunaSearch

pytestmark = pytest.mark.integration

# The workers cannot import this test module: send its functions by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


def rc(tmp_path: Any, name: str = "exp", **kw: Any) -> tune.RunConfig:
    kw.setdefault("verbose", 0)
    return tune.RunConfig(storage_path=str(tmp_path), name=name, **kw)


def _save(step: int, **extra: Any) -> tune.Checkpoint:
    d = tempfile.mkdtemp()
    with open(os.path.join(d, "state.json"), "w") as f:
        json.dump({"step": step, **extra}, f)
    return tune.Checkpoint.from_directory(d)


def _load() -> dict[str, Any] | None:
    ckpt = tune.get_checkpoint()
    if ckpt is None:
        return None
    with open(os.path.join(ckpt.path, "state.json")) as f:
        return dict(json.load(f))


def checkpointing_trainable(config: dict[str, Any]) -> None:
    """Counts to 6, checkpointing each step; fails once at step 3 when asked to."""
    state = _load()
    start = state["step"] + 1 if state else 0
    for step in range(start, 6):
        if step == 3 and config.get("fail") and state is None:
            raise ValueError("planned failure at step 3")
        # train.report is tune.report: Train code reports to Tune inside a trial.
        train.report({"score": step * config["lr"], "resumed_from": start}, checkpoint=_save(step))


def test_function_trainable_checkpoints_failures_and_files(
    shared_cluster: Any, tmp_path: Any
) -> None:
    assert tune.report is train.report and tune.Checkpoint is train.Checkpoint
    tuner = tune.Tuner(
        checkpointing_trainable,
        param_space={"lr": tune.grid_search([1.0, 2.0]), "fail": True},
        tune_config=tune.TuneConfig(metric="score", mode="max"),
        run_config=rc(tmp_path, failure_config=tune.FailureConfig(max_failures=1)),
    )
    grid = tuner.fit()
    assert len(grid) == 2 and grid.num_terminated == 2 and grid.num_errors == 0 and not grid.errors
    for r in grid:
        assert r.metrics["training_iteration"] == 6 and r.metrics["resumed_from"] == 3
        assert os.path.basename(r.checkpoint.path) == "checkpoint_000005"
        assert os.path.isfile(os.path.join(r.path, "error.txt"))  # the failure before the retry
        with open(os.path.join(r.path, "result.json")) as f:
            lines = [json.loads(line) for line in f]
        assert [ln["training_iteration"] for ln in lines] == [1, 2, 3, 4, 5, 6]
        assert r.metrics_dataframe["score"].tolist()[-1] == r.metrics["score"]
    best = grid.get_best_result()
    assert best.config["lr"] == 2.0 and best.metrics["score"] == 10.0
    assert grid.get_best_result(metric="score", mode="min").config["lr"] == 1.0
    df = grid.get_dataframe()
    assert sorted(df["config/lr"]) == [1.0, 2.0] and set(df["status"]) == {"TERMINATED"}
    assert grid.experiment_path == os.path.join(str(tmp_path), "exp")
    assert tune.Tuner.can_restore(grid.experiment_path)
    html = grid._repr_html_()
    assert "TERMINATED" in html and "score" in html and "<table>" in html


class Counter(tune.Trainable):
    setups = 0

    def setup(self, config: dict[str, Any]) -> None:
        Counter.setups += 1
        self.total = 0.0
        self.lr = config["lr"]

    def step(self) -> dict[str, Any]:
        self.total += self.lr
        return {"total": self.total, "setups": Counter.setups, "done": self.iteration >= 3}

    def save_checkpoint(self, checkpoint_dir: str) -> dict[str, Any]:
        return {"total": self.total}

    def load_checkpoint(self, checkpoint: Any) -> None:
        self.total = checkpoint["total"]

    def reset_config(self, new_config: dict[str, Any]) -> bool:
        self.lr = new_config["lr"]
        self.total = 0.0
        return True


def test_trainable_class_checkpoints_and_reuses_the_instance(
    shared_cluster: Any, tmp_path: Any
) -> None:
    grid = tune.Tuner(
        Counter,
        param_space={"lr": tune.grid_search([1.0, 2.0, 3.0, 4.0])},
        tune_config=tune.TuneConfig(reuse_actors=True, max_concurrent_trials=1),
        run_config=rc(
            tmp_path,
            checkpoint_config=tune.CheckpointConfig(checkpoint_frequency=2, checkpoint_at_end=True),
        ),
    ).fit()
    assert [r.metrics["total"] for r in grid] == [4.0, 8.0, 12.0, 16.0]
    assert [r.metrics["training_iteration"] for r in grid] == [4, 4, 4, 4]
    # One runner, one instance: reset_config took each new config.
    assert {r.metrics["setups"] for r in grid} == {1}
    assert {r.metrics["pid"] for r in grid} == {grid[0].metrics["pid"]}
    assert [os.path.basename(c.path) for c, _ in grid[0].best_checkpoints] == [
        "checkpoint_000000",
        "checkpoint_000001",
    ]


def _with_data(config: dict[str, Any], data: np.ndarray) -> None:
    start = time.time()
    time.sleep(0.05)
    tune.report({"sum": float(data.sum()) * config["a"], "start": start, "end": time.time()})


def test_with_parameters_and_with_resources(shared_cluster: Any, tmp_path: Any) -> None:
    big = np.ones(2_000_000)  # 16 MB: must travel through the object store, not the pickle
    trainable = tune.with_resources(tune.with_parameters(_with_data, data=big), {"cpu": 2})
    assert len(cloudpickle.dumps(trainable)) < 100_000
    grid = tune.Tuner(
        trainable, param_space={"a": tune.grid_search([1, 2, 3])}, run_config=rc(tmp_path)
    ).fit()
    assert sorted(r.metrics["sum"] for r in grid) == [2e6, 4e6, 6e6]
    spans = sorted((r.metrics["start"], r.metrics["end"]) for r in grid)
    for (_, end), (start, _) in zip(spans, spans[1:], strict=False):
        assert start >= end  # 2 CPUs per trial on a 2-CPU cluster: one trial at a time


def _always_fails(config: dict[str, Any]) -> None:
    tune.report({"x": 1})
    raise RuntimeError(f"bad config {config['i']}")


def _reports_loss(config: dict[str, Any]) -> None:
    tune.report({"loss": 1.0, "other": 2})


def test_errors_name_the_problem(shared_cluster: Any, tmp_path: Any) -> None:
    with pytest.raises(
        tune.TuneError, match=r"All 2 trials failed: 2× RuntimeError \(e.g. 'bad config \d'\)"
    ) as info:
        tune.Tuner(
            _always_fails, param_space={"i": tune.grid_search([1, 2])}, run_config=rc(tmp_path, "a")
        ).fit()
    grid = info.value.result_grid
    assert grid.num_errors == 2 and all(isinstance(e, RuntimeError) for e in grid.errors)
    assert "bad config" in str(grid.errors[0])
    with pytest.raises(tune.TuneError, match=r"without the metric 'acc'.*It reported: loss, other"):
        tune.Tuner(
            _reports_loss,
            tune_config=tune.TuneConfig(metric="acc", mode="max"),
            run_config=rc(tmp_path, "b"),
        ).fit()
    grid = tune.Tuner(
        _reports_loss, tune_config=tune.TuneConfig(num_samples=2), run_config=rc(tmp_path, "c")
    ).fit()
    with pytest.raises(RuntimeError, match=r"'acc'.*The trials reported: loss, other"):
        grid.get_best_result(metric="acc", mode="max")
    # A trial error with other trials going on: ERROR with its traceback, the rest finish.
    grid = tune.Tuner(
        lambda config: _always_fails(config) if config["i"] == 0 else tune.report({"x": 2}),
        param_space={"i": tune.grid_search([0, 1, 2])},
        run_config=rc(tmp_path, "d"),
    ).fit()
    assert grid.num_errors == 1 and grid.num_terminated == 2
    assert (
        "bad config 0"
        in (tmp_path / "d" / os.path.basename(grid[0].path) / "error.txt").read_text()
    )


def _slow_checkpointing(config: dict[str, Any]) -> None:
    state = _load()
    start = state["step"] + 1 if state else 0
    with open(config["pid_file"], "a") as f:
        f.write(f"{os.getpid()}\n")
    for step in range(start, 12):
        tune.report({"step": step, "resumed_from": start}, checkpoint=_save(step))
        if start == 0 and step == 2:
            time.sleep(600)  # the first run waits here for the test to kill its process


def test_killed_trial_worker_restarts_from_its_last_checkpoint(
    shared_cluster: Any, tmp_path: Any
) -> None:
    pid_file = str(tmp_path / "pids")
    result: dict[str, Any] = {}

    def run() -> None:
        result["grid"] = tune.Tuner(
            _slow_checkpointing,
            param_space={"pid_file": pid_file},
            run_config=rc(tmp_path, failure_config=tune.FailureConfig(max_failures=1)),
        ).fit()

    t = threading.Thread(target=run)
    t.start()
    # Kill it once the controller has taken the result that came with checkpoint 2 (the
    # trial then waits for the kill).
    trial_dir = poll_for(
        lambda: next(
            (
                c.parent
                for c in (tmp_path / "exp").glob("*/checkpoint_000002")
                if _lines(c.parent / "result.json") >= 3
            ),
            None,
        ),
        timeout=120,
    )
    pid = int((tmp_path / "pids").read_text().split()[0])
    kill_process(pid)
    t.join(timeout=240)
    (r,) = result["grid"]
    assert trial_dir is not None and r.metrics["step"] == 11 and r.error is None
    assert r.metrics["resumed_from"] == 3  # from its last checkpoint, not from scratch
    assert len((tmp_path / "pids").read_text().split()) == 2


def _curve(config: dict[str, Any]) -> None:
    for i in range(1, 28):
        time.sleep(0.002)
        tune.report({"acc": config["q"] * (1 - 1 / (i + 1))})


@pytest.mark.parametrize("scheduler", ["asha", "hyperband"])
def test_early_stopping_schedulers(shared_cluster: Any, tmp_path: Any, scheduler: str) -> None:
    sched = (
        ASHAScheduler(max_t=27, grace_period=1, reduction_factor=3)
        if scheduler == "asha"
        else HyperBandScheduler(max_t=27, reduction_factor=3)
    )
    grid = tune.Tuner(
        _curve,
        # Not sorted: with ascending q every newcomer would beat all before it, and an
        # asynchronous scheduler would have nothing to stop.
        param_space={"q": tune.grid_search([0.5, 0.9, 0.1, 0.7, 0.3, 0.8, 0.2, 0.6, 0.4])},
        tune_config=tune.TuneConfig(metric="acc", mode="max", scheduler=sched),
        run_config=rc(tmp_path),
    ).fit()
    iters = [r.metrics["training_iteration"] for r in grid]
    assert min(iters) < 27 and max(iters) == 27  # some stopped early, the best ran to the end
    assert grid.get_best_result().config["q"] == pytest.approx(0.9)


def _pbt_trainable(config: dict[str, Any]) -> None:
    state = _load()
    value, start = (state["value"], state["step"] + 1) if state else (0.0, 0)
    for step in range(start, 16):
        value += config["lr"]
        tune.report({"value": value}, checkpoint=_save(step, value=value))


def test_pbt_exploits_checkpoints(shared_cluster: Any, tmp_path: Any) -> None:
    pbt = PopulationBasedTraining(
        time_attr="training_iteration",
        perturbation_interval=4,
        hyperparam_mutations={"lr": tune.uniform(0.0, 1.0)},
    )
    grid = tune.Tuner(
        _pbt_trainable,
        param_space={"lr": tune.grid_search([0.05, 0.1, 0.9, 1.0])},
        tune_config=tune.TuneConfig(metric="value", mode="max", scheduler=pbt),
        run_config=rc(tmp_path),
    ).fit()
    assert pbt.num_perturbations >= 1
    assert all(r.metrics["training_iteration"] == 16 for r in grid)
    # An exploited trial carries on from the clone's checkpoint, so it ends far above
    # what its initial small learning rate alone would give (16 * 0.05 = 0.8).
    assert grid[0].metrics["value"] > 2.0


def _slow(config: dict[str, Any]) -> None:
    state = _load()
    start = state["step"] + 1 if state else 0
    for step in range(start, config["steps"]):
        time.sleep(config["sleep"])
        tune.report({"step": step, "resumed_from": start}, checkpoint=_save(step))


def test_fit_again_continues_and_takes_more_samples(shared_cluster: Any, tmp_path: Any) -> None:
    tc = tune.TuneConfig(num_samples=2)
    tuner = tune.Tuner(
        _slow,
        param_space={"steps": 3, "sleep": 0.0, "x": tune.uniform(0, 1)},
        tune_config=tc,
        run_config=rc(tmp_path),
    )
    first = tuner.fit()
    ids = [r.metrics["trial_id"] for r in first]
    tc.num_samples = 4
    second = tuner.fit()
    assert len(second) == 4 and [r.metrics["trial_id"] for r in second][:2] == ids
    assert [r.metrics["training_iteration"] for r in second] == [3, 3, 3, 3]


def _gated(config: dict[str, Any]) -> None:
    """``_slow``, but a first run waits after step 2 until the test lets it go on."""
    state = _load()
    start = state["step"] + 1 if state else 0
    for step in range(start, config["steps"]):
        time.sleep(config["sleep"])
        tune.report({"step": step, "resumed_from": start}, checkpoint=_save(step))
        if start == 0 and step == 2:
            poll_for(lambda: os.path.exists(config["go"]), timeout=120)


def test_interrupt_stops_gracefully_and_fit_again_resumes(
    shared_cluster: Any, tmp_path: Any
) -> None:
    go = tmp_path / "go"
    tuner = tune.Tuner(
        _gated,
        param_space={
            "steps": 30,
            "sleep": 0.05,
            "go": str(go),
            "i": tune.grid_search([0, 1, 2]),
        },
        run_config=rc(tmp_path),
    )
    exp = tmp_path / "exp"

    def interrupt_when_checkpointed() -> None:
        # The trials wait after step 2 until the interrupt was sent: they cannot finish
        # before it, however slow the machine.
        poll_for(lambda: any(exp.glob("*/checkpoint_000002")), timeout=120)
        os.kill(os.getpid(), signal.SIGINT)
        go.touch()

    threading.Thread(target=interrupt_when_checkpointed, daemon=True).start()
    grid = tuner.fit()  # the SIGINT lands in this (main) thread: a graceful stop, no exception
    assert grid.stop_reason == "interrupted"
    statuses = {
        r.metrics["trial_id"]: tuner._controller.get_trial(r.metrics["trial_id"]).status
        for r in grid
        if r.metrics
    }  # type: ignore[union-attr]
    assert "PAUSED" in statuses.values()
    # Continue: on the same Tuner, and equally from disk with Tuner.restore.
    restored = tune.Tuner.restore(str(exp), _gated)
    grid = restored.fit()
    assert grid.num_terminated == 3
    assert all(r.metrics["step"] == 29 for r in grid)
    assert max(r.metrics["resumed_from"] for r in grid) >= 3  # resumed, not restarted


def test_optuna_search_with_concurrency_limiter(shared_cluster: Any, tmp_path: Any) -> None:
    search = ConcurrencyLimiter(OptunaSearch(seed=0), max_concurrent=2)
    grid = tune.Tuner(
        lambda config: tune.report({"loss": (config["x"] - 0.3) ** 2 + config["nested"]["y"]}),
        param_space={"x": tune.uniform(0, 1), "nested": {"y": tune.choice([0, 1])}, "const": 5},
        tune_config=tune.TuneConfig(metric="loss", mode="min", num_samples=16, search_alg=search),
        run_config=rc(tmp_path),
    ).fit()
    best = grid.get_best_result()
    assert len(grid) == 16 and best.config["nested"]["y"] == 0 and best.config["const"] == 5
    assert best.metrics["loss"] < 0.05


def _chatty(config: dict[str, Any]) -> None:
    for i in range(500):
        print(f"line {i}")
    tune.report({"x": 1})


def test_trial_prints_are_rate_limited_and_folded(
    shared_cluster: Any, tmp_path: Any, capsys: Any
) -> None:
    grid = tune.Tuner(_chatty, run_config=rc(tmp_path, verbose=1)).fit()
    out = capsys.readouterr().out
    shown = [
        ln
        for ln in out.splitlines()
        if ln.startswith(f"({grid[0].metrics['trial_id']}") or " line " in ln
    ]
    assert 0 < len(shown) < 100
    assert "folded" in out
    with open(os.path.join(grid[0].path, "output.log")) as f:
        assert len(f.read().splitlines()) == 500


_DRIVER_SCRIPT = """
import json, os, sys, tempfile, time
import nbcluster
from nbcluster import tune

def slow(config):
    ckpt = tune.get_checkpoint()
    start = 0
    if ckpt is not None:
        with open(os.path.join(ckpt.path, "state.json")) as f:
            start = json.load(f)["step"] + 1
    for step in range(start, config["steps"]):
        time.sleep(config["sleep"])
        d = tempfile.mkdtemp()
        with open(os.path.join(d, "state.json"), "w") as f:
            json.dump({"step": step}, f)
        tune.report({"step": step, "resumed_from": start}, checkpoint=tune.Checkpoint.from_directory(d))

nbcluster.init(num_cpus=2)
tune.Tuner(
    slow,
    param_space={"steps": 40, "sleep": 0.05, "i": tune.grid_search([0, 1])},
    run_config=tune.RunConfig(storage_path=sys.argv[1], name="exp", verbose=0),
).fit()
"""


def test_restore_after_the_driver_was_killed(shared_cluster: Any, tmp_path: Any) -> None:
    script = tmp_path / "driver.py"
    script.write_text(_DRIVER_SCRIPT)
    env = dict(os.environ, NBCLUSTER_TEMP_DIR=str(tmp_path / "sessions"))
    proc = subprocess.Popen(
        [sys.executable, str(script), str(tmp_path)],
        env=env,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    exp = tmp_path / "exp"
    try:
        # Kill it once both trials have checkpoint 4 and their first 5 results on disk.
        poll_for(
            lambda: (
                len(list(exp.glob("*/checkpoint_000004"))) == 2
                and (exp / "experiment_state.pkl").exists()
                and all(
                    _lines(c.parent / "result.json") >= 5 for c in exp.glob("*/checkpoint_000004")
                )
            ),
            timeout=120,
        )
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the driver and everything it started
        proc.wait(timeout=30)
    assert tune.Tuner.can_restore(str(exp)) and not tune.Tuner.can_restore(str(tmp_path))
    grid = tune.Tuner.restore(str(exp), _slow).fit()
    assert len(grid) == 2 and grid.num_terminated == 2
    for r in grid:
        assert r.metrics["step"] == 39
        # Resumed from a checkpoint saved before the kill, not from the start.
        assert r.metrics["resumed_from"] >= 5
        steps = [row["step"] for row in r.metrics_dataframe.to_dict("records")]
        assert steps[-1] == 39 and steps[0] == 0


def _lines(path: Any) -> int:
    try:
        return len(path.read_text().splitlines())
    except FileNotFoundError:
        return 0


def _torch_loop(config: dict[str, Any]) -> None:
    import torch

    torch.manual_seed(0)
    x = torch.linspace(-1, 1, 32).unsqueeze(1)
    y = 3 * x + 1
    model = torch.nn.Linear(1, 1)
    opt = torch.optim.SGD(model.parameters(), lr=config["lr"])
    for epoch in range(config["epochs"]):
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        with tempfile.TemporaryDirectory() as d:
            torch.save({"epoch": epoch}, os.path.join(d, "model.pt"))
            train.report(
                {"loss": loss.item(), "epoch": epoch}, checkpoint=train.Checkpoint.from_directory(d)
            )


def test_tune_over_a_torch_trainer(shared_cluster: Any, tmp_path: Any) -> None:
    pytest.importorskip("torch")
    from nbcluster.train import ScalingConfig
    from nbcluster.train.torch import TorchTrainer

    trainer = TorchTrainer(
        _torch_loop,
        train_loop_config={"epochs": 4, "lr": 0.01},
        scaling_config=ScalingConfig(num_workers=1),
    )
    grid = tune.Tuner(
        trainer,
        param_space={"train_loop_config": {"lr": tune.grid_search([0.01, 0.3])}},
        tune_config=tune.TuneConfig(metric="loss", mode="min"),
        run_config=rc(tmp_path, stop={"training_iteration": 3}),
    ).fit()
    assert grid.num_terminated == 2
    assert [r.metrics["training_iteration"] for r in grid] == [3, 3]  # Tune's stop reached Train
    assert grid.get_best_result().config["train_loop_config"]["lr"] == 0.3
    for r in grid:
        assert os.path.dirname(r.checkpoint.path) == r.path  # Train wrote into the trial's folder
        assert os.path.isfile(os.path.join(r.checkpoint.path, "model.pt"))


class Accumulate(tune.Trainable):
    def setup(self, config: dict[str, Any]) -> None:
        self.total = 0.0
        self.restores = 0

    def step(self) -> dict[str, Any]:
        time.sleep(0.01)
        self.total += self.config["lr"]
        return {"total": self.total, "restores": self.restores}

    def save_checkpoint(self, checkpoint_dir: str) -> None:
        with open(os.path.join(checkpoint_dir, "total.json"), "w") as f:
            json.dump({"total": self.total, "restores": self.restores}, f)

    def load_checkpoint(self, checkpoint: Any) -> None:
        with open(os.path.join(checkpoint, "total.json")) as f:
            state = json.load(f)
        self.total, self.restores = state["total"], state["restores"] + 1


def test_hyperband_pauses_and_resumes_a_trainable_class(shared_cluster: Any, tmp_path: Any) -> None:
    grid = tune.Tuner(
        Accumulate,
        param_space={"lr": tune.grid_search([0.5, 1.0, 0.1, 0.2, 0.3, 0.4, 0.6, 0.7])},
        tune_config=tune.TuneConfig(
            metric="total", mode="max", scheduler=HyperBandScheduler(max_t=9, reduction_factor=3)
        ),
        run_config=rc(tmp_path),
    ).fit()
    for r in grid:
        # Paused at a milestone, saved, resumed later from that checkpoint: nothing lost.
        assert r.metrics["total"] == pytest.approx(r.metrics["training_iteration"] * r.config["lr"])
    assert max(r.metrics["restores"] for r in grid) >= 1
    assert {r.metrics["training_iteration"] for r in grid} >= {9}


def test_time_budget_and_function_stopper(shared_cluster: Any, tmp_path: Any) -> None:
    start = time.monotonic()
    grid = tune.Tuner(
        _slow,
        param_space={"steps": 100_000, "sleep": 0.05},  # 80 min, unless the budget stops it
        tune_config=tune.TuneConfig(num_samples=2, time_budget_s=1.0),
        run_config=rc(tmp_path, "budget"),
    ).fit()
    assert time.monotonic() - start < 120
    assert "time budget" in grid.stop_reason and grid.num_terminated == 2
    grid = tune.Tuner(
        _slow,
        param_space={"steps": 1000, "sleep": 0.0},
        run_config=rc(tmp_path, "fn", stop=lambda trial_id, result: result["step"] >= 4),
    ).fit()
    assert grid[0].metrics["step"] == 4 and grid[0].metrics["training_iteration"] == 5
