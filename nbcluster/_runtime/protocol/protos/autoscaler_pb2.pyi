from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Ack(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class Shape(_message.Message):
    __slots__ = ("resources", "count")
    class ResourcesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    RESOURCES_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    resources: _containers.ScalarMap[str, float]
    count: int
    def __init__(self, resources: _Optional[_Mapping[str, float]] = ..., count: _Optional[int] = ...) -> None: ...

class NodeLoadReport(_message.Message):
    __slots__ = ("node_id", "total", "available", "pending", "infeasible", "leased_workers", "bundles", "primary_objects", "primary_bytes", "idle_s", "draining")
    class TotalEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    class AvailableEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    TOTAL_FIELD_NUMBER: _ClassVar[int]
    AVAILABLE_FIELD_NUMBER: _ClassVar[int]
    PENDING_FIELD_NUMBER: _ClassVar[int]
    INFEASIBLE_FIELD_NUMBER: _ClassVar[int]
    LEASED_WORKERS_FIELD_NUMBER: _ClassVar[int]
    BUNDLES_FIELD_NUMBER: _ClassVar[int]
    PRIMARY_OBJECTS_FIELD_NUMBER: _ClassVar[int]
    PRIMARY_BYTES_FIELD_NUMBER: _ClassVar[int]
    IDLE_S_FIELD_NUMBER: _ClassVar[int]
    DRAINING_FIELD_NUMBER: _ClassVar[int]
    node_id: bytes
    total: _containers.ScalarMap[str, float]
    available: _containers.ScalarMap[str, float]
    pending: _containers.RepeatedCompositeFieldContainer[Shape]
    infeasible: _containers.RepeatedCompositeFieldContainer[Shape]
    leased_workers: int
    bundles: int
    primary_objects: int
    primary_bytes: int
    idle_s: float
    draining: bool
    def __init__(self, node_id: _Optional[bytes] = ..., total: _Optional[_Mapping[str, float]] = ..., available: _Optional[_Mapping[str, float]] = ..., pending: _Optional[_Iterable[_Union[Shape, _Mapping]]] = ..., infeasible: _Optional[_Iterable[_Union[Shape, _Mapping]]] = ..., leased_workers: _Optional[int] = ..., bundles: _Optional[int] = ..., primary_objects: _Optional[int] = ..., primary_bytes: _Optional[int] = ..., idle_s: _Optional[float] = ..., draining: _Optional[bool] = ...) -> None: ...

class LoadReply(_message.Message):
    __slots__ = ("unknown_node", "interval_s")
    UNKNOWN_NODE_FIELD_NUMBER: _ClassVar[int]
    INTERVAL_S_FIELD_NUMBER: _ClassVar[int]
    unknown_node: bool
    interval_s: float
    def __init__(self, unknown_node: _Optional[bool] = ..., interval_s: _Optional[float] = ...) -> None: ...

class DemandRequest(_message.Message):
    __slots__ = ("after_version", "timeout")
    AFTER_VERSION_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_FIELD_NUMBER: _ClassVar[int]
    after_version: int
    timeout: float
    def __init__(self, after_version: _Optional[int] = ..., timeout: _Optional[float] = ...) -> None: ...

class NodeDemand(_message.Message):
    __slots__ = ("node_id", "node_name", "address", "load", "has_load")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    NODE_NAME_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    LOAD_FIELD_NUMBER: _ClassVar[int]
    HAS_LOAD_FIELD_NUMBER: _ClassVar[int]
    node_id: bytes
    node_name: str
    address: str
    load: NodeLoadReport
    has_load: bool
    def __init__(self, node_id: _Optional[bytes] = ..., node_name: _Optional[str] = ..., address: _Optional[str] = ..., load: _Optional[_Union[NodeLoadReport, _Mapping]] = ..., has_load: _Optional[bool] = ...) -> None: ...

class PendingPlacementGroup(_message.Message):
    __slots__ = ("pg_id", "name", "strategy", "bundles")
    PG_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    STRATEGY_FIELD_NUMBER: _ClassVar[int]
    BUNDLES_FIELD_NUMBER: _ClassVar[int]
    pg_id: bytes
    name: str
    strategy: str
    bundles: _containers.RepeatedCompositeFieldContainer[Shape]
    def __init__(self, pg_id: _Optional[bytes] = ..., name: _Optional[str] = ..., strategy: _Optional[str] = ..., bundles: _Optional[_Iterable[_Union[Shape, _Mapping]]] = ...) -> None: ...

class DemandReply(_message.Message):
    __slots__ = ("version", "nodes", "placement_groups", "requested", "head_time")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    PLACEMENT_GROUPS_FIELD_NUMBER: _ClassVar[int]
    REQUESTED_FIELD_NUMBER: _ClassVar[int]
    HEAD_TIME_FIELD_NUMBER: _ClassVar[int]
    version: int
    nodes: _containers.RepeatedCompositeFieldContainer[NodeDemand]
    placement_groups: _containers.RepeatedCompositeFieldContainer[PendingPlacementGroup]
    requested: _containers.RepeatedCompositeFieldContainer[Shape]
    head_time: float
    def __init__(self, version: _Optional[int] = ..., nodes: _Optional[_Iterable[_Union[NodeDemand, _Mapping]]] = ..., placement_groups: _Optional[_Iterable[_Union[PendingPlacementGroup, _Mapping]]] = ..., requested: _Optional[_Iterable[_Union[Shape, _Mapping]]] = ..., head_time: _Optional[float] = ...) -> None: ...

class ScalingEvent(_message.Message):
    __slots__ = ("seq", "time", "kind", "message", "node_type", "instance_id", "count", "shape")
    class ShapeEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    SEQ_FIELD_NUMBER: _ClassVar[int]
    TIME_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    NODE_TYPE_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    seq: int
    time: float
    kind: str
    message: str
    node_type: str
    instance_id: str
    count: int
    shape: _containers.ScalarMap[str, float]
    def __init__(self, seq: _Optional[int] = ..., time: _Optional[float] = ..., kind: _Optional[str] = ..., message: _Optional[str] = ..., node_type: _Optional[str] = ..., instance_id: _Optional[str] = ..., count: _Optional[int] = ..., shape: _Optional[_Mapping[str, float]] = ...) -> None: ...

class NodeTypeStatus(_message.Message):
    __slots__ = ("name", "resources", "min_workers", "max_workers", "running", "launching", "failures", "retry_in_s")
    class ResourcesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    RESOURCES_FIELD_NUMBER: _ClassVar[int]
    MIN_WORKERS_FIELD_NUMBER: _ClassVar[int]
    MAX_WORKERS_FIELD_NUMBER: _ClassVar[int]
    RUNNING_FIELD_NUMBER: _ClassVar[int]
    LAUNCHING_FIELD_NUMBER: _ClassVar[int]
    FAILURES_FIELD_NUMBER: _ClassVar[int]
    RETRY_IN_S_FIELD_NUMBER: _ClassVar[int]
    name: str
    resources: _containers.ScalarMap[str, float]
    min_workers: int
    max_workers: int
    running: int
    launching: int
    failures: int
    retry_in_s: float
    def __init__(self, name: _Optional[str] = ..., resources: _Optional[_Mapping[str, float]] = ..., min_workers: _Optional[int] = ..., max_workers: _Optional[int] = ..., running: _Optional[int] = ..., launching: _Optional[int] = ..., failures: _Optional[int] = ..., retry_in_s: _Optional[float] = ...) -> None: ...

class WaitingDemand(_message.Message):
    __slots__ = ("shape", "reason")
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    shape: Shape
    reason: str
    def __init__(self, shape: _Optional[_Union[Shape, _Mapping]] = ..., reason: _Optional[str] = ...) -> None: ...

class AutoscalerReport(_message.Message):
    __slots__ = ("cluster_name", "provider", "node_types", "events", "pending", "infeasible", "waiting", "time", "idle_timeout_s", "max_workers", "monitor_pid", "update_interval_s")
    CLUSTER_NAME_FIELD_NUMBER: _ClassVar[int]
    PROVIDER_FIELD_NUMBER: _ClassVar[int]
    NODE_TYPES_FIELD_NUMBER: _ClassVar[int]
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    PENDING_FIELD_NUMBER: _ClassVar[int]
    INFEASIBLE_FIELD_NUMBER: _ClassVar[int]
    WAITING_FIELD_NUMBER: _ClassVar[int]
    TIME_FIELD_NUMBER: _ClassVar[int]
    IDLE_TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    MAX_WORKERS_FIELD_NUMBER: _ClassVar[int]
    MONITOR_PID_FIELD_NUMBER: _ClassVar[int]
    UPDATE_INTERVAL_S_FIELD_NUMBER: _ClassVar[int]
    cluster_name: str
    provider: str
    node_types: _containers.RepeatedCompositeFieldContainer[NodeTypeStatus]
    events: _containers.RepeatedCompositeFieldContainer[ScalingEvent]
    pending: _containers.RepeatedCompositeFieldContainer[Shape]
    infeasible: _containers.RepeatedCompositeFieldContainer[Shape]
    waiting: _containers.RepeatedCompositeFieldContainer[WaitingDemand]
    time: float
    idle_timeout_s: float
    max_workers: int
    monitor_pid: int
    update_interval_s: float
    def __init__(self, cluster_name: _Optional[str] = ..., provider: _Optional[str] = ..., node_types: _Optional[_Iterable[_Union[NodeTypeStatus, _Mapping]]] = ..., events: _Optional[_Iterable[_Union[ScalingEvent, _Mapping]]] = ..., pending: _Optional[_Iterable[_Union[Shape, _Mapping]]] = ..., infeasible: _Optional[_Iterable[_Union[Shape, _Mapping]]] = ..., waiting: _Optional[_Iterable[_Union[WaitingDemand, _Mapping]]] = ..., time: _Optional[float] = ..., idle_timeout_s: _Optional[float] = ..., max_workers: _Optional[int] = ..., monitor_pid: _Optional[int] = ..., update_interval_s: _Optional[float] = ...) -> None: ...

class RequestResourcesRequest(_message.Message):
    __slots__ = ("bundles",)
    BUNDLES_FIELD_NUMBER: _ClassVar[int]
    bundles: _containers.RepeatedCompositeFieldContainer[Shape]
    def __init__(self, bundles: _Optional[_Iterable[_Union[Shape, _Mapping]]] = ...) -> None: ...

class StatusRequest(_message.Message):
    __slots__ = ("after_seq",)
    AFTER_SEQ_FIELD_NUMBER: _ClassVar[int]
    after_seq: int
    def __init__(self, after_seq: _Optional[int] = ...) -> None: ...

class AutoscalerStatus(_message.Message):
    __slots__ = ("enabled", "report", "events", "report_age_s", "last_seq", "requested")
    ENABLED_FIELD_NUMBER: _ClassVar[int]
    REPORT_FIELD_NUMBER: _ClassVar[int]
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    REPORT_AGE_S_FIELD_NUMBER: _ClassVar[int]
    LAST_SEQ_FIELD_NUMBER: _ClassVar[int]
    REQUESTED_FIELD_NUMBER: _ClassVar[int]
    enabled: bool
    report: AutoscalerReport
    events: _containers.RepeatedCompositeFieldContainer[ScalingEvent]
    report_age_s: float
    last_seq: int
    requested: _containers.RepeatedCompositeFieldContainer[Shape]
    def __init__(self, enabled: _Optional[bool] = ..., report: _Optional[_Union[AutoscalerReport, _Mapping]] = ..., events: _Optional[_Iterable[_Union[ScalingEvent, _Mapping]]] = ..., report_age_s: _Optional[float] = ..., last_seq: _Optional[int] = ..., requested: _Optional[_Iterable[_Union[Shape, _Mapping]]] = ...) -> None: ...

class DrainRequest(_message.Message):
    __slots__ = ("node_id", "node_name", "reason", "undo")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    NODE_NAME_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    UNDO_FIELD_NUMBER: _ClassVar[int]
    node_id: bytes
    node_name: str
    reason: str
    undo: bool
    def __init__(self, node_id: _Optional[bytes] = ..., node_name: _Optional[str] = ..., reason: _Optional[str] = ..., undo: _Optional[bool] = ...) -> None: ...

class DrainReply(_message.Message):
    __slots__ = ("accepted", "message")
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    accepted: bool
    message: str
    def __init__(self, accepted: _Optional[bool] = ..., message: _Optional[str] = ...) -> None: ...
