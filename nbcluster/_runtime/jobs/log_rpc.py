"""Serving one file of a session's ``logs`` folder over gRPC (head and node agents)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import grpc

from nbcluster._runtime.jobs import logfiles
from nbcluster._runtime.protocol.protos import jobs_pb2 as jpb

__all__ = ["serve_log"]


async def serve_log(
    logs_dir: Path, request: jpb.StreamLogRequest, context: grpc.aio.ServicerContext
) -> AsyncIterator[jpb.LogChunk]:
    """Stream one file of a logs folder as ``LogChunk`` messages, the last with ``eof``."""
    try:
        path = logfiles.safe_path(logs_dir, request.filename)
    except logfiles.BadLogName as err:
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(err))
    if not path.is_file():
        await context.abort(
            grpc.StatusCode.NOT_FOUND,
            f"no log file {request.filename!r}; `nbcluster logs` lists the files",
        )
    offset = request.offset
    async for offset, data in logfiles.stream_file(
        path, offset=request.offset, tail_bytes=request.tail_bytes, follow=request.follow
    ):
        yield jpb.LogChunk(data=data, offset=offset)
        offset += len(data)
    yield jpb.LogChunk(offset=offset, eof=True)
