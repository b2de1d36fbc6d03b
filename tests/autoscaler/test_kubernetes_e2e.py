"""The kubernetes provider end to end, without a Kubernetes: the autoscaler (the real
``Monitor``) drives the real ``CoreV1Api`` against an in-memory API server whose "kubelet"
runs each created pod's container arguments as a local process (``nbcluster start ...
--block``, with the pod's name and the head's address filled in) and stops it when the pod
is deleted. Demand from a driver makes pods; idleness deletes them."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
from test_providers import K8S_VERSION, FakeApiServer, _api  # the in-memory API server

import nbcluster
from nbcluster import state
from nbcluster._runtime import proc
from nbcluster.autoscaler.config import parse_config
from nbcluster.autoscaler.monitor import Monitor
from nbcluster.autoscaler.providers.kubernetes import KubernetesNodeProvider
from nbcluster.cluster import LocalCluster
from nbcluster.testing import assert_no_processes, poll_for

pytestmark = pytest.mark.integration


class Kubelet(FakeApiServer):
    """Runs a pod's container as a process when it is created; stops it when deleted."""

    def __init__(self, head_address: str, token_file: str, log_dir: Path) -> None:
        super().__init__()
        self.head_address = head_address
        self.token_file = token_file
        self.log_dir = log_dir
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def request(self, method: str, url: str, headers: Any = None, body: Any = None,
                post_params: Any = None, _request_timeout: Any = None) -> Any:  # fmt: skip
        reply = super().request(method, url, headers, body, post_params, _request_timeout)
        if method == "POST" and reply.status == 201:
            pod = json.loads(reply.read())
            self._run(pod)
        if method == "DELETE" and reply.status == 200:
            self._stop(url.rsplit("/", 1)[-1].split("?")[0])
        return reply

    def _run(self, pod: dict[str, Any]) -> None:
        kubernetes_validate.validate(pod, K8S_VERSION, strict=True)
        name = pod["metadata"]["name"]
        args = list(pod["spec"]["containers"][0]["args"])
        assert args[:2] == ["nbcluster", "start"], args
        args[args.index("--address") + 1] = self.head_address  # the Service, resolved
        args[args.index("--token-file") + 1] = self.token_file  # the mounted Secret
        args = [a.replace("$(POD_NAME)", name).replace("$(POD_IP)", "127.0.0.1") for a in args]
        with open(self.log_dir / f"{name}.out", "ab") as log:
            self.procs[name] = subprocess.Popen(
                [sys.executable, "-m", "nbcluster.cli", *args[1:]],
                stdout=log,
                stderr=log,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        self.pods[(pod["metadata"]["namespace"], name)]["status"]["phase"] = "Running"

    def _stop(self, name: str) -> None:
        p = self.procs.pop(name, None)
        if p is not None and p.poll() is None:
            os.killpg(p.pid, signal.SIGTERM)
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(5)

    def stop_all(self) -> None:
        for name in list(self.procs):
            self._stop(name)


@pytest.fixture
def head(tmp_path: Path) -> Iterator[LocalCluster]:
    if nbcluster.is_initialized():
        nbcluster.shutdown()
    cluster = LocalCluster(num_cpus=0).start()
    yield cluster
    if nbcluster.is_initialized():
        nbcluster.shutdown()
    cluster.stop()
    assert_no_processes(cluster.session_dir, timeout=20)


# The head's node has no CPU: the tasks are infeasible (and say so) until the first pod joins.
@pytest.mark.filterwarnings("ignore::nbcluster.exceptions.InfeasibleResourceWarning")
def test_the_autoscaler_makes_and_deletes_pods_for_demand(
    head: LocalCluster, tmp_path: Path
) -> None:
    kubelet = Kubelet(head.address, str(head.token_file), tmp_path)
    cfg = parse_config(
        {
            "cluster_name": "k8sdemo",
            "max_workers": 2,
            "idle_timeout_minutes": 0.05,
            "provider": {"type": "kubernetes", "namespace": "ml", "image": "nbcluster:test"},
            "available_node_types": {"cpu1": {"resources": {"CPU": 1}, "max_workers": 2}},
            "update_interval_s": 0.3,
        }
    )
    provider = KubernetesNodeProvider(cfg.provider, cfg.cluster_name, core_api=_api(kubelet))
    monitor = Monitor(cfg, provider, head.address, proc.read_token(head.token_file))
    loop = asyncio.new_event_loop()
    stop = asyncio.Event()
    thread = threading.Thread(target=lambda: loop.run_until_complete(monitor.run(stop)))
    thread.start()
    try:
        nbcluster.init(address=head.address)

        @nbcluster.remote
        def where() -> str:
            time.sleep(1.0)
            return nbcluster.get_runtime_context().get_node_id()

        ran = nbcluster.get([where.remote() for _ in range(4)], timeout=90)
        names = {n["NodeID"]: n["NodeName"] for n in nbcluster.nodes()}
        assert all(names[r].startswith("k8sdemo-cpu1-") for r in ran)  # the head has no CPU
        created = [c for c in kubelet.calls if c[0] == "POST"]
        assert 1 <= len(created) <= 2
        # Idle: the pods are deleted through the API and their nodes leave the cluster.
        poll_for(lambda: not kubelet.pods, 60, 0.2, "the idle pods were not deleted")

        def workers_alive() -> list[str]:
            return [
                n["NodeName"]
                for n in nbcluster.nodes()
                if n["Alive"] and "k8sdemo" in n["NodeName"]
            ]

        poll_for(lambda: not workers_alive(), 30, 0.2, "the pods' nodes did not leave")
        poll_for(
            lambda: (
                [e.kind for e in state.autoscaler_status().events].count("removed") == len(created)
            ),
            30,
            0.2,
        )
        kinds = [e.kind for e in state.autoscaler_status().events]
        assert kinds.count("joined") == len(created) and kinds.count("removed") == len(created)
        assert [c[0] for c in kubelet.calls].count("DELETE") == len(created)
    finally:
        loop.call_soon_threadsafe(stop.set)
        thread.join(30)
        kubelet.stop_all()
