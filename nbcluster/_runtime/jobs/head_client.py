"""A blocking client of the head's job, package, log, KV and state RPCs.

Used from user threads (the job client, the state API, the CLI, the notebook magics):
one blocking channel per client, every call carrying the cluster token, gRPC errors
translated to ``nbcluster.exceptions`` here. Streams (logs, uploads) are plain iterators.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import grpc

from nbcluster._runtime import exceptions as exc
from nbcluster._runtime.protocol.errors import (
    Peer,
    RpcAlreadyExists,
    RpcCancelled,
    RpcFailedPrecondition,
    RpcFailure,
    RpcNotFound,
    RpcResourceExhausted,
    to_exception,
)
from nbcluster._runtime.protocol.protos import jobs_pb2 as jpb
from nbcluster._runtime.protocol.protos import jobs_pb2_grpc as jpb_grpc
from nbcluster._runtime.protocol.protos import task_state_pb2 as tspb
from nbcluster._runtime.protocol.protos import task_state_pb2_grpc as tspb_grpc
from nbcluster._runtime.protocol.rpc import SyncStub, make_sync_channel, pb, pb_grpc

__all__ = ["CHUNK_BYTES", "HeadJobsClient", "jpb"]

CHUNK_BYTES = 1 << 20
T = TypeVar("T")


class HeadJobsClient:
    """Typed blocking calls to one cluster's head."""

    def __init__(self, address: str, token: str, *, timeout: float = 30.0) -> None:
        self.address = address
        self.timeout = timeout
        self._channel = make_sync_channel(address, token, max_message_bytes=64 * 2**20)
        self._jobs = SyncStub(jpb_grpc.JobServiceStub(self._channel), token, address)
        self._head = SyncStub(pb_grpc.HeadStub(self._channel), token, address)
        self._task_state = SyncStub(tspb_grpc.TaskStateStub(self._channel), token, address)

    def close(self) -> None:
        """Close the channel."""
        self._channel.close()

    def __enter__(self) -> HeadJobsClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- plumbing --------------------------------------------------------------------------
    def _call(
        self, what: str, fn: Callable[..., T], request: Any, timeout: float | None = None
    ) -> T:
        try:
            return fn(request, timeout=timeout or self.timeout)
        except RpcFailure as err:
            raise self._translate(err, what) from None

    def _translate(self, err: RpcFailure, what: str) -> Exception:
        details = err.details() or ""
        if isinstance(err, RpcNotFound):
            return LookupError(details)
        if isinstance(err, RpcAlreadyExists):
            return ValueError(details)
        if isinstance(err, RpcFailedPrecondition):
            return RuntimeError(details)
        if isinstance(err, RpcResourceExhausted) and not details.startswith("ObjectStoreFull"):
            return ValueError(details)
        if err.code() == grpc.StatusCode.UNIMPLEMENTED:
            return exc.NbclusterSystemError(
                f"the head at {self.address} does not serve {what}: is it an older nbcluster?"
            )
        return to_exception(err, Peer.HEAD, what)

    def _stream(self, what: str, it: Any) -> Iterator[Any]:
        try:
            yield from it
        except RpcCancelled:
            return
        except RpcFailure as err:
            raise self._translate(err, what) from None
        finally:
            with contextlib.suppress(Exception):
                it.cancel()

    # -- jobs ------------------------------------------------------------------------------
    def submit_job(self, request: jpb.SubmitJobRequest) -> jpb.JobDetails:
        """Submit a job; ValueError for a duplicate submission id."""
        return self._call("SubmitJob", self._jobs.SubmitJob, request)

    def get_job(self, submission_id: str) -> jpb.JobDetails:
        """One job; LookupError when the head has no such job."""
        return self._call("GetJob", self._jobs.GetJob, jpb.JobRequest(submission_id=submission_id))

    def list_jobs(self) -> list[jpb.JobDetails]:
        """Every submitted job, oldest first."""
        return list(self._call("ListJobs", self._jobs.ListJobs, jpb.Empty()).jobs)

    def stop_job(self, submission_id: str) -> bool:
        """Ask the job to stop; False when it had already finished."""
        reply = self._call(
            "StopJob", self._jobs.StopJob, jpb.JobRequest(submission_id=submission_id)
        )
        return bool(reply.stopped)

    def delete_job(self, submission_id: str) -> bool:
        """Forget a finished job and its logs."""
        reply = self._call(
            "DeleteJob", self._jobs.DeleteJob, jpb.JobRequest(submission_id=submission_id)
        )
        return bool(reply.deleted)

    def job_logs(
        self, submission_id: str, offset: int = 0, follow: bool = False
    ) -> Iterator[jpb.LogChunk]:
        """Chunks of a job's log from ``offset``; with ``follow`` until the job ends."""
        call = self._jobs.TailJobLogs(
            jpb.JobLogRequest(submission_id=submission_id, offset=offset, follow=follow),
            timeout=None if follow else self.timeout,
        )
        return self._stream("TailJobLogs", call)

    def update_job_status(
        self, update: jpb.JobStatusUpdate, timeout: float = 10.0
    ) -> jpb.JobDetails:
        """Supervisor → head: the job moved on."""
        return self._call("UpdateJobStatus", self._jobs.UpdateJobStatus, update, timeout)

    # -- packages ---------------------------------------------------------------------------
    def package_exists(self, uri: str) -> bool:
        """True when the head already holds this package."""
        info = self._call("GetPackageInfo", self._jobs.GetPackageInfo, jpb.PackageRef(uri=uri))
        return bool(info.exists)

    def upload_package(self, uri: str, path: str | os.PathLike[str]) -> None:
        """Send a package file to the head in chunks."""
        size = os.path.getsize(path)

        def chunks() -> Iterator[jpb.PackageChunk]:
            with open(path, "rb") as f:
                offset = 0
                while True:
                    data = f.read(CHUNK_BYTES)
                    yield jpb.PackageChunk(uri=uri, offset=offset, total_size=size, data=data)
                    offset += len(data)
                    if not data or offset >= size:
                        return

        self._call("UploadPackage", self._jobs.UploadPackage, chunks(), timeout=600)

    # -- logs -------------------------------------------------------------------------------
    def list_logs(self, node_id: str = "", glob: str = "") -> list[jpb.LogFile]:
        """Log files of a node ('' = the head's own)."""
        reply = self._call(
            "ListLogs", self._jobs.ListLogs, jpb.ListLogsRequest(node_id=node_id, glob=glob)
        )
        return list(reply.files)

    def stream_log(
        self,
        node_id: str,
        filename: str,
        *,
        follow: bool = False,
        tail_bytes: int = 0,
        offset: int = 0,
    ) -> Iterator[jpb.LogChunk]:
        """A log file's contents from ``offset`` (or its last ``tail_bytes``); ``follow``
        keeps streaming what is appended. The last chunk has ``eof`` and the end offset."""
        call = self._jobs.StreamLog(
            jpb.StreamLogRequest(
                node_id=node_id,
                filename=filename,
                follow=follow,
                tail_bytes=tail_bytes,
                offset=offset,
            ),
            timeout=None if follow else self.timeout,
        )
        return self._stream("StreamLog", call)

    # -- state ------------------------------------------------------------------------------
    def nodes(self, include_dead: bool = True) -> list[pb.NodeInfo]:
        """Every node the head knows."""
        reply = self._call(
            "GetNodes", self._head.GetNodes, pb.GetNodesRequest(include_dead=include_dead)
        )
        return list(reply.nodes)

    def drivers(self) -> list[pb.JobInfo]:
        """Every driver job that attached to the cluster."""
        return list(self._call("GetJobs", self._head.GetJobs, pb.Empty()).jobs)

    def actors(self) -> list[pb.ActorInfo]:
        """Every actor the head knows."""
        return list(self._call("ListActors", self._head.ListActors, pb.Empty()).actors)

    def placement_groups(self) -> list[pb.PlacementGroupInfo]:
        """Every placement group the head knows."""
        reply = self._call("ListPlacementGroups", self._head.ListPlacementGroups, pb.Empty())
        return list(reply.groups)

    def task_events(self, job_id: bytes = b"", limit: int = 0) -> tuple[list[pb.TaskEvent], int]:
        """Task attempts the head recorded, and how many events were dropped."""
        reply = self._call(
            "GetTaskEvents",
            self._head.GetTaskEvents,
            pb.GetTaskEventsRequest(job_id=job_id, limit=limit),
        )
        return list(reply.events), int(reply.dropped)

    def live_tasks(self, job_id: bytes = b"") -> tuple[list[pb.TaskEvent], int]:
        """Running attempts and waiting tasks, and how many waiting ones were not listed."""
        reply = self._call(
            "GetLiveTasks", self._task_state.GetLiveTasks, tspb.LiveTasksRequest(job_id=job_id)
        )
        return list(reply.tasks), int(reply.not_listed)

    def workers(self) -> list[jpb.WorkerState]:
        """Worker processes of every live node."""
        return list(self._call("ListWorkers", self._jobs.ListWorkers, jpb.Empty()).workers)

    def objects(self) -> list[jpb.StoreObject]:
        """Objects in every live node's store."""
        return list(self._call("ListObjects", self._jobs.ListObjects, jpb.Empty()).objects)

    # -- internal KV ---------------------------------------------------------------------
    def kv_put(self, ns: str, key: bytes, value: bytes, overwrite: bool) -> bool:
        """Set a key; True when it was added (not present before)."""
        req = pb.KVRequest(ns=ns, key=key, value=value, overwrite=overwrite)
        return bool(self._call("KVPut", self._head.KVPut, req).added)

    def kv_get(self, ns: str, key: bytes) -> bytes | None:
        """A key's value, or None."""
        reply = self._call("KVGet", self._head.KVGet, pb.KVRequest(ns=ns, key=key))
        return bytes(reply.value) if reply.found else None

    def kv_del(self, ns: str, key: bytes, by_prefix: bool) -> int:
        """Delete a key (or every key with the prefix); how many were deleted."""
        req = pb.KVRequest(ns=ns, prefix=key) if by_prefix else pb.KVRequest(ns=ns, key=key)
        return int(self._call("KVDel", self._head.KVDel, req).deleted)

    def kv_keys(self, ns: str, prefix: bytes) -> list[bytes]:
        """Keys that start with ``prefix``."""
        reply = self._call("KVKeys", self._head.KVKeys, pb.KVRequest(ns=ns, prefix=prefix))
        return [bytes(k) for k in reply.keys]


def read_token_file(path: str | os.PathLike[str]) -> str:
    """The token in a token file."""
    return Path(path).read_text().strip()
