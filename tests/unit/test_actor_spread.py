"""SPREAD places actors on the node hosting the fewest live actors, also when they hold no
CPU (load alone could not tell the nodes apart: every one went to the first node)."""

from __future__ import annotations

from nbcluster._runtime.head.actor_service import ActorManager
from nbcluster._runtime.head.actors import DEAD, ActorRecord
from nbcluster._runtime.head.state import HeadState, NodeRecord


def _node(i: int) -> NodeRecord:
    return NodeRecord(
        node_id=bytes([i]) * 16,
        node_name=f"n{i}",
        address=f"127.0.0.1:{7000 + i}",
        hostname="h",
        store_dir="/dev/shm/x",
        total={"CPU": 1.0},
        available={"CPU": 1.0},
        store_capacity=1,
        pid=i,
        start_time=0.0,
        last_heartbeat=0.0,
    )


def _actor(i: int, strategy: str = "SPREAD") -> ActorRecord:
    return ActorRecord(
        actor_id=bytes([i]) * 16,
        spec=None,
        resources={},
        name="",
        namespace="ns",
        class_name="A",
        detached=False,
        max_restarts=0,
        owner_address="o",
        job_id=b"j",
        strategy=strategy,
    )


def test_zero_cpu_actors_spread_over_every_node() -> None:
    state = HeadState(node_death_timeout_s=30)
    for i in range(3):
        state.register_node(_node(i))
    manager = ActorManager(state, channels=None)  # type: ignore[arg-type]
    placed = []
    for i in range(6):
        rec = _actor(i)
        manager.table.actors[rec.actor_id] = rec
        rec.node_address = manager._pick_node(rec) or ""
        placed.append(rec.node_address)
    assert sorted(placed) == sorted([n.address for n in state.live_nodes()] * 2)
    # A dead actor no longer counts: its node is the emptiest again.
    first = manager.table.actors[bytes([0]) * 16]
    first.state = DEAD
    assert manager._pick_node(_actor(9)) == first.node_address


def test_a_hard_affinity_to_a_restored_node_waits_for_it_instead_of_failing() -> None:
    """After a head restart a restored node is unconfirmed (no work) until it heartbeats; an
    actor restarted before then (its worker's death reported first) must wait, not fail."""
    state = HeadState(node_death_timeout_s=2)
    node = _node(1)
    state.restore_node(node, now=100.0)
    manager = ActorManager(state, channels=None)  # type: ignore[arg-type]
    rec = _actor(1, strategy=f"NODE_AFFINITY:{node.node_id.hex()}:0")
    assert state.live_nodes() == []  # gets no work yet...
    assert manager._hard_affinity_lost(rec) is None  # ...but is not given up on
    assert manager._pick_node(rec) is None  # placement retries until it heartbeats
    assert state.heartbeat(node.node_id, 101.0, {"CPU": 1.0}, 0, 0)
    assert manager._pick_node(rec) == node.address
    # Silent past the death timeout: dead, and the hard affinity can never be met.
    state.tick(104.0)
    assert manager._hard_affinity_lost(rec) == node.node_id.hex()
    unknown = _actor(2, strategy=f"NODE_AFFINITY:{'ab' * 16}:0")
    assert manager._hard_affinity_lost(unknown) == "ab" * 16
