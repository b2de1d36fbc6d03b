"""Search algorithms and search spaces.

The default :class:`BasicVariantGenerator` expands grids and samples the rest at random;
:class:`~nbcluster.tune.search.optuna.OptunaSearch` (``optuna`` needed) suggests configs
from the results so far; :class:`ConcurrencyLimiter` caps how many run at once.
"""

from nbcluster.tune.search.basic_variant import BasicVariantGenerator
from nbcluster.tune.search.sample import grid_search
from nbcluster.tune.search.searcher import (
    ConcurrencyLimiter,
    SearchAlgorithm,
    Searcher,
    SearchGenerator,
)

__all__ = [
    "BasicVariantGenerator",
    "ConcurrencyLimiter",
    "SearchAlgorithm",
    "SearchGenerator",
    "Searcher",
    "grid_search",
]
