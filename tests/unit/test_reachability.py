"""The head's reachability checks of nodes (issue 12, item 9), with a fake probe."""

from __future__ import annotations

import asyncio
import logging

import pytest

from nbcluster._runtime.head.reachability import NodeReachability, unreachable_message
from nbcluster._runtime.head.state import HeadState, NodeRecord
from nbcluster._runtime.netaddr import route_address, split_host_port


def _node(node_id: bytes, address: str) -> NodeRecord:
    return NodeRecord(
        node_id=node_id,
        node_name=node_id.decode(),
        address=address,
        hostname="h",
        store_dir="/dev/shm/x",
        total={"CPU": 1.0},
        available={"CPU": 1.0},
        store_capacity=1,
        pid=1,
        start_time=0.0,
        last_heartbeat=0.0,
    )


class FakeProbe(NodeReachability):
    def __init__(self, state: HeadState, answers: list[str]) -> None:
        super().__init__(state, token="t" * 64)
        self.answers = answers
        self.probed = 0

    async def probe(self, node: NodeRecord) -> str:
        self.probed += 1
        return self.answers.pop(0)


def test_an_unreachable_node_gets_no_work_is_logged_once_and_comes_back(
    caplog: pytest.LogCaptureFixture,
) -> None:
    state = HeadState(node_death_timeout_s=30)
    node = _node(b"n1", "127.0.0.1:7001")
    state.register_node(node)
    checker = FakeProbe(state, ["UNAVAILABLE: refused", "UNAVAILABLE: refused", ""])
    checker.head_address = "10.0.0.1:7000"
    with caplog.at_level(logging.WARNING):
        assert asyncio.run(checker.check(node)) is False
        assert state.live_nodes() == []  # no leases, no spillback, no actors
        assert asyncio.run(checker.check(node)) is False
        assert asyncio.run(checker.check(node)) is True
    assert [n.node_id for n in state.live_nodes()] == [b"n1"]
    warnings = [r.getMessage() for r in caplog.records if "advertised" in r.getMessage()]
    assert len(warnings) == 1  # reported once, not once per probe
    assert any("reachable now" in r.getMessage() for r in caplog.records)


def test_loopback_nodes_of_a_loopback_head_are_not_probed() -> None:
    state = HeadState(node_death_timeout_s=30)
    checker = FakeProbe(state, [])
    checker.head_address = "127.0.0.1:7000"
    node = _node(b"n1", "127.0.0.1:7001")
    state.register_node(node)
    assert asyncio.run(checker.check(node)) is True
    assert checker.probed == 0
    checker.head_address = "10.0.0.1:7000"  # a head other hosts join: loopback proves nothing
    assert checker.needs_probe(node)
    assert checker.needs_probe(_node(b"n2", "10.0.0.2:7001"))


def test_the_message_names_the_advertised_address_and_the_flag_that_fixes_it() -> None:
    msg = unreachable_message(_node(b"n1", "127.0.0.1:7001"), "10.0.0.1:7000", "UNAVAILABLE")
    assert "advertised 127.0.0.1:7001" in msg
    assert "loopback" in msg
    assert "nbcluster start --address 10.0.0.1:7000 --host" in msg
    other = unreachable_message(_node(b"n1", "10.9.9.9:7001"), "10.0.0.1:7000", "DEADLINE")
    assert "firewall" in other


def test_route_address_picks_the_local_end_of_the_route() -> None:
    assert route_address("127.0.0.1") == "127.0.0.1"
    assert route_address("::1") == "::1"
    assert split_host_port("[::1]:7000") == ("::1", 7000)
    with pytest.raises(ValueError, match="HOST:PORT"):
        split_host_port("no-port")
