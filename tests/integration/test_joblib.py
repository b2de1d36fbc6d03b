"""The joblib backend (issue 20 item 5): ``parallel_backend("nbcluster")`` (and ``"ray"``)
runs joblib's work, and scikit-learn's ``n_jobs``, as cluster tasks.

Ray's ``ray.util.joblib`` (2.60) is the reference: ``register_ray()`` then
``with joblib.parallel_backend("ray"): GridSearchCV(..., n_jobs=-1).fit(X, y)`` fits on
the cluster and gives the same result as a local run; ``n_jobs=-1`` means the cluster's
CPUs; a call's exception reaches the caller.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import cloudpickle
import joblib
import numpy as np
import pytest
from sklearn.datasets import make_classification
from sklearn.model_selection import GridSearchCV
from sklearn.svm import SVC

import nbcluster
from nbcluster.testing import worker_pids
from nbcluster.util.joblib import NbclusterBackend, register_nbcluster, register_ray

pytestmark = pytest.mark.integration

cloudpickle.register_pickle_by_value(sys.modules[__name__])


def pid_score(estimator: object, X: object, y: object) -> float:
    """A scorer that reports the process the fit and score ran in."""
    return float(os.getpid())


def where(i: int) -> tuple[int, int]:
    return i, os.getpid()


def total(i: int, big: np.ndarray) -> float:
    return float(big.sum()) + i


def fail_on_two(i: int) -> int:
    if i == 2:
        raise ValueError("two is not allowed")
    return i


def test_register_names_and_alias() -> None:
    assert register_ray is register_nbcluster
    register_ray()
    with joblib.parallel_backend("ray") as (backend, _):
        assert isinstance(backend, NbclusterBackend)
    with joblib.parallel_backend("nbcluster") as (backend, _):
        assert isinstance(backend, NbclusterBackend)


def test_grid_search_fits_run_as_cluster_tasks(shared_cluster: Any) -> None:
    register_nbcluster()
    X, y = make_classification(n_samples=60, n_features=5, random_state=0)
    grid = {"C": [0.1, 1.0, 10.0], "kernel": ["linear", "rbf"]}
    scoring = {"accuracy": "accuracy", "pid": pid_score}
    with joblib.parallel_backend("nbcluster"):
        remote = GridSearchCV(SVC(), grid, cv=3, n_jobs=-1, scoring=scoring, refit="accuracy")
        remote.fit(X, y)
    local = GridSearchCV(SVC(), grid, cv=3, n_jobs=1, scoring=scoring, refit="accuracy").fit(X, y)
    assert remote.best_params_ == local.best_params_
    np.testing.assert_allclose(
        remote.cv_results_["mean_test_accuracy"], local.cv_results_["mean_test_accuracy"]
    )
    seen = {
        int(p)
        for k, v in remote.cv_results_.items()
        if k.endswith("_test_pid") and k.startswith("split")
        for p in v
    }
    # every fit and score ran in a worker process of this cluster
    assert seen and seen <= set(worker_pids(shared_cluster.session_dir))


def test_parallel_calls_and_n_jobs(shared_cluster: Any) -> None:
    register_nbcluster()
    cpus = int(nbcluster.cluster_resources()["CPU"])
    with joblib.parallel_backend("nbcluster"):
        assert joblib.effective_n_jobs(-1) == cpus
        assert joblib.effective_n_jobs() == cpus  # -1 is the default while it is active
        out = joblib.Parallel(n_jobs=-1)(joblib.delayed(where)(i) for i in range(20))
    assert [i for i, _ in out] == list(range(20))
    assert {p for _, p in out} <= set(worker_pids(shared_cluster.session_dir))
    with joblib.parallel_backend("nbcluster", n_jobs=1):  # one job: runs here
        out = joblib.Parallel()(joblib.delayed(where)(i) for i in range(3))
    assert {p for _, p in out} == {os.getpid()}


def test_large_arguments_travel_through_the_store(
    shared_cluster: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    register_nbcluster()
    puts: list[object] = []
    real_put = nbcluster.put
    monkeypatch.setattr(nbcluster, "put", lambda v: puts.append(v) or real_put(v))
    big = np.ones(200_000)  # 1.6 MB: stored once, read by every task
    with joblib.parallel_backend("nbcluster"):
        out = joblib.Parallel(n_jobs=2, batch_size=1)(
            joblib.delayed(total)(i, big) for i in range(6)
        )
    assert out == [200_000.0 + i for i in range(6)]
    assert len(puts) == 1 and puts[0] is big


def test_errors_reach_the_caller(shared_cluster: object) -> None:
    register_nbcluster()
    with (
        joblib.parallel_backend("nbcluster"),
        pytest.raises(ValueError, match="two is not allowed"),
    ):
        joblib.Parallel(n_jobs=2)(joblib.delayed(fail_on_two)(i) for i in range(5))
    with (
        joblib.parallel_backend("nbcluster", ray_remote_args={"bogus": 1}),
        pytest.raises(ValueError, match="bogus"),
    ):
        joblib.Parallel(n_jobs=2)(joblib.delayed(where)(i) for i in range(2))
