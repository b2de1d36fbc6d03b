"""The public error tree.

The names mirror Ray's ``ray.exceptions`` (2.60) one for one, so that code which catches
Ray's errors reads the same here: ``RayTaskError`` is :class:`TaskError`, ``RayActorError``
is :class:`ActorError`, ``RaySystemError`` is :class:`NbclusterSystemError`, and
``LocalRayletDiedError`` is :class:`LocalNodeDiedError`. Two types are new:
:class:`HeadUnavailableError` (Ray kills the process instead) and :class:`SerializationError`
(Ray raises a plain ``TypeError``).

Every message says what happened, where, and what to do next. Every exception survives a
(cloud)pickle round trip with its attributes: :meth:`NbclusterError.__reduce__` rebuilds the
object without calling ``__init__``, so constructor signatures are free to differ from
``args``.

The classes are defined by area under :mod:`nbcluster._runtime.exceptions` (the runtime
raises them and imports nothing above itself); this module is where users import them from,
and the name each class gives as its ``__module__``.
"""

from nbcluster._runtime.exceptions import (  # noqa: F401 - MAX_TRACEBACK_BYTES: the cut
    MAX_TRACEBACK_BYTES,
    ActorDiedError,
    ActorError,
    ActorUnavailableError,
    ActorUnschedulableError,
    AsyncioActorExit,
    AuthenticationError,
    GetTimeoutError,
    HeadUnavailableError,
    InfeasibleResourceWarning,
    LocalNodeDiedError,
    NbclusterError,
    NbclusterSystemError,
    NodeDiedError,
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
    PendingCallsLimitExceeded,
    PendingTasksLimitExceeded,
    ReferenceCountingAssertionError,
    RuntimeEnvSetupError,
    SerializationError,
    TaskCancelledError,
    TaskError,
    TaskUnschedulableError,
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
