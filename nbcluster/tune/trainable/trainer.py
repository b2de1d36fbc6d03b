"""A Train trainer (``TorchTrainer``...) as a Tune trainable: ``Tuner(trainer, param_space=...)``.

Each trial runs the trainer once, in its runner, with ``param_space["train_loop_config"]``
merged over the trainer's own ``train_loop_config`` (and ``param_space["scaling_config"]``,
a ``ScalingConfig`` or a dict of its fields, replacing the trainer's). The trainer's run
writes into the trial's folder, so its checkpoints are the trial's; every complete report
of rank 0 becomes a trial result. A stop or pause from Tune asks the workers to stop at
their next report; a trial that resumes passes its checkpoint as
``resume_from_checkpoint``. The trial reserves the worker group's resources (the runner
itself holds none).
"""

from __future__ import annotations

import copy
import dataclasses
import os
from typing import Any

from nbcluster.train import DataParallelTrainer, ScalingConfig, release_warm_groups
from nbcluster.train.trainer import TrainingReport, run_trainer
from nbcluster.tune._session import TrialStopped, current_session

__all__ = ["TrainerTrainable", "as_trainable", "trainer_resources"]


def _scaling(value: Any) -> ScalingConfig:
    if isinstance(value, ScalingConfig):
        return value
    if isinstance(value, dict):
        return ScalingConfig(**value)
    raise TypeError(
        f"param_space['scaling_config'] must be a ScalingConfig or a dict of its fields, got {type(value).__name__}"
    )


def trainer_resources(trainer: DataParallelTrainer, config: dict[str, Any]) -> dict[str, float]:
    """What a trial of ``trainer`` with ``config`` reserves: its worker group, in all."""
    scaling = (
        _scaling(config["scaling_config"]) if "scaling_config" in config else trainer.scaling_config
    )
    total = dict(scaling.total_resources)
    total.setdefault("CPU", 0.0)
    return total


class TrainerTrainable:
    """The function a trial calls for a trainer (picklable; holds the trainer)."""

    def __init__(self, trainer: DataParallelTrainer) -> None:
        self.trainer = trainer
        self.__name__ = type(trainer).__name__

    def __call__(self, config: dict[str, Any]) -> None:
        session = current_session()
        if session is None:
            raise RuntimeError("a trainer trainable runs inside Tuner.fit()")
        base = self.trainer
        extra = config.get("train_loop_config") or {}
        if not isinstance(extra, dict):
            raise TypeError(
                f"param_space['train_loop_config'] must be a dict, got {type(extra).__name__}"
            )
        loop_config = {**(base.train_loop_config or {}), **extra}
        trainer = copy.copy(base)
        if "scaling_config" in config:
            trainer.scaling_config = _scaling(config["scaling_config"])
        if session.loaded_checkpoint is not None:
            trainer.resume_from_checkpoint = session.loaded_checkpoint
        trial_dir = os.path.abspath(session.trial_dir)
        run_config = dataclasses.replace(
            base.run_config,
            name=os.path.basename(trial_dir),
            storage_path=os.path.dirname(trial_dir),
            verbose=0,
            callbacks=list(base.run_config.callbacks or []),
        )
        stopped = False

        def on_report(report: TrainingReport) -> bool:
            nonlocal stopped
            try:
                session.report(dict(report.metrics), checkpoint=report.checkpoint)
            except TrialStopped:
                stopped = True
                return True  # the workers stop at their next report
            return False

        try:
            result = run_trainer(
                trainer,
                train_loop_config=loop_config,
                run_config=run_config,
                on_report=on_report,
                show=False,
            )
        finally:
            release_warm_groups()  # the trial's resources are free when it ends
        if stopped:
            raise TrialStopped("stop")
        if result.error is not None:
            raise result.error


def as_trainable(trainer: DataParallelTrainer) -> tuple[TrainerTrainable, Any]:
    """The trial function of ``trainer`` and its per-config resources."""
    fn = TrainerTrainable(trainer)

    def resources(config: dict[str, Any]) -> dict[str, float]:
        return trainer_resources(trainer, config)

    return fn, resources
