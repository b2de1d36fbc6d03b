"""ResultGrid, the live widget, the text reporter and Tuner's checks (no cluster needed)."""

from __future__ import annotations

import io
from typing import Any

import pytest

from nbcluster import tune
from nbcluster.exceptions import TaskError
from nbcluster.tune._display import Reporter, WidgetReporter
from nbcluster.tune.experiment.trial import Trial
from nbcluster.tune.result_grid import ResultGrid
from nbcluster.tune.schedulers import ASHAScheduler, PopulationBasedTraining
from nbcluster.tune.search.optuna import OptunaSearch


def make_trials() -> list[Trial]:
    trials = []
    for i, (status, losses) in enumerate(
        [
            (Trial.TERMINATED, [3.0, 2.0, 1.0]),
            (Trial.TERMINATED, [2.5, 0.5, 1.5]),
            (Trial.RUNNING, [4.0]),
            (Trial.ERROR, [5.0, float("nan")]),
            (Trial.PENDING, []),
        ]
    ):
        t = Trial("train_fn", f"abc_{i:05d}", {"lr": 0.1 * (i + 1), "note": "<script>x</script>"})
        t.evaluated_params = {"lr": t.config["lr"]}
        t.local_path = f"/exp/t{i}"
        for it, loss in enumerate(losses, start=1):
            t.add_result({"loss": loss, "training_iteration": it, "config": t.config})
        t.set_status(status)
        trials.append(t)
    try:
        raise ValueError("bad lr")
    except ValueError as e:
        trials[3].error = TaskError.from_exception(e, "train_fn")
        trials[3].error_msg = trials[3].error.traceback_str
    return trials


def test_result_grid_best_scopes_and_errors() -> None:
    grid = ResultGrid(make_trials(), "/exp", "loss", "min")
    assert len(grid) == 5 and grid.num_terminated == 2 and grid.num_errors == 1
    assert grid.get_best_result().config["lr"] == pytest.approx(0.1)  # last: 1.0 beats 1.5
    assert grid.get_best_result(scope="all").config["lr"] == pytest.approx(0.2)  # best ever 0.5
    assert grid.get_best_result(scope="avg").config["lr"] == pytest.approx(0.2)
    assert grid.get_best_result(metric="loss", mode="max").config["lr"] == pytest.approx(0.3)
    (err,) = grid.errors
    assert isinstance(err, ValueError) and isinstance(err, TaskError) and "bad lr" in str(err)
    assert [r.error is None for r in grid] == [True, True, True, False, True]
    with pytest.raises(ValueError, match="scope"):
        grid.get_best_result(scope="median")
    with pytest.raises(RuntimeError, match=r"'acc'.*The trials reported: loss"):
        grid.get_best_result(metric="acc", mode="max")
    with pytest.raises(ValueError, match="No metric"):
        ResultGrid(make_trials(), "/exp").get_best_result()


def test_result_grid_dataframe_and_reprs() -> None:
    grid = ResultGrid(make_trials(), "/exp", "loss", "min")
    df = grid.get_dataframe()
    assert {"loss", "config/lr", "trial_id", "status", "logdir"} <= set(df.columns)
    best = grid.get_dataframe(filter_metric="loss", filter_mode="min")
    assert best.loc[1, "loss"] == 0.5
    text = repr(grid)
    assert "5 trials" in text and "best loss (min): 0.5 in train_fn_abc_00001" in text  # best seen
    html = grid._repr_html_()
    assert "<script>" not in html and "&lt;script&gt;" not in html  # params: only searched ones
    assert "TERMINATED" in html and "ERROR" in html and "/exp" in html
    assert set(grid._repr_mimebundle_()) == {"text/plain", "text/html"}
    assert grid[0].metrics_dataframe["loss"].tolist() == [3.0, 2.0, 1.0]


def test_widget_draws_a_line_per_trial_coloured_by_status() -> None:
    trials = make_trials()
    w = WidgetReporter("loss", "min")
    w.update(trials, force=True)
    assert len(w.figure.data) == 5
    assert [tr.line.color for tr in w.figure.data][:4] == [
        "#2ca02c",
        "#2ca02c",
        "#1f77b4",
        "#d62728",
    ]
    assert list(w.figure.data[0].y) == [3.0, 2.0, 1.0]
    assert "2 TERMINATED" in w._header.value and "best loss 0.5" in w._header.value
    assert "train_fn_abc_00001" in w._table.value
    trials[2].add_result({"loss": 0.1, "training_iteration": 2})
    trials[2].set_status(Trial.TERMINATED)
    w.update(trials, force=True)
    assert len(w.figure.data) == 5 and w.figure.data[2].line.color == "#2ca02c"
    assert list(w.figure.data[2].y) == [4.0, 0.1]
    # A hostile config value is escaped in the table.
    trials[0].evaluated_params = {"x": "<img onerror=1>"}
    w.update(trials, force=True)
    assert "<img" not in w._table.value and "&lt;img" in w._table.value


def test_text_reporter_status_lines_and_output_folding() -> None:
    out = io.StringIO()
    rep = Reporter("loss", "min", verbose=1, experiment_path="/exp", file=out)
    trials = make_trials()
    rep.update(trials, force=True)
    assert "5 trials" in out.getvalue() and "best loss 0.5" in out.getvalue()
    rep.output(trials[0], "\n".join(f"line {i}" for i in range(200)))
    rep.finish(trials)
    text = out.getvalue()
    assert (
        text.count("(train_fn_abc_00000) line") == 50
        and "150 line(s) of trial output folded" in text
    )
    assert "ResultGrid<5 trials" in text


def _f(config: dict[str, Any]) -> None: ...


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"trainable": 3}, TypeError, "trainable must be a function"),
        ({"trainable": dict}, TypeError, "not a tune.Trainable subclass"),
        ({"trainable": lambda a, b: None}, TypeError, "exactly one argument"),
        ({"param_space": [1]}, TypeError, r"param_space=\) must be a dict"),
        ({"tune_config": {"metric": "x"}}, TypeError, r"tune_config=\) must be a tune.TuneConfig"),
        ({"run_config": {"name": "x"}}, TypeError, r"run_config=\) must be a tune.RunConfig"),
        (
            {"tune_config": tune.TuneConfig(scheduler=ASHAScheduler())},
            ValueError,
            "ASHAScheduler|AsyncHyperBandScheduler has no metric/mode",
        ),
        (
            {
                "tune_config": tune.TuneConfig(
                    metric="a", mode="max", scheduler=ASHAScheduler(metric="b", mode="max")
                )
            },
            ValueError,
            "already instantiated with a different `metric`",
        ),
        (
            {
                "param_space": {"x": tune.grid_search([1, 2])},
                "tune_config": tune.TuneConfig(metric="a", mode="max", search_alg=OptunaSearch()),
            },
            ValueError,
            "OptunaSearch cannot use grid_search",
        ),
        ({"run_config": tune.RunConfig(stop=42)}, TypeError, r"stop=\) must be a dict"),
    ],
)
def test_tuner_checks_its_arguments(kwargs: dict[str, Any], error: type, match: str) -> None:
    kwargs.setdefault("trainable", _f)
    with pytest.raises(error, match=match):
        tune.Tuner(kwargs.pop("trainable"), **kwargs)


def test_configs_check_their_fields() -> None:
    with pytest.raises(ValueError, match="num_samples"):
        tune.TuneConfig(num_samples=0)
    with pytest.raises(ValueError, match="mode"):
        tune.TuneConfig(mode="maximize")
    with pytest.raises(ValueError, match="time_budget_s"):
        tune.TuneConfig(time_budget_s=-1)
    with pytest.raises(ValueError, match="fail_fast"):
        tune.FailureConfig(fail_fast="sometimes")
    with pytest.raises(ValueError, match="checkpoint_frequency"):
        tune.CheckpointConfig(checkpoint_frequency=-1)
    with pytest.raises(Exception, match="hyperparam_mutations"):
        PopulationBasedTraining()
    with pytest.raises(ValueError, match=r"resource 'cpu' must be a number >= 0"):
        tune.with_resources(_f, {"cpu": -1})
