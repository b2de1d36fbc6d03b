"""The state API: what the cluster runs and has run (Ray's ``ray.util.state``).

``list_actors``, ``list_tasks``, ``list_nodes``, ``list_jobs``, ``list_objects``,
``list_placement_groups``, ``list_workers`` take ``filters=[("state", "=", "FAILED")]``,
``limit=`` and ``detail=``; ``get_actor``/``get_task``/... fetch one record;
``summarize_tasks``/``summarize_actors``/``summarize_objects`` count them; ``list_logs``
and ``get_log`` read log files by node, actor, task or job. The same from a shell:
``nbcluster list tasks --filter "state=FAILED"``, ``nbcluster summary tasks``,
``nbcluster get actors ID``, ``nbcluster logs``.
"""

from nbcluster.util.state._api import (
    get_actor,
    get_job,
    get_node,
    get_placement_group,
    get_task,
    get_worker,
    list_actors,
    list_jobs,
    list_nodes,
    list_objects,
    list_placement_groups,
    list_tasks,
    list_workers,
    summarize_actors,
    summarize_objects,
    summarize_tasks,
)
from nbcluster.util.state._logs import get_log, list_logs
from nbcluster.util.state._models import (
    ActorState,
    JobState,
    NodeState,
    ObjectState,
    PlacementGroupState,
    TaskState,
    WorkerState,
)

__all__ = [
    "ActorState",
    "JobState",
    "NodeState",
    "ObjectState",
    "PlacementGroupState",
    "TaskState",
    "WorkerState",
    "get_actor",
    "get_job",
    "get_log",
    "get_node",
    "get_placement_group",
    "get_task",
    "get_worker",
    "list_actors",
    "list_jobs",
    "list_logs",
    "list_nodes",
    "list_objects",
    "list_placement_groups",
    "list_tasks",
    "list_workers",
    "summarize_actors",
    "summarize_objects",
    "summarize_tasks",
]
