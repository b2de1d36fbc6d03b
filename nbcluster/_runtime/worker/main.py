"""Worker process: ``python -m nbcluster._runtime.worker.main`` (started by a node manager).

User code runs on the main thread (so cancelling a task can raise ``KeyboardInterrupt``
in it, and only in it: ``Executor.interrupt``); the core client's I/O loop runs on a
background thread and serves ``PushTasks`` streams from owners that hold a lease on this
worker.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import inspect
import logging
import os
import queue
import signal
import sys
import threading
import time
from typing import Any

import cloudpickle

from nbcluster._runtime import context, proc
from nbcluster._runtime import exceptions as exc
from nbcluster._runtime.config import Config
from nbcluster._runtime.core.client import CoreClient
from nbcluster._runtime.core.driver import CoreDriver
from nbcluster._runtime.protocol import faults
from nbcluster._runtime.protocol.rpc import pb
from nbcluster._runtime.running_mark import RunningMark
from nbcluster._runtime.runtime_env import driver as runtime_env_driver
from nbcluster._runtime.serialization import SerializedValue, deserialize, serialize
from nbcluster._runtime.task_events import error_info
from nbcluster._runtime.worker import actor_exit
from nbcluster._runtime.worker.actor_runner import ActorCallRunner, cancel_call
from nbcluster._runtime.worker.args import resolve_task_args
from nbcluster._runtime.worker.concurrency import group_limits
from nbcluster._runtime.worker.direct import DirectLoop, DirectStream, detach, hung_up
from nbcluster._runtime.worker.event_log import EventLog
from nbcluster._runtime.worker.executor_view import ExitRequest
from nbcluster._runtime.worker.generators import (
    is_generator_call,
    run_generator,
    run_generator_async,
)
from nbcluster._runtime.worker.output import OutputCapture, flush_forever
from nbcluster._runtime.worker.output import install as install_output
from nbcluster._runtime.worker.owner_stream import OwnerStream, ReplySink
from nbcluster._runtime.worker.returns import place, serialize_value, split_returns
from nbcluster._runtime.worker.service import WorkerService

log = logging.getLogger("nbcluster.worker")


def _ray_call(instance: Any, fn: Any, *args: Any, **kwargs: Any) -> Any:
    return fn(instance, *args, **kwargs)


def actor_method(instance: Any, name: str) -> Any:
    """The actor's method ``name``; ``__ray_call__`` (Ray's built-in) runs ``fn(instance,
    *args, **kwargs)`` for any function ``fn`` sent with the call."""
    if name == "__ray_call__":
        return functools.partial(_ray_call, instance)
    return getattr(instance, name)


class RunningTask:
    """What ``get_runtime_context()`` reads about the call running in a thread or asyncio
    task of this worker (calls of threaded and async actors run at once)."""

    __slots__ = ("spec", "actor_id", "in_async_actor", "_executor")

    def __init__(self, spec: pb.TaskSpec, executor: Executor, in_async_actor: bool) -> None:
        self.spec = spec
        self._executor = executor
        self.in_async_actor = in_async_actor
        self.actor_id = spec.actor_id

    @property
    def resources(self) -> dict[str, float]:
        """The resources granted to the call (an actor's calls keep its grant)."""
        spec = self.spec
        if spec.actor_id and not spec.actor_creation:
            return dict(self._executor.actor_resources)
        return dict(spec.resources)

    @property
    def gpu_ids(self) -> list[int]:
        """The GPUs granted to the call (an actor's calls keep its grant)."""
        spec = self.spec
        if spec.actor_id and not spec.actor_creation:
            return list(self._executor.actor_gpu_ids)
        return list(spec.gpu_ids)

    @property
    def task_id(self) -> bytes:
        """Id of the running task or actor call."""
        return self.spec.task_id

    def is_canceled(self) -> bool:
        """True once ``nbcluster.cancel`` reached this call."""
        return self.spec.task_id in self._executor.cancelled


#: The call running in this thread or asyncio task (see :class:`RunningTask`).
_running: contextvars.ContextVar[RunningTask | None] = contextvars.ContextVar(
    "nbcluster_running_task", default=None
)


class Executor:
    """Runs tasks one at a time on the main thread."""

    def __init__(self, client: CoreClient) -> None:
        self.client = client
        self.queue: queue.SimpleQueue[tuple[pb.TaskSpec, OwnerStream] | None] = queue.SimpleQueue()
        self.functions: dict[bytes, Any] = {}
        self.calls: dict[bytes, int] = {}
        self.running: bytes = b""
        self.running_stream: ReplySink | None = None
        self.cancelled: set[bytes] = set()
        self.interruptible = False  # the main thread runs a task's code: see interrupt()
        self.blocked = False
        self.exit_after_reply = threading.Event()
        self.event_log = EventLog()  # the attempts' events, sent to the head once a second
        self._lock = threading.Lock()
        self.pending: dict[bytes, tuple[pb.TaskSpec, ReplySink]] = {}
        self.output = OutputCapture()
        self.actor: Any = None
        self.actor_id = b""
        self.actor_resources: dict[str, float] = {}  # granted at creation, kept by its calls
        self.actor_gpu_ids: list[int] = []
        self.actor_runner: Any = None  # set for threaded or async actors
        self.actor_calls: ActorCallRunner | None = None  # their concurrency groups
        self.exit_request: ExitRequest | None = None  # the actor ends itself
        self.actor_capture: tuple[bytes, bool] | None = None
        self.actor_loop: asyncio.AbstractEventLoop | None = None
        self.last_error: tuple[str, str] = ("", "")
        self.direct: DirectLoop | None = None  # the channels the main thread reads
        self.mark: RunningMark | None = None  # what this process began last (running_mark)
        self._async_methods: dict[str, bool] = {}  # actor method name -> a coroutine?

    # -- called on the I/O loop ------------------------------------------------------------
    def enqueue(self, spec: pb.TaskSpec, stream: OwnerStream) -> None:
        if self.exit_request is not None and self.exit_request.intended and spec.actor_id:
            stream.replies.put_nowait(actor_exit.refused(self, spec))  # it ends itself
            return
        with self._lock:
            if self.blocked:
                stream.replies.put_nowait(self._requeue_reply(spec))
                return
            self.pending[spec.task_id] = (spec, stream)
        self.put((spec, stream))

    def put(self, item: Any) -> None:
        """Queue work for the main thread (any thread) and wake it."""
        self.queue.put(item)
        direct = self.direct
        if direct is not None:
            direct.wake()

    def _requeue_reply(self, spec: pb.TaskSpec) -> pb.TaskReply:
        return pb.TaskReply(task_id=spec.task_id, attempt=spec.attempt, requeued=True)

    def drop_stream(self, stream: OwnerStream) -> None:
        stream.open = False

    def owns_work(self, stream: OwnerStream) -> bool:
        """True when a task from ``stream`` is running or queued here."""
        with self._lock:
            if self.running_stream is stream:
                return True
            return any(st is stream for _, st in self.pending.values())

    def cancel(self, task_id: bytes) -> None:
        if self.actor_id:  # an actor call is never interrupted (Ray): see cancel_call
            cancel_call(self, task_id)
            return
        with self._lock:
            if task_id == self.running:
                self.cancelled.add(task_id)
                # A real SIGINT aimed at the main thread also wakes it from sleep() and
                # blocking calls, which _thread.interrupt_main() would not.
                signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGINT)
            else:  # queued here, or not read yet off a lease's channel (direct.py)
                if len(self.cancelled) >= 4096:  # ids of tasks that never came: forget them
                    self.cancelled.clear()
                self.cancelled.add(task_id)

    def interrupt(self, signum: int, frame: Any) -> None:
        """The main thread's SIGINT handler (a cancel sends one: :meth:`cancel`). It raises
        only in a task's code: one that lands after that ended (the cancel raced the task's
        end) is dropped, so the task's reply still goes out and its lease stays usable."""
        if self.interruptible:
            raise KeyboardInterrupt

    def drain_pending(self) -> list[tuple[pb.TaskSpec, OwnerStream]]:
        """Take every queued, not started call (the actor is exiting)."""
        with self._lock:
            drained = list(self.pending.values())
            self.pending.clear()
        return drained

    # -- called by the task's thread while it blocks in get/wait ----------------------------
    def requeue_pending(self) -> None:
        """Hand every queued, not started task back to its owner."""
        with self._lock:
            requeue = list(self.pending.values())
            self.pending.clear()
        for spec, stream in requeue:
            stream.send_now(self._requeue_reply(spec))

    def set_blocked(self, blocked: bool) -> None:
        with self._lock:
            self.blocked = blocked and not self.actor_id  # actor calls stay, in order
            lend = self.direct is not None and not self.actor_id and bool(self.running)
        if blocked and not self.actor_id:
            self.requeue_pending()
        if self.direct is not None and not self.actor_id:
            # Tasks pipelined behind this one are answered "requeued" meanwhile (direct.py).
            if blocked and lend:
                self.direct.lend()
            elif not blocked:
                self.direct.take_back()
        with contextlib.suppress(Exception):
            self.client.run(
                lambda: self.client.node().NotifyBlocked(
                    pb.BlockedRequest(worker_id=self.client.worker_id, blocked=blocked), timeout=10
                ),
                timeout=10,
            )

    # -- main thread ---------------------------------------------------------------------------
    def run_forever(self) -> None:
        """The main thread: it reads its direct channels (task leases, a plain sync actor's)
        and runs what they and the I/O loop's queue bring (``direct.py``)."""
        if self.direct is None:
            self.direct = self._direct_loop()
        self._serve_direct(self.direct)

    def _run_item(self, item: tuple[pb.TaskSpec, Any]) -> None:
        spec, stream = item
        if spec.actor_id and self.actor_runner is not None:
            with self._lock:
                self.pending.pop(spec.task_id, None)
            self.actor_runner(spec, stream)
            return
        self._run_one(spec, stream)

    def _run_one(self, spec: pb.TaskSpec, stream: ReplySink) -> None:
        """Run one queued task or sync actor call on this (the main) thread; send its reply."""
        with self._lock:
            if self.pending.pop(spec.task_id, None) is None:
                return  # requeued to the owner while we were blocked
            self.running = spec.task_id
            self.running_stream = stream
        mark = self.mark
        if mark is not None:  # read by the node should this process die running it
            mark.set(spec.task_id, spec.attempt)
        reply = self._captured(spec, stream, self.execute)
        with self._lock:
            self.running = b""
            self.running_stream = None
            self.cancelled.discard(spec.task_id)
        if self.exit_request is not None:
            actor_exit.finish(self, stream, reply)  # the actor ended itself
        stream.send(reply)
        if reply.worker_exiting:
            if isinstance(stream, DirectStream):
                self.exit_after_reply.set()  # sent (such a reply is never held)
            self.requeue_pending()
            self.exit_after_reply.wait(5)
            time.sleep(0.05)
            os._exit(0)

    # -- task leases and plain sync actors: the main thread reads their channels (direct.py)
    def _direct_loop(self) -> DirectLoop:
        return DirectLoop(
            max_frame=self.client.config.rpc_max_message_bytes,
            loop=self.client.loop,
            run_call=self._run_one,
            drain_queue=self._drain_queue,
            register=self._register_direct,
            dropped=self._direct_dropped,
            requeued=self._requeue_reply,
        )

    def _direct_dropped(self, stream: DirectStream) -> None:
        """A direct channel ended (main thread, between calls): forget what it left unrun;
        a lease's goes back to its node (returning one twice is harmless)."""
        with self._lock:
            for tid in [t for t, (_, st) in self.pending.items() if st is stream]:
                del self.pending[tid]
        if stream.lease:
            service = self.client.service
            lease_id = bytes.fromhex(stream.lease)
            self.client.call_soon(
                lambda: self.client.loop.create_task(service.return_lease(lease_id))
            )

    def owner_check(self) -> bool:
        """I/O loop, now and then: while a task that came on a direct lease channel runs,
        the worker shares its owner's fate (as on the loop's streams: ``service.py``). True
        while such a task runs (check again later)."""
        direct, stream = self.direct, self.running_stream
        if (
            direct is None
            or not isinstance(stream, DirectStream)
            or not direct.running_from(stream)
        ):
            return False
        if hung_up(stream) and self.running_stream is stream:  # (still its task running)
            log.warning("owner disconnected with tasks in flight; exiting")
            self.client.loop.call_later(0.05, os._exit, 1)
        return True

    def _serve_direct(self, direct: DirectLoop) -> None:
        direct.wake()  # anything queued before the switch
        while True:
            try:
                direct.run()
                return
            except KeyboardInterrupt:
                continue  # a cancel that arrived after its call finished

    def _drain_queue(self) -> bool:
        """Run what the I/O loop queued (gRPC streams, TLS channels); False: stop."""
        while True:
            try:
                item = self.queue.get_nowait()
            except queue.Empty:
                return True
            if item is None:
                return False
            if item[0] == "create":  # this worker becomes an actor
                _, spec, fut = item
                fut.set_result(self.create_actor(spec))
                continue
            self._run_item(item)

    def _register_direct(self, spec: pb.TaskSpec, stream: ReplySink) -> None:
        """A call read off a direct channel, about to run (cancel and exit can see it)."""
        if self.exit_request is not None and self.exit_request.intended:
            stream.send(actor_exit.refused(self, spec))  # it ends itself
            return
        with self._lock:
            self.pending[spec.task_id] = (spec, stream)

    def adopt_channel(self, writer: Any, lease_hex: str = "") -> bool:
        """The I/O loop accepted a task channel: the main thread serves it itself (True) if
        it is a task lease's (``lease_hex``) and this worker runs tasks, or an actor's and
        this is a plain sync actor; else the loop does (False)."""
        direct = self.direct
        if direct is None:
            return False
        if lease_hex:
            if not self.client.config.direct_tasks or self.actor_id or self.blocked:
                return False
        elif self.actor is None or self.actor_runner is not None:
            return False
        sock = detach(writer)
        if sock is None:
            return False
        direct.adopt(sock, lease_hex)
        return True

    def function(self, spec: pb.TaskSpec) -> Any:
        if spec.actor_id and not spec.actor_creation:
            if self.actor is None or spec.actor_id != self.actor_id:
                raise exc.NbclusterSystemError("this worker does not host that actor")
            method = actor_method(self.actor, spec.function_name)
            is_async = self._async_methods.get(spec.function_name)
            if is_async is None:
                is_async = inspect.iscoroutinefunction(method)
                if spec.function_name != "__ray_call__":  # its function changes per call
                    self._async_methods[spec.function_name] = is_async
            return self._sync_wrapper(method) if is_async else method
        fn = self.functions.get(spec.function_id)
        if fn is None:
            reply = self.client.call_head(
                "GetFunction",
                lambda head: head.GetFunction(
                    pb.GetFunctionRequest(function_id=spec.function_id), timeout=30
                ),
            )
            if not reply.found:
                raise exc.NbclusterSystemError(
                    f"function {spec.function_name} is not in the function table"
                )
            fn = cloudpickle.loads(reply.payload)
            self.functions[spec.function_id] = fn
        return fn

    def resolve_args(self, spec: pb.TaskSpec) -> tuple[tuple[Any, ...], dict[str, Any]]:
        return resolve_task_args(spec, self.client.map_from_store_location)

    # -- actors ----------------------------------------------------------------------------
    def create_actor(self, spec: pb.TaskSpec) -> pb.TaskReply:
        """Run the actor's ``__init__`` on the main thread; the instance lives here."""
        client = self.client
        reply = pb.TaskReply(task_id=spec.task_id, start_time=time.time(), worker_pid=os.getpid())
        if spec.gpu_ids:
            os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in spec.gpu_ids)
        client.job_id = spec.job_id
        client.namespace = spec.namespace
        client.current_task_id = spec.task_id
        client.current_pg = (spec.capture_pg, True) if spec.capture_pg else None
        self.actor_resources = dict(spec.resources)
        self.actor_gpu_ids = list(spec.gpu_ids)
        token = _running.set(RunningTask(spec, self, in_async_actor=False))
        try:
            cls = self.function(spec)
            args, kwargs = self.resolve_args(spec)
            instance = cls(*args, **kwargs)
        except BaseException as e:  # noqa: BLE001 - __init__ raised: report it
            err = exc.TaskError.from_exception(
                e, f"{spec.function_name}.__init__", pid=os.getpid(), hostname=client.hostname()
            )
            self._error_returns(spec, err, reply)
            return reply
        finally:
            client.current_task_id = b""
            _running.reset(token)
        self.actor = instance
        self.actor_id = spec.actor_id
        self.actor_capture = (spec.capture_pg, True) if spec.capture_pg else None
        if spec.is_async or spec.max_concurrency > 1 or spec.concurrency_groups:
            limits = group_limits(spec.concurrency_groups, spec.max_concurrency, spec.is_async)
            self.actor_calls = ActorCallRunner(self, limits, spec.is_async)
            self.actor_runner = self.actor_calls.submit
            self.actor_loop = self.actor_calls.default_loop
        reply.end_time = time.time()
        return reply

    def _captured(self, spec: pb.TaskSpec, stream: OwnerStream, run: Any) -> pb.TaskReply:
        """``run(spec)`` with what it prints sent to the caller (on this thread)."""
        slot = self.output.begin(spec.task_id, stream)
        try:
            return run(spec)
        finally:
            self._end_output(slot, stream)

    def _end_output(self, slot: Any, stream: OwnerStream) -> None:
        """A call ended: its last output goes out before its reply (same loop, in order)."""
        with self.output.send_lock:  # after any flush of its earlier output (direct streams)
            task_id, _, rest = self.output.end(slot)
            if rest:
                stream.send_rest(task_id, rest)

    def _sync_wrapper(self, method: Any) -> Any:
        """Run a coroutine method to completion on the actor's loop (sync callers)."""

        def call(*args: Any, **kwargs: Any) -> Any:
            if self.actor_loop is None:
                return asyncio.run(method(*args, **kwargs))
            return asyncio.run_coroutine_threadsafe(
                method(*args, **kwargs), self.actor_loop
            ).result()

        return call

    async def execute_async(self, spec: pb.TaskSpec) -> pb.TaskReply:
        """Run one call of an async actor on the actor's loop."""
        reply = pb.TaskReply(
            task_id=spec.task_id,
            attempt=spec.attempt,
            start_time=time.time(),
            worker_id=self.client.worker_id,
            worker_pid=os.getpid(),
            node_id=self.client.node_id,
        )
        _running.set(RunningTask(spec, self, in_async_actor=True))  # this asyncio task's
        self._started(spec, reply.start_time)
        try:
            method = actor_method(self.actor, spec.function_name)
            # Threads only where a call may block: mapping stored arguments, writing large
            # returns to the store. Inline arguments and small returns stay on the loop
            # (two thread hops cost more than a whole small call).
            if any(loc.in_store for loc in spec.resolved_args):
                args, kwargs = await asyncio.to_thread(self.resolve_args, spec)
            else:
                args, kwargs = self.resolve_args(spec)
            result = method(*args, **kwargs)
            if is_generator_call(spec, result):
                await run_generator_async(self, spec, result, reply)
            else:
                if inspect.isawaitable(result):
                    result = await result
                returns = self._serialize_returns(spec, split_returns(spec, result))
                big = self.client.config.max_inline_bytes
                if any(sv.total_size > big for _, sv in returns):
                    await asyncio.to_thread(self._add_returns, returns, reply, spec.owner_address)
                else:
                    self._add_returns(returns, reply, spec.owner_address)
        except (SystemExit, exc.AsyncioActorExit) as e:
            self._exit_raised(spec, e, reply)
        except BaseException as e:  # noqa: BLE001 - user code raised; report it
            err = exc.TaskError.from_exception(
                e,
                spec.function_name,
                pid=os.getpid(),
                hostname=self.client.hostname(),
                task_id=spec.task_id.hex(),
            )
            self._error_returns(spec, err, reply)
        reply.end_time = time.time()
        self._record_event(spec, reply)
        pending = self.client.table.take_unregistered()
        if pending:  # (as execute does: owners learn of the refs it keeps before the reply)
            with contextlib.suppress(Exception):
                fut = asyncio.run_coroutine_threadsafe(
                    self.client.register_borrows(pending), self.client.loop
                )
                await asyncio.wait_for(asyncio.wrap_future(fut), 10)
        return reply

    def execute(self, spec: pb.TaskSpec) -> pb.TaskReply:
        client = self.client
        start = time.time()
        reply = pb.TaskReply(
            task_id=spec.task_id,
            attempt=spec.attempt,
            start_time=start,
            worker_id=client.worker_id,
            worker_pid=os.getpid(),
            node_id=client.node_id,
        )
        name = spec.function_name
        self._started(spec, start)
        client.current_task_id = spec.task_id
        token = _running.set(RunningTask(spec, self, in_async_actor=False))
        if spec.actor_id:
            client.current_pg = self.actor_capture  # an actor's calls keep its group
        else:
            client.current_pg = (spec.capture_pg, True) if spec.capture_pg else None
        client.job_id = spec.job_id
        client.namespace = spec.namespace
        if spec.gpu_ids:
            os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in spec.gpu_ids)
        elif not spec.actor_id:  # an actor keeps the GPUs assigned at its creation
            os.environ.pop("CUDA_VISIBLE_DEVICES", None)
        try:
            try:
                self.interruptible = True  # a cancel's SIGINT raises from here on: interrupt()
                if spec.task_id in self.cancelled:
                    raise KeyboardInterrupt
                fn = self.function(spec)
                args, kwargs = self.resolve_args(spec)
                result = fn(*args, **kwargs)
                if is_generator_call(spec, result):
                    run_generator(self, spec, result, reply)
                else:
                    self._store_returns(spec, split_returns(spec, result), reply)
                self.interruptible = False
            except BaseException as e:  # noqa: BLE001 - user code raised; report it
                self.interruptible = False
                if type(e) is KeyboardInterrupt and spec.task_id in self.cancelled:
                    reply.cancelled = True
                    self._error_returns(spec, exc.TaskCancelledError(spec.task_id.hex()), reply)
                elif isinstance(e, (SystemExit, exc.AsyncioActorExit)):
                    self._exit_raised(spec, e, reply)
                else:  # (a KeyboardInterrupt of the task's own too)
                    err = exc.TaskError.from_exception(
                        e,
                        name,
                        pid=os.getpid(),
                        hostname=client.hostname(),
                        task_id=spec.task_id.hex(),
                    )
                    reply.retryable = self._retryable(spec, e)
                    self._error_returns(spec, err, reply)
        finally:
            client.current_task_id = b""
            _running.reset(token)
        reply.end_time = time.time()
        self.calls[spec.function_id] = self.calls.get(spec.function_id, 0) + 1
        if spec.max_calls and self.calls[spec.function_id] >= spec.max_calls:
            reply.worker_exiting = True
        self._record_event(spec, reply)
        pending_borrows = client.table.take_unregistered()
        if pending_borrows:
            with contextlib.suppress(Exception):
                client.run(client.register_borrows(pending_borrows), timeout=10)
        return reply

    def _exit_raised(self, spec: pb.TaskSpec, e: BaseException, reply: pb.TaskReply) -> None:
        """``sys.exit()`` or ``exit_actor()`` in user code: an actor ends (see actor_exit);
        in a task it is the task's error, as any exception."""
        if spec.actor_id and not spec.actor_creation:
            self.exit_request = actor_exit.request(self, spec, e)
            self._error_returns(spec, self.exit_request.error, reply)
            return
        err = exc.TaskError.from_exception(
            e, spec.function_name, hostname=self.client.hostname(), task_id=spec.task_id.hex()
        )
        self._error_returns(spec, err, reply)

    def _retryable(self, spec: pb.TaskSpec, error: BaseException) -> bool:
        if not spec.retry_exceptions:
            return False
        allowed = deserialize(spec.retry_exceptions)
        if allowed is True:
            return isinstance(error, Exception)
        return isinstance(error, tuple(allowed))

    def _store_returns(self, spec: pb.TaskSpec, values: list[Any], reply: pb.TaskReply) -> None:
        self._add_returns(self._serialize_returns(spec, values), reply, spec.owner_address)

    def _serialize_returns(
        self, spec: pb.TaskSpec, values: list[Any]
    ) -> list[tuple[bytes, SerializedValue]]:
        what = f"the return value of {spec.function_name}"
        return [
            (spec.task_id + i.to_bytes(4, "big"), serialize_value(self.client, value, what))
            for i, value in enumerate(values, start=1)
        ]

    def _add_returns(
        self, returns: list[tuple[bytes, SerializedValue]], reply: pb.TaskReply, owner: str
    ) -> None:
        """Small values inline in the reply; larger ones written to the node's store, owned
        by ``owner`` (the caller)."""
        for oid, sv in returns:
            reply.returns.add(**place(self.client, oid, sv, owner))

    def _error_returns(self, spec: pb.TaskSpec, error: BaseException, reply: pb.TaskReply) -> None:
        self.last_error = error_info(error)  # issue 17: the state API shows why it failed
        del reply.returns[:]
        reply.is_error = True
        try:
            data = serialize(error).to_bytes()
        except Exception:  # noqa: BLE001
            data = serialize(exc.NbclusterSystemError(str(error))).to_bytes()
        for i in range(1, max(spec.num_returns, 1) + 1):
            reply.returns.add(
                object_id=spec.task_id + i.to_bytes(4, "big"), data=data, size=len(data)
            )

    def _started(self, spec: pb.TaskSpec, start: float) -> None:
        self.event_log.started(spec, start)

    def _record_event(self, spec: pb.TaskSpec, reply: pb.TaskReply) -> None:
        self.event_log.ended(spec, reply, self.last_error if reply.is_error else None)

    def busy(self) -> bool:
        """A task or actor call runs now."""
        return self.event_log.running()


class WorkerClient(CoreClient):
    """The core client of a worker: blocking in get gives the CPU back."""

    executor: Executor

    def on_blocked(self, blocked: bool) -> None:
        self.executor.set_blocked(blocked)

    def running_task(self) -> RunningTask | None:
        """The call running in the caller's thread or asyncio task."""
        return _running.get()

    def map_from_store_location(self, loc: pb.ObjectLocation) -> memoryview:
        from nbcluster._runtime.core.ownership import Entry

        entry = Entry(False, loc.owner_address)
        entry.set_ready(
            in_store=True, size=loc.size, node_id=loc.node_id, node_address=loc.node_address
        )
        return self.map_from_store(loc.object_id, entry)


def main() -> None:
    """Register with the node manager and run tasks until told to stop."""
    config = Config.from_env()
    worker_id = bytes.fromhex(os.environ["NBCLUSTER_WORKER_ID"])
    node_address = os.environ["NBCLUSTER_NODE_ADDRESS"]
    token = proc.read_token(os.environ["NBCLUSTER_TOKEN_FILE"])
    parent_fd = int(os.environ.get("NBCLUSTER_PARENT_FD", "-1"))
    logging.basicConfig(level=config.log_level, stream=sys.stderr)
    host = node_address.rsplit(":", 1)[0]
    client = WorkerClient(
        mode="worker",
        config=config,
        token=token,
        head_address="",
        node_address=node_address,
        job_id=b"",
        worker_id=worker_id,
        host=host,
    )
    executor = Executor(client)
    client.executor = executor
    signal.signal(signal.SIGINT, executor.interrupt)
    client.start(lambda c: WorkerService(c, executor))
    # Before any channel can connect: the first lease's comes as soon as the node has this
    # worker, and is the main thread's even if it connects before the main thread is ready.
    executor.direct = executor._direct_loop()
    if config.task_channels:
        client.run(client.service.start_channels())
    context.set_client(client, CoreDriver(client))
    reply = client.run(
        lambda: client.node().RegisterWorker(
            pb.WorkerRegisterRequest(
                worker_id=worker_id,
                pid=os.getpid(),
                address=client.address,
                channel_address=client.service.channel_address(),
                ctrl_address=client.service.ctrl_address(),
            ),
            timeout=30,
        )
    )
    client.node_id = reply.node_id
    client.head_address = reply.head_address
    client.store_dir = reply.store_dir
    client.session_dir = reply.session_dir
    executor.mark = RunningMark.open(reply.session_dir, worker_id)
    # issue 17: apply this worker's runtime_env before any task runs; children inherit it
    runtime_env_driver.set_worker_env(client, reply.runtime_env)
    faults.freeze()  # this process's variables are set: read them once
    if parent_fd >= 0:
        client.loop.call_soon_threadsafe(
            proc.watch_parent, client.loop, parent_fd, lambda: os._exit(1)
        )
    if client.dormancy is not None:  # gRPC sleeps while this worker idles
        client.loop.call_soon_threadsafe(client.dormancy.start, executor.busy)
    asyncio.run_coroutine_threadsafe(
        executor.event_log.send_forever(client, executor.owner_check), client.loop
    )
    asyncio.run_coroutine_threadsafe(flush_forever(executor.output), client.loop)
    install_output(executor.output)
    executor.run_forever()


if __name__ == "__main__":
    main()
