from nbcluster._runtime.protocol.protos import nbcluster_pb2 as _nbcluster_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class PendingTasks(_message.Message):
    __slots__ = ("owner_address", "tasks", "not_listed")
    OWNER_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    TASKS_FIELD_NUMBER: _ClassVar[int]
    NOT_LISTED_FIELD_NUMBER: _ClassVar[int]
    owner_address: str
    tasks: _containers.RepeatedCompositeFieldContainer[_nbcluster_pb2.TaskEvent]
    not_listed: int
    def __init__(self, owner_address: _Optional[str] = ..., tasks: _Optional[_Iterable[_Union[_nbcluster_pb2.TaskEvent, _Mapping]]] = ..., not_listed: _Optional[int] = ...) -> None: ...

class LiveTasksRequest(_message.Message):
    __slots__ = ("job_id",)
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: bytes
    def __init__(self, job_id: _Optional[bytes] = ...) -> None: ...

class LiveTasksReply(_message.Message):
    __slots__ = ("tasks", "not_listed")
    TASKS_FIELD_NUMBER: _ClassVar[int]
    NOT_LISTED_FIELD_NUMBER: _ClassVar[int]
    tasks: _containers.RepeatedCompositeFieldContainer[_nbcluster_pb2.TaskEvent]
    not_listed: int
    def __init__(self, tasks: _Optional[_Iterable[_Union[_nbcluster_pb2.TaskEvent, _Mapping]]] = ..., not_listed: _Optional[int] = ...) -> None: ...
