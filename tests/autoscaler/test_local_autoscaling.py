"""A cluster of processes that grows under load and shrinks when idle (local provider).

One autoscaling cluster for the module: ``init(num_cpus=1)`` with ``autoscale_max_nodes=3``
and a 2 s idle timeout, as ``%cluster start --num-cpus 1 --max-nodes 3 --idle-timeout 2``
does. Each test waits for the cluster to be back at its one node before it starts.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import nbcluster
from nbcluster import state
from nbcluster.autoscaler.sdk import request_resources
from nbcluster.cluster import LocalCluster
from nbcluster.testing import assert_no_processes, poll_for
from nbcluster.util.scheduling_strategies import NodeAffinitySchedulingStrategy

pytestmark = pytest.mark.integration

IDLE_S = 2.0
DEADLINE = 60.0


@pytest.fixture(scope="module")
def autoscaling() -> Iterator[Any]:
    if nbcluster.is_initialized():
        nbcluster.shutdown()
    info = nbcluster.init(
        num_cpus=1,
        _system_config={"autoscale_max_nodes": 3, "autoscale_idle_timeout_s": IDLE_S},
    )
    yield info
    nbcluster.shutdown()
    assert_no_processes(info.session_dir, timeout=20)


def live() -> list[str]:
    return sorted(n["NodeName"] for n in nbcluster.nodes() if n["Alive"])


def workers() -> list[str]:
    return [n for n in live() if n.startswith("local-worker-")]


def events(kind: str) -> list[Any]:
    return [e for e in state.autoscaler_status().events if e.kind == kind]


@pytest.fixture
def one_node(autoscaling: Any) -> Any:
    """Start (and end) each test with the cluster back at its first node."""
    request_resources(num_cpus=0)
    poll_for(lambda: not workers(), DEADLINE, 0.1, f"workers left over: {workers()}")
    yield autoscaling
    request_resources(num_cpus=0)


@nbcluster.remote
def busy(seconds: float) -> str:
    time.sleep(seconds)
    return nbcluster.get_runtime_context().get_node_id()


def test_grows_under_load_and_shrinks_when_idle(one_node: Any) -> None:
    launched_before = len(events("launch"))
    refs = [busy.remote(1.5) for _ in range(6)]
    poll_for(lambda: len(workers()) == 2, DEADLINE, 0.05, "the cluster did not grow to 3 nodes")
    ran_on = set(nbcluster.get(refs, timeout=DEADLINE))
    assert len(ran_on) >= 2, "the new nodes ran none of the tasks"
    assert len(events("launch")) > launched_before
    joined = events("joined")
    assert joined and "joined after" in joined[-1].message
    st = state.autoscaler_status()
    assert st.enabled and st.provider == "local" and st.max_workers == 2
    assert [t.name for t in st.node_types] == ["worker"]
    # Idle again: back to one node after the idle timeout.
    poll_for(lambda: not workers(), DEADLINE, 0.1, "idle nodes were not removed")
    removed = events("terminate")
    assert removed and f"(idle timeout {IDLE_S:g}s)" in removed[-1].message


def test_time_from_burst_to_a_new_node_running_tasks(one_node: Any) -> None:
    """The issue's target is <= 2 s; the assert only guards against a hang (shared CI)."""
    blocker = busy.remote(30.0)  # holds the only CPU until cancelled
    poll_for(lambda: nbcluster.available_resources().get("CPU", 0) == 0, DEADLINE, 0.02)
    t0 = time.monotonic()
    first = busy.remote(0.0)
    node = nbcluster.get(first, timeout=DEADLINE)
    elapsed = time.monotonic() - t0
    print(f"burst -> new node running a task: {elapsed:.2f}s")
    nbcluster.cancel(blocker, force=True)
    assert node != nbcluster.get_runtime_context().get_node_id()


def test_infeasible_request_is_reported_once_and_never_launched(one_node: Any) -> None:
    @nbcluster.remote(num_gpus=1)
    def needs_gpu() -> None:
        return None

    launches = len(events("launch"))
    with pytest.warns(nbcluster.exceptions.InfeasibleResourceWarning):
        ref = needs_gpu.remote()
        poll_for(lambda: events("infeasible"), DEADLINE, 0.1, "no infeasible event")
        time.sleep(3.0)  # several more autoscaler rounds with the same demand
    found = events("infeasible")
    assert len(found) == 1
    assert found[0].shape == {"CPU": 1.0, "GPU": 1.0}
    assert "no node type can ever hold {CPU: 1, GPU: 1}" in found[0].message
    assert "worker {CPU: 1" in found[0].message  # names the node types
    assert len(events("launch")) == launches and not workers()
    st = state.autoscaler_status()
    assert [dict(s) for s, _ in st.infeasible] == [{"CPU": 1.0, "GPU": 1.0}]
    nbcluster.cancel(ref)


def _second_node() -> str:
    """Fill the first node, so that the autoscaler adds one; return the new node's id."""
    home = nbcluster.get_runtime_context().get_node_id()
    blocker = busy.remote(30.0)  # holds the first node's CPU until cancelled
    poll_for(lambda: nbcluster.available_resources().get("CPU", 0) == 0, DEADLINE, 0.02)
    nid = nbcluster.get(busy.remote(0.0), timeout=DEADLINE)
    nbcluster.cancel(blocker, force=True)
    assert nid != home, "the probe ran on the first node"
    return nid


def _alive(node_id: str) -> bool:
    return any(n["NodeID"] == node_id and n["Alive"] for n in nbcluster.nodes())


def test_a_node_with_an_actor_or_objects_only_there_is_kept(one_node: Any) -> None:
    nid = _second_node()
    here = NodeAffinitySchedulingStrategy(nid, soft=False)

    @nbcluster.remote(num_cpus=0)
    class Keeper:
        def ping(self) -> str:
            return "pong"

    @nbcluster.remote(num_cpus=0)
    def make() -> Any:
        return np.ones(2**20)  # 8 MiB: stored in that node's object store

    keeper = Keeper.options(scheduling_strategy=here).remote()
    assert nbcluster.get(keeper.ping.remote(), timeout=DEADLINE) == "pong"
    obj = make.options(scheduling_strategy=here).remote()
    nbcluster.wait([obj], timeout=DEADLINE)
    time.sleep(3 * IDLE_S)
    assert _alive(nid), "the node hosting an actor was removed"
    nbcluster.kill(keeper)
    time.sleep(3 * IDLE_S)
    assert _alive(nid), "the node holding the only copy of an object was removed"
    assert nbcluster.get(obj, timeout=DEADLINE).sum() == 2**20
    del obj
    try:
        poll_for(lambda: not _alive(nid), DEADLINE, 0.1)
    except AssertionError:
        raise AssertionError(f"the node was not removed once idle: {_diagnose(nid)}") from None


def _diagnose(node_id: str) -> str:
    """What the head knows of a node's load, and the autoscaler's log (for failures)."""
    from nbcluster._runtime import context
    from nbcluster._runtime.node.autoscaling import busy_reason
    from nbcluster._runtime.protocol.protos import autoscaler_pb2 as apb
    from nbcluster._runtime.protocol.protos import autoscaler_pb2_grpc as apb_grpc
    from nbcluster._runtime.protocol.rpc import auth_metadata, make_sync_channel

    client = context.require_client()
    channel = make_sync_channel(client.head_address, client.token)
    reply = apb_grpc.AutoscalingStub(channel).GetDemand(
        apb.DemandRequest(), metadata=auth_metadata(client.token), timeout=10
    )
    channel.close()
    loads = [
        f"{n.node_name}: busy={busy_reason(n.load)!r} idle={n.load.idle_s:.1f}s "
        f"draining={n.load.draining}"
        for n in reply.nodes
        if n.node_id.hex() == node_id
    ]
    log = Path(state.session_info()["session_dir"]) / "logs" / "monitor.log"
    events = [f"{e.kind}: {e.message}" for e in state.autoscaler_status().events[-8:]]
    return f"{loads} events={events} monitor log: {log.read_text()[-2000:]}"


def test_request_resources_scales_without_tasks(one_node: Any) -> None:
    request_resources(num_cpus=3)
    poll_for(lambda: len(workers()) == 2, DEADLINE, 0.1, "request_resources did not scale up")
    time.sleep(2 * IDLE_S)
    assert len(workers()) == 2, "nodes kept for request_resources were removed"
    assert state.autoscaler_status().requested == (({"CPU": 1.0}, 3),)
    request_resources(num_cpus=0)
    poll_for(lambda: not workers(), DEADLINE, 0.1, "nodes stayed after the request was cleared")


def test_request_resources_checks_its_arguments_like_ray(one_node: Any) -> None:
    with pytest.raises(TypeError, match=r"^num_cpus should be of type int\.$"):
        request_resources(num_cpus=1.5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"^bundles should be of type List$"):
        request_resources(bundles={"CPU": 1})  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"^each bundle value should be a number"):
        request_resources(bundles=[{"CPU": True}])
    with pytest.raises(ValueError, match=r"finite numbers >= 0"):
        request_resources(bundles=[{"CPU": -1}])


def test_a_head_restart_resumes_with_the_nodes_it_had(one_node: Any) -> None:
    request_resources(num_cpus=3)
    poll_for(lambda: len(workers()) == 2, DEADLINE, 0.1, "request_resources did not scale up")
    before = workers()
    cluster = state.local_cluster()
    provider_file = Path(cluster.session_dir) / "autoscaler" / "local-nodes.json"
    ids = sorted(json.loads(provider_file.read_text()))
    cluster.restart_head()
    # Nodes register again under their names; the autoscaler neither relaunches nor drops.
    poll_for(lambda: workers() == before, DEADLINE, 0.2, "nodes did not come back")
    poll_for(lambda: state.autoscaler_status().enabled, DEADLINE, 0.2, "no report after restart")
    time.sleep(2.0)
    assert workers() == before
    assert sorted(json.loads(provider_file.read_text())) == ids
    st = state.autoscaler_status()
    assert st.requested == (({"CPU": 1.0}, 3),)  # kept in the head's database
    assert not [e for e in st.events if e.kind in ("launch", "lost", "launch-failed")]
    assert (st.running, st.launching) == (2, 0)


def test_failed_launches_back_off_and_are_reported(tmp_path: Path, autoscaling: Any) -> None:
    cfg = {
        "cluster_name": "failing",
        "max_workers": 1,
        "provider": {"type": "local"},
        "available_node_types": {"w": {"resources": {"CPU": 1}, "min_workers": 1}},
        "worker_setup_commands": ["echo no such image >&2; exit 3"],
        "update_interval_s": 0.2,
        "launch_backoff_s": 0.5,
    }
    cluster = LocalCluster(num_cpus=0, temp_dir=str(tmp_path), autoscaler_config=cfg).start()
    try:
        token = cluster.token_file

        def failures() -> list[Any]:
            st = state.autoscaler_status(cluster.address, str(token))
            return [e for e in st.events if e.kind == "launch-failed"]

        poll_for(lambda: len(failures()) >= 3, DEADLINE, 0.1, "no repeated failures")
        found = failures()
        assert "setup command 'echo no such image >&2; exit 3' failed (exit 3): no such image" in (
            found[0].message
        )
        assert [e.message.split("; ")[-1] for e in found[:3]] == [
            "failure 1, retrying in 0s",  # 0.5 s, printed rounded
            "failure 2, retrying in 1s",
            "failure 3, retrying in 2s",
        ]
        assert found[1].time - found[0].time >= 0.4  # the back-off was waited out
        st = state.autoscaler_status(cluster.address, str(token))
        assert st.node_types[0].failures >= 3
    finally:
        cluster.stop()
    assert_no_processes(cluster.session_dir, timeout=20)


def test_status_widget_and_server_model_show_the_scaling(one_node: Any) -> None:
    from nbcluster.jupyter.server.status import load_from_status
    from nbcluster.jupyter.widgets import Autoscaler
    from nbcluster.jupyter.widgets._feed import Feed

    feed = Feed(autostart=False)
    since = time.time()
    widget = Autoscaler(feed=feed)
    try:
        request_resources(num_cpus=2)
        poll_for(lambda: len(workers()) == 1, DEADLINE, 0.1, "request_resources did not scale up")

        def seen_join() -> bool:
            feed.poll_once()
            return any(e.kind == "joined" and e.time >= since for e in widget.events)

        poll_for(seen_join, DEADLINE, 0.2, "the widget did not get the joined event")
        assert widget.status.enabled and widget.nodes[-1][1] == 2
        fig = widget.figure
        assert list(fig.data[0].y)[-1] == 2  # nodes over time
        assert any("joined" in t for t in fig.data[2].text)  # an event marker
        text = repr(widget)
        assert text.startswith("autoscaler (local): ") and "joined: node local-worker-" in text
        # The same events reach the server extension's load model (the lab extension's card).
        info = state.session_info()
        status = state.cluster_status(info["address"], str(Path(info["session_dir"]) / "token"))
        load = load_from_status("x", status)
        assert load["autoscaler"] and load["autoscaler"].startswith("autoscaler (local): ")
        assert any(e["kind"] == "joined" for e in load["scaling_events"]), load["scaling_events"]
    finally:
        widget.close()
        request_resources(num_cpus=0)


def test_the_magic_passes_max_nodes_and_idle_timeout() -> None:
    from IPython.core.error import UsageError

    from nbcluster.jupyter.magics import _autoscale_config, build_parser

    parse = build_parser().parse_args
    args = parse(["start", "--num-cpus", "1", "--max-nodes", "3", "--idle-timeout", "2.5"])
    assert _autoscale_config(args) == {"autoscale_max_nodes": 3, "autoscale_idle_timeout_s": 2.5}
    assert _autoscale_config(parse(["start"])) == {}
    with pytest.raises(UsageError, match=r"--idle-timeout needs --max-nodes N"):
        _autoscale_config(parse(["start", "--idle-timeout", "3"]))
    with pytest.raises(UsageError, match=r"--max-nodes \(2\) must be at least --nodes \(3\)"):
        _autoscale_config(parse(["start", "--nodes", "3", "--max-nodes", "2"]))


def test_local_cluster_checks_max_nodes() -> None:
    with pytest.raises(ValueError, match=r"^max_nodes must be a whole number >= nodes \(2\)"):
        LocalCluster(nodes=2, max_nodes=1)
    with pytest.raises(ValueError, match=r"^idle_timeout_s must be a number >= 0"):
        LocalCluster(max_nodes=2, idle_timeout_s=-1)
