"""An out-of-scope actor's kill is asked of the head again until it is done
(``ActorSubmitter._kill``): a request lost to an unavailable head must not leave the
actor's process running; a head that refuses it, or stays away past ``KILL_RETRY_S``, is
left alone (its own cleanup ends the owner's actors when the owner exits)."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import grpc
import pytest
from submitter_util import bare_actor_submitter

from nbcluster._runtime.core import actor_submitter
from nbcluster._runtime.protocol.errors import RpcInvalidArgument, RpcUnavailable

AID = b"a" * 16


class Head:
    """Answers ``KillActor`` with the errors it is given, then succeeds."""

    def __init__(self, errors: list[BaseException]) -> None:
        self.errors = errors
        self.requests: list[Any] = []

    async def KillActor(self, request: Any, timeout: float) -> None:  # noqa: N802 - gRPC's name
        self.requests.append(request)
        if self.errors:
            raise self.errors.pop(0)


def run_kill(head: Head) -> None:
    loop = asyncio.new_event_loop()
    try:
        sub = bare_actor_submitter(loop, head=lambda: head)
        loop.run_until_complete(asyncio.wait_for(sub._kill(AID, "out_of_scope"), 30))
    finally:
        loop.close()


def unavailable() -> RpcUnavailable:
    return RpcUnavailable(grpc.StatusCode.UNAVAILABLE, "the head is restarting")


def test_a_kill_the_head_could_not_take_is_asked_again_until_it_is_done() -> None:
    head = Head([unavailable(), unavailable()])
    run_kill(head)
    assert len(head.requests) == 3
    assert all(r.actor_id == AID and r.no_restart for r in head.requests)


def test_a_head_that_stays_away_past_kill_retry_s_is_left_alone(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(actor_submitter, "KILL_RETRY_S", 0.3)
    head = Head([unavailable() for _ in range(100)])
    with caplog.at_level(logging.WARNING, logger=actor_submitter.__name__):
        run_kill(head)
    assert 2 <= len(head.requests) <= 4  # asked again at 0.2 and 0.6 s, then given up
    assert "did not end actor" in caplog.text


def test_a_kill_the_head_refuses_is_not_asked_again(caplog: pytest.LogCaptureFixture) -> None:
    head = Head([RpcInvalidArgument(grpc.StatusCode.INVALID_ARGUMENT, "no such actor")])
    with caplog.at_level(logging.WARNING, logger=actor_submitter.__name__):
        run_kill(head)
    assert len(head.requests) == 1
    assert "did not end actor" in caplog.text
