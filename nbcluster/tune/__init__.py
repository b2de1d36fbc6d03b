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
"""

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
from nbcluster.tune.trainable import Trainable, with_parameters, with_resources
from nbcluster.tune.tuner import Tuner

__all__ = [
    "Callback",
    "Checkpoint",
    "CheckpointConfig",
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
