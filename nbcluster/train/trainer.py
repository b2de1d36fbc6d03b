"""Entry points for libraries built on Train (``nbcluster.tune``), with a stable name.

These are not part of Ray Train's user API, but other nbcluster libraries may rely on them:

- :func:`run_trainer` runs a trainer (``TorchTrainer``...) once and returns its
  ``Result`` without raising for a failed run, calling ``on_report`` with each complete
  report (a :class:`TrainingReport`); Tune runs a trainer as a trial with it.
- :func:`trial_session` routes ``nbcluster.train.report`` / ``get_checkpoint`` made
  outside a Train worker to another library's session for the length of a ``with``
  block (Tune's runner sets it around each trial's function); :func:`current_trial_session`
  returns the one in force.

Importing this module is cheap: ``run_trainer`` and ``TrainingReport`` load the driver's
controller on first use, so a process that only sets trial sessions (a Tune runner)
does not.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from nbcluster.train._session import current_trial_session, trial_session

__all__ = ["TrainingReport", "current_trial_session", "run_trainer", "trial_session"]

_LAZY = {
    "TrainingReport": "nbcluster.train._controller",
    "run_trainer": "nbcluster.train._controller",
}


def __getattr__(name: str) -> Any:
    """Load ``run_trainer`` / ``TrainingReport`` on first use."""
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'nbcluster.train.trainer' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


if TYPE_CHECKING:
    from nbcluster.train._controller import TrainingReport, run_trainer
