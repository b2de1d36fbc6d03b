"""Idle workers close their gRPC runtime (core/dormancy.py) and are not woken while idle;
every path into and out of a sleeping worker still works: actor calls on the task channel,
a driver reading an object the actor owns (a connection wakes the worker's server and is
relayed to it), the actor reading a driver's object (a new outgoing channel), with TLS too.
Real cluster; the worker's threads and context switches are read from /proc."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import cloudpickle
import pytest

import nbcluster
from nbcluster.testing import grpc_threads, thread_names

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # workers cannot import tests/


@nbcluster.remote(num_cpus=0)
class Holder:
    def pid(self) -> int:
        return os.getpid()

    def make(self, n: int) -> list[object]:
        return [nbcluster.put(b"a" * n)]  # owned by this actor

    def size(self, refs: list[object]) -> int:
        return len(nbcluster.get(refs[0]))

    def dormancy(self) -> tuple[int, int]:
        from nbcluster._runtime import client_slot

        client = client_slot.current_client()
        assert client is not None and client.dormancy is not None
        return client.dormancy.sleeps, client.dormancy.wakes


def _switches(pid: int) -> int:
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            status = Path(f"/proc/{pid}/task/{tid}/status").read_text()
        except OSError:
            continue
        total += sum(int(line.split()[1]) for line in status.splitlines() if "ctxt" in line)
    return total


def _grpc_alive(pid: int) -> bool:
    return bool(grpc_threads(pid))


def _until_asleep(pid: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while _grpc_alive(pid):
        assert time.monotonic() < deadline, f"gRPC threads still alive: {thread_names(pid)}"
        time.sleep(0.05)


def _round_trip(h: object, pid: int) -> None:
    """Every path in and out of the sleeping worker, each starting from sleep."""
    _until_asleep(pid)
    sleeps, wakes = nbcluster.get(h.dormancy.remote())  # type: ignore[attr-defined]
    assert sleeps >= 1
    assert nbcluster.get(h.pid.remote()) == pid  # the task channel needs no gRPC
    # An object the actor owns, read by the driver: the driver connects to the actor's
    # address, which wakes its server; the connection is relayed.
    refs = nbcluster.get(h.make.remote(300_000))  # type: ignore[attr-defined]
    _until_asleep(pid)
    assert len(nbcluster.get(refs[0], timeout=60)) == 300_000
    assert nbcluster.get(h.dormancy.remote())[1] > wakes  # type: ignore[attr-defined]
    # A driver's object read by the actor: it opens a new channel to the driver.
    mine = nbcluster.put(b"d" * 400_000)
    _until_asleep(pid)
    assert nbcluster.get(h.size.remote([mine]), timeout=60) == 400_000  # type: ignore[attr-defined]
    # ... and back to sleep after all of it.
    _until_asleep(pid)


def test_an_idle_actor_worker_sleeps_and_wakes_on_every_path(
    cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NBCLUSTER_WORKER_GRPC_IDLE_S", "0.3")
    cluster(num_cpus=1)
    h = Holder.remote()
    pid = nbcluster.get(h.pid.remote())
    _until_asleep(pid)
    time.sleep(1.5)  # the call's task event goes to the head a second after it (gRPC again)
    _until_asleep(pid)
    before = _switches(pid)
    time.sleep(1.5)
    assert _switches(pid) == before, "an idle, sleeping worker was woken"
    _round_trip(h, pid)
    nbcluster.kill(h)


@nbcluster.remote(num_cpus=1)
def dormancy_of_my_worker() -> tuple[int, int, int]:
    from nbcluster._runtime import client_slot

    client = client_slot.current_client()
    assert client is not None and client.dormancy is not None
    return os.getpid(), client.dormancy.sleeps, client.dormancy.wakes


def test_a_task_leased_to_a_sleeping_worker_does_not_wake_its_grpc(
    cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The lease grant carries the worker's task channel address, so the owner never calls
    the worker's gRPC (TaskChannel) and the task runs without waking its server."""
    monkeypatch.setenv("NBCLUSTER_WORKER_GRPC_IDLE_S", "0.3")
    cluster(num_cpus=1)
    time.sleep(2.0)  # the prestarted worker registers, idles and closes its gRPC
    pid, sleeps, wakes = nbcluster.get(dormancy_of_my_worker.remote(), timeout=60)
    assert sleeps >= 1, "the worker had not gone to sleep before its first task"
    assert wakes == 0, "the first lease woke the worker's gRPC server"
    _until_asleep(pid)


def test_the_first_call_to_a_sleeping_actor_does_not_wake_its_grpc(
    cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The head's actor record carries the worker's task channel address (from the lease
    the head placed it with), so a caller's first call opens the channel without asking
    the worker over gRPC."""
    monkeypatch.setenv("NBCLUSTER_WORKER_GRPC_IDLE_S", "0.3")
    cluster(num_cpus=1)
    h = Holder.remote()
    pid = nbcluster.get(h.pid.remote())
    sleeps0, wakes0 = nbcluster.get(h.dormancy.remote())
    # A second handle holder that never talked to the actor: a task in another worker.
    _until_asleep(pid)

    @nbcluster.remote(num_cpus=0)
    def ask(holder: object) -> tuple[int, int]:
        return nbcluster.get(holder.dormancy.remote())  # type: ignore[attr-defined]

    sleeps, wakes = nbcluster.get(ask.remote(h), timeout=60)
    assert sleeps > sleeps0 and wakes == wakes0, "a new caller's first call woke the actor"


def test_a_sleeping_worker_wakes_through_tls(
    cluster, tls_env: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NBCLUSTER_WORKER_GRPC_IDLE_S", "0.3")
    cluster(num_cpus=1)
    h = Holder.remote()
    _round_trip(h, nbcluster.get(h.pid.remote()))
    nbcluster.kill(h)


def test_zero_keeps_grpc_open(cluster, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NBCLUSTER_WORKER_GRPC_IDLE_S", "0")
    cluster(num_cpus=1)
    h = Holder.remote()
    pid = nbcluster.get(h.pid.remote())
    time.sleep(1.0)
    assert _grpc_alive(pid)
    with pytest.raises(nbcluster.exceptions.TaskError, match="dormancy"):
        nbcluster.get(h.dormancy.remote())
    nbcluster.kill(h)
