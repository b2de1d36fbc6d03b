"""Names of the keys Tune adds to every reported result (Ray's ``ray.tune.result``)."""

from __future__ import annotations

__all__ = [
    "AUTO_RESULT_KEYS",
    "DONE",
    "TRAINING_ITERATION",
    "TIME_TOTAL_S",
    "TIME_THIS_ITER_S",
    "TIMESTAMP",
    "TRIAL_ID",
    "EXPERIMENT_TAG",
    "PID",
    "HOSTNAME",
    "NODE_IP",
]

DONE = "done"
TRAINING_ITERATION = "training_iteration"
TIME_TOTAL_S = "time_total_s"
TIME_THIS_ITER_S = "time_this_iter_s"
TIMESTAMP = "timestamp"
TRIAL_ID = "trial_id"
EXPERIMENT_TAG = "experiment_tag"
PID = "pid"
HOSTNAME = "hostname"
NODE_IP = "node_ip"

#: Keys every result gets whether or not the trainable reports them.
AUTO_RESULT_KEYS: frozenset[str] = frozenset(
    {
        DONE,
        TRAINING_ITERATION,
        TIME_TOTAL_S,
        TIME_THIS_ITER_S,
        TIMESTAMP,
        TRIAL_ID,
        EXPERIMENT_TAG,
        PID,
        HOSTNAME,
        NODE_IP,
        "date",
        "time_since_restore",
        "iterations_since_restore",
        "config",
        "checkpoint_dir_name",
        "should_checkpoint",
    }
)
