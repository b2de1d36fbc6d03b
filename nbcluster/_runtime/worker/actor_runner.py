"""Runs the calls of a threaded or async actor, one concurrency group at a time limit each.

As in Ray, each concurrency group has its own threads (a sync actor: a pool of ``limit``
threads per group) or its own event loop on its own thread (an async actor), so a busy or
blocked group never holds up another; :class:`~nbcluster._runtime.worker.concurrency.
GroupQueues` decides which calls start. A plain sync actor (``max_concurrency=1`` and no
groups) does not use this: its calls run in order on the worker's main thread.

Cancellation follows Ray: a call that has not started never runs (``TaskCancelledError``);
a running async call gets ``asyncio.CancelledError`` at its ``await`` (and, if that ends
it, its caller gets a ``TaskCancelledError`` that is also a ``TaskError``); a running
sync call only sees ``get_runtime_context().is_canceled()`` turn True.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from typing import Any

from nbcluster._runtime import exceptions as exc
from nbcluster._runtime.loops import new_event_loop
from nbcluster._runtime.protocol.rpc import pb
from nbcluster._runtime.serialization import deserialize
from nbcluster._runtime.worker import actor_exit
from nbcluster._runtime.worker.concurrency import DEFAULT_GROUP, GroupQueues
from nbcluster._runtime.worker.executor_view import ExecutorView
from nbcluster._runtime.worker.owner_stream import ReplySink

__all__ = ["ActorCallRunner", "cancel_call", "cancelled_error"]

#: Task ids remembered for cancels that arrive before their call (bounded).
_MAX_EARLY_CANCELS = 10_000


def cancelled_error(spec: pb.TaskSpec, executor: ExecutorView) -> exc.TaskError:
    """The error of a running call that a cancel ended: a ``TaskError`` whose cause is a
    ``TaskCancelledError``, so ``get`` raises an error that is both (as Ray's
    ``RayTaskError(TaskCancelledError)``)."""
    try:
        raise exc.TaskCancelledError(spec.task_id.hex())
    except exc.TaskCancelledError as e:
        return exc.TaskError.from_exception(
            e,
            spec.function_name,
            hostname=executor.client.hostname(),
            task_id=spec.task_id.hex(),
        )


def _reply(spec: pb.TaskSpec) -> pb.TaskReply:
    return pb.TaskReply(task_id=spec.task_id, attempt=spec.attempt)


def _send(stream: ReplySink, reply: pb.TaskReply) -> None:
    stream.send(reply)


def cancel_call(executor: ExecutorView, task_id: bytes) -> None:
    """``CancelTask`` for an actor call (I/O loop): never interrupts the actor's thread."""
    runner = executor.actor_calls
    if runner is not None:
        runner.cancel(task_id)
        return
    with executor._lock:  # a plain sync actor: flag it; execute() drops it if not started
        if (
            task_id == executor.running
            or task_id in executor.pending
            or len(executor.cancelled) < _MAX_EARLY_CANCELS
        ):
            executor.cancelled.add(task_id)


class ActorCallRunner:
    """The calls of one threaded or async actor, run per concurrency group."""

    def __init__(self, executor: ExecutorView, limits: dict[str, int], is_async: bool) -> None:
        self.executor = executor
        self.is_async = is_async
        self.state = GroupQueues(limits)
        self.lock = threading.Lock()
        self.changed = threading.Condition(self.lock)
        self.calls: dict[bytes, tuple[pb.TaskSpec, ReplySink]] = {}
        self.tasks: dict[bytes, tuple[asyncio.AbstractEventLoop, asyncio.Task[Any]]] = {}
        self.pools: dict[str, concurrent.futures.ThreadPoolExecutor] = {}
        self.loops: dict[str, asyncio.AbstractEventLoop] = {}
        self._spawned: set[asyncio.Task[Any]] = set()
        for name, limit in limits.items():
            label = name or "default"
            if is_async:
                loop = new_event_loop()
                threading.Thread(
                    target=loop.run_forever, name=f"actor-loop-{label}", daemon=True
                ).start()
                self.loops[name] = loop
            else:
                self.pools[name] = concurrent.futures.ThreadPoolExecutor(
                    limit, thread_name_prefix=f"actor-{label}"
                )

    @property
    def default_loop(self) -> asyncio.AbstractEventLoop | None:
        """The default group's event loop (async actors), where sync callers run coroutines."""
        return self.loops.get(DEFAULT_GROUP)

    # -- the worker's main thread -------------------------------------------------------------
    def submit(self, spec: pb.TaskSpec, stream: ReplySink) -> None:
        """A call arrived: start it now if its group has room, else queue it."""
        ex = self.executor
        if self._exiting():
            _send(stream, actor_exit.refused(ex, spec))
            return
        group = spec.concurrency_group or DEFAULT_GROUP
        with self.lock:
            if group not in self.state:
                reply = _reply(spec)
                err = ValueError(
                    f"the actor has no concurrency group {group!r}; calls name one of the "
                    "groups given in @nbcluster.remote(concurrency_groups=...)"
                )
                ex._error_returns(
                    spec, exc.TaskError.from_exception(err, spec.function_name), reply
                )
                _send(stream, reply)
                return
            self.calls[spec.task_id] = (spec, stream)
            start = self.state.submit(spec.task_id, group)
        self._start(start)

    # -- the I/O loop -----------------------------------------------------------------------
    def cancel(self, task_id: bytes) -> None:
        """Cancel a call: drop it if waiting, cancel its asyncio task if running (async)."""
        with self.lock:
            ex = self.executor
            if task_id in self.calls or len(ex.cancelled) < _MAX_EARLY_CANCELS:
                ex.cancelled.add(task_id)  # is_canceled(); a call not arrived yet never runs
            if self.state.cancel(task_id):
                spec, stream = self.calls.pop(task_id)
                ex.cancelled.discard(task_id)
                reply = _reply(spec)
                reply.cancelled = True
                ex._error_returns(spec, exc.TaskCancelledError(task_id.hex()), reply)
                _send(stream, reply)
                return
            running = self.tasks.get(task_id)
        if running is not None:
            loop, task = running
            loop.call_soon_threadsafe(task.cancel)

    # -- running ------------------------------------------------------------------------------
    def _start(self, call_ids: list[bytes]) -> None:
        for task_id in call_ids:
            with self.lock:
                spec, stream = self.calls[task_id]
            group = spec.concurrency_group or DEFAULT_GROUP
            if self._exiting():  # calls that have not started fail
                _send(stream, actor_exit.refused(self.executor, spec))
                self._finished(task_id)
                continue
            if self.is_async:
                # one hand-off to the group's loop per call (no concurrent future to complete)
                loop = self.loops[group]
                loop.call_soon_threadsafe(self._spawn, loop, spec, stream)
            else:
                self.pools[group].submit(self._run_thread, spec, stream)

    def _spawn(self, loop: asyncio.AbstractEventLoop, spec: pb.TaskSpec, stream: ReplySink) -> None:
        task = loop.create_task(self._run_async(spec, stream))
        self._spawned.add(task)  # a strong ref until the call ends
        task.add_done_callback(self._spawned.discard)

    def _exiting(self) -> bool:
        """The actor ends itself on purpose (an unexpected exit just ends the process)."""
        request = self.executor.exit_request
        return request is not None and request.intended

    def _run_thread(self, spec: pb.TaskSpec, stream: ReplySink) -> None:
        ex = self.executor
        reply = ex._captured(spec, stream, ex.execute)
        self._done(spec, stream, reply)

    async def _run_async(self, spec: pb.TaskSpec, stream: ReplySink) -> None:
        ex = self.executor
        task_id = spec.task_id
        task = asyncio.current_task()
        assert task is not None
        with self.lock:
            self.tasks[task_id] = (asyncio.get_running_loop(), task)
            cancelled_before = task_id in ex.cancelled
        try:
            if cancelled_before:
                reply = _reply(spec)
                reply.cancelled = True
                ex._error_returns(spec, exc.TaskCancelledError(task_id.hex()), reply)
            else:
                # this asyncio task's context: its prints are this call's output
                slot = ex.output.begin(task_id, stream)
                try:
                    reply = await ex.execute_async(spec)
                finally:
                    ex._end_output(slot, stream)
                if task_id in ex.cancelled and reply.is_error:
                    self._as_cancelled(spec, reply)
        finally:
            with self.lock:
                self.tasks.pop(task_id, None)
        self._done(spec, stream, reply)

    def _as_cancelled(self, spec: pb.TaskSpec, reply: pb.TaskReply) -> None:
        """A cancelled call that ended with ``asyncio.CancelledError``: report the cancel."""
        try:
            err = deserialize(reply.returns[0].data) if reply.returns else None
        except Exception:  # noqa: BLE001 - leave the reply as it is
            return
        if isinstance(err, exc.TaskError) and isinstance(err.cause, asyncio.CancelledError):
            reply.cancelled = True
            self.executor._error_returns(spec, cancelled_error(spec, self.executor), reply)

    def _done(self, spec: pb.TaskSpec, stream: ReplySink, reply: pb.TaskReply) -> None:
        ex = self.executor
        request = ex.exit_request
        if request is not None and request.task_id == spec.task_id:
            self._finished(spec.task_id, start_next=False)
            # Not on this thread: it may be a group's event loop, which must keep running
            # the calls that finish before the actor exits.
            threading.Thread(
                target=actor_exit.finish, args=(ex, stream, reply, self), name="actor-exit"
            ).start()
            return
        _send(stream, reply)
        self._finished(spec.task_id)

    def _finished(self, task_id: bytes, start_next: bool = True) -> None:
        """A call ended (or was answered without running): start what its group allows,
        or, if the actor is ending itself, answer those calls with ``ActorDiedError``."""
        ended = [task_id]
        while ended:
            with self.lock:
                call_id = ended.pop()
                self.executor.cancelled.discard(call_id)
                self.calls.pop(call_id, None)
                start = self.state.finished(call_id)
                self.changed.notify_all()
                refuse = [(c, self.calls.get(c)) for c in start] if self._exiting() else []
            if refuse:
                for next_id, entry in refuse:  # they must not run
                    if entry is not None:
                        _send(entry[1], actor_exit.refused(self.executor, entry[0]))
                    ended.append(next_id)
            elif start and start_next:
                self._start(start)

    # -- exit ---------------------------------------------------------------------------------
    def drain(self) -> list[tuple[pb.TaskSpec, ReplySink]]:
        """Drop every call that has not started; return them (to answer them)."""
        with self.lock:
            dropped = [self.calls.pop(task_id) for task_id in self.state.drain()]
            self.changed.notify_all()
        return dropped

    def wait_idle(self, timeout: float) -> bool:
        """Wait until no call runs; False at the deadline."""
        with self.lock:
            return self.changed.wait_for(lambda: self.state.running() == 0, timeout)
