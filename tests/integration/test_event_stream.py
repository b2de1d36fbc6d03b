"""The head's pushed event stream against a real cluster (``nbcluster.state.subscribe_events``).

Tasks, actors, nodes, jobs and store use arrive as events; an idle cluster pushes
nothing; a subscriber that stops reading gets a "dropped N" marker whose count closes
the gap in the sequence numbers; a bad request or a wrong token ends the stream with a
message; a subscription without a driver works from the address and token file.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import grpc
import pytest

import nbcluster
from nbcluster import state
from nbcluster._runtime.protocol.protos import events_pb2 as epb
from nbcluster._runtime.protocol.protos import events_pb2_grpc as epb_grpc
from nbcluster._runtime.protocol.rpc import auth_metadata, make_sync_channel, pb, pb_grpc
from nbcluster.testing import poll_for

pytestmark = pytest.mark.integration

DEADLINE_S = 30.0


class Collector:
    """Keeps every batch a subscription delivers."""

    def __init__(self) -> None:
        self.batches: list[state.EventBatch] = []
        self.lock = threading.Lock()

    def __call__(self, batch: state.EventBatch) -> None:
        with self.lock:
            self.batches.append(batch)

    def events(self, kind: str | None = None) -> list[state.ClusterEvent]:
        with self.lock:
            return [
                e
                for b in self.batches
                if not b.snapshot
                for e in b.events
                if kind is None or e.kind == kind
            ]


@nbcluster.remote
def add(a: int, b: int) -> int:
    return a + b


@nbcluster.remote
class Greeter:
    def hello(self) -> str:
        return "hi"


def test_tasks_actors_nodes_and_jobs_are_pushed(shared_cluster: Any) -> None:
    got = Collector()
    sub = state.subscribe_events(got)
    try:
        assert sub.wait_ready(DEADLINE_S)
        snap = got.batches[0]
        assert snap.snapshot and snap.connected
        node_ids = {e.data.node.node_id for e in snap.events if e.kind == "node"}
        assert node_ids == {n.node_id for n in state.node_stats()}
        jobs = [e.data for e in snap.events if e.kind == "job"]
        assert state.session_info()["job_id"] in {j.job_id for j in jobs if j.alive}

        assert nbcluster.get([add.remote(i, 1) for i in range(5)]) == [1, 2, 3, 4, 5]
        g = Greeter.remote()
        assert nbcluster.get(g.hello.remote()) == "hi"
        nbcluster.kill(g)
        poll_for(
            lambda: (
                sum(e.data.name == "add" for e in got.events("task")) >= 5
                and any(e.data.state == "DEAD" for e in got.events("actor"))
            ),
            DEADLINE_S,
            0.05,
            "five add tasks and a dead actor",
        )
        states = [e.data.state for e in got.events("actor") if e.data.class_name == "Greeter"]
        assert states[0] in ("PENDING", "ALIVE") and states[-1] == "DEAD"
        assert any(e.data.running_tasks > 0 for e in got.events("node")), "no busy node shown"
        seqs = [e.seq for e in got.events()]
        assert seqs == sorted(seqs) and len(seqs) == len(set(seqs))
    finally:
        sub.close()
    assert not sub.alive


def test_an_idle_cluster_pushes_nothing(shared_cluster: Any) -> None:
    got = Collector()
    sub = state.subscribe_events(got)
    try:
        assert sub.wait_ready(DEADLINE_S)
        nbcluster.get(add.remote(1, 1))
        # Let the task's events and the heartbeats that report it settle, then listen.
        poll_for(lambda: len(got.events("task")) >= 1, DEADLINE_S, 0.05, "the task's event")
        quiet_since = time.monotonic()
        last = len(got.events())
        while time.monotonic() - quiet_since < 1.0 and time.monotonic() < 30 + quiet_since:
            time.sleep(0.25)
            if len(got.events()) != last:
                last, quiet_since = len(got.events()), time.monotonic()
        before = len(got.events())
        time.sleep(2.0)  # four heartbeats, nothing changes
        assert got.events()[before:] == []
    finally:
        sub.close()


def test_a_reader_that_falls_behind_gets_a_dropped_marker(shared_cluster: Any) -> None:
    info = state.session_info()
    token = (Path(info["session_dir"]) / "token").read_text().strip()
    address = shared_cluster.address
    md = auth_metadata(token)
    channel = make_sync_channel(address, token)
    try:
        stream = epb_grpc.EventsStub(channel).Subscribe(
            epb.SubscribeRequest(snapshot=True, buffer=64), metadata=md
        )
        assert next(stream).snapshot
        # Report many task events while nobody reads: the transport fills up, then the
        # head's buffer for this subscriber (64) overflows.
        head = pb_grpc.HeadStub(channel)
        n = 100_000
        last_id = (n - 1).to_bytes(16, "big")
        for start in range(0, n, 5000):
            events = [
                pb.TaskEvent(
                    task_id=i.to_bytes(16, "big"),
                    job_id=b"\x01" * 4,
                    name="synthetic-" + "x" * 200,
                    state="FINISHED",
                )
                for i in range(start, start + 5000)
            ]
            head.ReportTaskEvents(pb.TaskEventsRequest(events=events), metadata=md, timeout=30)
        received = synthetic = dropped = 0
        first = last = None
        done = False
        for batch in stream:
            for e in batch.events:
                if e.WhichOneof("body") == "dropped":
                    dropped += e.dropped.count
                    first = first if first is not None else e.seq - e.dropped.count + 1
                else:
                    received += 1
                    synthetic += e.task.name.startswith("synthetic")
                    first = first if first is not None else e.seq
                    done = done or e.task.task_id == last_id
                last = e.seq
            if done:
                break
        stream.cancel()
        assert dropped > 0, "the slow reader lost nothing: the test sent too little"
        assert 0 < synthetic < n
        # Every event is either received or counted as dropped: no silent gap.
        assert received + dropped == last - first + 1
    finally:
        channel.close()


def test_bad_requests_and_wrong_tokens_end_the_stream(shared_cluster: Any, tmp_path: Path) -> None:
    got = Collector()
    sub = state.subscribe_events(got, kinds=("bogus",))
    poll_for(lambda: sub.error is not None, DEADLINE_S, 0.05, "the refusal")
    assert "INVALID_ARGUMENT" in sub.error and "unknown event kinds ['bogus']" in sub.error
    assert got.batches[-1].error == sub.error and not got.batches[-1].connected
    sub.close()

    wrong = tmp_path / "token"
    wrong.write_text("0" * 64)
    wrong.chmod(0o600)
    sub = state.subscribe_events(got, address=shared_cluster.address, token_file=str(wrong))
    poll_for(lambda: sub.error is not None, DEADLINE_S, 0.05, "the refusal")
    assert sub.error.startswith("PERMISSION_DENIED")
    assert not sub.wait_ready(0.1)
    sub.close()
    with pytest.raises(ValueError, match="needs token_file"):
        state.subscribe_events(got, address=shared_cluster.address)


def test_subscribe_by_address_without_a_driver(shared_cluster: Any) -> None:
    token_file = str(Path(state.session_info()["session_dir"]) / "token")
    got = Collector()
    sub = state.subscribe_events(
        got, kinds=("node",), address=shared_cluster.address, token_file=token_file
    )
    try:
        assert sub.wait_ready(DEADLINE_S)
        assert {e.kind for e in got.batches[0].events} == {"node"}
    finally:
        sub.close()


def test_raw_call_without_a_token_is_refused(shared_cluster: Any) -> None:
    channel = make_sync_channel(shared_cluster.address, "")
    try:
        stream = epb_grpc.EventsStub(channel).Subscribe(epb.SubscribeRequest())
        with pytest.raises(grpc.RpcError) as err:
            next(stream)
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
    finally:
        channel.close()
