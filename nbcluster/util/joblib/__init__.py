"""A joblib backend that runs ``Parallel`` work (and scikit-learn's ``n_jobs``) on the
cluster (Ray's ``ray.util.joblib``)::

    import joblib
    from nbcluster.util.joblib import register_nbcluster

    register_nbcluster()
    with joblib.parallel_backend("nbcluster"):
        search = GridSearchCV(SVC(), params, n_jobs=-1).fit(X, y)  # each fit is a task

:func:`register_nbcluster` registers the backend under both ``"nbcluster"`` and
``"ray"``, and :func:`register_ray` is the same function, so Ray code runs unchanged.
Each batch of calls is one task; ``n_jobs=-1`` means every CPU of the cluster (a local
cluster is started if this process is not connected yet).
"""

from __future__ import annotations

from joblib import register_parallel_backend

from nbcluster.util.joblib._backend import NbclusterBackend

__all__ = ["NbclusterBackend", "register_nbcluster", "register_ray"]


def register_nbcluster() -> None:
    """Register the backend with joblib as ``"nbcluster"`` and ``"ray"``."""
    register_parallel_backend("nbcluster", NbclusterBackend)
    register_parallel_backend("ray", NbclusterBackend)


register_ray = register_nbcluster
"""Ray's name for :func:`register_nbcluster`."""
