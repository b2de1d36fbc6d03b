from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Empty(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class JobDetails(_message.Message):
    __slots__ = ("submission_id", "entrypoint", "status", "message", "metadata", "runtime_env", "start_time", "end_time", "has_exit_code", "driver_exit_code", "job_id", "supervisor_pid", "driver_pid", "error_type", "entrypoint_num_cpus", "entrypoint_num_gpus", "entrypoint_resources", "node_id", "hostname", "run_time", "lease_node", "lease_id", "supervisor_start")
    class MetadataEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    class EntrypointResourcesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    SUBMISSION_ID_FIELD_NUMBER: _ClassVar[int]
    ENTRYPOINT_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    RUNTIME_ENV_FIELD_NUMBER: _ClassVar[int]
    START_TIME_FIELD_NUMBER: _ClassVar[int]
    END_TIME_FIELD_NUMBER: _ClassVar[int]
    HAS_EXIT_CODE_FIELD_NUMBER: _ClassVar[int]
    DRIVER_EXIT_CODE_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    SUPERVISOR_PID_FIELD_NUMBER: _ClassVar[int]
    DRIVER_PID_FIELD_NUMBER: _ClassVar[int]
    ERROR_TYPE_FIELD_NUMBER: _ClassVar[int]
    ENTRYPOINT_NUM_CPUS_FIELD_NUMBER: _ClassVar[int]
    ENTRYPOINT_NUM_GPUS_FIELD_NUMBER: _ClassVar[int]
    ENTRYPOINT_RESOURCES_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    HOSTNAME_FIELD_NUMBER: _ClassVar[int]
    RUN_TIME_FIELD_NUMBER: _ClassVar[int]
    LEASE_NODE_FIELD_NUMBER: _ClassVar[int]
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    SUPERVISOR_START_FIELD_NUMBER: _ClassVar[int]
    submission_id: str
    entrypoint: str
    status: str
    message: str
    metadata: _containers.ScalarMap[str, str]
    runtime_env: str
    start_time: float
    end_time: float
    has_exit_code: bool
    driver_exit_code: int
    job_id: str
    supervisor_pid: int
    driver_pid: int
    error_type: str
    entrypoint_num_cpus: float
    entrypoint_num_gpus: float
    entrypoint_resources: _containers.ScalarMap[str, float]
    node_id: str
    hostname: str
    run_time: float
    lease_node: str
    lease_id: bytes
    supervisor_start: int
    def __init__(self, submission_id: _Optional[str] = ..., entrypoint: _Optional[str] = ..., status: _Optional[str] = ..., message: _Optional[str] = ..., metadata: _Optional[_Mapping[str, str]] = ..., runtime_env: _Optional[str] = ..., start_time: _Optional[float] = ..., end_time: _Optional[float] = ..., has_exit_code: _Optional[bool] = ..., driver_exit_code: _Optional[int] = ..., job_id: _Optional[str] = ..., supervisor_pid: _Optional[int] = ..., driver_pid: _Optional[int] = ..., error_type: _Optional[str] = ..., entrypoint_num_cpus: _Optional[float] = ..., entrypoint_num_gpus: _Optional[float] = ..., entrypoint_resources: _Optional[_Mapping[str, float]] = ..., node_id: _Optional[str] = ..., hostname: _Optional[str] = ..., run_time: _Optional[float] = ..., lease_node: _Optional[str] = ..., lease_id: _Optional[bytes] = ..., supervisor_start: _Optional[int] = ...) -> None: ...

class SubmitJobRequest(_message.Message):
    __slots__ = ("entrypoint", "submission_id", "runtime_env", "metadata", "entrypoint_num_cpus", "entrypoint_num_gpus", "entrypoint_resources")
    class MetadataEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    class EntrypointResourcesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    ENTRYPOINT_FIELD_NUMBER: _ClassVar[int]
    SUBMISSION_ID_FIELD_NUMBER: _ClassVar[int]
    RUNTIME_ENV_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    ENTRYPOINT_NUM_CPUS_FIELD_NUMBER: _ClassVar[int]
    ENTRYPOINT_NUM_GPUS_FIELD_NUMBER: _ClassVar[int]
    ENTRYPOINT_RESOURCES_FIELD_NUMBER: _ClassVar[int]
    entrypoint: str
    submission_id: str
    runtime_env: str
    metadata: _containers.ScalarMap[str, str]
    entrypoint_num_cpus: float
    entrypoint_num_gpus: float
    entrypoint_resources: _containers.ScalarMap[str, float]
    def __init__(self, entrypoint: _Optional[str] = ..., submission_id: _Optional[str] = ..., runtime_env: _Optional[str] = ..., metadata: _Optional[_Mapping[str, str]] = ..., entrypoint_num_cpus: _Optional[float] = ..., entrypoint_num_gpus: _Optional[float] = ..., entrypoint_resources: _Optional[_Mapping[str, float]] = ...) -> None: ...

class JobRequest(_message.Message):
    __slots__ = ("submission_id",)
    SUBMISSION_ID_FIELD_NUMBER: _ClassVar[int]
    submission_id: str
    def __init__(self, submission_id: _Optional[str] = ...) -> None: ...

class JobList(_message.Message):
    __slots__ = ("jobs",)
    JOBS_FIELD_NUMBER: _ClassVar[int]
    jobs: _containers.RepeatedCompositeFieldContainer[JobDetails]
    def __init__(self, jobs: _Optional[_Iterable[_Union[JobDetails, _Mapping]]] = ...) -> None: ...

class StopJobReply(_message.Message):
    __slots__ = ("stopped",)
    STOPPED_FIELD_NUMBER: _ClassVar[int]
    stopped: bool
    def __init__(self, stopped: _Optional[bool] = ...) -> None: ...

class DeleteJobReply(_message.Message):
    __slots__ = ("deleted",)
    DELETED_FIELD_NUMBER: _ClassVar[int]
    deleted: bool
    def __init__(self, deleted: _Optional[bool] = ...) -> None: ...

class JobLogRequest(_message.Message):
    __slots__ = ("submission_id", "offset", "follow")
    SUBMISSION_ID_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    FOLLOW_FIELD_NUMBER: _ClassVar[int]
    submission_id: str
    offset: int
    follow: bool
    def __init__(self, submission_id: _Optional[str] = ..., offset: _Optional[int] = ..., follow: _Optional[bool] = ...) -> None: ...

class LogChunk(_message.Message):
    __slots__ = ("data", "offset", "eof", "status")
    DATA_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    EOF_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    data: bytes
    offset: int
    eof: bool
    status: str
    def __init__(self, data: _Optional[bytes] = ..., offset: _Optional[int] = ..., eof: _Optional[bool] = ..., status: _Optional[str] = ...) -> None: ...

class JobStatusUpdate(_message.Message):
    __slots__ = ("submission_id", "status", "message", "driver_pid", "has_exit_code", "exit_code", "error_type", "lease_node", "lease_id", "node_id")
    SUBMISSION_ID_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    DRIVER_PID_FIELD_NUMBER: _ClassVar[int]
    HAS_EXIT_CODE_FIELD_NUMBER: _ClassVar[int]
    EXIT_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_TYPE_FIELD_NUMBER: _ClassVar[int]
    LEASE_NODE_FIELD_NUMBER: _ClassVar[int]
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    submission_id: str
    status: str
    message: str
    driver_pid: int
    has_exit_code: bool
    exit_code: int
    error_type: str
    lease_node: str
    lease_id: bytes
    node_id: str
    def __init__(self, submission_id: _Optional[str] = ..., status: _Optional[str] = ..., message: _Optional[str] = ..., driver_pid: _Optional[int] = ..., has_exit_code: _Optional[bool] = ..., exit_code: _Optional[int] = ..., error_type: _Optional[str] = ..., lease_node: _Optional[str] = ..., lease_id: _Optional[bytes] = ..., node_id: _Optional[str] = ...) -> None: ...

class PackageChunk(_message.Message):
    __slots__ = ("uri", "offset", "total_size", "data")
    URI_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    TOTAL_SIZE_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    uri: str
    offset: int
    total_size: int
    data: bytes
    def __init__(self, uri: _Optional[str] = ..., offset: _Optional[int] = ..., total_size: _Optional[int] = ..., data: _Optional[bytes] = ...) -> None: ...

class PackageRef(_message.Message):
    __slots__ = ("uri",)
    URI_FIELD_NUMBER: _ClassVar[int]
    uri: str
    def __init__(self, uri: _Optional[str] = ...) -> None: ...

class PackageInfo(_message.Message):
    __slots__ = ("exists", "size")
    EXISTS_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    exists: bool
    size: int
    def __init__(self, exists: _Optional[bool] = ..., size: _Optional[int] = ...) -> None: ...

class LogFile(_message.Message):
    __slots__ = ("node_id", "filename", "size", "mtime")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    FILENAME_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    MTIME_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    filename: str
    size: int
    mtime: float
    def __init__(self, node_id: _Optional[str] = ..., filename: _Optional[str] = ..., size: _Optional[int] = ..., mtime: _Optional[float] = ...) -> None: ...

class ListLogsRequest(_message.Message):
    __slots__ = ("node_id", "glob")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    GLOB_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    glob: str
    def __init__(self, node_id: _Optional[str] = ..., glob: _Optional[str] = ...) -> None: ...

class ListLogsReply(_message.Message):
    __slots__ = ("files",)
    FILES_FIELD_NUMBER: _ClassVar[int]
    files: _containers.RepeatedCompositeFieldContainer[LogFile]
    def __init__(self, files: _Optional[_Iterable[_Union[LogFile, _Mapping]]] = ...) -> None: ...

class StreamLogRequest(_message.Message):
    __slots__ = ("node_id", "filename", "follow", "tail_bytes", "offset")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    FILENAME_FIELD_NUMBER: _ClassVar[int]
    FOLLOW_FIELD_NUMBER: _ClassVar[int]
    TAIL_BYTES_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    filename: str
    follow: bool
    tail_bytes: int
    offset: int
    def __init__(self, node_id: _Optional[str] = ..., filename: _Optional[str] = ..., follow: _Optional[bool] = ..., tail_bytes: _Optional[int] = ..., offset: _Optional[int] = ...) -> None: ...

class WorkerState(_message.Message):
    __slots__ = ("worker_id", "pid", "state", "address", "node_id", "runtime_env_hash", "lease_owner_job")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    RUNTIME_ENV_HASH_FIELD_NUMBER: _ClassVar[int]
    LEASE_OWNER_JOB_FIELD_NUMBER: _ClassVar[int]
    worker_id: bytes
    pid: int
    state: str
    address: str
    node_id: bytes
    runtime_env_hash: str
    lease_owner_job: bytes
    def __init__(self, worker_id: _Optional[bytes] = ..., pid: _Optional[int] = ..., state: _Optional[str] = ..., address: _Optional[str] = ..., node_id: _Optional[bytes] = ..., runtime_env_hash: _Optional[str] = ..., lease_owner_job: _Optional[bytes] = ...) -> None: ...

class ListWorkersReply(_message.Message):
    __slots__ = ("workers",)
    WORKERS_FIELD_NUMBER: _ClassVar[int]
    workers: _containers.RepeatedCompositeFieldContainer[WorkerState]
    def __init__(self, workers: _Optional[_Iterable[_Union[WorkerState, _Mapping]]] = ...) -> None: ...

class StoreObject(_message.Message):
    __slots__ = ("object_id", "size", "owner_address", "state", "node_id", "primary")
    OBJECT_ID_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    OWNER_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    PRIMARY_FIELD_NUMBER: _ClassVar[int]
    object_id: bytes
    size: int
    owner_address: str
    state: str
    node_id: bytes
    primary: bool
    def __init__(self, object_id: _Optional[bytes] = ..., size: _Optional[int] = ..., owner_address: _Optional[str] = ..., state: _Optional[str] = ..., node_id: _Optional[bytes] = ..., primary: _Optional[bool] = ...) -> None: ...

class ListObjectsReply(_message.Message):
    __slots__ = ("objects",)
    OBJECTS_FIELD_NUMBER: _ClassVar[int]
    objects: _containers.RepeatedCompositeFieldContainer[StoreObject]
    def __init__(self, objects: _Optional[_Iterable[_Union[StoreObject, _Mapping]]] = ...) -> None: ...

class PrepareEnvRequest(_message.Message):
    __slots__ = ("runtime_env",)
    RUNTIME_ENV_FIELD_NUMBER: _ClassVar[int]
    runtime_env: str
    def __init__(self, runtime_env: _Optional[str] = ...) -> None: ...

class EnvProgress(_message.Message):
    __slots__ = ("phase", "text", "done", "error", "worker_env")
    PHASE_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    DONE_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    WORKER_ENV_FIELD_NUMBER: _ClassVar[int]
    phase: str
    text: str
    done: bool
    error: str
    worker_env: str
    def __init__(self, phase: _Optional[str] = ..., text: _Optional[str] = ..., done: _Optional[bool] = ..., error: _Optional[str] = ..., worker_env: _Optional[str] = ...) -> None: ...
