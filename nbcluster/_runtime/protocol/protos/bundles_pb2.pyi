from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class BundleSpec(_message.Message):
    __slots__ = ("index", "resources")
    class ResourcesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    INDEX_FIELD_NUMBER: _ClassVar[int]
    RESOURCES_FIELD_NUMBER: _ClassVar[int]
    index: int
    resources: _containers.ScalarMap[str, float]
    def __init__(self, index: _Optional[int] = ..., resources: _Optional[_Mapping[str, float]] = ...) -> None: ...

class BundlesRequest(_message.Message):
    __slots__ = ("pg_id", "bundles", "commit", "release")
    PG_ID_FIELD_NUMBER: _ClassVar[int]
    BUNDLES_FIELD_NUMBER: _ClassVar[int]
    COMMIT_FIELD_NUMBER: _ClassVar[int]
    RELEASE_FIELD_NUMBER: _ClassVar[int]
    pg_id: bytes
    bundles: _containers.RepeatedCompositeFieldContainer[BundleSpec]
    commit: bool
    release: _containers.RepeatedCompositeFieldContainer[BundlesRequest]
    def __init__(self, pg_id: _Optional[bytes] = ..., bundles: _Optional[_Iterable[_Union[BundleSpec, _Mapping]]] = ..., commit: _Optional[bool] = ..., release: _Optional[_Iterable[_Union[BundlesRequest, _Mapping]]] = ...) -> None: ...

class BundlesReply(_message.Message):
    __slots__ = ("ok", "message")
    OK_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    ok: bool
    message: str
    def __init__(self, ok: _Optional[bool] = ..., message: _Optional[str] = ...) -> None: ...
