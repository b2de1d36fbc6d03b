"""nbcluster.tune: hyperparameter search with Ray Tune's names and semantics.

::

    from nbcluster import tune

    def train_fn(config):
        for step in range(10):
            tune.report({"loss": (config["lr"] - 0.1) ** 2 / (step + 1)})

    tuner = tune.Tuner(
        train_fn,
        param_space={"lr": tune.loguniform(1e-4, 1.0)},
        tune_config=tune.TuneConfig(metric="loss", mode="min", num_samples=20,
                                    scheduler=tune.schedulers.ASHAScheduler()),
    )
    results = tuner.fit()
    results.get_best_result().config

Trials run in runner actors on the cluster (one trial at a time per runner, reused across
trials); a controller in the driver consults the search algorithm and the scheduler at
each result. ``fit()`` shows a live table and chart in a notebook, survives interrupts
(call ``fit()`` again to continue), and saves the experiment for ``Tuner.restore``.

``Tuner.fit_detached()`` runs the same controller in a detached actor instead, so the
search goes on when the kernel restarts or the driver exits; ``tune.attach(name)``
returns a :class:`DetachedRun` to watch it (``get_results()``) or stop it (``stop()``).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# Every public name, and the module that defines it. ``import nbcluster.tune`` imports none
# of them: a name is imported on first use. This keeps the trial runners (which import
# only ``nbcluster.tune.execution.runner``) from loading the search, the schedulers,
# numpy and the Tuner they never use.
_EXPORTS: dict[str, str] = {
    "Callback": "nbcluster.tune.callback",
    "Checkpoint": "nbcluster.train",
    "DetachedRun": "nbcluster.tune.detached",
    "CheckpointConfig": "nbcluster.train",
    "FailureConfig": "nbcluster.train",
    "Result": "nbcluster.tune.result_grid",
    "ResultGrid": "nbcluster.tune.result_grid",
    "RunConfig": "nbcluster.train",
    "Stopper": "nbcluster.tune.stopper",
    "Trainable": "nbcluster.tune.trainable.trainable",
    "TuneConfig": "nbcluster.tune._config",
    "TuneContext": "nbcluster.tune._session",
    "TuneError": "nbcluster.tune.error",
    "Tuner": "nbcluster.tune.tuner",
    "attach": "nbcluster.tune.detached",
    "choice": "nbcluster.tune.search.sample",
    "get_checkpoint": "nbcluster.train",
    "get_context": "nbcluster.tune._session",
    "grid_search": "nbcluster.tune.search.sample",
    "lograndint": "nbcluster.tune.search.sample",
    "loguniform": "nbcluster.tune.search.sample",
    "qlograndint": "nbcluster.tune.search.sample",
    "qloguniform": "nbcluster.tune.search.sample",
    "qrandint": "nbcluster.tune.search.sample",
    "qrandn": "nbcluster.tune.search.sample",
    "quniform": "nbcluster.tune.search.sample",
    "randint": "nbcluster.tune.search.sample",
    "randn": "nbcluster.tune.search.sample",
    "report": "nbcluster.train",
    "sample_from": "nbcluster.tune.search.sample",
    "schedulers": "nbcluster.tune.schedulers",
    "search": "nbcluster.tune.search",
    "stopper": "nbcluster.tune.stopper",
    "uniform": "nbcluster.tune.search.sample",
    "with_parameters": "nbcluster.tune.trainable.util",
    "with_resources": "nbcluster.tune.trainable.util",
}

__all__ = [
    "Callback",
    "Checkpoint",
    "CheckpointConfig",
    "DetachedRun",
    "FailureConfig",
    "Result",
    "ResultGrid",
    "RunConfig",
    "Stopper",
    "Trainable",
    "TuneConfig",
    "TuneContext",
    "TuneError",
    "Tuner",
    "attach",
    "choice",
    "get_checkpoint",
    "get_context",
    "grid_search",
    "lograndint",
    "loguniform",
    "qlograndint",
    "qloguniform",
    "qrandint",
    "qrandn",
    "quniform",
    "randint",
    "randn",
    "report",
    "sample_from",
    "schedulers",
    "search",
    "stopper",
    "uniform",
    "with_parameters",
    "with_resources",
]


def __getattr__(name: str) -> Any:
    """Import a public name on first use (see ``_EXPORTS``)."""
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'nbcluster.tune' has no attribute {name!r}")
    if name in ("schedulers", "search", "stopper"):
        value = importlib.import_module(module)
    else:
        value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


if TYPE_CHECKING:  # what static tools see: the same names, imported eagerly
    from nbcluster.train import (
        Checkpoint,
        CheckpointConfig,
        FailureConfig,
        RunConfig,
        get_checkpoint,
        report,
    )
    from nbcluster.tune import schedulers, search, stopper
    from nbcluster.tune._config import TuneConfig
    from nbcluster.tune._session import TuneContext, get_context
    from nbcluster.tune.callback import Callback
    from nbcluster.tune.detached import DetachedRun, attach
    from nbcluster.tune.error import TuneError
    from nbcluster.tune.result_grid import Result, ResultGrid
    from nbcluster.tune.search.sample import (
        choice,
        grid_search,
        lograndint,
        loguniform,
        qlograndint,
        qloguniform,
        qrandint,
        qrandn,
        quniform,
        randint,
        randn,
        sample_from,
        uniform,
    )
    from nbcluster.tune.stopper import Stopper
    from nbcluster.tune.trainable.trainable import Trainable
    from nbcluster.tune.trainable.util import with_parameters, with_resources
    from nbcluster.tune.tuner import Tuner
