"""DataParallelTrainer on a real cluster (no framework: no torch to import, so worker
groups start fast): failures, bad input, stopping, callbacks and the entry point Tune
uses."""

from __future__ import annotations

import io
import os
import signal
import sys
import tempfile
import threading
import time

import cloudpickle
import psutil
import pytest

import nbcluster
from nbcluster import train
from nbcluster.exceptions import SerializationError
from nbcluster.testing import poll_for
from nbcluster.train import (
    Checkpoint,
    CheckpointConfig,
    DataParallelTrainer,
    RunConfig,
    ScalingConfig,
    _controller,
)
from nbcluster.train.trainer import TrainingReport, run_trainer
from nbcluster.util.state import list_placement_groups

cloudpickle.register_pickle_by_value(sys.modules[__name__])
pytestmark = [pytest.mark.integration]


def _run_config(tmp_path, **kw):
    return RunConfig(storage_path=str(tmp_path), verbose=kw.pop("verbose", 0), **kw)


def _pids_file(tmp_path):
    return tmp_path / "pids"


def raising_loop(config):
    with open(config["pids"], "a") as f:
        f.write(f"{os.getpid()}\n")
    if train.get_context().get_world_rank() == 1:
        raise ValueError("bad batch on rank 1")
    time.sleep(600)  # rank 0 would wait for rank 1 in a collective


def test_a_loop_that_raises_names_the_rank_and_ends_every_worker(train_cluster, tmp_path):
    pids = _pids_file(tmp_path)
    start = time.monotonic()
    with pytest.raises(train.TrainingFailedError) as info:
        DataParallelTrainer(
            raising_loop,
            train_loop_config={"pids": str(pids)},
            scaling_config=ScalingConfig(num_workers=2),
            run_config=_run_config(tmp_path),
        ).fit()
    assert time.monotonic() - start < 120  # rank 0 (asleep for 600 s) did not keep it waiting
    err = info.value
    assert isinstance(err, train.WorkerGroupError) and list(err.worker_failures) == [1]
    assert isinstance(err.worker_failures[1], ValueError)
    text = str(err)
    assert text.startswith("Training failed due to worker errors:\n[Rank 1] (pid ")
    assert "Traceback (most recent call last):" in text
    assert 'in raising_loop\n    raise ValueError("bad batch on rank 1")' in text
    assert text.rstrip().endswith("ValueError: bad batch on rank 1")
    for pid in map(int, pids.read_text().split()):
        poll_for(lambda pid=pid: not psutil.pid_exists(pid), timeout=60)
    # (the fixture checks that every resource came back and tasks still run)


def test_more_workers_than_the_cluster_can_hold_is_an_error_at_once(train_cluster, tmp_path):
    start = time.monotonic()
    with pytest.raises(
        ValueError,
        match=r"num_workers=5\) needs 5 bundles \(5 CPU in total\), but the cluster has 4 CPU",
    ):
        DataParallelTrainer(
            raising_loop,
            scaling_config=ScalingConfig(num_workers=5),
            run_config=_run_config(tmp_path),
        ).fit()
    with pytest.raises(ValueError, match=r"STRICT_SPREAD"):
        DataParallelTrainer(
            raising_loop,
            scaling_config=ScalingConfig(num_workers=2, placement_strategy="STRICT_SPREAD"),
            run_config=_run_config(tmp_path),
        ).fit()
    assert time.monotonic() - start < 30  # an error, not a wait for resources
    assert os.listdir(tmp_path) == []  # nothing was started or written


def test_unpicklable_config_or_dataset_is_named_at_fit(train_cluster, tmp_path):
    lock = threading.Lock()
    with pytest.raises(SerializationError, match=r"train_loop_config cannot be sent") as info:
        DataParallelTrainer(
            lambda config: None, train_loop_config={"lock": lock}, run_config=_run_config(tmp_path)
        ).fit()
    assert info.value.object_path == "train_loop_config['lock']"

    class Data:
        def streaming_split(self, n, equal=False):
            return [self] * n

        def __init__(self):
            self.handle = lock

    with pytest.raises(SerializationError, match=r"datasets cannot be sent") as info:
        DataParallelTrainer(
            lambda: None, datasets={"train": Data()}, run_config=_run_config(tmp_path)
        ).fit()
    assert info.value.object_path == "datasets['train'].handle"
    assert os.listdir(tmp_path) == []


def nonscalar_loop(config):
    train.report({"weights": [0.1, 0.2]})


def vanished_loop(config):
    tmp = tempfile.mkdtemp()
    ckpt = Checkpoint.from_directory(tmp)
    os.rmdir(tmp)
    train.report({"x": 1}, checkpoint=ckpt)


@pytest.mark.parametrize(
    ("loop", "message"),
    [
        (nonscalar_loop, r"TypeError: report\(\): metric 'weights' is a list, not a scalar"),
        (
            vanished_loop,
            r"FileNotFoundError: report\(\): the checkpoint directory \S+ no longer exists",
        ),
    ],
)
def test_bad_reports_fail_with_a_clear_error(train_cluster, tmp_path, loop, message):
    with pytest.raises(train.TrainingFailedError, match=message):
        DataParallelTrainer(
            loop, scaling_config=ScalingConfig(num_workers=2), run_config=_run_config(tmp_path)
        ).fit()


def unscored_loop(config):
    with tempfile.TemporaryDirectory() as tmp:
        train.report({"loss": 1.0}, checkpoint=Checkpoint.from_directory(tmp))


def test_a_checkpoint_without_its_score_is_a_controller_error(train_cluster, tmp_path):
    with pytest.raises(
        train.ControllerError, match=r"checkpoint_score_attribute='accuracy'.*missing"
    ):
        DataParallelTrainer(
            unscored_loop,
            run_config=_run_config(
                tmp_path,
                checkpoint_config=CheckpointConfig(
                    num_to_keep=1, checkpoint_score_attribute="accuracy"
                ),
            ),
        ).fit()


def sleepy_loop(config):
    train.report({"started": 1})
    time.sleep(600)  # never reaches another report


class _InterruptAt:
    def __init__(self, iteration):
        self.iteration = iteration

    def on_trial_result(self, iteration, trials, trial, result, **info):
        if result["training_iteration"] == self.iteration:
            os.kill(os.getpid(), signal.SIGINT)


def test_workers_that_do_not_stop_are_ended_after_the_grace_period(
    train_cluster, tmp_path, monkeypatch
):
    monkeypatch.setattr(_controller, "STOP_GRACE_S", 1.0)
    pids = _pids_file(tmp_path)
    start = time.monotonic()
    result = DataParallelTrainer(
        sleepy_loop,
        scaling_config=ScalingConfig(num_workers=2),
        run_config=_run_config(tmp_path, callbacks=[_InterruptAt(1)]),
    ).fit()
    assert time.monotonic() - start < 120  # the loops (asleep for 600 s) were ended
    assert result.interrupted and result.metrics["started"] == 1
    del pids
    # The killed group is not kept warm: the next run starts new workers, and works.
    again = DataParallelTrainer(
        lambda: train.report({"ok": 1}),
        scaling_config=ScalingConfig(num_workers=2),
        run_config=_run_config(tmp_path),
    ).fit()
    assert again.metrics["ok"] == 1


class Recorder:
    def __init__(self):
        self.calls = []

    def on_trial_start(self, iteration, trials, trial, **info):
        self.calls.append(("start", trial.trial_name, trial.config["n"]))

    def on_trial_result(self, iteration, trials, trial, result, **info):
        self.calls.append(("result", iteration, result["i"]))

    def on_checkpoint(self, iteration, trials, trial, checkpoint, **info):
        self.calls.append(("checkpoint", os.path.basename(checkpoint.path)))

    def on_trial_complete(self, iteration, trials, trial, **info):
        self.calls.append(("complete", trial.status))


def counting_loop(config):
    for i in range(config["n"]):
        ckpt = None
        with tempfile.TemporaryDirectory() as tmp:
            if i == 1:
                ckpt = Checkpoint.from_directory(tmp)
            train.report({"i": i}, checkpoint=ckpt)


def test_callbacks_see_the_run(train_cluster, tmp_path):
    rec = Recorder()
    DataParallelTrainer(
        counting_loop,
        train_loop_config={"n": 3},
        scaling_config=ScalingConfig(num_workers=2),
        run_config=_run_config(tmp_path, name="cb", callbacks=[rec]),
    ).fit()
    assert rec.calls == [
        ("start", "cb", 3),
        ("result", 1, 0),
        ("result", 2, 1),
        ("checkpoint", "checkpoint_000001"),
        ("result", 3, 2),
        ("complete", "TERMINATED"),
    ]


def test_run_trainer_streams_reports_and_can_stop_the_run(train_cluster, tmp_path):
    """The entry point Tune uses: another config, reports to a callback, stop on request."""
    trainer = DataParallelTrainer(
        counting_loop,
        train_loop_config={"n": 2},
        scaling_config=ScalingConfig(num_workers=2),
        run_config=_run_config(tmp_path),
    )
    seen: list[TrainingReport] = []

    def on_report(report: TrainingReport) -> bool:
        seen.append(report)
        return report.iteration == 3

    result = run_trainer(
        trainer,
        train_loop_config={"n": 50},
        run_config=_run_config(tmp_path, name="trial_0"),
        on_report=on_report,
        show=False,
    )
    assert [r.iteration for r in seen] == [1, 2, 3]
    assert [r.metrics["i"] for r in seen] == [0, 1, 2]
    assert seen[1].checkpoint is not None and seen[1].checkpoint.path.endswith(
        "trial_0/checkpoint_000001"
    )
    assert result.stopped == "stopped by on_report" and not result.interrupted
    assert result.metrics["training_iteration"] == 3 and result.error is None
    # A failure is returned in the result, not raised.
    failed = run_trainer(
        DataParallelTrainer(nonscalar_loop, run_config=_run_config(tmp_path)), show=False
    )
    assert isinstance(failed.error, train.TrainingFailedError)


def test_get_dataset_shard_names_the_missing_dataset(train_cluster, tmp_path):
    def loop():
        train.get_dataset_shard("train")

    with pytest.raises(
        train.TrainingFailedError, match=r"get_dataset_shard\('train'\): the trainer has no dataset"
    ):
        DataParallelTrainer(loop, run_config=_run_config(tmp_path)).fit()


def test_a_busy_cluster_makes_the_run_wait_and_say_so(train_cluster, tmp_path, capsys, monkeypatch):
    @nbcluster.remote(num_cpus=3)
    def hold(path: str) -> None:
        while not os.path.exists(path):
            time.sleep(0.05)

    release = tmp_path / "release"
    ref = hold.remote(str(release))
    poll_for(lambda: nbcluster.available_resources().get("CPU", 0) <= 1.0, timeout=60)
    said = "waiting for resources: the run needs 2 CPU, available now: 1 CPU"
    # Free the CPUs once the run has said it waits (not after a fixed time).
    monkeypatch.setattr(sys, "stdout", _Tee(sys.stdout, said, release.touch))
    result = DataParallelTrainer(
        lambda: train.report({"ok": 1}),
        scaling_config=ScalingConfig(num_workers=2),
        run_config=_run_config(tmp_path, verbose=1),
    ).fit()
    nbcluster.get(ref)
    assert result.metrics["ok"] == 1
    assert said in capsys.readouterr().out


class _Tee(io.TextIOBase):
    """Writes through to ``inner`` and calls ``action()`` when ``text`` goes by."""

    def __init__(self, inner, text, action):
        self.inner, self.text, self.action = inner, text, action

    def write(self, s):
        self.inner.write(s)
        if self.text in s:
            self.action()
        return len(s)

    def flush(self):
        self.inner.flush()


def _pending_placement_groups():
    return [g for g in list_placement_groups() if g.state == "PENDING"]


def context_loop(config):
    ctx = train.get_context()
    train.report(
        {
            "experiment": ctx.get_experiment_name(),
            "trial": ctx.get_trial_name(),
            "trial_dir": ctx.get_trial_dir(),
            "storage": ctx.get_storage().storage_path,
            "meta": ctx.get_metadata()["owner"],
            "cpus": ctx.get_trial_resources()["CPU"],
            "ranks": f"{ctx.get_world_rank()}/{ctx.get_world_size()}/{ctx.get_local_rank()}/{ctx.get_node_rank()}",
        }
    )


def test_context_names_the_run_and_its_storage(train_cluster, tmp_path):
    result = DataParallelTrainer(
        context_loop,
        scaling_config=ScalingConfig(num_workers=2),
        run_config=_run_config(tmp_path, name="ctx"),
        metadata={"owner": "me"},
    ).fit()
    m = result.metrics
    assert (m["experiment"], m["trial"]) == ("ctx", "ctx")
    assert m["trial_dir"] == str(tmp_path / "ctx") == result.path
    assert m["storage"] == str(tmp_path) and m["meta"] == "me" and m["cpus"] == 1.0
    assert m["ranks"] == "0/2/0/0"


def flooding_loop(config):
    for i in range(20000):
        print(f"line {i}")
    train.report({"done": 1})


def test_a_flood_of_worker_output_is_folded(train_cluster, tmp_path, capfd):
    result = DataParallelTrainer(
        flooding_loop, scaling_config=ScalingConfig(num_workers=2), run_config=_run_config(tmp_path)
    ).fit()
    assert result.metrics["done"] == 1
    out = capfd.readouterr().out  # printed before fit() returned: no wait for it
    assert "[rank 0] line 0\n" in out and "[rank 1] line 0\n" in out
    printed = out.count("] line ")
    assert printed < 40000, printed  # not every line reached the driver
    assert "more lines folded by the output rate limit" in out or "more lines dropped" in out


def test_an_interrupt_while_waiting_for_resources_gives_them_back(train_cluster, tmp_path):
    @nbcluster.remote(num_cpus=3)
    def hold(path: str) -> None:
        while not os.path.exists(path):
            time.sleep(0.05)

    release = tmp_path / "release"
    ref = hold.remote(str(release))
    poll_for(lambda: nbcluster.available_resources().get("CPU", 0) <= 1.0, timeout=60)
    main = threading.main_thread().ident

    def interrupt_once_waiting() -> None:
        # The run is waiting once its placement group is pending: interrupt it then.
        poll_for(_pending_placement_groups, timeout=120)
        signal.pthread_kill(main, signal.SIGINT)

    threading.Thread(target=interrupt_once_waiting).start()
    result = DataParallelTrainer(
        lambda: train.report({"ok": 1}),
        scaling_config=ScalingConfig(num_workers=2),
        run_config=_run_config(tmp_path),
    ).fit()
    assert result.interrupted and result.metrics is None and result.checkpoint is None
    release.touch()
    nbcluster.get(ref)
    # (the fixture checks that the pending placement group's CPUs are all back)
