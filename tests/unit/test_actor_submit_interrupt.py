"""A Ctrl-C on the main thread while it submits an actor call (``ActorSubmitter.submit``)
is held until the call is counted and written: it never leaves a call in flight that was
not sent, which the caller would wait for, and the actor would never be idle for."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
from collections.abc import Iterator

import pytest
from submitter_util import bare_actor_submitter

from nbcluster._runtime.core.actor_state import ActorConn
from nbcluster._runtime.core.records import TaskRecord
from nbcluster._runtime.protocol.rpc import pb

AID = b"a" * 16


class Call:
    """An actor's channel whose first write is interrupted by a Ctrl-C (SIGINT)."""

    def __init__(self) -> None:
        self.frames: list[bytes] = []

    def thread_writable(self) -> bool:
        return True

    def send_from_thread(self, frame: bytes) -> int:
        os.kill(os.getpid(), signal.SIGINT)  # lands here, on the main thread
        self.frames.append(frame)
        return len(frame)


@pytest.fixture
def default_sigint() -> Iterator[None]:
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def test_a_ctrl_c_while_a_call_is_written_comes_after_it_is_sent(default_sigint: None) -> None:
    assert threading.current_thread() is threading.main_thread()
    loop = asyncio.new_event_loop()
    try:
        sub = bare_actor_submitter(loop)
        conn = ActorConn(AID)
        conn.state, conn.stream, conn.call = pb.ActorInfo.ALIVE, 1, Call()
        sub.state.conns[AID] = conn
        rec = TaskRecord()
        rec.task_id = b"t" * 16
        rec.spec = pb.TaskSpec(task_id=rec.task_id, actor_id=AID, function_name="ping")
        rec.dep_ids = []
        with pytest.raises(KeyboardInterrupt):
            sub.submit(rec, -1)
        # The interrupt came after the call was whole: in flight, and written.
        assert rec.task_id in conn.inflight
        assert len(conn.call.frames) == 1 and sub.sent_direct == 1
        assert sub.pending_counts[AID] == 1
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # restored
    finally:
        loop.close()
