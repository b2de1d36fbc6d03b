"""The parts of nbcluster.train that need no cluster: configs, checkpoints, metric checks,
ranks, feasibility, the result, the displays (text and widget) and the public surface."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tempfile
import threading

import pytest

from nbcluster import train
from nbcluster.exceptions import SerializationError
from nbcluster.train import (
    Checkpoint,
    CheckpointConfig,
    DataConfig,
    DataParallelTrainer,
    FailureConfig,
    Result,
    RunConfig,
    ScalingConfig,
)
from nbcluster.train._display import RunView, TextDisplay, WorkerRow, chart_metrics, summary_line
from nbcluster.train._group import assign_ranks, infeasible_reason
from nbcluster.train._session import Outbox, check_metrics
from nbcluster.train._state import CheckpointRecord
from nbcluster.train._storage import STATE_FILE, RunDir
from nbcluster.train._worker import _OutputGate, _RankStream
from nbcluster.train.torch import TorchConfig, TorchTrainer

# -- the public surface -----------------------------------------------------------------------


def test_exports_are_explicit_and_documented():
    import nbcluster.train.torch as ttorch

    for module in (train, ttorch):
        assert sorted(module.__all__) == sorted(set(module.__all__))
        for name in module.__all__:
            obj = getattr(module, name)
            assert obj.__doc__, f"{module.__name__}.{name} has no docstring"


def test_importing_train_loads_neither_torch_nor_widgets():
    code = (
        "import sys, nbcluster, nbcluster.train, nbcluster.train.torch\n"
        "print(sorted(m for m in ('torch', 'plotly', 'ipywidgets', 'pandas') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_a_process_that_only_reports_loads_no_driver_module():
    # A Tune runner (or a worker) uses report / Checkpoint / the trial-session hook: none
    # of the driver's controller, worker group, display or torch modules.
    code = (
        "import sys, nbcluster.train, nbcluster.train.trainer\n"
        "nbcluster.train.report, nbcluster.train.Checkpoint, nbcluster.train.trainer.trial_session\n"
        "heavy = ['nbcluster.train._controller', 'nbcluster.train._group', "
        "'nbcluster.train._display', 'nbcluster.train._worker', 'nbcluster.train._trainer', "
        "'nbcluster.train.torch', 'torch']\n"
        "print(sorted(m for m in heavy if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr
    assert train.__all__ == sorted(train._EXPORTS)


def test_libraries_run_a_trainer_through_a_documented_entry_point():
    from nbcluster.train import _controller, trainer

    assert trainer.run_trainer is _controller.run_trainer
    assert trainer.TrainingReport is _controller.TrainingReport
    for name in trainer.__all__:
        assert getattr(trainer, name).__doc__, name
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        trainer.nope  # noqa: B018


def test_nbcluster_train_is_a_lazy_attribute():
    code = "import sys, nbcluster\nprint('nbcluster.train' in sys.modules, nbcluster.train.ScalingConfig.__name__)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "ScalingConfig"]


# -- configs ----------------------------------------------------------------------------------


def test_scaling_config_defaults_and_bundles():
    sc = ScalingConfig(num_workers=2)
    assert sc.placement_strategy == "PACK" and not sc.use_gpu
    assert sc.bundles() == [{"CPU": 1.0}, {"CPU": 1.0}]
    assert sc.num_cpus_per_worker == 1 and sc.num_gpus_per_worker == 0
    gpu = ScalingConfig(num_workers=2, use_gpu=True, trainer_resources={"CPU": 1})
    assert gpu.bundles() == [{"CPU": 1.0, "GPU": 1.0}] * 2 + [{"CPU": 1.0}]
    assert gpu.total_resources == {"CPU": 3.0, "GPU": 2.0}
    custom = ScalingConfig(num_workers=1, resources_per_worker={"CPU": 2, "acc": 1})
    assert custom.bundles() == [{"CPU": 2.0, "acc": 1.0}]
    assert custom.additional_resources_per_worker == {"acc": 1.0}


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"num_workers": 0}, ValueError, r"num_workers=\.\.\.\) must be at least 1, got 0"),
        ({"num_workers": "2"}, TypeError, r"must be an int"),
        ({"placement_strategy": "TIGHT"}, ValueError, r"one of PACK, SPREAD, STRICT_PACK"),
        ({"resources_per_worker": {"CPU": -1}}, ValueError, r"\['CPU'\] must be a non-negative"),
        ({"resources_per_worker": {"CPU": 0}}, ValueError, r"reserves nothing"),
        ({"use_gpu": "yes"}, TypeError, r"use_gpu"),
    ],
)
def test_scaling_config_rejects_bad_values(kwargs, error, match):
    with pytest.raises(error, match=match):
        ScalingConfig(**kwargs)


@pytest.mark.parametrize(
    ("make", "error", "match"),
    [
        (lambda: CheckpointConfig(num_to_keep=0), ValueError, r"num_to_keep.*positive integer"),
        (lambda: CheckpointConfig(checkpoint_score_order="up"), ValueError, r"'max' or 'min'"),
        (lambda: FailureConfig(max_failures=-2), ValueError, r"integer >= -1"),
        (lambda: RunConfig(name="a/b"), ValueError, r"cannot contain"),
        (lambda: RunConfig(storage_path="s3://bucket"), ValueError, r"no URIs"),
        (lambda: RunConfig(checkpoint_config={"num_to_keep": 1}), TypeError, r"CheckpointConfig"),
        (lambda: RunConfig(callbacks=object()), TypeError, r"list of callback"),
        (lambda: DataConfig(datasets_to_split=3), TypeError, r"'all' or a list"),
    ],
)
def test_configs_reject_bad_values(make, error, match):
    with pytest.raises(error, match=match):
        make()


def test_run_config_defaults(monkeypatch, tmp_path):
    rc = RunConfig()
    assert rc.checkpoint_config == CheckpointConfig() and rc.failure_config.max_failures == 0
    monkeypatch.delenv("NBCLUSTER_TRAIN_STORAGE_PATH", raising=False)
    assert rc.resolved_storage_path() == os.path.expanduser("~/nbcluster_results")
    monkeypatch.setenv("NBCLUSTER_TRAIN_STORAGE_PATH", str(tmp_path))
    assert rc.resolved_storage_path() == str(tmp_path)
    assert RunConfig(storage_path="rel").resolved_storage_path() == os.path.abspath("rel")


def test_trainer_checks_its_arguments():
    with pytest.raises(ValueError, match=r"0 or 1 arguments.*takes 2: a, b"):
        DataParallelTrainer(lambda a, b: None)
    with pytest.raises(TypeError, match=r"must be a function"):
        DataParallelTrainer(3)
    with pytest.raises(TypeError, match=r"train_loop_config must be a dict"):
        DataParallelTrainer(lambda: None, train_loop_config=[1])
    with pytest.raises(TypeError, match=r"datasets\['train'\] is a list, not a dataset"):
        DataParallelTrainer(lambda: None, datasets={"train": [1, 2]})
    with pytest.raises(TypeError, match=r"resume_from_checkpoint must be a Checkpoint"):
        DataParallelTrainer(lambda: None, resume_from_checkpoint="/tmp")
    with pytest.raises(TypeError, match=r"torch_config must be a TorchConfig"):
        TorchTrainer(lambda: None, torch_config={"backend": "gloo"})
    with pytest.raises(ValueError, match=r"backend"):
        TorchConfig(backend="tcp")
    t = TorchTrainer(lambda config: None, scaling_config=ScalingConfig(num_workers=3))
    assert t.torch_config == TorchConfig() and "num_workers=3" in repr(t)


def test_unpicklable_config_is_named_before_anything_starts():
    lock = threading.Lock()
    t = DataParallelTrainer(lambda config: None, train_loop_config={"lr": 0.1, "opts": [1, lock]})
    with pytest.raises(SerializationError) as info:
        t._check_picklable(t.train_loop_config)
    assert info.value.object_path == "train_loop_config['opts'][1]"
    assert "cannot be sent to the workers" in str(info.value)
    assert isinstance(info.value, TypeError)


# -- checkpoints and metrics ------------------------------------------------------------------


def test_checkpoint_directory_roundtrip_and_metadata(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "model.pt").write_text("weights")
    (src / "sub").mkdir()
    (src / "sub" / "x").write_text("1")
    ckpt = Checkpoint.from_directory(src)
    assert ckpt.get_metadata() == {}
    ckpt.set_metadata({"epoch": 3})
    ckpt.update_metadata({"acc": 0.5})
    assert ckpt.get_metadata() == {"epoch": 3, "acc": 0.5}
    out = ckpt.to_directory(tmp_path / "copy")
    assert (tmp_path / "copy" / "sub" / "x").read_text() == "1"
    with ckpt.as_directory() as d:
        assert d == str(src)
    tmp = ckpt.to_directory()
    assert os.path.exists(os.path.join(tmp, "model.pt")) and out == str(tmp_path / "copy")
    assert repr(ckpt) == f"Checkpoint(filesystem=local, path={src})"
    with pytest.raises(TypeError, match="JSON"):
        ckpt.set_metadata({"x": object()})


def test_checkpoint_of_a_missing_directory_is_a_clear_error(tmp_path):
    with pytest.raises(
        FileNotFoundError, match=r"from_directory\(\): the checkpoint directory .* does not exist"
    ):
        Checkpoint.from_directory(tmp_path / "nope")
    with pytest.raises(FileNotFoundError, match=r"to_directory"):
        Checkpoint(tmp_path / "gone").to_directory()


def test_metrics_must_be_scalars():
    np = pytest.importorskip("numpy")
    clean = check_metrics(
        {"a": 1, "b": 2.5, "c": "x", "d": None, "e": True, "f": np.float32(0.5), "g": np.array(3)}
    )
    assert clean == {"a": 1, "b": 2.5, "c": "x", "d": None, "e": True, "f": 0.5, "g": 3}
    assert type(clean["g"]) is int
    with pytest.raises(TypeError, match=r"metric 'w' is a ndarray of shape \(2,\), not a scalar"):
        check_metrics({"w": np.zeros(2)})
    with pytest.raises(TypeError, match=r"metric 'n' is a dict"):
        check_metrics({"n": {"x": 1}})
    with pytest.raises(TypeError, match=r"metric names must be strings"):
        check_metrics({1: 2})
    with pytest.raises(TypeError, match=r"expects a dict"):
        check_metrics([1])


def test_session_functions_outside_a_training_function():
    for fn in (train.get_context, train.get_checkpoint, lambda: train.report({"x": 1})):
        with pytest.raises(RuntimeError, match=r"can only be called inside a training function"):
            fn()


def test_outbox_keeps_events_until_acknowledged_and_stops():
    box = Outbox()
    box.put(("report", 0))
    box.put(("report", 1))
    assert [seq for seq, _ in box.take(0, 0)] == [1, 2]
    assert [seq for seq, _ in box.take(0, 0)] == [1, 2]  # a cancelled poll loses nothing
    assert [seq for seq, _ in box.take(1, 0)] == [2]
    assert box.take(2, 0.01) == []
    box.request_stop()
    assert box.stop.is_set()


def test_worker_output_is_prefixed_by_rank_and_held_for_the_next_poll():
    gate = _OutputGate()
    gate.rank = 1
    log = tempfile.TemporaryFile("w+")  # noqa: SIM115 - closed by the garbage collector
    out = _RankStream("stdout", log, gate)
    err = _RankStream("stderr", log, gate)
    out.write("held line\npart")
    err.write("oops\n")
    assert gate.take() == [  # the unfinished line waits for its end
        ("stdout", "[rank 1] held line\n"),
        ("stderr", "[rank 1] oops\n"),
    ]
    out.write("ial\nnext\n")
    assert gate.take() == [("stdout", "[rank 1] partial\n[rank 1] next\n")]
    assert gate.take() == []
    log.seek(0)  # the worker's log has everything, in order
    assert log.read() == "[rank 1] held line\n[rank 1] part[rank 1] oops\nial\n[rank 1] next\n"


def test_a_poll_between_a_prints_text_and_its_newline_sends_the_line_whole():
    # print() writes the text, then the newline: a poll between them must not send the
    # text alone, or the driver prints another rank's line after it on the same line.
    gate = _OutputGate()
    gate.rank = 1
    stream = _RankStream("stdout", None, gate)
    stream.write("hello 1")
    stream.write(" from")
    assert gate.take() == []
    stream.write(" rank 1")
    stream.write("\n")
    assert gate.take() == [("stdout", "[rank 1] hello 1 from rank 1\n")]
    assert gate.held == [] and gate.held_chars == 0


def test_an_unfinished_line_goes_out_when_the_function_ends_or_it_is_old(monkeypatch):
    from nbcluster.train import _worker

    gate = _OutputGate()
    stream = _RankStream("stderr", None, gate)
    stream.write("last words")
    assert gate.take() == []
    assert gate.take(final=True) == [("stderr", "[rank 0] last words\n")]  # ended
    monkeypatch.setattr(_worker, "PARTIAL_LINE_S", 0.0)
    stream = _RankStream("stderr", None, gate)  # the next function's
    stream.write("progress 10%")
    assert gate.take() == [("stderr", "[rank 0] progress 10%")]  # waited long enough
    stream.write(" 20%\n")
    assert gate.take() == [("stderr", " 20%\n")]
    stream.write("done")
    assert gate.take() == [("stderr", "[rank 0] done")]  # old: out without its end
    assert gate.take(final=True) == [("stderr", "\n")]  # the function ended: the line too


def test_worker_output_beyond_the_rate_limit_is_folded_into_a_count(monkeypatch):
    from nbcluster.train import _worker

    monkeypatch.setattr(_worker, "OUTPUT_LINES_PER_S", 5)
    gate = _OutputGate()
    stream = _RankStream("stdout", None, gate)
    for i in range(50):
        print(f"line {i}", file=stream)
    text = "".join(t for _, t in gate.take())
    assert text.startswith("[rank 0] line 0\n") and "[rank 0] line 5\n" not in text
    assert text.endswith("[rank 0] [... 45 more lines folded by the output rate limit ...]\n")
    assert gate.take() == []


# -- ranks and feasibility --------------------------------------------------------------------


def test_ranks_are_contiguous_per_node_with_the_driver_node_first():
    ranks = assign_ranks(["b", "a", "b", "c", "a"], driver_node="a")
    assert [(r.world_rank, r.local_rank, r.local_world_size, r.node_rank) for r in ranks] == [
        (2, 0, 2, 1),
        (0, 0, 2, 0),
        (3, 1, 2, 1),
        (4, 0, 1, 2),
        (1, 1, 2, 0),
    ]
    assert [r.world_rank for r in assign_ranks(["x", "x"], driver_node="y")] == [0, 1]


@pytest.mark.parametrize(
    ("workers", "per", "strategy", "nodes", "match"),
    [
        (
            5,
            {"CPU": 1},
            "PACK",
            [{"CPU": 4}],
            r"num_workers=5\) needs 5 bundles \(5 CPU in total\), but the cluster has 4 CPU",
        ),
        (1, {"GPU": 1}, "PACK", [{"CPU": 4}], r"no node can hold a bundle of 1 GPU"),
        (3, {"CPU": 2}, "PACK", [{"CPU": 3}, {"CPU": 3}], r"only 2 such bundles"),
        (2, {"CPU": 2}, "STRICT_PACK", [{"CPU": 2}, {"CPU": 2}], r"on one node \(STRICT_PACK\)"),
        (3, {"CPU": 1}, "STRICT_SPREAD", [{"CPU": 4}, {"CPU": 4}], r"3 different nodes"),
    ],
)
def test_infeasible_requests_say_why(workers, per, strategy, nodes, match):
    bundles = [per] * workers
    reason = infeasible_reason(bundles, strategy, nodes, workers)
    assert reason is not None and "Lower num_workers" in reason
    import re

    assert re.search(match, reason), reason


@pytest.mark.parametrize(
    ("workers", "strategy", "nodes"),
    [
        (2, "PACK", [{"CPU": 2}]),
        (4, "SPREAD", [{"CPU": 2}, {"CPU": 2}]),
        (2, "STRICT_SPREAD", [{"CPU": 1}, {"CPU": 1}]),
        (2, "STRICT_PACK", [{"CPU": 1}, {"CPU": 2}]),
    ],
)
def test_feasible_requests_pass(workers, strategy, nodes):
    assert infeasible_reason([{"CPU": 1.0}] * workers, strategy, nodes, workers) is None


# -- results, storage and displays ------------------------------------------------------------


def _result(tmp_path, **kw):
    history = [
        {"loss": 1.0 / i, "acc": i / 10, "training_iteration": i, "time_total_s": float(i)}
        for i in range(1, 4)
    ]
    ck = [(Checkpoint(tmp_path / f"checkpoint_00000{i}"), history[i]) for i in (1, 2)]
    return Result(
        metrics=history[-1],
        checkpoint=ck[-1][0],
        error=kw.pop("error", None),
        path=str(tmp_path),
        best_checkpoints=ck,
        metrics_history=history,
        **kw,
    )


def test_result_views(tmp_path):
    pd = pytest.importorskip("pandas")
    res = _result(tmp_path, interrupted=True, resumed_from=Checkpoint(tmp_path / "old"))
    df = res.metrics_dataframe
    assert isinstance(df, pd.DataFrame) and list(df["training_iteration"]) == [1, 2, 3]
    assert res.get_best_checkpoint("acc", "max").path.endswith("checkpoint_000002")
    assert res.get_best_checkpoint("loss", "max").path.endswith("checkpoint_000001")
    with pytest.raises(ValueError, match="no kept checkpoint has the metric 'nope'"):
        res.get_best_checkpoint("nope", "max")
    text = repr(res)
    assert text.startswith("Result(\n  metrics={'loss'") and "interrupted=True" in text
    assert "resumed_from=Checkpoint(" in text
    bundle = res._repr_mimebundle_()
    assert bundle["text/plain"] == text
    assert "interrupted" in bundle["text/html"] and "checkpoint_000002" in bundle["text/html"]


def test_result_html_escapes_what_the_loop_reported(tmp_path):
    res = _result(tmp_path, error=train.TrainingFailedError("<script>alert(1)</script>"))
    res.metrics = {"<b>": "<img src=x onerror=alert(1)>"}
    page = res._repr_html_()
    assert "<script>" not in page and "<img" not in page and "&lt;script&gt;" in page


def test_run_dir_state_roundtrip_and_result_from_path(tmp_path):
    run = RunDir(str(tmp_path), "exp")
    run.create()
    (tmp_path / "exp" / "checkpoint_000001").mkdir()
    (tmp_path / "exp" / "checkpoint_000005").mkdir()  # written by a failed attempt
    history = [{"training_iteration": 1, "x": 1}, {"training_iteration": 2, "x": 2}]
    run.save_state(
        {
            "version": 1,
            "history": history,
            "checkpoints": [CheckpointRecord("checkpoint_000001", 2, history[1]).to_json()],
            "failures": 1,
        }
    )
    assert json.loads((tmp_path / "exp" / STATE_FILE).read_text())["failures"] == 1
    assert run.remove_unregistered({"checkpoint_000001"}) == ["checkpoint_000005"]
    res = Result.from_path(tmp_path / "exp")
    assert res.metrics == history[1] and res.num_failures == 1
    assert res.checkpoint.path == str(tmp_path / "exp" / "checkpoint_000001")
    with pytest.raises(FileNotFoundError, match="no nbcluster training run"):
        Result.from_path(tmp_path)


def test_run_dir_that_cannot_be_created_is_a_clear_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(OSError, match=r"cannot create the run directory .*storage_path"):
        RunDir(str(blocker), "exp").create()


def _view() -> RunView:
    view = RunView("TorchTrainer", "exp", "/tmp/exp", 2, 1)
    view.workers = [
        WorkerRow(0, "aaaaaaaaaa", 10, "RUNNING", 2),
        WorkerRow(1, "bbbbbbbbbb", 11, "RUNNING", 2),
    ]
    view.history = [
        {"loss": 0.5, "acc": 0.1, "name": "x", "training_iteration": 1, "time_total_s": 1.0},
        {"loss": 0.25, "acc": 0.2, "name": "y", "training_iteration": 2, "time_total_s": 2.0},
    ]
    view.checkpoints = [CheckpointRecord("checkpoint_000001", 2, view.history[1])]
    view.status = "RUNNING"
    return view


def test_text_display_prints_changes_and_a_final_line():
    view = _view()
    out = io.StringIO()
    text = TextDisplay(file=out, interval=0.0)
    text.update(view)
    view.notice("rank 1 failed (failure 1 of 1); restarting from checkpoint_000001")
    view.status = "FINISHED"
    text.close(view)
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("[train] TorchTrainer exp: RUNNING, iteration 2, loss=0.25, acc=0.2")
    assert "[train] rank 1 failed (failure 1 of 1); restarting from checkpoint_000001" in lines
    assert (
        lines[-1].startswith("[train] TorchTrainer exp: FINISHED")
        and "results in /tmp/exp" in lines[-1]
    )
    assert "1 checkpoint(s) kept, latest checkpoint_000001" in lines[-1]
    assert chart_metrics(view.history) == ["loss", "acc"]
    assert summary_line(view).count("failures") == 0


def test_widget_renders_metrics_workers_and_checkpoints():
    pytest.importorskip("plotly")
    from nbcluster.train._widget import TrainWidget

    view = _view()
    w = TrainWidget(view, show=False)
    assert [t.name for t in w.fig.data] == ["loss", "acc"]
    assert list(w.fig.data[0].x) == [1, 2] and list(w.fig.data[0].y) == [0.5, 0.25]
    assert w.fig.data[1].xaxis == "x2" and w.fig.layout.xaxis2.domain[0] > 0.5
    assert "RUNNING" in w.header.value and "exp" in w.header.value
    assert (
        "checkpoint_000001" in w.checkpoints_html.value and "(latest)" in w.checkpoints_html.value
    )
    assert w.workers_html.value.count("<tr><td>") == 2
    # One more report and a new metric: the same figure grows in place.
    view.history = [*view.history, {"loss": 0.1, "acc": 0.3, "lr": 0.01, "training_iteration": 3}]
    w.update(view, force=True)
    assert [t.name for t in w.fig.data] == ["loss", "acc", "lr"] and list(w.fig.data[0].x) == [
        1,
        2,
        3,
    ]
    view.status = "FINISHED"
    w.close(view)
    bundle = w._repr_mimebundle_()
    assert "application/vnd.jupyter.widget-view+json" in bundle
    assert bundle["text/plain"].startswith("TorchTrainer exp: FINISHED, iteration 3")
