from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Optional as _Optional

DESCRIPTOR: _descriptor.FileDescriptor

class GeneratorItem(_message.Message):
    __slots__ = ("task_id", "attempt", "index", "object_id", "data", "in_store", "size", "node_id", "node_address")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    OBJECT_ID_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    IN_STORE_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    NODE_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    task_id: bytes
    attempt: int
    index: int
    object_id: bytes
    data: bytes
    in_store: bool
    size: int
    node_id: bytes
    node_address: str
    def __init__(self, task_id: _Optional[bytes] = ..., attempt: _Optional[int] = ..., index: _Optional[int] = ..., object_id: _Optional[bytes] = ..., data: _Optional[bytes] = ..., in_store: _Optional[bool] = ..., size: _Optional[int] = ..., node_id: _Optional[bytes] = ..., node_address: _Optional[str] = ...) -> None: ...

class GeneratorItemAck(_message.Message):
    __slots__ = ("backpressure",)
    BACKPRESSURE_FIELD_NUMBER: _ClassVar[int]
    backpressure: int
    def __init__(self, backpressure: _Optional[int] = ...) -> None: ...
