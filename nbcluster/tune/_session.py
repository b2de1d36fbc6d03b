"""The trial side of Tune: the session a trial reports to, and ``get_context``.

A trial runs in a thread of a runner actor, inside ``with use_session(session):``, which
sets its :class:`TrialSession` for that thread (and as the process's, so threads the
trial starts itself can report too; see ``nbcluster.train.trainer.trial_session``). The
session belongs to that one execution: a runner that ends one trial and starts the next
never clears or replaces the session under a trial that is still running.
``tune.report`` and ``tune.get_checkpoint`` are Train's functions
(``nbcluster.train.report``, as in Ray): outside a training function they go to the
trial's session, so training code written for Train reports to Tune when it runs inside
a trial.
"""

from __future__ import annotations

import contextlib
from typing import Any

from nbcluster.train import Checkpoint
from nbcluster.train.trainer import current_trial_session, trial_session

__all__ = [
    "TrialSession",
    "TrialStopped",
    "TuneContext",
    "current_session",
    "get_context",
    "use_session",
]


class TrialStopped(BaseException):
    """Raised inside a trial by ``report`` when the controller stopped or paused it.

    A ``BaseException``, so that ``except Exception`` in a training loop lets it through.
    """


class TrialSession:
    """What a running trial can reach: its identity, config, checkpoint, and ``report``.

    The runner subclasses it and implements :meth:`report`.
    """

    def __init__(
        self,
        *,
        trial_id: str,
        trial_name: str,
        trial_dir: str,
        experiment_name: str,
        config: dict[str, Any],
        resources: dict[str, float],
        checkpoint: Checkpoint | None,
    ) -> None:
        self.trial_id = trial_id
        self.trial_name = trial_name
        self.trial_dir = trial_dir
        self.experiment_name = experiment_name
        self.config = config
        self.resources = resources
        self.loaded_checkpoint = checkpoint

    def report(self, metrics: dict[str, Any], checkpoint: Checkpoint | None = None) -> None:
        """Queue a result (and persist a checkpoint) for the controller."""
        raise NotImplementedError


def use_session(session: TrialSession) -> contextlib.AbstractContextManager[TrialSession]:
    """``with use_session(s):`` runs one execution of a trial with ``s`` as its session."""
    return trial_session(session)  # type: ignore[no-any-return]


def current_session() -> TrialSession | None:
    """The trial session of this thread, else of this process, else None."""
    session = current_trial_session()
    return session if isinstance(session, TrialSession) else None


class TuneContext:
    """Information about the running trial (``tune.get_context()``)."""

    def __init__(self, session: TrialSession | None) -> None:
        self._session = session

    def get_trial_name(self) -> str | None:
        """The trial's name."""
        return self._session.trial_name if self._session else None

    def get_trial_id(self) -> str | None:
        """The trial's id."""
        return self._session.trial_id if self._session else None

    def get_trial_dir(self) -> str | None:
        """The trial's folder under ``storage_path/name``."""
        return self._session.trial_dir if self._session else None

    def get_experiment_name(self) -> str | None:
        """The experiment's name."""
        return self._session.experiment_name if self._session else None

    def get_trial_resources(self) -> dict[str, float] | None:
        """The resources reserved for the trial."""
        return dict(self._session.resources) if self._session else None

    def get_world_size(self) -> int:
        """1: a Tune trial is one process (Train's workers have their own context)."""
        return 1

    def get_world_rank(self) -> int:
        """0 (see :meth:`get_world_size`)."""
        return 0

    def get_local_rank(self) -> int:
        """0 (see :meth:`get_world_size`)."""
        return 0

    def __repr__(self) -> str:
        return f"TuneContext(trial={self.get_trial_name()!r})"


def get_context() -> TuneContext:
    """The context of the running trial (its name, id, folder, resources)."""
    return TuneContext(current_session())
