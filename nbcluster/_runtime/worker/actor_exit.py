"""An actor that ends itself: ``nbcluster.actor.exit_actor()`` or ``sys.exit()`` in a method.

Ray's rules (``_raylet.pyx``, ``task_execution_handler``): ``exit_actor()`` and
``sys.exit(0)`` are an *intended* exit: the caller of that call gets ``ActorDiedError``,
calls that have not started fail with ``ActorDiedError``, calls already running (threaded
and async actors) finish first, ``atexit`` handlers run, and the actor is not restarted.
``sys.exit()`` (code ``None``) or a non-zero code is an *unexpected* exit: the process ends
like a crash, so ``max_restarts`` restarts the actor and ``max_task_retries`` retries the
calls that were running; without them, callers get ``ActorDiedError``.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
import time

from nbcluster._runtime import exceptions as exc
from nbcluster._runtime.protocol.rpc import pb
from nbcluster._runtime.serialization import serialize
from nbcluster._runtime.worker.executor_view import CallRunner, ExecutorView, ExitRequest
from nbcluster._runtime.worker.owner_stream import ReplySink

__all__ = ["ExitRequest", "IntendedExit", "finish", "refused", "request"]

#: How long replies may take to leave before the process exits anyway.
FLUSH_TIMEOUT_S = 5.0


class IntendedExit(SystemExit):
    """Raised by ``exit_actor()`` in a sync or threaded actor's call (an intended exit)."""

    def __init__(self) -> None:
        super().__init__(0)


def request(executor: ExecutorView, spec: pb.TaskSpec, raised: BaseException) -> ExitRequest:
    """What ``raised`` (``SystemExit`` or ``AsyncioActorExit``) in call ``spec`` asks for."""
    if isinstance(raised, (IntendedExit, exc.AsyncioActorExit)):
        intended, code, how = True, 0, "exit_actor() was called"
    else:
        assert isinstance(raised, SystemExit)
        value = raised.code
        intended = value == 0
        code = 0 if intended else (value if isinstance(value, int) else 1)
        how = f"sys.exit({'' if value is None else repr(value)}) was called"
    reason = f"{how} in {spec.function_name}"
    error = exc.ActorDiedError(
        executor.actor_id.hex(),
        reason=reason,
        pid=os.getpid(),
        hostname=executor.client.hostname(),
        exited=intended,
    )
    return ExitRequest(spec.task_id, intended, code, reason, error)


def refused(executor: ExecutorView, spec: pb.TaskSpec) -> pb.TaskReply:
    """The reply to a call that reached an exiting actor: ``ActorDiedError``."""
    reply = pb.TaskReply(task_id=spec.task_id, attempt=spec.attempt)
    assert executor.exit_request is not None
    executor._error_returns(spec, executor.exit_request.error, reply)
    return reply


def _as_died(reply: pb.TaskReply, error: BaseException) -> None:
    data = serialize(error).to_bytes()
    count = max(len(reply.returns), 1)
    del reply.returns[:]
    reply.is_error = True
    for i in range(1, count + 1):
        oid = reply.task_id + i.to_bytes(4, "big")
        reply.returns.add(object_id=oid, data=data, size=len(data))


def finish(
    executor: ExecutorView,
    stream: ReplySink,
    reply: pb.TaskReply,
    runner: CallRunner | None = None,
) -> None:
    """End the process after the call that asked to exit (never returns)."""
    req = executor.exit_request
    assert req is not None
    streams = {stream}
    if req.intended:
        if not reply.is_error:  # user code caught the exit: its caller still sees the death
            _as_died(reply, req.error)
        stream.send(reply)
        waiting = runner.drain() if runner is not None else executor.drain_pending()
        for spec, st in waiting:
            streams.add(st)
            st.send(refused(executor, spec))
        if runner is not None:
            runner.wait_idle(timeout=3600.0)  # running calls finish first (Ray)
    # (an unexpected exit drops the reply: the caller sees the process die, as on a crash)
    deadline = time.monotonic() + FLUSH_TIMEOUT_S
    while time.monotonic() < deadline and not all(s.flushed() for s in streams):
        time.sleep(0.01)
    time.sleep(0.1)  # the last batch leaves the gRPC stream
    if req.intended:  # the head records the end (no restart) and leaves the process to us
        client = executor.client
        with contextlib.suppress(Exception):
            client.run(
                lambda: client.head().KillActor(
                    pb.KillActorRequest(
                        actor_id=executor.actor_id,
                        no_restart=True,
                        reason=req.reason,
                        kind="exited",
                    ),
                    timeout=10,
                ),
                timeout=15,
            )
    with contextlib.suppress(Exception):
        atexit._run_exitfuncs()
    with contextlib.suppress(Exception):
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(req.code)
