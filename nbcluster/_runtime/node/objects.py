"""The node manager's object store service: accounting, files, the pool and transfers.

The RPCs of the ``NodeManager`` service that deal with objects land here (the node's
``NodeService`` forwards them): ``CreateObject``/``SealObject``/``FreeObjects`` keep the
:class:`~nbcluster._runtime.objects.state.StoreState` in step with the files written by
workers and drivers, ``GetObjectInfo`` restores spilled objects, ``FetchObject`` pulls a
copy from another node over the data plane (``objects.transfer``; gRPC ``ReadObject``
remains for peers without one), and the pool of pre-allocated files is refilled in the
background (``objects.pool``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import errno
import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any

import grpc

from nbcluster._runtime.objects import store as objstore
from nbcluster._runtime.objects import transfer
from nbcluster._runtime.objects.pool import WarmPool
from nbcluster._runtime.objects.readers import open_locked
from nbcluster._runtime.objects.state import StoreState
from nbcluster._runtime.protocol import hello, tls
from nbcluster._runtime.protocol.errors import RpcFailure
from nbcluster._runtime.protocol.protos import transfer_pb2, transfer_pb2_grpc
from nbcluster._runtime.protocol.rpc import AuthedStub, Channels, pb

log = logging.getLogger(__name__)

#: ``errno`` values that mean the spill disk has no room left.
_DISK_FULL = frozenset({errno.ENOSPC, errno.EDQUOT})


class SpillDiskFull(OSError):
    """Spilling found the spill disk full: the room an object needs cannot be made."""

    def __str__(self) -> str:
        return str(self.strerror)


#: Parallel connections (ranges) of one pull over the data plane.
PULL_STREAMS = 2
#: Parallel gRPC streams of one pull from a peer without a data plane.
FETCH_STREAMS = 2


class NodeObjects:
    """The object side of one node manager."""

    def __init__(
        self,
        store: StoreState,
        *,
        store_dir: str,
        spill_dir: str,
        file_backed: bool,
        token: str,
        channels: Channels,
        host: str = "127.0.0.1",
        data_plane: bool = True,
    ) -> None:
        self.store = store
        self.store_dir = store_dir
        self.spill_dir = spill_dir
        self.file_backed = file_backed
        self.token = token
        self.channels = channels
        self.restored_bytes = 0
        self.fetched_bytes = 0
        self.fetches: dict[bytes, asyncio.Task[pb.ObjectInfoReply]] = {}
        self.pool = WarmPool(self.max_pool_bytes)
        self._pool_task: asyncio.Task[None] | None = None
        # One low-priority thread: filling the pool must not slow the writes it serves.
        self._pool_executor = concurrent.futures.ThreadPoolExecutor(
            1, thread_name_prefix="nbc-pool", initializer=_lower_thread_priority
        )
        self.loop = asyncio.get_running_loop()
        self.tls = tls.current()  # the data plane speaks TLS when the cluster does
        self.data_server = (
            transfer.DataServer(
                token,
                self._locate_threadsafe,
                host=host,
                ssl_context=tls.ssl_context(self.tls, server=True) if self.tls else None,
            ).start()
            if data_plane
            else None
        )
        self._stubs: dict[str, AuthedStub] = {}  # gRPC address -> ObjectTransfer stub
        self._data_addresses: dict[str, str] = {}  # gRPC address -> data-plane address
        #: Called when the store's usage changed (the node reports it to the head).
        self.on_change: Callable[[], None] = lambda: None

    async def close(self) -> None:
        """Stop the data plane and the pool thread; close peer channels."""
        if self.data_server is not None:
            await asyncio.to_thread(self.data_server.close)
        self._pool_executor.shutdown(wait=False, cancel_futures=True)

    # -- writes ------------------------------------------------------------------------------
    async def create(self, request: pb.CreateObjectRequest, context: Any) -> pb.CreateObjectReply:
        decision = self.store.create(request.object_id, request.size, request.owner_address)
        if not decision.ok:
            await context.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED, f"ObjectStoreFull: {decision.message}"
            )
        try:
            self.make_room(decision.spill, decision.evict, request.size)
        except SpillDiskFull as err:
            self.store.free([request.object_id])  # nothing was written yet
            self.on_change()
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, f"OutOfDisk: {err}")
        self.on_change()
        self.pool.writing(request.size, time.monotonic())
        if request.size >= objstore.RECYCLE_MIN_SIZE and not self.file_backed:
            objstore.promote_waiting(self.store_dir)  # so the writer finds them in the pool
        return pb.CreateObjectReply(path=objstore.object_path(self.store_dir, request.object_id))

    def make_room(self, spill: tuple[bytes, ...], evict: tuple[bytes, ...], size: int) -> None:
        """Delete ``evict`` and spill ``spill`` so ``size`` more bytes fit in the store.

        Raises :class:`SpillDiskFull` (after putting every object not spilled back in
        memory) if the spill disk is full: the caller must then drop its reservation.
        """
        for oid in evict:
            objstore.delete_object(self.store_dir, oid)
        full: OSError | None = None
        for oid in spill:
            if full is not None:
                self.store.cancel_spill(oid)
                continue
            try:
                objstore.spill_object(self.store_dir, self.spill_dir, oid)
            except OSError as err:
                if err.errno in _DISK_FULL:
                    full = err
                else:
                    log.exception("spilling %s failed", oid.hex())
                self.store.cancel_spill(oid)
                continue
            if not self.store.mark_spilled(oid):  # freed meanwhile
                objstore.delete_object(self.spill_dir, oid)
        if full is not None:
            raise SpillDiskFull(full.errno, self._disk_full_message(size))

    def _disk_full_message(self, size: int) -> str:
        try:
            st = os.statvfs(self.spill_dir)
            free, total = st.f_bavail * st.f_frsize, st.f_blocks * st.f_frsize
            room = f" ({free / 2**20:.1f} of {total / 2**20:.1f} MiB free)"
        except OSError:
            room = ""
        stats = self.store.stats()
        return (
            f"the spill directory {self.spill_dir} is full{room}: an object of "
            f"{size / 2**20:.1f} MiB does not fit in the {stats.capacity / 2**20:.1f} MiB object "
            f"store ({stats.used / 2**20:.1f} MiB in memory, {stats.spilled_bytes / 2**20:.1f} "
            "MiB spilled) and nothing more can be spilled. Delete ObjectRefs you no longer "
            "need (`del ref`) so their objects are freed."
        )

    async def seal(self, request: pb.SealObjectRequest, context: Any) -> pb.Empty:
        if not self.store.seal(request.object_id):  # freed while it was being written
            objstore.delete_object(self.store_dir, request.object_id)
        self._keep_pool_within_capacity()  # (after the write took its pool file, if any)
        self.pool.wrote(request.size, time.monotonic())
        self.refill_pool()
        return pb.Empty()

    async def free(self, request: pb.ObjectIds, context: Any) -> pb.Empty:
        self.free_ids(list(request.object_ids))
        return pb.Empty()

    def free_ids(self, object_ids: list[bytes]) -> None:
        """Forget these objects and delete their files (in memory or spilled)."""
        self.on_change()
        for oid, where in self.store.free(object_ids):
            if where == "spilled":
                objstore.delete_object(self.spill_dir, oid)
            else:
                # Keep freed files for reuse: writing into allocated tmpfs pages is ~2x faster.
                objstore.delete_object(self.store_dir, oid, recycle_limit=self.pool_limit())

    def free_owned_by(self, owner: str) -> int:
        """An owner died: free everything it owned here (its objects die with it). Returns
        how many objects went."""
        ids = self.store.owned_by(owner) if owner else []
        if ids:
            log.info("freeing %d object(s) of %s, which died", len(ids), owner)
            self.free_ids(ids)
        return len(ids)

    @property
    def max_pool_bytes(self) -> int:
        """The pool's ceiling: three quarters of the store's capacity."""
        return self.store.capacity * 3 // 4

    def pool_limit(self) -> int:
        """What the pool may hold now: the capacity objects leave free (up to three quarters
        of it), so objects and pool files together stay within the store's capacity."""
        stats = self.store.stats()
        return max(0, min(self.max_pool_bytes, stats.capacity - stats.used))

    def _keep_pool_within_capacity(self) -> None:
        limit = self.pool_limit()
        if objstore.free_pool_bytes(self.store_dir) > limit:
            objstore.trim_free_pool(self.store_dir, keep_bytes=limit)

    def free_all(self) -> None:
        """Drop every object (the node was fenced and starts over)."""
        for oid, where in self.store.free(self.store.object_ids()):
            objstore.delete_object(self.spill_dir if where == "spilled" else self.store_dir, oid)

    # -- the pool of pre-allocated files (objects.pool) ----------------------------------------
    def refill_pool(self, initial: bool = False) -> None:
        """Allocate pool files in the background for the next large writes (one at a time)."""
        if self.file_backed or (self._pool_task is not None and not self._pool_task.done()):
            return
        self._pool_task = self.loop.create_task(self._refill_pool(initial))

    async def _refill_pool(self, initial: bool) -> None:
        # One file at a time, each once large writes have paused (``WarmPool.wait_s``).
        try:
            pending = self.pool.initial() if initial else []
            while True:
                if not pending:  # files no recent write can use go at once (an unlink)
                    sizes, drop = self._pool_plan()
                    if drop:
                        objstore.drop_pool_files(self.store_dir, drop)
                    if not sizes:
                        return
                await self._until_writes_pause()
                if pending:
                    size = pending.pop(0)
                else:
                    sizes, _ = self._pool_plan()  # (the writes meanwhile may have used some)
                    if not sizes:
                        return
                    size = sizes[0]
                made = await self.loop.run_in_executor(
                    self._pool_executor, objstore.allocate_pool_files, self.store_dir, [size]
                )
                if not made:
                    return  # the disk is full: try again after the next write
        except OSError:
            log.exception("allocating reusable store files failed")

    async def _until_writes_pause(self) -> None:
        """Wait until no large write has come for ``pool.quiet_s`` (``objects.pool``)."""
        while (wait := self.pool.wait_s(time.monotonic())) > 0:
            await asyncio.sleep(wait)

    def _pool_plan(self) -> tuple[list[int], list[int]]:
        objstore.promote_waiting(self.store_dir)  # freed files whose readers are gone
        self.pool.limit = self.pool_limit()
        return self.pool.plan(
            objstore.pool_file_sizes(self.store_dir), objstore.spare_bytes(self.store_dir)
        )

    # -- reads -------------------------------------------------------------------------------
    async def info(self, request: pb.ObjectIds, context: Any) -> pb.ObjectInfoReply:
        if not request.object_ids:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "object_ids is empty")
        oid = request.object_ids[0]
        deadline = time.monotonic() + 60
        while True:
            access = self.store.access(oid)
            if access is None:
                return pb.ObjectInfoReply(found=False)
            if access.status != "pending" or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.01)  # being written, spilled or restored right now
        if access.status == "full":
            await context.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED, f"ObjectStoreFull: {access.message}"
            )
        if access.restore:
            try:
                self.make_room(access.spill, access.evict, access.size)
            except SpillDiskFull as err:
                self.store.cancel_restore(oid)
                await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, f"OutOfDisk: {err}")
            try:
                self.restored_bytes += objstore.restore_object(self.spill_dir, self.store_dir, oid)
            except OSError:
                self.store.cancel_restore(oid)
                raise
            if not self.store.mark_restored(oid):
                objstore.delete_object(self.store_dir, oid)
                return pb.ObjectInfoReply(found=False)
        return pb.ObjectInfoReply(
            found=True, path=objstore.object_path(self.store_dir, oid), size=access.size
        )

    async def read(self, request: pb.ReadObjectRequest, context: Any) -> Any:
        """Stream our copy of an object in gRPC chunks (for peers without a data plane)."""
        info = await self.info(pb.ObjectIds(object_ids=[request.object_id]), context)
        if not info.found:
            await context.abort(grpc.StatusCode.NOT_FOUND, "object not in this node's store")
        chunk = min(max(request.chunk_bytes or 4 * 2**20, 64 * 1024), 64 * 2**20)
        fd = open_locked(info.path)  # (the file is not reused while we read it)
        if fd is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, "object not in this node's store")
        try:
            size = os.fstat(fd).st_size
            offset = request.offset
            end = min(size, offset + request.length) if request.length else size
            while offset < end:
                data = await asyncio.to_thread(os.pread, fd, min(chunk, end - offset), offset)
                if not data:
                    break
                yield pb.ObjectChunk(offset=offset, total_size=size, data=data)
                offset += len(data)
        finally:
            os.close(fd)

    def _locate_threadsafe(self, object_id: bytes) -> tuple[str, int] | None:
        """For the data server's threads: where this node's copy is (restored if spilled)."""
        future = asyncio.run_coroutine_threadsafe(self._locate(object_id), self.loop)
        return future.result(timeout=120)

    async def _locate(self, object_id: bytes) -> tuple[str, int] | None:
        info = await self.info(pb.ObjectIds(object_ids=[object_id]), _NoContext())
        return (info.path, info.size) if info.found else None

    async def data_address(self, request: Any, context: Any) -> transfer_pb2.DataAddressReply:
        """``ObjectTransfer.GetDataAddress``: where peers pull our objects from."""
        address = self.data_server.address if self.data_server is not None else ""
        return transfer_pb2.DataAddressReply(address=address)

    # -- pulls from other nodes --------------------------------------------------------------
    async def fetch(self, request: pb.FetchObjectRequest, context: Any) -> pb.ObjectInfoReply:
        """Pull an object from another node into this node's store (once, even if asked twice)."""
        oid = request.object_id
        pending = self.fetches.get(oid)
        if pending is None:
            pending = self.loop.create_task(self._fetch(request))
            self.fetches[oid] = pending
            pending.add_done_callback(lambda _: self.fetches.pop(oid, None))
        where = request.from_address
        try:
            return await asyncio.shield(pending)
        except RpcFailure as err:
            await context.abort(err.code(), f"fetching from {where}: {err.details()}")
        except transfer.SourceGone as err:
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"fetching from {where}: {err}")
        except transfer.ObjectMissing as err:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"fetching from {where}: {err}")
        except SpillDiskFull as err:
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, f"OutOfDisk: {err}")
        except OSError as err:
            await context.abort(grpc.StatusCode.INTERNAL, f"fetching the object failed: {err}")
        raise AssertionError("unreachable")  # abort raises

    async def _fetch(self, request: pb.FetchObjectRequest) -> pb.ObjectInfoReply:
        oid = request.object_id
        access = self.store.access(oid)
        if access is not None and access.status in ("ok", "restore"):
            return await self.info(pb.ObjectIds(object_ids=[oid]), _NoContext())
        decision = self.store.create(oid, request.size, request.owner_address, primary=False)
        if not decision.ok:
            raise OSError(f"ObjectStoreFull: {decision.message}")
        try:
            self.make_room(decision.spill, decision.evict, request.size)
        except SpillDiskFull:
            self.store.free([oid])  # nothing was written yet
            raise
        size = request.size
        if size >= objstore.RECYCLE_MIN_SIZE and not self.file_backed:
            objstore.promote_waiting(self.store_dir)  # freed files whose readers are gone
        try:
            data_address = await self._peer_data_address(request.from_address)
            start = time.monotonic()
            with objstore.RawWriter(self.store_dir, oid, size) as writer:
                warm = writer.allocated
                if data_address and hello.token_fits(self.token):  # else gRPC carries it
                    await asyncio.to_thread(self._pull, writer, data_address, oid)
                else:
                    await self._pull_grpc(writer, request.from_address, oid, size)
            log.debug(
                "pulled %s (%d bytes) from %s over %s into a %s file in %.3f s",
                oid.hex()[:12], size, request.from_address,
                data_address or "gRPC", "pooled" if warm else "new", time.monotonic() - start,
            )  # fmt: skip
        except BaseException:
            self.store.free([oid])
            raise
        self.store.seal(oid)
        self.on_change()
        self._keep_pool_within_capacity()
        self.fetched_bytes += size
        self.pool.wrote(size, time.monotonic())
        self.refill_pool()
        return pb.ObjectInfoReply(
            found=True, path=objstore.object_path(self.store_dir, oid), size=size
        )

    def _pull(self, writer: objstore.RawWriter, address: str, oid: bytes) -> None:
        if not self.tls and transfer.CAN_SPLICE:  # straight into the file: no mapping to build
            writer.reserve()
            transfer.pull_object(
                address,
                self.token,
                oid,
                transfer.FileTarget(writer.fd, writer.size),
                parts=PULL_STREAMS,
            )
            return
        view = writer.mapped()
        try:
            transfer.pull_object(
                address,
                self.token,
                oid,
                view,
                parts=PULL_STREAMS,
                prepare=writer.prefault,
                ssl_context=tls.ssl_context(self.tls, server=False) if self.tls else None,
                server_hostname=self.tls.server_name if self.tls else None,
            )
        finally:
            view.release()

    async def _pull_grpc(
        self, writer: objstore.RawWriter, address: str, oid: bytes, size: int
    ) -> None:
        remote = self.channels.stub(address, "node")
        parts = max(1, min(FETCH_STREAMS, size // (8 * 2**20)))
        step = -(-size // parts)

        async def pull(start: int) -> None:
            req = pb.ReadObjectRequest(object_id=oid, offset=start, length=min(step, size - start))
            async for chunk in remote.ReadObject(req, timeout=600):
                await asyncio.to_thread(writer.write, chunk.offset, chunk.data)

        await asyncio.gather(*(pull(i * step) for i in range(parts) if i * step < size))

    async def _peer_data_address(self, grpc_address: str) -> str:
        """The data-plane address of the node at ``grpc_address`` ("" if it has none)."""
        cached = self._data_addresses.get(grpc_address)
        if cached is not None:
            return cached
        stub = self._stubs.get(grpc_address)
        if stub is None:
            raw = transfer_pb2_grpc.ObjectTransferStub(self.channels.channel(grpc_address))
            stub = self._stubs[grpc_address] = AuthedStub(raw, self.token)
        try:
            reply = await stub.GetDataAddress(transfer_pb2.DataAddressRequest(), timeout=10)
        except RpcFailure as err:
            if err.code() == grpc.StatusCode.UNIMPLEMENTED:  # an older node: gRPC chunks
                self._data_addresses[grpc_address] = ""
                return ""
            if err.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                raise transfer.SourceGone(f"cannot reach {grpc_address}: {err.details()}") from None
            raise
        self._data_addresses[grpc_address] = reply.address
        return reply.address

    def stats(self) -> pb.StoreStatsReply:
        s = self.store.stats()
        return pb.StoreStatsReply(
            capacity=s.capacity,
            used=s.used,
            num_objects=s.num_objects,
            spilled_bytes=s.spilled_bytes,
            num_spilled=s.num_spilled,
            restored_bytes=s.restored_bytes,
            evicted_bytes=s.evicted_bytes,
            file_backed=self.file_backed,
        )


class TransferService(transfer_pb2_grpc.ObjectTransferServicer):
    """The ``ObjectTransfer`` gRPC service of a node (where its data plane listens)."""

    def __init__(self, objects: NodeObjects) -> None:
        self.objects = objects

    async def GetDataAddress(
        self, request: transfer_pb2.DataAddressRequest, context: grpc.aio.ServicerContext
    ) -> transfer_pb2.DataAddressReply:
        return await self.objects.data_address(request, context)


class _NoContext:
    """Stands in for a servicer context when a handler is reused internally."""

    async def abort(self, code: grpc.StatusCode, details: str) -> None:
        raise OSError(f"{code.name}: {details}")


def _lower_thread_priority() -> None:
    """Run the calling thread at the lowest CPU priority (Linux: niceness is per thread)."""
    with contextlib.suppress(OSError, AttributeError):
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
