from nbcluster._runtime.protocol.protos import nbcluster_pb2 as _nbcluster_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class SubscribeRequest(_message.Message):
    __slots__ = ("kinds", "snapshot", "buffer", "job_id")
    KINDS_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_FIELD_NUMBER: _ClassVar[int]
    BUFFER_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    kinds: _containers.RepeatedScalarFieldContainer[str]
    snapshot: bool
    buffer: int
    job_id: bytes
    def __init__(self, kinds: _Optional[_Iterable[str]] = ..., snapshot: _Optional[bool] = ..., buffer: _Optional[int] = ..., job_id: _Optional[bytes] = ...) -> None: ...

class NodeEvent(_message.Message):
    __slots__ = ("change", "node")
    class Change(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        UPDATED: _ClassVar[NodeEvent.Change]
        JOINED: _ClassVar[NodeEvent.Change]
        DIED: _ClassVar[NodeEvent.Change]
    UPDATED: NodeEvent.Change
    JOINED: NodeEvent.Change
    DIED: NodeEvent.Change
    CHANGE_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    change: NodeEvent.Change
    node: _nbcluster_pb2.NodeInfo
    def __init__(self, change: _Optional[_Union[NodeEvent.Change, str]] = ..., node: _Optional[_Union[_nbcluster_pb2.NodeInfo, _Mapping]] = ...) -> None: ...

class ActorEvent(_message.Message):
    __slots__ = ("actor",)
    ACTOR_FIELD_NUMBER: _ClassVar[int]
    actor: _nbcluster_pb2.ActorInfo
    def __init__(self, actor: _Optional[_Union[_nbcluster_pb2.ActorInfo, _Mapping]] = ...) -> None: ...

class JobEvent(_message.Message):
    __slots__ = ("job",)
    JOB_FIELD_NUMBER: _ClassVar[int]
    job: _nbcluster_pb2.JobInfo
    def __init__(self, job: _Optional[_Union[_nbcluster_pb2.JobInfo, _Mapping]] = ...) -> None: ...

class ObjectStoreEvent(_message.Message):
    __slots__ = ("node_id", "node_name", "used", "spilled", "capacity")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    NODE_NAME_FIELD_NUMBER: _ClassVar[int]
    USED_FIELD_NUMBER: _ClassVar[int]
    SPILLED_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_FIELD_NUMBER: _ClassVar[int]
    node_id: bytes
    node_name: str
    used: int
    spilled: int
    capacity: int
    def __init__(self, node_id: _Optional[bytes] = ..., node_name: _Optional[str] = ..., used: _Optional[int] = ..., spilled: _Optional[int] = ..., capacity: _Optional[int] = ...) -> None: ...

class AutoscalerEvent(_message.Message):
    __slots__ = ("last_seq",)
    LAST_SEQ_FIELD_NUMBER: _ClassVar[int]
    last_seq: int
    def __init__(self, last_seq: _Optional[int] = ...) -> None: ...

class Dropped(_message.Message):
    __slots__ = ("count",)
    COUNT_FIELD_NUMBER: _ClassVar[int]
    count: int
    def __init__(self, count: _Optional[int] = ...) -> None: ...

class Event(_message.Message):
    __slots__ = ("seq", "time", "task", "node", "actor", "job", "object", "dropped", "autoscaler")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    TIME_FIELD_NUMBER: _ClassVar[int]
    TASK_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    ACTOR_FIELD_NUMBER: _ClassVar[int]
    JOB_FIELD_NUMBER: _ClassVar[int]
    OBJECT_FIELD_NUMBER: _ClassVar[int]
    DROPPED_FIELD_NUMBER: _ClassVar[int]
    AUTOSCALER_FIELD_NUMBER: _ClassVar[int]
    seq: int
    time: float
    task: _nbcluster_pb2.TaskEvent
    node: NodeEvent
    actor: ActorEvent
    job: JobEvent
    object: ObjectStoreEvent
    dropped: Dropped
    autoscaler: AutoscalerEvent
    def __init__(self, seq: _Optional[int] = ..., time: _Optional[float] = ..., task: _Optional[_Union[_nbcluster_pb2.TaskEvent, _Mapping]] = ..., node: _Optional[_Union[NodeEvent, _Mapping]] = ..., actor: _Optional[_Union[ActorEvent, _Mapping]] = ..., job: _Optional[_Union[JobEvent, _Mapping]] = ..., object: _Optional[_Union[ObjectStoreEvent, _Mapping]] = ..., dropped: _Optional[_Union[Dropped, _Mapping]] = ..., autoscaler: _Optional[_Union[AutoscalerEvent, _Mapping]] = ...) -> None: ...

class EventBatch(_message.Message):
    __slots__ = ("events", "snapshot", "head_id")
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_FIELD_NUMBER: _ClassVar[int]
    HEAD_ID_FIELD_NUMBER: _ClassVar[int]
    events: _containers.RepeatedCompositeFieldContainer[Event]
    snapshot: bool
    head_id: str
    def __init__(self, events: _Optional[_Iterable[_Union[Event, _Mapping]]] = ..., snapshot: _Optional[bool] = ..., head_id: _Optional[str] = ...) -> None: ...
