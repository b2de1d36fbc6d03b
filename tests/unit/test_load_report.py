"""The node's load report (node/autoscaling.py) built from a real NodeState and StoreState."""

from __future__ import annotations

from types import SimpleNamespace

from nbcluster._runtime.node.autoscaling import LoadReporter, busy_reason
from nbcluster._runtime.node.state import NodeState
from nbcluster._runtime.objects.state import StoreState


def _reporter() -> tuple[LoadReporter, StoreState]:
    store = StoreState(1 << 20)
    state = NodeState(b"n" * 16, "127.0.0.1:1", {"CPU": 2.0}, prestart=0)
    service = SimpleNamespace(state=state, objects=SimpleNamespace(store=store))
    return LoadReporter(service, "token", clock=lambda: 100.0), store


def test_an_empty_node_reports_idle() -> None:
    reporter, _ = _reporter()
    rep = reporter.report()
    assert rep.primary_objects == 0 and rep.leased_workers == 0
    assert dict(rep.total) == {"CPU": 2.0}
    assert busy_reason(rep) == ""


def test_primary_objects_keep_the_node_and_copies_do_not() -> None:
    reporter, store = _reporter()
    assert store.create(b"a" * 20, 1000, "owner").ok
    assert store.create(b"b" * 20, 500, "owner", primary=False).ok
    rep = reporter.report()
    assert (rep.primary_objects, rep.primary_bytes) == (1, 1000)
    assert "1 object(s)" in busy_reason(rep)


def test_store_listing_names_phase_and_primary() -> None:
    _, store = _reporter()
    assert store.create(b"a" * 20, 10, "owner").ok
    store.seal(b"a" * 20)
    [entry] = store.listing()
    assert (entry.object_id, entry.size, entry.owner, entry.phase, entry.primary) == (
        b"a" * 20,
        10,
        "owner",
        "sealed",
        True,
    )
