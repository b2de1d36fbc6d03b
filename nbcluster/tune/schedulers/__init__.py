"""Trial schedulers: decide at each result whether a trial goes on, pauses or stops.

``FIFOScheduler`` (the default) never intervenes; ``ASHAScheduler``
(``AsyncHyperBandScheduler``) and ``MedianStoppingRule`` stop weak trials early;
``HyperBandScheduler`` and ``PopulationBasedTraining`` also pause trials and resume them
from their checkpoints. Names, arguments and defaults are Ray's.
"""

from nbcluster.tune.schedulers.async_hyperband import ASHAScheduler, AsyncHyperBandScheduler
from nbcluster.tune.schedulers.hyperband import HyperBandScheduler
from nbcluster.tune.schedulers.median_stopping_rule import MedianStoppingRule
from nbcluster.tune.schedulers.pbt import PopulationBasedTraining
from nbcluster.tune.schedulers.trial_scheduler import FIFOScheduler, TrialScheduler

__all__ = [
    "ASHAScheduler",
    "AsyncHyperBandScheduler",
    "FIFOScheduler",
    "HyperBandScheduler",
    "MedianStoppingRule",
    "PopulationBasedTraining",
    "TrialScheduler",
]
