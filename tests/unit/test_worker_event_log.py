"""A worker's task events (``worker/event_log.py``): what an attempt records, and what one
send reports to the head, without processes."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from nbcluster._runtime.protocol.rpc import pb
from nbcluster._runtime.worker import event_log
from nbcluster._runtime.worker.event_log import EventLog


class _Head:
    def __init__(self) -> None:
        self.reports: list[pb.TaskEventsRequest] = []

    async def ReportTaskEvents(self, request: pb.TaskEventsRequest, timeout: float) -> None:  # noqa: N802
        self.reports.append(request)


class _Client:
    node_id = b"n" * 8
    worker_id = b"w" * 8

    def __init__(self) -> None:
        self._head = _Head()

    def head(self) -> Any:
        return self._head


def _spec(task_id: bytes, disabled: bool = False) -> pb.TaskSpec:
    return pb.TaskSpec(task_id=task_id, function_name="f", disable_task_events=disabled)


def test_an_attempt_is_running_until_it_ends_and_then_recorded() -> None:
    log = EventLog()
    assert not log.running()
    log.started(_spec(b"t1"), 1.0)
    assert log.running()
    log.ended(_spec(b"t1"), pb.TaskReply(start_time=1.0, end_time=2.0), None)
    assert not log.running()
    log.started(_spec(b"t2", disabled=True), 3.0)
    log.ended(_spec(b"t2", disabled=True), pb.TaskReply(), None)  # enable_task_events=False
    assert not log.running()
    assert [ev[0].task_id for ev in log.events] == [b"t1"]


def test_a_send_reports_finished_failed_and_still_running_attempts(monkeypatch) -> None:
    monkeypatch.setattr(event_log, "SEND_INTERVAL_S", 0.01)
    client = _Client()
    log = EventLog()
    log.started(_spec(b"ok"), 1.0)
    log.ended(_spec(b"ok"), pb.TaskReply(start_time=1.0, end_time=2.0), None)
    log.started(_spec(b"bad"), 1.5)
    log.ended(_spec(b"bad"), pb.TaskReply(start_time=1.5, end_time=2.5), ("ValueError", "no"))
    log.started(_spec(b"long"), 3.0)

    async def main() -> None:
        sender = asyncio.ensure_future(log.send_forever(client, lambda: False))  # type: ignore[arg-type]
        try:
            for _ in range(500):
                if client._head.reports:
                    break
                await asyncio.sleep(0.01)
        finally:
            sender.cancel()
            with pytest.raises(asyncio.CancelledError):
                await sender

    asyncio.run(main())
    assert len(client._head.reports) == 1
    states = {ev.task_id: ev for ev in client._head.reports[0].events}
    assert states[b"ok"].state == "FINISHED" and states[b"ok"].end_time == 2.0
    assert states[b"bad"].state == "FAILED" and states[b"bad"].error_type == "ValueError"
    assert states[b"long"].state == "RUNNING"
    assert {ev.node_id for ev in states.values()} == {_Client.node_id}
    assert log.events == [] and log.running()
