"""Trials: the records the controller, schedulers and searchers share."""

from nbcluster.tune.experiment.trial import CheckpointRecord, Trial, trial_dirname

__all__ = ["CheckpointRecord", "Trial", "trial_dirname"]
