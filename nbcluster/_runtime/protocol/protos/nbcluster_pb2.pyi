from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Empty(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class NodeInfo(_message.Message):
    __slots__ = ("node_id", "node_name", "address", "hostname", "store_dir", "total", "available", "alive", "start_time", "store_capacity", "store_used", "num_workers", "pid", "death_reason", "last_heartbeat", "store_spilled", "pending_leases", "leased_workers")
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
    NODE_NAME_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    HOSTNAME_FIELD_NUMBER: _ClassVar[int]
    STORE_DIR_FIELD_NUMBER: _ClassVar[int]
    TOTAL_FIELD_NUMBER: _ClassVar[int]
    AVAILABLE_FIELD_NUMBER: _ClassVar[int]
    ALIVE_FIELD_NUMBER: _ClassVar[int]
    START_TIME_FIELD_NUMBER: _ClassVar[int]
    STORE_CAPACITY_FIELD_NUMBER: _ClassVar[int]
    STORE_USED_FIELD_NUMBER: _ClassVar[int]
    NUM_WORKERS_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    DEATH_REASON_FIELD_NUMBER: _ClassVar[int]
    LAST_HEARTBEAT_FIELD_NUMBER: _ClassVar[int]
    STORE_SPILLED_FIELD_NUMBER: _ClassVar[int]
    PENDING_LEASES_FIELD_NUMBER: _ClassVar[int]
    LEASED_WORKERS_FIELD_NUMBER: _ClassVar[int]
    node_id: bytes
    node_name: str
    address: str
    hostname: str
    store_dir: str
    total: _containers.ScalarMap[str, float]
    available: _containers.ScalarMap[str, float]
    alive: bool
    start_time: float
    store_capacity: int
    store_used: int
    num_workers: int
    pid: int
    death_reason: str
    last_heartbeat: float
    store_spilled: int
    pending_leases: int
    leased_workers: int
    def __init__(self, node_id: _Optional[bytes] = ..., node_name: _Optional[str] = ..., address: _Optional[str] = ..., hostname: _Optional[str] = ..., store_dir: _Optional[str] = ..., total: _Optional[_Mapping[str, float]] = ..., available: _Optional[_Mapping[str, float]] = ..., alive: _Optional[bool] = ..., start_time: _Optional[float] = ..., store_capacity: _Optional[int] = ..., store_used: _Optional[int] = ..., num_workers: _Optional[int] = ..., pid: _Optional[int] = ..., death_reason: _Optional[str] = ..., last_heartbeat: _Optional[float] = ..., store_spilled: _Optional[int] = ..., pending_leases: _Optional[int] = ..., leased_workers: _Optional[int] = ...) -> None: ...

class RegisterNodeRequest(_message.Message):
    __slots__ = ("node",)
    NODE_FIELD_NUMBER: _ClassVar[int]
    node: NodeInfo
    def __init__(self, node: _Optional[_Union[NodeInfo, _Mapping]] = ...) -> None: ...

class RegisterNodeReply(_message.Message):
    __slots__ = ("session_name",)
    SESSION_NAME_FIELD_NUMBER: _ClassVar[int]
    session_name: str
    def __init__(self, session_name: _Optional[str] = ...) -> None: ...

class HeartbeatRequest(_message.Message):
    __slots__ = ("node_id", "available", "store_used", "num_workers", "store_spilled", "pending_leases", "total", "leased_workers")
    class AvailableEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    class TotalEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    AVAILABLE_FIELD_NUMBER: _ClassVar[int]
    STORE_USED_FIELD_NUMBER: _ClassVar[int]
    NUM_WORKERS_FIELD_NUMBER: _ClassVar[int]
    STORE_SPILLED_FIELD_NUMBER: _ClassVar[int]
    PENDING_LEASES_FIELD_NUMBER: _ClassVar[int]
    TOTAL_FIELD_NUMBER: _ClassVar[int]
    LEASED_WORKERS_FIELD_NUMBER: _ClassVar[int]
    node_id: bytes
    available: _containers.ScalarMap[str, float]
    store_used: int
    num_workers: int
    store_spilled: int
    pending_leases: int
    total: _containers.ScalarMap[str, float]
    leased_workers: int
    def __init__(self, node_id: _Optional[bytes] = ..., available: _Optional[_Mapping[str, float]] = ..., store_used: _Optional[int] = ..., num_workers: _Optional[int] = ..., store_spilled: _Optional[int] = ..., pending_leases: _Optional[int] = ..., total: _Optional[_Mapping[str, float]] = ..., leased_workers: _Optional[int] = ...) -> None: ...

class HeartbeatReply(_message.Message):
    __slots__ = ("reregister", "nodes", "fenced")
    REREGISTER_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    FENCED_FIELD_NUMBER: _ClassVar[int]
    reregister: bool
    nodes: _containers.RepeatedCompositeFieldContainer[NodeInfo]
    fenced: bool
    def __init__(self, reregister: _Optional[bool] = ..., nodes: _Optional[_Iterable[_Union[NodeInfo, _Mapping]]] = ..., fenced: _Optional[bool] = ...) -> None: ...

class NodeRef(_message.Message):
    __slots__ = ("node_id", "reason")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    node_id: bytes
    reason: str
    def __init__(self, node_id: _Optional[bytes] = ..., reason: _Optional[str] = ...) -> None: ...

class GetNodesRequest(_message.Message):
    __slots__ = ("include_dead",)
    INCLUDE_DEAD_FIELD_NUMBER: _ClassVar[int]
    include_dead: bool
    def __init__(self, include_dead: _Optional[bool] = ...) -> None: ...

class GetNodesReply(_message.Message):
    __slots__ = ("nodes",)
    NODES_FIELD_NUMBER: _ClassVar[int]
    nodes: _containers.RepeatedCompositeFieldContainer[NodeInfo]
    def __init__(self, nodes: _Optional[_Iterable[_Union[NodeInfo, _Mapping]]] = ...) -> None: ...

class KVRequest(_message.Message):
    __slots__ = ("ns", "key", "value", "overwrite", "prefix")
    NS_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    OVERWRITE_FIELD_NUMBER: _ClassVar[int]
    PREFIX_FIELD_NUMBER: _ClassVar[int]
    ns: str
    key: bytes
    value: bytes
    overwrite: bool
    prefix: bytes
    def __init__(self, ns: _Optional[str] = ..., key: _Optional[bytes] = ..., value: _Optional[bytes] = ..., overwrite: _Optional[bool] = ..., prefix: _Optional[bytes] = ...) -> None: ...

class KVReply(_message.Message):
    __slots__ = ("found", "value", "added", "keys", "deleted")
    FOUND_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    ADDED_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    DELETED_FIELD_NUMBER: _ClassVar[int]
    found: bool
    value: bytes
    added: bool
    keys: _containers.RepeatedScalarFieldContainer[bytes]
    deleted: int
    def __init__(self, found: _Optional[bool] = ..., value: _Optional[bytes] = ..., added: _Optional[bool] = ..., keys: _Optional[_Iterable[bytes]] = ..., deleted: _Optional[int] = ...) -> None: ...

class ExportFunctionRequest(_message.Message):
    __slots__ = ("function_id", "payload", "name", "job_id")
    FUNCTION_ID_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    function_id: bytes
    payload: bytes
    name: str
    job_id: bytes
    def __init__(self, function_id: _Optional[bytes] = ..., payload: _Optional[bytes] = ..., name: _Optional[str] = ..., job_id: _Optional[bytes] = ...) -> None: ...

class GetFunctionRequest(_message.Message):
    __slots__ = ("function_id",)
    FUNCTION_ID_FIELD_NUMBER: _ClassVar[int]
    function_id: bytes
    def __init__(self, function_id: _Optional[bytes] = ...) -> None: ...

class GetFunctionReply(_message.Message):
    __slots__ = ("found", "payload", "name")
    FOUND_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    found: bool
    payload: bytes
    name: str
    def __init__(self, found: _Optional[bool] = ..., payload: _Optional[bytes] = ..., name: _Optional[str] = ...) -> None: ...

class JobInfo(_message.Message):
    __slots__ = ("job_id", "driver_address", "driver_pid", "namespace", "entrypoint", "start_time", "end_time", "alive", "driver_hostname")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    DRIVER_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    DRIVER_PID_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    ENTRYPOINT_FIELD_NUMBER: _ClassVar[int]
    START_TIME_FIELD_NUMBER: _ClassVar[int]
    END_TIME_FIELD_NUMBER: _ClassVar[int]
    ALIVE_FIELD_NUMBER: _ClassVar[int]
    DRIVER_HOSTNAME_FIELD_NUMBER: _ClassVar[int]
    job_id: bytes
    driver_address: str
    driver_pid: int
    namespace: str
    entrypoint: str
    start_time: float
    end_time: float
    alive: bool
    driver_hostname: str
    def __init__(self, job_id: _Optional[bytes] = ..., driver_address: _Optional[str] = ..., driver_pid: _Optional[int] = ..., namespace: _Optional[str] = ..., entrypoint: _Optional[str] = ..., start_time: _Optional[float] = ..., end_time: _Optional[float] = ..., alive: _Optional[bool] = ..., driver_hostname: _Optional[str] = ...) -> None: ...

class RegisterJobRequest(_message.Message):
    __slots__ = ("job",)
    JOB_FIELD_NUMBER: _ClassVar[int]
    job: JobInfo
    def __init__(self, job: _Optional[_Union[JobInfo, _Mapping]] = ...) -> None: ...

class RegisterJobReply(_message.Message):
    __slots__ = ("job_id",)
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: bytes
    def __init__(self, job_id: _Optional[bytes] = ...) -> None: ...

class JobRef(_message.Message):
    __slots__ = ("job_id",)
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: bytes
    def __init__(self, job_id: _Optional[bytes] = ...) -> None: ...

class GetJobsReply(_message.Message):
    __slots__ = ("jobs",)
    JOBS_FIELD_NUMBER: _ClassVar[int]
    jobs: _containers.RepeatedCompositeFieldContainer[JobInfo]
    def __init__(self, jobs: _Optional[_Iterable[_Union[JobInfo, _Mapping]]] = ...) -> None: ...

class TaskEvent(_message.Message):
    __slots__ = ("task_id", "job_id", "name", "node_id", "worker_id", "worker_pid", "state", "start_time", "end_time", "parent_task_id", "attempt", "error_type", "error_message", "actor_id")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    WORKER_PID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    START_TIME_FIELD_NUMBER: _ClassVar[int]
    END_TIME_FIELD_NUMBER: _ClassVar[int]
    PARENT_TASK_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    ERROR_TYPE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    ACTOR_ID_FIELD_NUMBER: _ClassVar[int]
    task_id: bytes
    job_id: bytes
    name: str
    node_id: bytes
    worker_id: bytes
    worker_pid: int
    state: str
    start_time: float
    end_time: float
    parent_task_id: bytes
    attempt: int
    error_type: str
    error_message: str
    actor_id: bytes
    def __init__(self, task_id: _Optional[bytes] = ..., job_id: _Optional[bytes] = ..., name: _Optional[str] = ..., node_id: _Optional[bytes] = ..., worker_id: _Optional[bytes] = ..., worker_pid: _Optional[int] = ..., state: _Optional[str] = ..., start_time: _Optional[float] = ..., end_time: _Optional[float] = ..., parent_task_id: _Optional[bytes] = ..., attempt: _Optional[int] = ..., error_type: _Optional[str] = ..., error_message: _Optional[str] = ..., actor_id: _Optional[bytes] = ...) -> None: ...

class TaskEventsRequest(_message.Message):
    __slots__ = ("events",)
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    events: _containers.RepeatedCompositeFieldContainer[TaskEvent]
    def __init__(self, events: _Optional[_Iterable[_Union[TaskEvent, _Mapping]]] = ...) -> None: ...

class GetTaskEventsRequest(_message.Message):
    __slots__ = ("job_id", "limit")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    job_id: bytes
    limit: int
    def __init__(self, job_id: _Optional[bytes] = ..., limit: _Optional[int] = ...) -> None: ...

class GetTaskEventsReply(_message.Message):
    __slots__ = ("events", "dropped")
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    DROPPED_FIELD_NUMBER: _ClassVar[int]
    events: _containers.RepeatedCompositeFieldContainer[TaskEvent]
    dropped: int
    def __init__(self, events: _Optional[_Iterable[_Union[TaskEvent, _Mapping]]] = ..., dropped: _Optional[int] = ...) -> None: ...

class ClusterInfoReply(_message.Message):
    __slots__ = ("session_name", "session_dir", "start_time", "version", "nodes")
    SESSION_NAME_FIELD_NUMBER: _ClassVar[int]
    SESSION_DIR_FIELD_NUMBER: _ClassVar[int]
    START_TIME_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    session_name: str
    session_dir: str
    start_time: float
    version: str
    nodes: _containers.RepeatedCompositeFieldContainer[NodeInfo]
    def __init__(self, session_name: _Optional[str] = ..., session_dir: _Optional[str] = ..., start_time: _Optional[float] = ..., version: _Optional[str] = ..., nodes: _Optional[_Iterable[_Union[NodeInfo, _Mapping]]] = ...) -> None: ...

class ShutdownRequest(_message.Message):
    __slots__ = ("stop_nodes",)
    STOP_NODES_FIELD_NUMBER: _ClassVar[int]
    stop_nodes: bool
    def __init__(self, stop_nodes: _Optional[bool] = ...) -> None: ...

class ActorInfo(_message.Message):
    __slots__ = ("actor_id", "state", "address", "node_id", "worker_pid", "name", "namespace", "class_name", "num_restarts", "max_restarts", "death_cause", "init_error", "version", "owner_address", "job_id", "detached", "worker_id", "death_kind", "start_time", "end_time", "handle_meta", "channel_address")
    class State(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        PENDING: _ClassVar[ActorInfo.State]
        ALIVE: _ClassVar[ActorInfo.State]
        RESTARTING: _ClassVar[ActorInfo.State]
        DEAD: _ClassVar[ActorInfo.State]
    PENDING: ActorInfo.State
    ALIVE: ActorInfo.State
    RESTARTING: ActorInfo.State
    DEAD: ActorInfo.State
    ACTOR_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    WORKER_PID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    CLASS_NAME_FIELD_NUMBER: _ClassVar[int]
    NUM_RESTARTS_FIELD_NUMBER: _ClassVar[int]
    MAX_RESTARTS_FIELD_NUMBER: _ClassVar[int]
    DEATH_CAUSE_FIELD_NUMBER: _ClassVar[int]
    INIT_ERROR_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    OWNER_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    DETACHED_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    DEATH_KIND_FIELD_NUMBER: _ClassVar[int]
    START_TIME_FIELD_NUMBER: _ClassVar[int]
    END_TIME_FIELD_NUMBER: _ClassVar[int]
    HANDLE_META_FIELD_NUMBER: _ClassVar[int]
    CHANNEL_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    actor_id: bytes
    state: ActorInfo.State
    address: str
    node_id: bytes
    worker_pid: int
    name: str
    namespace: str
    class_name: str
    num_restarts: int
    max_restarts: int
    death_cause: str
    init_error: bytes
    version: int
    owner_address: str
    job_id: bytes
    detached: bool
    worker_id: bytes
    death_kind: str
    start_time: float
    end_time: float
    handle_meta: bytes
    channel_address: str
    def __init__(self, actor_id: _Optional[bytes] = ..., state: _Optional[_Union[ActorInfo.State, str]] = ..., address: _Optional[str] = ..., node_id: _Optional[bytes] = ..., worker_pid: _Optional[int] = ..., name: _Optional[str] = ..., namespace: _Optional[str] = ..., class_name: _Optional[str] = ..., num_restarts: _Optional[int] = ..., max_restarts: _Optional[int] = ..., death_cause: _Optional[str] = ..., init_error: _Optional[bytes] = ..., version: _Optional[int] = ..., owner_address: _Optional[str] = ..., job_id: _Optional[bytes] = ..., detached: _Optional[bool] = ..., worker_id: _Optional[bytes] = ..., death_kind: _Optional[str] = ..., start_time: _Optional[float] = ..., end_time: _Optional[float] = ..., handle_meta: _Optional[bytes] = ..., channel_address: _Optional[str] = ...) -> None: ...

class RegisterActorRequest(_message.Message):
    __slots__ = ("spec", "resources", "name", "namespace", "detached", "get_if_exists", "max_restarts", "class_name", "preferred_node", "strategy", "handle_meta")
    class ResourcesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    SPEC_FIELD_NUMBER: _ClassVar[int]
    RESOURCES_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    DETACHED_FIELD_NUMBER: _ClassVar[int]
    GET_IF_EXISTS_FIELD_NUMBER: _ClassVar[int]
    MAX_RESTARTS_FIELD_NUMBER: _ClassVar[int]
    CLASS_NAME_FIELD_NUMBER: _ClassVar[int]
    PREFERRED_NODE_FIELD_NUMBER: _ClassVar[int]
    STRATEGY_FIELD_NUMBER: _ClassVar[int]
    HANDLE_META_FIELD_NUMBER: _ClassVar[int]
    spec: TaskSpec
    resources: _containers.ScalarMap[str, float]
    name: str
    namespace: str
    detached: bool
    get_if_exists: bool
    max_restarts: int
    class_name: str
    preferred_node: str
    strategy: str
    handle_meta: bytes
    def __init__(self, spec: _Optional[_Union[TaskSpec, _Mapping]] = ..., resources: _Optional[_Mapping[str, float]] = ..., name: _Optional[str] = ..., namespace: _Optional[str] = ..., detached: _Optional[bool] = ..., get_if_exists: _Optional[bool] = ..., max_restarts: _Optional[int] = ..., class_name: _Optional[str] = ..., preferred_node: _Optional[str] = ..., strategy: _Optional[str] = ..., handle_meta: _Optional[bytes] = ...) -> None: ...

class RegisterActorReply(_message.Message):
    __slots__ = ("actor", "existing")
    ACTOR_FIELD_NUMBER: _ClassVar[int]
    EXISTING_FIELD_NUMBER: _ClassVar[int]
    actor: ActorInfo
    existing: bool
    def __init__(self, actor: _Optional[_Union[ActorInfo, _Mapping]] = ..., existing: _Optional[bool] = ...) -> None: ...

class WaitActorRequest(_message.Message):
    __slots__ = ("actor_id", "after_version", "timeout")
    ACTOR_ID_FIELD_NUMBER: _ClassVar[int]
    AFTER_VERSION_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_FIELD_NUMBER: _ClassVar[int]
    actor_id: bytes
    after_version: int
    timeout: float
    def __init__(self, actor_id: _Optional[bytes] = ..., after_version: _Optional[int] = ..., timeout: _Optional[float] = ...) -> None: ...

class NamedActorRequest(_message.Message):
    __slots__ = ("name", "namespace")
    NAME_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    name: str
    namespace: str
    def __init__(self, name: _Optional[str] = ..., namespace: _Optional[str] = ...) -> None: ...

class KillActorRequest(_message.Message):
    __slots__ = ("actor_id", "no_restart", "reason", "kind")
    ACTOR_ID_FIELD_NUMBER: _ClassVar[int]
    NO_RESTART_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    actor_id: bytes
    no_restart: bool
    reason: str
    kind: str
    def __init__(self, actor_id: _Optional[bytes] = ..., no_restart: _Optional[bool] = ..., reason: _Optional[str] = ..., kind: _Optional[str] = ...) -> None: ...

class ListActorsReply(_message.Message):
    __slots__ = ("actors",)
    ACTORS_FIELD_NUMBER: _ClassVar[int]
    actors: _containers.RepeatedCompositeFieldContainer[ActorInfo]
    def __init__(self, actors: _Optional[_Iterable[_Union[ActorInfo, _Mapping]]] = ...) -> None: ...

class Bundle(_message.Message):
    __slots__ = ("resources",)
    class ResourcesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    RESOURCES_FIELD_NUMBER: _ClassVar[int]
    resources: _containers.ScalarMap[str, float]
    def __init__(self, resources: _Optional[_Mapping[str, float]] = ...) -> None: ...

class PlacementGroupInfo(_message.Message):
    __slots__ = ("pg_id", "name", "bundles", "strategy", "state", "bundle_node_ids", "bundle_node_addresses", "message", "detached", "job_id", "version", "namespace")
    class State(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        PENDING: _ClassVar[PlacementGroupInfo.State]
        CREATED: _ClassVar[PlacementGroupInfo.State]
        REMOVED: _ClassVar[PlacementGroupInfo.State]
    PENDING: PlacementGroupInfo.State
    CREATED: PlacementGroupInfo.State
    REMOVED: PlacementGroupInfo.State
    PG_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    BUNDLES_FIELD_NUMBER: _ClassVar[int]
    STRATEGY_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    BUNDLE_NODE_IDS_FIELD_NUMBER: _ClassVar[int]
    BUNDLE_NODE_ADDRESSES_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    DETACHED_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    pg_id: bytes
    name: str
    bundles: _containers.RepeatedCompositeFieldContainer[Bundle]
    strategy: str
    state: PlacementGroupInfo.State
    bundle_node_ids: _containers.RepeatedScalarFieldContainer[bytes]
    bundle_node_addresses: _containers.RepeatedScalarFieldContainer[str]
    message: str
    detached: bool
    job_id: bytes
    version: int
    namespace: str
    def __init__(self, pg_id: _Optional[bytes] = ..., name: _Optional[str] = ..., bundles: _Optional[_Iterable[_Union[Bundle, _Mapping]]] = ..., strategy: _Optional[str] = ..., state: _Optional[_Union[PlacementGroupInfo.State, str]] = ..., bundle_node_ids: _Optional[_Iterable[bytes]] = ..., bundle_node_addresses: _Optional[_Iterable[str]] = ..., message: _Optional[str] = ..., detached: _Optional[bool] = ..., job_id: _Optional[bytes] = ..., version: _Optional[int] = ..., namespace: _Optional[str] = ...) -> None: ...

class CreatePlacementGroupRequest(_message.Message):
    __slots__ = ("pg",)
    PG_FIELD_NUMBER: _ClassVar[int]
    pg: PlacementGroupInfo
    def __init__(self, pg: _Optional[_Union[PlacementGroupInfo, _Mapping]] = ...) -> None: ...

class PlacementGroupRequest(_message.Message):
    __slots__ = ("pg_id", "name", "namespace", "after_version", "timeout")
    PG_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    AFTER_VERSION_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_FIELD_NUMBER: _ClassVar[int]
    pg_id: bytes
    name: str
    namespace: str
    after_version: int
    timeout: float
    def __init__(self, pg_id: _Optional[bytes] = ..., name: _Optional[str] = ..., namespace: _Optional[str] = ..., after_version: _Optional[int] = ..., timeout: _Optional[float] = ...) -> None: ...

class ListPlacementGroupsReply(_message.Message):
    __slots__ = ("groups",)
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    groups: _containers.RepeatedCompositeFieldContainer[PlacementGroupInfo]
    def __init__(self, groups: _Optional[_Iterable[_Union[PlacementGroupInfo, _Mapping]]] = ...) -> None: ...

class BundleRequest(_message.Message):
    __slots__ = ("pg_id", "index", "resources")
    class ResourcesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    PG_ID_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    RESOURCES_FIELD_NUMBER: _ClassVar[int]
    pg_id: bytes
    index: int
    resources: _containers.ScalarMap[str, float]
    def __init__(self, pg_id: _Optional[bytes] = ..., index: _Optional[int] = ..., resources: _Optional[_Mapping[str, float]] = ...) -> None: ...

class BundleReply(_message.Message):
    __slots__ = ("ok", "message")
    OK_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    ok: bool
    message: str
    def __init__(self, ok: _Optional[bool] = ..., message: _Optional[str] = ...) -> None: ...

class WorkerDeathReport(_message.Message):
    __slots__ = ("node_id", "worker_id", "worker_address", "detail")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    WORKER_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    node_id: bytes
    worker_id: bytes
    worker_address: str
    detail: str
    def __init__(self, node_id: _Optional[bytes] = ..., worker_id: _Optional[bytes] = ..., worker_address: _Optional[str] = ..., detail: _Optional[str] = ...) -> None: ...

class LeaseRequest(_message.Message):
    __slots__ = ("resources", "owner_address", "job_id", "no_spillback", "request_id", "strategy", "runtime_env")
    class ResourcesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    RESOURCES_FIELD_NUMBER: _ClassVar[int]
    OWNER_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    NO_SPILLBACK_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    STRATEGY_FIELD_NUMBER: _ClassVar[int]
    RUNTIME_ENV_FIELD_NUMBER: _ClassVar[int]
    resources: _containers.ScalarMap[str, float]
    owner_address: str
    job_id: bytes
    no_spillback: bool
    request_id: bytes
    strategy: str
    runtime_env: str
    def __init__(self, resources: _Optional[_Mapping[str, float]] = ..., owner_address: _Optional[str] = ..., job_id: _Optional[bytes] = ..., no_spillback: _Optional[bool] = ..., request_id: _Optional[bytes] = ..., strategy: _Optional[str] = ..., runtime_env: _Optional[str] = ...) -> None: ...

class LeaseReply(_message.Message):
    __slots__ = ("status", "lease_id", "worker_id", "worker_address", "worker_pid", "gpu_ids", "spill_address", "message", "node_id", "worker_channel_address", "worker_ctrl_address")
    class Status(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        GRANTED: _ClassVar[LeaseReply.Status]
        SPILLBACK: _ClassVar[LeaseReply.Status]
        INFEASIBLE: _ClassVar[LeaseReply.Status]
        CANCELLED: _ClassVar[LeaseReply.Status]
        RUNTIME_ENV_FAILED: _ClassVar[LeaseReply.Status]
    GRANTED: LeaseReply.Status
    SPILLBACK: LeaseReply.Status
    INFEASIBLE: LeaseReply.Status
    CANCELLED: LeaseReply.Status
    RUNTIME_ENV_FAILED: LeaseReply.Status
    STATUS_FIELD_NUMBER: _ClassVar[int]
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    WORKER_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    WORKER_PID_FIELD_NUMBER: _ClassVar[int]
    GPU_IDS_FIELD_NUMBER: _ClassVar[int]
    SPILL_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    WORKER_CHANNEL_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    WORKER_CTRL_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    status: LeaseReply.Status
    lease_id: bytes
    worker_id: bytes
    worker_address: str
    worker_pid: int
    gpu_ids: _containers.RepeatedScalarFieldContainer[int]
    spill_address: str
    message: str
    node_id: bytes
    worker_channel_address: str
    worker_ctrl_address: str
    def __init__(self, status: _Optional[_Union[LeaseReply.Status, str]] = ..., lease_id: _Optional[bytes] = ..., worker_id: _Optional[bytes] = ..., worker_address: _Optional[str] = ..., worker_pid: _Optional[int] = ..., gpu_ids: _Optional[_Iterable[int]] = ..., spill_address: _Optional[str] = ..., message: _Optional[str] = ..., node_id: _Optional[bytes] = ..., worker_channel_address: _Optional[str] = ..., worker_ctrl_address: _Optional[str] = ...) -> None: ...

class OwnerRef(_message.Message):
    __slots__ = ("owner_address",)
    OWNER_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    owner_address: str
    def __init__(self, owner_address: _Optional[str] = ...) -> None: ...

class ReturnLeaseRequest(_message.Message):
    __slots__ = ("lease_id", "worker_failed")
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    WORKER_FAILED_FIELD_NUMBER: _ClassVar[int]
    lease_id: bytes
    worker_failed: bool
    def __init__(self, lease_id: _Optional[bytes] = ..., worker_failed: _Optional[bool] = ...) -> None: ...

class CancelLeaseRequest(_message.Message):
    __slots__ = ("request_id",)
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    request_id: bytes
    def __init__(self, request_id: _Optional[bytes] = ...) -> None: ...

class WorkerRegisterRequest(_message.Message):
    __slots__ = ("worker_id", "pid", "address", "channel_address", "ctrl_address")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    CHANNEL_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    CTRL_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    worker_id: bytes
    pid: int
    address: str
    channel_address: str
    ctrl_address: str
    def __init__(self, worker_id: _Optional[bytes] = ..., pid: _Optional[int] = ..., address: _Optional[str] = ..., channel_address: _Optional[str] = ..., ctrl_address: _Optional[str] = ...) -> None: ...

class WorkerRegisterReply(_message.Message):
    __slots__ = ("node_id", "head_address", "store_dir", "session_dir", "runtime_env")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    HEAD_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    STORE_DIR_FIELD_NUMBER: _ClassVar[int]
    SESSION_DIR_FIELD_NUMBER: _ClassVar[int]
    RUNTIME_ENV_FIELD_NUMBER: _ClassVar[int]
    node_id: bytes
    head_address: str
    store_dir: str
    session_dir: str
    runtime_env: str
    def __init__(self, node_id: _Optional[bytes] = ..., head_address: _Optional[str] = ..., store_dir: _Optional[str] = ..., session_dir: _Optional[str] = ..., runtime_env: _Optional[str] = ...) -> None: ...

class BlockedRequest(_message.Message):
    __slots__ = ("worker_id", "blocked")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    BLOCKED_FIELD_NUMBER: _ClassVar[int]
    worker_id: bytes
    blocked: bool
    def __init__(self, worker_id: _Optional[bytes] = ..., blocked: _Optional[bool] = ...) -> None: ...

class CreateObjectRequest(_message.Message):
    __slots__ = ("object_id", "size", "owner_address")
    OBJECT_ID_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    OWNER_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    object_id: bytes
    size: int
    owner_address: str
    def __init__(self, object_id: _Optional[bytes] = ..., size: _Optional[int] = ..., owner_address: _Optional[str] = ...) -> None: ...

class CreateObjectReply(_message.Message):
    __slots__ = ("path",)
    PATH_FIELD_NUMBER: _ClassVar[int]
    path: str
    def __init__(self, path: _Optional[str] = ...) -> None: ...

class SealObjectRequest(_message.Message):
    __slots__ = ("object_id", "size")
    OBJECT_ID_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    object_id: bytes
    size: int
    def __init__(self, object_id: _Optional[bytes] = ..., size: _Optional[int] = ...) -> None: ...

class ObjectIds(_message.Message):
    __slots__ = ("object_ids",)
    OBJECT_IDS_FIELD_NUMBER: _ClassVar[int]
    object_ids: _containers.RepeatedScalarFieldContainer[bytes]
    def __init__(self, object_ids: _Optional[_Iterable[bytes]] = ...) -> None: ...

class ObjectChunk(_message.Message):
    __slots__ = ("offset", "total_size", "data")
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    TOTAL_SIZE_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    offset: int
    total_size: int
    data: bytes
    def __init__(self, offset: _Optional[int] = ..., total_size: _Optional[int] = ..., data: _Optional[bytes] = ...) -> None: ...

class ReadObjectRequest(_message.Message):
    __slots__ = ("object_id", "chunk_bytes", "offset", "length")
    OBJECT_ID_FIELD_NUMBER: _ClassVar[int]
    CHUNK_BYTES_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    object_id: bytes
    chunk_bytes: int
    offset: int
    length: int
    def __init__(self, object_id: _Optional[bytes] = ..., chunk_bytes: _Optional[int] = ..., offset: _Optional[int] = ..., length: _Optional[int] = ...) -> None: ...

class FetchObjectRequest(_message.Message):
    __slots__ = ("object_id", "from_address", "size", "owner_address")
    OBJECT_ID_FIELD_NUMBER: _ClassVar[int]
    FROM_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    OWNER_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    object_id: bytes
    from_address: str
    size: int
    owner_address: str
    def __init__(self, object_id: _Optional[bytes] = ..., from_address: _Optional[str] = ..., size: _Optional[int] = ..., owner_address: _Optional[str] = ...) -> None: ...

class ObjectInfoReply(_message.Message):
    __slots__ = ("found", "path", "size")
    FOUND_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    found: bool
    path: str
    size: int
    def __init__(self, found: _Optional[bool] = ..., path: _Optional[str] = ..., size: _Optional[int] = ...) -> None: ...

class StoreStatsReply(_message.Message):
    __slots__ = ("capacity", "used", "num_objects", "spilled_bytes", "num_spilled", "restored_bytes", "evicted_bytes", "file_backed")
    CAPACITY_FIELD_NUMBER: _ClassVar[int]
    USED_FIELD_NUMBER: _ClassVar[int]
    NUM_OBJECTS_FIELD_NUMBER: _ClassVar[int]
    SPILLED_BYTES_FIELD_NUMBER: _ClassVar[int]
    NUM_SPILLED_FIELD_NUMBER: _ClassVar[int]
    RESTORED_BYTES_FIELD_NUMBER: _ClassVar[int]
    EVICTED_BYTES_FIELD_NUMBER: _ClassVar[int]
    FILE_BACKED_FIELD_NUMBER: _ClassVar[int]
    capacity: int
    used: int
    num_objects: int
    spilled_bytes: int
    num_spilled: int
    restored_bytes: int
    evicted_bytes: int
    file_backed: bool
    def __init__(self, capacity: _Optional[int] = ..., used: _Optional[int] = ..., num_objects: _Optional[int] = ..., spilled_bytes: _Optional[int] = ..., num_spilled: _Optional[int] = ..., restored_bytes: _Optional[int] = ..., evicted_bytes: _Optional[int] = ..., file_backed: _Optional[bool] = ...) -> None: ...

class WorkerRef(_message.Message):
    __slots__ = ("worker_id", "force")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    FORCE_FIELD_NUMBER: _ClassVar[int]
    worker_id: bytes
    force: bool
    def __init__(self, worker_id: _Optional[bytes] = ..., force: _Optional[bool] = ...) -> None: ...

class WorkerExitInfo(_message.Message):
    __slots__ = ("found", "exited", "exit_code", "signal", "detail", "started")
    FOUND_FIELD_NUMBER: _ClassVar[int]
    EXITED_FIELD_NUMBER: _ClassVar[int]
    EXIT_CODE_FIELD_NUMBER: _ClassVar[int]
    SIGNAL_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    STARTED_FIELD_NUMBER: _ClassVar[int]
    found: bool
    exited: bool
    exit_code: int
    signal: int
    detail: str
    started: bytes
    def __init__(self, found: _Optional[bool] = ..., exited: _Optional[bool] = ..., exit_code: _Optional[int] = ..., signal: _Optional[int] = ..., detail: _Optional[str] = ..., started: _Optional[bytes] = ...) -> None: ...

class NodeStatsReply(_message.Message):
    __slots__ = ("node", "idle_workers", "leased_workers", "pending_leases", "store")
    NODE_FIELD_NUMBER: _ClassVar[int]
    IDLE_WORKERS_FIELD_NUMBER: _ClassVar[int]
    LEASED_WORKERS_FIELD_NUMBER: _ClassVar[int]
    PENDING_LEASES_FIELD_NUMBER: _ClassVar[int]
    STORE_FIELD_NUMBER: _ClassVar[int]
    node: NodeInfo
    idle_workers: int
    leased_workers: int
    pending_leases: int
    store: StoreStatsReply
    def __init__(self, node: _Optional[_Union[NodeInfo, _Mapping]] = ..., idle_workers: _Optional[int] = ..., leased_workers: _Optional[int] = ..., pending_leases: _Optional[int] = ..., store: _Optional[_Union[StoreStatsReply, _Mapping]] = ...) -> None: ...

class ObjectLocation(_message.Message):
    __slots__ = ("object_id", "data", "in_store", "size", "node_id", "node_address", "owner_address")
    OBJECT_ID_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    IN_STORE_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    NODE_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    OWNER_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    object_id: bytes
    data: bytes
    in_store: bool
    size: int
    node_id: bytes
    node_address: str
    owner_address: str
    def __init__(self, object_id: _Optional[bytes] = ..., data: _Optional[bytes] = ..., in_store: _Optional[bool] = ..., size: _Optional[int] = ..., node_id: _Optional[bytes] = ..., node_address: _Optional[str] = ..., owner_address: _Optional[str] = ...) -> None: ...

class TaskSpec(_message.Message):
    __slots__ = ("task_id", "job_id", "function_id", "function_name", "args", "resolved_args", "num_returns", "owner_address", "attempt", "retry_exceptions", "max_calls", "gpu_ids", "parent_task_id", "lease_id", "namespace", "actor_id", "actor_creation", "sequence", "max_concurrency", "is_async", "capture_pg", "runtime_env", "resources", "concurrency_groups", "concurrency_group", "disable_task_events", "poll_after")
    class ResourcesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    class ConcurrencyGroupsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    FUNCTION_ID_FIELD_NUMBER: _ClassVar[int]
    FUNCTION_NAME_FIELD_NUMBER: _ClassVar[int]
    ARGS_FIELD_NUMBER: _ClassVar[int]
    RESOLVED_ARGS_FIELD_NUMBER: _ClassVar[int]
    NUM_RETURNS_FIELD_NUMBER: _ClassVar[int]
    OWNER_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    RETRY_EXCEPTIONS_FIELD_NUMBER: _ClassVar[int]
    MAX_CALLS_FIELD_NUMBER: _ClassVar[int]
    GPU_IDS_FIELD_NUMBER: _ClassVar[int]
    PARENT_TASK_ID_FIELD_NUMBER: _ClassVar[int]
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    ACTOR_ID_FIELD_NUMBER: _ClassVar[int]
    ACTOR_CREATION_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    MAX_CONCURRENCY_FIELD_NUMBER: _ClassVar[int]
    IS_ASYNC_FIELD_NUMBER: _ClassVar[int]
    CAPTURE_PG_FIELD_NUMBER: _ClassVar[int]
    RUNTIME_ENV_FIELD_NUMBER: _ClassVar[int]
    RESOURCES_FIELD_NUMBER: _ClassVar[int]
    CONCURRENCY_GROUPS_FIELD_NUMBER: _ClassVar[int]
    CONCURRENCY_GROUP_FIELD_NUMBER: _ClassVar[int]
    DISABLE_TASK_EVENTS_FIELD_NUMBER: _ClassVar[int]
    POLL_AFTER_FIELD_NUMBER: _ClassVar[int]
    task_id: bytes
    job_id: bytes
    function_id: bytes
    function_name: str
    args: bytes
    resolved_args: _containers.RepeatedCompositeFieldContainer[ObjectLocation]
    num_returns: int
    owner_address: str
    attempt: int
    retry_exceptions: bytes
    max_calls: int
    gpu_ids: _containers.RepeatedScalarFieldContainer[int]
    parent_task_id: bytes
    lease_id: bytes
    namespace: str
    actor_id: bytes
    actor_creation: bool
    sequence: int
    max_concurrency: int
    is_async: bool
    capture_pg: bytes
    runtime_env: str
    resources: _containers.ScalarMap[str, float]
    concurrency_groups: _containers.ScalarMap[str, int]
    concurrency_group: str
    disable_task_events: bool
    poll_after: bool
    def __init__(self, task_id: _Optional[bytes] = ..., job_id: _Optional[bytes] = ..., function_id: _Optional[bytes] = ..., function_name: _Optional[str] = ..., args: _Optional[bytes] = ..., resolved_args: _Optional[_Iterable[_Union[ObjectLocation, _Mapping]]] = ..., num_returns: _Optional[int] = ..., owner_address: _Optional[str] = ..., attempt: _Optional[int] = ..., retry_exceptions: _Optional[bytes] = ..., max_calls: _Optional[int] = ..., gpu_ids: _Optional[_Iterable[int]] = ..., parent_task_id: _Optional[bytes] = ..., lease_id: _Optional[bytes] = ..., namespace: _Optional[str] = ..., actor_id: _Optional[bytes] = ..., actor_creation: _Optional[bool] = ..., sequence: _Optional[int] = ..., max_concurrency: _Optional[int] = ..., is_async: _Optional[bool] = ..., capture_pg: _Optional[bytes] = ..., runtime_env: _Optional[str] = ..., resources: _Optional[_Mapping[str, float]] = ..., concurrency_groups: _Optional[_Mapping[str, int]] = ..., concurrency_group: _Optional[str] = ..., disable_task_events: _Optional[bool] = ..., poll_after: _Optional[bool] = ...) -> None: ...

class TaskReply(_message.Message):
    __slots__ = ("task_id", "attempt", "returns", "is_error", "retryable", "worker_exiting", "start_time", "end_time", "cancelled", "worker_id", "worker_pid", "requeued", "node_id")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    RETURNS_FIELD_NUMBER: _ClassVar[int]
    IS_ERROR_FIELD_NUMBER: _ClassVar[int]
    RETRYABLE_FIELD_NUMBER: _ClassVar[int]
    WORKER_EXITING_FIELD_NUMBER: _ClassVar[int]
    START_TIME_FIELD_NUMBER: _ClassVar[int]
    END_TIME_FIELD_NUMBER: _ClassVar[int]
    CANCELLED_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    WORKER_PID_FIELD_NUMBER: _ClassVar[int]
    REQUEUED_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    task_id: bytes
    attempt: int
    returns: _containers.RepeatedCompositeFieldContainer[ObjectLocation]
    is_error: bool
    retryable: bool
    worker_exiting: bool
    start_time: float
    end_time: float
    cancelled: bool
    worker_id: bytes
    worker_pid: int
    requeued: bool
    node_id: bytes
    def __init__(self, task_id: _Optional[bytes] = ..., attempt: _Optional[int] = ..., returns: _Optional[_Iterable[_Union[ObjectLocation, _Mapping]]] = ..., is_error: _Optional[bool] = ..., retryable: _Optional[bool] = ..., worker_exiting: _Optional[bool] = ..., start_time: _Optional[float] = ..., end_time: _Optional[float] = ..., cancelled: _Optional[bool] = ..., worker_id: _Optional[bytes] = ..., worker_pid: _Optional[int] = ..., requeued: _Optional[bool] = ..., node_id: _Optional[bytes] = ...) -> None: ...

class LogRecord(_message.Message):
    __slots__ = ("task_id", "stream", "text", "dropped_lines", "pid")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    STREAM_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    DROPPED_LINES_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    task_id: bytes
    stream: str
    text: str
    dropped_lines: int
    pid: int
    def __init__(self, task_id: _Optional[bytes] = ..., stream: _Optional[str] = ..., text: _Optional[str] = ..., dropped_lines: _Optional[int] = ..., pid: _Optional[int] = ...) -> None: ...

class TaskBatch(_message.Message):
    __slots__ = ("tasks",)
    TASKS_FIELD_NUMBER: _ClassVar[int]
    tasks: _containers.RepeatedCompositeFieldContainer[TaskSpec]
    def __init__(self, tasks: _Optional[_Iterable[_Union[TaskSpec, _Mapping]]] = ...) -> None: ...

class ReplyBatch(_message.Message):
    __slots__ = ("replies", "logs")
    REPLIES_FIELD_NUMBER: _ClassVar[int]
    LOGS_FIELD_NUMBER: _ClassVar[int]
    replies: _containers.RepeatedCompositeFieldContainer[TaskReply]
    logs: _containers.RepeatedCompositeFieldContainer[LogRecord]
    def __init__(self, replies: _Optional[_Iterable[_Union[TaskReply, _Mapping]]] = ..., logs: _Optional[_Iterable[_Union[LogRecord, _Mapping]]] = ...) -> None: ...

class ObjectStatusRequest(_message.Message):
    __slots__ = ("object_id", "timeout")
    OBJECT_ID_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_FIELD_NUMBER: _ClassVar[int]
    object_id: bytes
    timeout: float
    def __init__(self, object_id: _Optional[bytes] = ..., timeout: _Optional[float] = ...) -> None: ...

class ObjectStatusReply(_message.Message):
    __slots__ = ("status", "location", "is_error")
    class Status(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        PENDING: _ClassVar[ObjectStatusReply.Status]
        READY: _ClassVar[ObjectStatusReply.Status]
        FREED: _ClassVar[ObjectStatusReply.Status]
        UNKNOWN: _ClassVar[ObjectStatusReply.Status]
    PENDING: ObjectStatusReply.Status
    READY: ObjectStatusReply.Status
    FREED: ObjectStatusReply.Status
    UNKNOWN: ObjectStatusReply.Status
    STATUS_FIELD_NUMBER: _ClassVar[int]
    LOCATION_FIELD_NUMBER: _ClassVar[int]
    IS_ERROR_FIELD_NUMBER: _ClassVar[int]
    status: ObjectStatusReply.Status
    location: ObjectLocation
    is_error: bool
    def __init__(self, status: _Optional[_Union[ObjectStatusReply.Status, str]] = ..., location: _Optional[_Union[ObjectLocation, _Mapping]] = ..., is_error: _Optional[bool] = ...) -> None: ...

class BorrowRequest(_message.Message):
    __slots__ = ("object_ids", "borrower_address", "add")
    OBJECT_IDS_FIELD_NUMBER: _ClassVar[int]
    BORROWER_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    ADD_FIELD_NUMBER: _ClassVar[int]
    object_ids: _containers.RepeatedScalarFieldContainer[bytes]
    borrower_address: str
    add: bool
    def __init__(self, object_ids: _Optional[_Iterable[bytes]] = ..., borrower_address: _Optional[str] = ..., add: _Optional[bool] = ...) -> None: ...

class CancelTaskRequest(_message.Message):
    __slots__ = ("task_id", "force", "recursive")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    FORCE_FIELD_NUMBER: _ClassVar[int]
    RECURSIVE_FIELD_NUMBER: _ClassVar[int]
    task_id: bytes
    force: bool
    recursive: bool
    def __init__(self, task_id: _Optional[bytes] = ..., force: _Optional[bool] = ..., recursive: _Optional[bool] = ...) -> None: ...

class TaskChannelReply(_message.Message):
    __slots__ = ("address",)
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    address: str
    def __init__(self, address: _Optional[str] = ...) -> None: ...

class ClientRequest(_message.Message):
    __slots__ = ("session", "op", "payload")
    SESSION_FIELD_NUMBER: _ClassVar[int]
    OP_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    session: bytes
    op: str
    payload: bytes
    def __init__(self, session: _Optional[bytes] = ..., op: _Optional[str] = ..., payload: _Optional[bytes] = ...) -> None: ...

class ClientReply(_message.Message):
    __slots__ = ("payload", "is_error")
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    IS_ERROR_FIELD_NUMBER: _ClassVar[int]
    payload: bytes
    is_error: bool
    def __init__(self, payload: _Optional[bytes] = ..., is_error: _Optional[bool] = ...) -> None: ...
