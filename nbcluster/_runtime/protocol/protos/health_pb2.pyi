from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Optional as _Optional

DESCRIPTOR: _descriptor.FileDescriptor

class ReachabilityRequest(_message.Message):
    __slots__ = ("node_id",)
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    node_id: bytes
    def __init__(self, node_id: _Optional[bytes] = ...) -> None: ...

class ReachabilityReply(_message.Message):
    __slots__ = ("known", "reachable", "address", "message")
    KNOWN_FIELD_NUMBER: _ClassVar[int]
    REACHABLE_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    known: bool
    reachable: bool
    address: str
    message: str
    def __init__(self, known: _Optional[bool] = ..., reachable: _Optional[bool] = ..., address: _Optional[str] = ..., message: _Optional[str] = ...) -> None: ...
