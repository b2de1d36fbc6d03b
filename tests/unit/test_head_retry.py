"""``HeadRetry``: calls to the head retry while it is unreachable, for the grace period
counted from the call's first failure (issue 12, item 5).

A long poll (``WaitActor`` waits up to 10 minutes) may have been open longer than the grace
period when the head goes away: it must still get the whole grace period to see the head
come back, not fail at once. A fake clock stands in for time; no process is started.
"""

from __future__ import annotations

import asyncio
import types
from typing import Any

import grpc
import grpc.aio
import pytest

from nbcluster._runtime.core import head_retry as client_module
from nbcluster._runtime.core.head_retry import HeadRetry, HeadSilentError
from nbcluster._runtime.protocol.errors import translated

GRACE_S = 30.0


def unavailable() -> grpc.aio.AioRpcError:
    """What the protocol layer's stub raises for a refused connection (translated once)."""
    return translated(
        grpc.aio.AioRpcError(
            grpc.StatusCode.UNAVAILABLE,
            initial_metadata=grpc.aio.Metadata(),
            trailing_metadata=grpc.aio.Metadata(),
            details="Connection refused",
        )
    )


class FakeClock:
    """``time.monotonic`` for the client module: moves only when told to."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


class FakeHead:
    """A head stub whose ``WaitActor`` runs the scripted outcomes one call at a time:
    a number advances the clock by that many seconds and then fails UNAVAILABLE; a
    string is returned."""

    def __init__(self, clock: FakeClock, script: list[float | str]) -> None:
        self.clock = clock
        self.script = list(script)
        self.calls = 0

    async def WaitActor(self, *args: Any, **kwargs: Any) -> str:  # noqa: N802 - gRPC name
        self.calls += 1
        step = self.script.pop(0)
        if isinstance(step, str):
            return step
        self.clock.now += step
        raise unavailable()


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    fake = FakeClock()
    monkeypatch.setattr(client_module, "time", fake)
    real_sleep = asyncio.sleep

    async def no_wait(_delay: float) -> None:  # the back-off between tries: no real wait
        await real_sleep(0)

    monkeypatch.setattr(client_module.asyncio, "sleep", no_wait)
    return fake


def head_retry(head: FakeHead) -> HeadRetry:
    fake_client = types.SimpleNamespace(
        config=types.SimpleNamespace(head_grace_period_s=GRACE_S),
        closed=False,
        head_address="127.0.0.1:1",
        channels=types.SimpleNamespace(stub=lambda address, kind: head),
    )
    return HeadRetry(fake_client)  # type: ignore[arg-type]


def test_a_long_poll_cut_after_the_grace_period_still_gets_the_whole_grace_period(
    clock: FakeClock,
) -> None:
    # The poll was open 10 minutes when the head died; it came back 20 s later.
    head = FakeHead(clock, [600.0, 10.0, 10.0, "answered"])
    assert asyncio.run(head_retry(head).WaitActor()) == "answered"
    assert head.calls == 4


def test_a_head_that_stays_away_fails_the_call_after_the_grace_period(clock: FakeClock) -> None:
    head = FakeHead(clock, [600.0, *([1.0] * 100)])
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        asyncio.run(head_retry(head).WaitActor())
    assert raised.value.code() == grpc.StatusCode.UNAVAILABLE
    # Given up once the head had been away for the grace period, not before, not long after.
    assert head.calls == 1 + int(GRACE_S) + 1


# A stopped head (SIGSTOP) resets nothing: calls hang instead of failing. Real time here,
# with a grace period of a fraction of a second; the fakes never touch a socket.
SHORT_GRACE_S = 0.4


class SlowHead:
    """A head stub whose ``WaitActor`` answers after ``poll_s`` and whose probe
    (``GetClusterInfo``) answers at once, or never when the head is ``stopped``."""

    def __init__(self, poll_s: float, *, stopped: bool) -> None:
        self.poll_s = poll_s
        self.stopped = stopped
        self.probes = 0

    async def WaitActor(self, *args: Any, **kwargs: Any) -> str:  # noqa: N802 - gRPC name
        await asyncio.sleep(self.poll_s)
        return "answered"

    async def GetClusterInfo(self, *args: Any, **kwargs: Any) -> str:  # noqa: N802
        self.probes += 1
        if self.stopped:
            await asyncio.sleep(3600)
        return "info"


def short_grace_retry(head: SlowHead) -> HeadRetry:
    fake_client = types.SimpleNamespace(
        config=types.SimpleNamespace(head_grace_period_s=SHORT_GRACE_S),
        closed=False,
        head_address="127.0.0.1:1",
        channels=types.SimpleNamespace(stub=lambda address, kind: head),
    )
    return HeadRetry(fake_client)  # type: ignore[arg-type]


def test_a_long_poll_on_a_head_that_answers_probes_is_not_a_failure() -> None:
    head = SlowHead(poll_s=5 * SHORT_GRACE_S, stopped=False)
    assert asyncio.run(short_grace_retry(head).WaitActor()) == "answered"
    assert head.probes >= 1  # the head was asked, and answered


def test_a_call_to_a_stopped_head_fails_after_the_grace_period_not_its_own_timeout() -> None:
    head = SlowHead(poll_s=3600, stopped=True)

    async def call() -> str:
        # The deadline only guards against a hang; the call must end long before.
        return await asyncio.wait_for(short_grace_retry(head).WaitActor(), timeout=60)

    with pytest.raises(HeadSilentError) as raised:
        asyncio.run(call())
    assert raised.value.code() == grpc.StatusCode.UNAVAILABLE
    assert head.probes >= 1
