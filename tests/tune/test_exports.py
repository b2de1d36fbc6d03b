"""The public surface of nbcluster.tune: declared once, documented, and light to import."""

from __future__ import annotations

import inspect
import subprocess
import sys

import nbcluster
from nbcluster import tune
from nbcluster.tune import schedulers, search, stopper


def test_every_public_name_resolves_and_is_documented() -> None:
    assert tune.__all__ == sorted(tune._EXPORTS)
    for module in (tune, schedulers, search, stopper):
        for name in module.__all__:
            obj = getattr(module, name)
            assert inspect.getdoc(obj), f"{module.__name__}.{name} has no docstring"
    assert nbcluster.tune is tune and "tune" in nbcluster.__all__


def test_ray_names_are_the_same_objects_as_trains() -> None:
    from nbcluster import train

    assert tune.report is train.report and tune.get_checkpoint is train.get_checkpoint
    for name in ("Checkpoint", "RunConfig", "CheckpointConfig", "FailureConfig"):
        assert getattr(tune, name) is getattr(train, name)


def test_importing_tune_loads_no_heavy_or_optional_library() -> None:
    code = (
        "import sys, nbcluster.tune, nbcluster.tune.execution.runner\n"
        "heavy = ['optuna', 'pandas', 'ipywidgets', 'plotly', 'torch', 'nbcluster.tune.tuner']\n"
        "print(sorted(m for m in heavy if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr
