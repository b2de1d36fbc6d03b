"""nbcluster's error tree, split by area; the public face is :mod:`nbcluster.exceptions`.

Every public class here says it lives in :mod:`nbcluster.exceptions` (``__module__``), the
module users import it from, so tracebacks, reprs and pickles name it there, as Ray names
``ray.exceptions``.
"""

from __future__ import annotations

from nbcluster._runtime.exceptions.actor import (
    ActorDiedError,
    ActorError,
    ActorUnavailableError,
    AsyncioActorExit,
    PendingCallsLimitExceeded,
    PendingTasksLimitExceeded,
)
from nbcluster._runtime.exceptions.base import (
    MAX_TRACEBACK_BYTES,
    PUBLIC_MODULE,
    NbclusterError,
)
from nbcluster._runtime.exceptions.objects import (
    ObjectFetchTimedOutError,
    ObjectFreedError,
    ObjectLostError,
    ObjectReconstructionFailedError,
    ObjectReconstructionFailedLineageEvictedError,
    ObjectReconstructionFailedMaxAttemptsExceededError,
    ObjectStoreFullError,
    OutOfDiskError,
    OutOfMemoryError,
    OwnerDiedError,
    ReferenceCountingAssertionError,
)
from nbcluster._runtime.exceptions.system import (
    ActorUnschedulableError,
    AuthenticationError,
    GetTimeoutError,
    HeadUnavailableError,
    InfeasibleResourceWarning,
    LocalNodeDiedError,
    NbclusterSystemError,
    NodeDiedError,
    RuntimeEnvSetupError,
    SerializationError,
    TaskUnschedulableError,
)
from nbcluster._runtime.exceptions.task import (
    TaskCancelledError,
    TaskError,
    UnserializableException,
    WorkerCrashedError,
)

__all__ = [
    "ActorDiedError",
    "ActorError",
    "ActorUnavailableError",
    "ActorUnschedulableError",
    "AsyncioActorExit",
    "AuthenticationError",
    "GetTimeoutError",
    "HeadUnavailableError",
    "InfeasibleResourceWarning",
    "LocalNodeDiedError",
    "MAX_TRACEBACK_BYTES",
    "NbclusterError",
    "NbclusterSystemError",
    "NodeDiedError",
    "ObjectFetchTimedOutError",
    "ObjectFreedError",
    "ObjectLostError",
    "ObjectReconstructionFailedError",
    "ObjectReconstructionFailedLineageEvictedError",
    "ObjectReconstructionFailedMaxAttemptsExceededError",
    "ObjectStoreFullError",
    "OutOfDiskError",
    "OutOfMemoryError",
    "OwnerDiedError",
    "PendingCallsLimitExceeded",
    "PendingTasksLimitExceeded",
    "ReferenceCountingAssertionError",
    "RuntimeEnvSetupError",
    "SerializationError",
    "TaskCancelledError",
    "TaskError",
    "TaskUnschedulableError",
    "UnserializableException",
    "WorkerCrashedError",
]


for _name in __all__:
    _obj = globals()[_name]
    if isinstance(_obj, type):
        _obj.__module__ = PUBLIC_MODULE
del _name, _obj
