"""One table of task and actor options (public face of :mod:`nbcluster._runtime.options`).

The option records are what the API hands the runtime's driver with every submission, so
they are defined under the runtime; ``@remote(...)`` and ``.options(...)`` build them here.
"""

from nbcluster._runtime.options import (
    ACTOR_OPTION_NAMES,
    TASK_OPTION_NAMES,
    ActorOptions,
    FrozenResources,
    TaskOptions,
    Where,
    actor_options,
    check_backpressure,
    check_num_returns,
    task_options,
)

__all__ = [
    "ACTOR_OPTION_NAMES",
    "TASK_OPTION_NAMES",
    "ActorOptions",
    "FrozenResources",
    "TaskOptions",
    "Where",
    "actor_options",
    "check_backpressure",
    "check_num_returns",
    "task_options",
]
