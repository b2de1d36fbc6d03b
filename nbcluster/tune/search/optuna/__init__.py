"""``OptunaSearch`` (needs ``optuna``, in the ``tune`` extra)."""

from nbcluster.tune.search.optuna.optuna_search import OptunaSearch

__all__ = ["OptunaSearch"]
