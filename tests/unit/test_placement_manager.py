"""The head's placement-group manager, with its node calls replaced by a fake (no processes).

Checks the round trips it makes (one call per node; one in all for a one-node group),
that the view is charged before those calls and refunded when a node refuses or the
group is removed, that a refused group waits without polling and is tried again when
resources change, that removal answers at once and releases in the background, and that
old removed groups are forgotten. Plus ``NodeState.prepare_bundles``: all or nothing.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from nbcluster._runtime.head.placement import (
    CREATED,
    PENDING,
    REMOVED,
    WAITING_FOR_RESOURCES,
    PlacementGroupManager,
)
from nbcluster._runtime.head.state import HeadState, NodeRecord
from nbcluster._runtime.node.state import NodeState
from nbcluster._runtime.protocol.rpc import pb


class Context:
    async def abort(self, code: Any, details: str) -> None:
        raise RuntimeError(f"{code.name}: {details}")


class Reply:
    def __init__(self, ok: bool) -> None:
        self.ok = ok


def make_manager(
    nodes: dict[str, float], *, removed_kept: int = 1000
) -> tuple[PlacementGroupManager, list[tuple[str, str, list[int], bool]], set[str]]:
    state = HeadState(node_death_timeout_s=30)
    for name, cpus in nodes.items():
        state.register_node(
            NodeRecord(
                node_id=name.encode().ljust(16, b"-"),
                node_name=name,
                address=f"{name}:1",
                hostname="h",
                store_dir="",
                total={"CPU": cpus},
                available={"CPU": cpus},
                store_capacity=0,
                pid=1,
                start_time=0,
                last_heartbeat=0,
            )
        )
    calls: list[tuple[str, str, list[int], bool]] = []
    refusing: set[str] = set()
    mgr = PlacementGroupManager(state, channels=None, removed_kept=removed_kept)  # type: ignore[arg-type]

    async def fake_rpc(
        method: str,
        address: str,
        pg: Any,
        indexes: list[int],
        *,
        commit: bool = False,
        release: list[Any] | None = None,
    ) -> Reply:
        for r in release or ():
            calls.append(("release", address, [b.index for b in r.bundles], False))
        calls.append((method, address, list(indexes), commit))
        await asyncio.sleep(0)
        return Reply(not (method == "PrepareBundles" and address in refusing))

    class FakeStub:
        def __init__(self, address: str) -> None:
            self.address = address

        async def PrepareBundles(self, req: Any, timeout: float) -> Reply:  # noqa: N802
            calls.append(("call", self.address, [], False))
            for r in req.release:
                calls.append(("release", self.address, [b.index for b in r.bundles], False))
            return Reply(True)

    mgr._bundles_rpc = fake_rpc  # type: ignore[method-assign]
    mgr._stub = FakeStub  # type: ignore[method-assign, assignment]
    return mgr, calls, refusing


def create_request(pg_id: bytes, cpus: list[float], strategy: str = "PACK") -> Any:
    return pb.CreatePlacementGroupRequest(
        pg=pb.PlacementGroupInfo(
            pg_id=pg_id,
            strategy=strategy,
            bundles=[pb.Bundle(resources={"CPU": c}) for c in cpus],
        )
    )


def available(mgr: PlacementGroupManager, name: str) -> float:
    return mgr.state.nodes[name.encode().ljust(16, b"-")].available["CPU"]


def test_a_one_node_group_is_reserved_in_one_call_and_answered_created() -> None:
    async def main() -> None:
        mgr, calls, _ = make_manager({"a": 2})
        mgr.start()
        pg = await mgr.create(create_request(b"g1", [0.5, 0.5]), Context())
        assert pg.state == CREATED and pg.version == 1  # written once, in its final state
        assert calls == [("PrepareBundles", "a:1", [0, 1], True)]
        assert available(mgr, "a") == 1.0
        names = mgr.state.nodes[b"a".ljust(16, b"-")].total
        assert sum(1 for k in names if "_group_" in k) > 0  # the group's own resource names
        mgr.close()

    asyncio.run(main())


def test_a_spread_group_prepares_every_node_then_commits() -> None:
    async def main() -> None:
        mgr, calls, _ = make_manager({"a": 2, "b": 2})
        pg = await mgr.create(create_request(b"g1", [1, 1], "STRICT_SPREAD"), Context())
        assert pg.state == CREATED
        methods = sorted((m, a, tuple(i), c) for m, a, i, c in calls)
        assert [m for m, *_ in methods] == [
            "CommitBundles",
            "CommitBundles",
            "PrepareBundles",
            "PrepareBundles",
        ]
        assert all(not c for *_, c in methods)  # two phases: prepare does not commit
        assert available(mgr, "a") == available(mgr, "b") == 1.0

    asyncio.run(main())


def test_a_refused_group_waits_refunded_and_is_retried_when_resources_change() -> None:
    async def main() -> None:
        mgr, calls, refusing = make_manager({"a": 2, "b": 2})
        mgr.start()
        refusing.add("b:1")
        pg = await mgr.create(create_request(b"g1", [1, 1], "STRICT_SPREAD"), Context())
        assert pg.state == PENDING and pg.message == WAITING_FOR_RESOURCES
        assert ("CancelBundles", "a:1", [0], False) in calls  # the prepared half undone
        assert available(mgr, "a") == available(mgr, "b") == 2.0  # the view refunded
        calls.clear()
        await asyncio.sleep(0.05)
        assert calls == []  # nothing polls
        refusing.clear()
        mgr.resources_changed()  # e.g. a heartbeat
        for _ in range(100):
            if pg.state == CREATED:
                break
            await asyncio.sleep(0.01)
        assert pg.state == CREATED and pg.message == ""
        mgr.close()

    asyncio.run(main())


def test_groups_placed_at_once_do_not_share_room() -> None:
    async def main() -> None:
        mgr, _, _ = make_manager({"a": 2})
        mgr.start()
        pgs = await asyncio.gather(
            *(mgr.create(create_request(bytes([i]), [1]), Context()) for i in range(3))
        )
        assert sorted(pg.state for pg in pgs) == [PENDING, CREATED, CREATED]
        assert available(mgr, "a") == 0.0
        mgr.close()

    asyncio.run(main())


def test_removal_cancels_on_each_node_once_and_frees_the_room() -> None:
    async def main() -> None:
        mgr, calls, _ = make_manager({"a": 1})
        mgr.start()
        first = await mgr.create(create_request(b"g1", [1]), Context())
        waiting = await mgr.create(create_request(b"g2", [1]), Context())
        assert (first.state, waiting.state) == (CREATED, PENDING)
        calls.clear()
        await mgr.remove(pb.PlacementGroupRequest(pg_id=b"g1"), Context())
        assert first.state == REMOVED
        assert calls[0] == ("CancelBundles", "a:1", [0], False)  # done before the answer
        for _ in range(100):
            if waiting.state == CREATED:
                break
            await asyncio.sleep(0.01)
        assert waiting.state == CREATED  # the freed room went to the waiting group
        assert not any(
            "_group_" in k and b"g1".hex() in k for k in mgr.state.nodes[b"a".ljust(16, b"-")].total
        )
        mgr.close()

    asyncio.run(main())


def test_a_restarted_head_releases_removed_groups_again_one_call_per_node() -> None:
    async def main() -> None:
        mgr, calls, _ = make_manager({"a": 2, "b": 2})
        groups = []
        for pg_id in (b"g1", b"g2"):
            pg = await mgr.create(create_request(pg_id, [1, 1], "STRICT_SPREAD"), Context())
            await mgr.remove(pb.PlacementGroupRequest(pg_id=pg_id), Context())
            groups.append(pg)
        fresh, _, _ = make_manager({"a": 2, "b": 2})
        fresh._stub = mgr._stub  # type: ignore[method-assign]
        calls.clear()
        fresh.recover(groups)
        await asyncio.sleep(0.05)
        # Each node gets one call carrying both groups' bundles on it.
        assert sorted(a for m, a, _, _ in calls if m == "call") == ["a:1", "b:1"]
        assert sorted(a for m, a, _, _ in calls if m == "release") == ["a:1", "a:1", "b:1", "b:1"]

    asyncio.run(main())


def test_old_removed_groups_are_forgotten() -> None:
    async def main() -> None:
        mgr, _, _ = make_manager({"a": 8}, removed_kept=3)
        forgotten: list[bytes] = []
        mgr.forget = forgotten.extend
        for i in range(5):
            await mgr.create(create_request(bytes([i]), [1]), Context())
            await mgr.remove(pb.PlacementGroupRequest(pg_id=bytes([i])), Context())
        assert forgotten == [bytes([0]), bytes([1])]
        assert sorted(mgr.groups) == [bytes([2]), bytes([3]), bytes([4])]
        with pytest.raises(RuntimeError, match="NOT_FOUND"):
            await mgr.get(pb.PlacementGroupRequest(pg_id=bytes([0])), Context())

    asyncio.run(main())


def test_node_state_prepares_a_groups_bundles_all_or_nothing() -> None:
    node = NodeState(b"n", "n:1", {"CPU": 2}, prestart=0)
    assert not node.prepare_bundles(b"g", [(0, {"CPU": 1}), (1, {"CPU": 1.5})])
    assert node.available["CPU"] == 2 and node.bundles == {}
    assert node.prepare_bundles(b"g", [(0, {"CPU": 1}), (1, {"CPU": 0.5})])
    assert node.available["CPU"] == 0.5
    assert node.prepare_bundles(b"g", [(0, {"CPU": 1}), (1, {"CPU": 0.5})])  # a retry: no-op
    assert node.available["CPU"] == 0.5
    node.commit_bundles(b"g", [0, 1])
    assert any(k.startswith("CPU_group_") for k in node.total)
    node.cancel_bundles(b"g", [0, 1])
    assert node.available["CPU"] == 2 and node.bundles == {}
    assert not any("_group_" in k for k in node.total)
