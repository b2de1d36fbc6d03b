"""Node providers behind one interface: local processes, hosts over a command runner, and
Kubernetes pods through the official client (its real generated API, with an in-memory
REST layer standing in for the API server, which cannot run here)."""

from __future__ import annotations

import json
import stat
import subprocess
import sys
import time
import urllib.parse
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
from kubernetes.client import ApiClient, Configuration, CoreV1Api, rest
from kubernetes.client.exceptions import ApiException

from nbcluster.autoscaler.config import parse_config
from nbcluster.autoscaler.providers import (
    TAG_CLUSTER,
    TAG_LAUNCH_TIME,
    TAG_NODE_KIND,
    TAG_NODE_TYPE,
    NodeProvider,
    ProviderError,
    get_provider,
)
from nbcluster.autoscaler.providers.hosts import (
    CommandRunner,
    HostsNodeProvider,
    PrefixCommandRunner,
    SSHCommandRunner,
)
from nbcluster.autoscaler.providers.kubernetes import KubernetesNodeProvider, worker_pod
from nbcluster.autoscaler.providers.local import LocalNodeProvider, node_args
from nbcluster.testing import poll_for

K8S_VERSION = "1.32.0"
TAGS = {TAG_CLUSTER: "demo", TAG_NODE_KIND: "worker", TAG_NODE_TYPE: "cpu2", TAG_LAUNCH_TIME: "100"}
NODE_CONFIG = {"resources": {"CPU": 2.0, "memory": 4e9, "GPU": 1.0, "disk": 3.0}}


def test_every_provider_implements_the_whole_interface() -> None:
    abstract = {
        name for name, v in vars(NodeProvider).items() if getattr(v, "__isabstractmethod__", False)
    }
    assert abstract == {
        "create_node",
        "terminate_node",
        "non_terminated_nodes",
        "node_tags",
        "set_node_tags",
    }
    for cls in (LocalNodeProvider, HostsNodeProvider, KubernetesNodeProvider):
        assert not cls.__abstractmethods__, cls


def test_node_args_carry_the_node_types_resources() -> None:
    args = node_args({"CPU": 2.0, "GPU": 1.0, "disk": 3.0, "memory": 4e9}, 10**8)
    assert args == [
        "--num-cpus",
        "2",
        "--num-gpus",
        "1",
        "--resources",
        json.dumps({"disk": 3.0, "memory": 4e9}, sort_keys=True),
        "--object-store-memory",
        "100000000",
    ]


# -- local ---------------------------------------------------------------------------------------
@pytest.fixture
def fake_python(tmp_path: Path) -> str:
    """Stands in for the interpreter: sleeps with the node manager's arguments on its
    command line (so the provider recognizes it), or exits at once when asked to."""
    script = tmp_path / "fakepython"
    script.write_text(
        f"#!/bin/sh\ncase \"$*\" in *crash*) echo 'ImportError: boom' >&2; exit 3;; esac\n"
        f'exec {sys.executable} -c "import time; time.sleep(60)" "$@"\n'
    )
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return str(script)


def _local(tmp_path: Path, python: str, **kw: Any) -> LocalNodeProvider:
    (tmp_path / "logs").mkdir(exist_ok=True)
    return LocalNodeProvider(
        {"type": "local"},
        "demo",
        session_dir=tmp_path,
        token_file=tmp_path / "token",
        head_address="127.0.0.1:1",
        python=python,
        **kw,
    )


def test_local_provider_starts_lists_tags_and_stops_processes(
    tmp_path: Path, fake_python: str
) -> None:
    p = _local(tmp_path, fake_python)
    ids = p.create_node(NODE_CONFIG, TAGS, 2)
    try:
        assert len(ids) == 2 and all(i.startswith("demo-cpu2-") for i in ids)
        assert p.non_terminated_nodes({TAG_NODE_KIND: "worker"}) == sorted(ids)
        assert p.non_terminated_nodes({TAG_NODE_TYPE: "gpu"}) == []
        p.set_node_tags(ids[0], {"extra": "1"})
        assert p.node_tags(ids[0]) == {**TAGS, "extra": "1"}
        # A new provider (a restarted monitor) finds them from the state file.
        again = _local(tmp_path, fake_python)
        assert again.non_terminated_nodes({}) == sorted(ids)
        pid = json.loads(p.path.read_text())[ids[0]]["pid"]
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        assert f"--node-name {ids[0]}" in cmd and "--num-gpus 1" in cmd
        again.terminate_node(ids[0])
        assert again.non_terminated_nodes({}) == [ids[1]]
        again.terminate_node(ids[0])  # idempotent
    finally:
        p.terminate_nodes(p.non_terminated_nodes({}))
    assert p.non_terminated_nodes({}) == []


def test_local_provider_notices_a_node_that_exits_and_says_why(
    tmp_path: Path, fake_python: str
) -> None:
    p = _local(tmp_path, fake_python)
    ids = p.create_node({"resources": {"CPU": 1, "crash": 1}}, TAGS, 1)
    poll_for(lambda: not p.non_terminated_nodes({}), 10, 0.05, "the crashed node is still listed")
    assert p.describe(ids[0]).startswith(f"{ids[0]} exited with code 3: ImportError: boom")


def test_local_provider_setup_commands_fail_with_their_output(
    tmp_path: Path, fake_python: str
) -> None:
    p = _local(tmp_path, fake_python, setup_commands=("echo nope >&2; exit 4",))
    with pytest.raises(ProviderError, match=r"setup command .* failed \(exit 4\): nope$"):
        p.create_node(NODE_CONFIG, TAGS, 1)
    assert p.non_terminated_nodes({}) == []


# -- hosts ---------------------------------------------------------------------------------------
class RecordingRunner(CommandRunner):
    """Records what would run on each host; fails the hosts listed in ``broken``."""

    def __init__(self, broken: tuple[str, ...] = ()) -> None:
        self.calls: list[tuple[str, list[str], str | None]] = []
        self.broken = broken

    def run(
        self, host: str, argv: Any, *, input: str | None = None, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        self.calls.append((host, list(argv), input))
        if host in self.broken and "start" in " ".join(argv):
            return subprocess.CompletedProcess(argv, 1, "", "the node exited (code 1)")
        return subprocess.CompletedProcess(argv, 0, "nbcluster node joined h:1 (pid 42)\n", "")


def _hosts(tmp_path: Path, runner: CommandRunner, ips: list[str]) -> HostsNodeProvider:
    return HostsNodeProvider(
        {"type": "hosts", "head_ip": "10.0.0.1", "worker_ips": ips},
        "demo",
        session_dir=tmp_path,
        token="s3cret-token",
        head_address="10.0.0.1:6380",
        runner=runner,
        setup_commands=("pip install nbcluster",),
    )


def test_hosts_provider_starts_one_node_per_machine(tmp_path: Path) -> None:
    runner = RecordingRunner()
    p = _hosts(tmp_path, runner, ["10.0.0.2", "10.0.0.3"])
    assert p.create_node(NODE_CONFIG, TAGS, 1) == ["10.0.0.2"]
    assert p.create_node(NODE_CONFIG, TAGS, 5) == ["10.0.0.3"]  # one machine left
    with pytest.raises(ProviderError, match=r"^all 2 machines of provider.worker_ips are in use$"):
        p.create_node(NODE_CONFIG, TAGS, 1)
    assert p.non_terminated_nodes({TAG_NODE_TYPE: "cpu2"}) == ["10.0.0.2", "10.0.0.3"]
    host, setup, _ = runner.calls[0]
    assert (host, setup) == ("10.0.0.2", ["sh", "-c", "pip install nbcluster"])
    _, copy, stdin = runner.calls[1]
    assert stdin == "s3cret-token" and "umask 077" in copy[-1]
    _, start, stdin = runner.calls[2]
    line = start[-1]
    assert stdin is None and "s3cret-token" not in line  # the token is never on a command line
    for part in ("-m nbcluster.cli start", "--address 10.0.0.1:6380", "--node-name 10.0.0.2"):
        assert part in line
    assert "--host 10.0.0.2" in line and '"$HOME/.nbcluster/demo.token"' in line
    # A restarted monitor finds the machines from the state file.
    assert _hosts(tmp_path, runner, ["10.0.0.2", "10.0.0.3"]).node_tags("10.0.0.2") == TAGS
    p.terminate_node("10.0.0.2")
    assert runner.calls[-1][0] == "10.0.0.2"
    assert runner.calls[-1][1][1:] == [
        "-m", "nbcluster.autoscaler.hostcmd", "stop", "--node-name", "10.0.0.2"
    ]  # fmt: skip
    assert p.non_terminated_nodes({}) == ["10.0.0.3"]


def test_hosts_provider_reports_a_machine_that_fails(tmp_path: Path) -> None:
    p = _hosts(tmp_path, RecordingRunner(broken=("10.0.0.2",)), ["10.0.0.2"])
    with pytest.raises(ProviderError, match=r"^10.0.0.2: starting nbcluster failed \(exit 1\)"):
        p.create_node(NODE_CONFIG, TAGS, 1)
    assert p.non_terminated_nodes({}) == [] and p.reserved == set()  # the machine is free again


def test_ssh_runner_builds_a_batch_mode_command() -> None:
    argv = SSHCommandRunner("ubuntu", "/k/id", 2222).ssh_argv("10.0.0.2")
    assert argv[0] == "ssh" and "BatchMode=yes" in argv and argv[-2:] == ["ubuntu@10.0.0.2", "--"]
    assert argv[argv.index("-p") + 1] == "2222" and argv[argv.index("-i") + 1] == "/k/id"


def test_prefix_runner_runs_locally_with_the_hosts_prefix() -> None:
    r = PrefixCommandRunner(lambda host: ["env", f"WHERE={host}"])
    out = r.run("h1", ["sh", "-c", "echo $WHERE; cat"], input="in", timeout=10)
    assert out.stdout.split() == ["h1", "in"]


# -- kubernetes ------------------------------------------------------------------------------------
class _Resp:
    def __init__(self, status: int, body: Any) -> None:
        self.status = status
        self.reason = {200: "OK", 201: "Created", 404: "Not Found", 403: "Forbidden"}[status]
        self.data = json.dumps(body).encode()
        self.headers = {"content-type": "application/json"}


class FakeApiServer:
    """The pod endpoints of a Kubernetes API server, in memory, at the HTTP level.

    It sits where urllib3 would (``ApiClient.rest_client``), so the real generated
    ``CoreV1Api`` builds the URLs, serializes the pods and parses the replies."""

    def __init__(self, forbid: bool = False) -> None:
        self.pods: dict[tuple[str, str], dict[str, Any]] = {}
        self.calls: list[tuple[str, str, dict[str, str]]] = []
        self.forbid = forbid

    def request(self, method: str, url: str, headers: Any = None, body: Any = None,
                post_params: Any = None, _request_timeout: Any = None) -> rest.RESTResponse:  # fmt: skip
        parsed = urllib.parse.urlparse(url)
        query = dict(urllib.parse.parse_qsl(parsed.query))
        self.calls.append((method, parsed.path, query))
        if self.forbid:
            return self._reply(403, {"kind": "Status", "message": "pods is forbidden"})
        parts = parsed.path.strip("/").split("/")
        assert parts[:3] == ["api", "v1", "namespaces"] and parts[4] == "pods", parsed.path
        ns = parts[3]
        name = parts[5] if len(parts) > 5 else None
        if method == "POST":
            pod = json.loads(body) if isinstance(body, str | bytes) else body
            pod["metadata"]["uid"] = f"uid-{len(self.pods)}"
            pod["status"] = {"phase": "Pending"}
            self.pods[(ns, pod["metadata"]["name"])] = pod
            return self._reply(201, pod)
        if method == "GET" and name is None:
            want = dict(kv.split("=") for kv in query.get("labelSelector", "").split(",") if kv)
            items = [
                p
                for (n, _), p in self.pods.items()
                if n == ns and all(p["metadata"]["labels"].get(k) == v for k, v in want.items())
            ]
            return self._reply(200, {"kind": "PodList", "apiVersion": "v1", "items": items})
        pod = self.pods.get((ns, name or ""))
        if pod is None:
            return self._reply(404, {"kind": "Status", "message": f'pods "{name}" not found'})
        if method == "GET":
            return self._reply(200, pod)
        if method == "DELETE":
            del self.pods[(ns, name or "")]
            return self._reply(200, pod)
        if method == "PATCH":
            patch = json.loads(body) if isinstance(body, str | bytes) else body
            pod["metadata"]["labels"].update(patch["metadata"]["labels"])
            return self._reply(200, pod)
        raise AssertionError(f"unexpected {method} {url}")

    def _reply(self, status: int, body: Any) -> rest.RESTResponse:
        r = rest.RESTResponse(_Resp(status, body))
        return r


def _api(server: FakeApiServer) -> CoreV1Api:
    client = ApiClient(Configuration(host="https://kubernetes.invalid"))
    client.rest_client = server  # type: ignore[assignment]
    return CoreV1Api(client)


def _k8s(server: FakeApiServer) -> KubernetesNodeProvider:
    cfg = {"type": "kubernetes", "namespace": "ml", "image": "registry.example/nbcluster:1"}
    return KubernetesNodeProvider(cfg, "demo", core_api=_api(server))


def test_kubernetes_provider_creates_lists_labels_and_deletes_pods() -> None:
    server = FakeApiServer()
    p = _k8s(server)
    ids = p.create_node(
        {**NODE_CONFIG, "pod": {"spec": {"nodeSelector": {"pool": "cpu"}}}}, TAGS, 2
    )
    assert len(ids) == 2 and all(i.startswith("demo-cpu2-") for i in ids)
    assert [c[:2] for c in server.calls] == [("POST", "/api/v1/namespaces/ml/pods")] * 2
    pod = server.pods[("ml", ids[0])]
    assert pod["spec"]["nodeSelector"] == {"pool": "cpu"}
    assert pod["metadata"]["labels"][TAG_NODE_TYPE] == "cpu2"
    kubernetes_validate.validate(pod, K8S_VERSION, strict=True)
    # Listing uses a label selector for this cluster and the filters.
    assert p.non_terminated_nodes({TAG_NODE_KIND: "worker"}) == sorted(ids)
    method, path, query = server.calls[-1]
    assert (method, path) == ("GET", "/api/v1/namespaces/ml/pods")
    assert query["labelSelector"] == f"{TAG_CLUSTER}=demo,{TAG_NODE_KIND}=worker"
    assert p.non_terminated_nodes({TAG_NODE_TYPE: "gpu"}) == []
    p.set_node_tags(ids[0], {"extra": "1"})
    assert server.calls[-1][:2] == ("PATCH", f"/api/v1/namespaces/ml/pods/{ids[0]}")
    p.tags_cache.clear()
    assert p.node_tags(ids[0])["extra"] == "1"  # read back through GET
    p.terminate_node(ids[0])
    assert server.calls[-1][0] == "DELETE" and server.calls[-1][2]["gracePeriodSeconds"] == "10"
    p.terminate_node(ids[0])  # a 404: already gone, not an error
    assert p.non_terminated_nodes({}) == [ids[1]]


def test_kubernetes_workers_use_the_heads_image_and_belong_to_its_replicaset(
    monkeypatch: Any,
) -> None:
    server = FakeApiServer()
    head = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "nbcluster-head-7d9f-x2",
            "namespace": "ml",
            "labels": {"app.kubernetes.io/component": "head"},
            "ownerReferences": [
                {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "nbcluster-head-7d9f",
                 "uid": "rs-uid", "controller": True}
            ],
        },
        "spec": {"containers": [{"name": "head", "image": "registry.example/nbcluster:2"}]},
    }  # fmt: skip
    server.pods[("ml", head["metadata"]["name"])] = head
    monkeypatch.setenv("POD_NAME", head["metadata"]["name"])
    p = KubernetesNodeProvider(
        {"type": "kubernetes", "namespace": "ml"}, "demo", core_api=_api(server)
    )
    (name,) = p.create_node(NODE_CONFIG, TAGS, 1)
    pod = server.pods[("ml", name)]
    assert pod["spec"]["containers"][0]["image"] == "registry.example/nbcluster:2"
    assert pod["metadata"]["ownerReferences"] == [
        {
            "apiVersion": "apps/v1",
            "kind": "ReplicaSet",
            "name": "nbcluster-head-7d9f",
            "uid": "rs-uid",
        }
    ]
    kubernetes_validate.validate(pod, K8S_VERSION, strict=True)


def test_kubernetes_provider_skips_finished_and_deleting_pods() -> None:
    server = FakeApiServer()
    p = _k8s(server)
    a, b, c = p.create_node(NODE_CONFIG, TAGS, 3)
    server.pods[("ml", a)]["status"]["phase"] = "Failed"
    server.pods[("ml", b)]["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    assert p.non_terminated_nodes({}) == [c]


def test_kubernetes_provider_explains_missing_permissions() -> None:
    p = _k8s(FakeApiServer(forbid=True))
    with pytest.raises(ProviderError, match=r"HTTP 403 Forbidden\).*pods get/list/create/delete"):
        p.create_node(NODE_CONFIG, TAGS, 1)
    with pytest.raises(ProviderError, match=r"^listing pods failed \(HTTP 403"):
        p.non_terminated_nodes({})


def test_kubernetes_client_errors_are_api_exceptions() -> None:
    """The provider's 404 handling relies on the client raising ApiException.status."""
    with pytest.raises(ApiException) as info:
        _api(FakeApiServer()).read_namespaced_pod(name="x", namespace="ml")
    assert info.value.status == 404


def test_worker_pod_is_a_valid_pod_with_what_nbcluster_needs() -> None:
    pod = worker_pod(
        "demo-cpu2-abc123",
        "ml",
        NODE_CONFIG,
        TAGS,
        head_address="demo-head.ml.svc:6380",
        token_secret="demo-token",
        service_account="nbcluster-worker",
    )
    kubernetes_validate.validate(pod, K8S_VERSION, strict=True)
    c = pod["spec"]["containers"][0]
    assert c["args"][:6] == [
        "nbcluster",
        "start",
        "--address",
        "demo-head.ml.svc:6380",
        "--node-name",
        "$(POD_NAME)",
    ]
    assert "--num-gpus=1" in c["args"] and c["args"][-1] == "--block"
    assert c["resources"]["limits"] == {"cpu": "2", "memory": "4000000000", "nvidia.com/gpu": "1"}
    assert {v["name"] for v in pod["spec"]["volumes"]} == {"token", "dshm"}
    assert pod["spec"]["restartPolicy"] == "Never"
    assert pod["spec"]["serviceAccountName"] == "nbcluster-worker"


def test_get_provider_builds_each_kind(tmp_path: Path) -> None:
    (tmp_path / "token").write_text("t" * 64)
    (tmp_path / "logs").mkdir()
    base = {"cluster_name": "demo", "available_node_types": {"w": {"resources": {"CPU": 1}}}}
    common = {
        "session_dir": tmp_path,
        "token_file": tmp_path / "token",
        "head_address": "127.0.0.1:9",
    }
    local = get_provider(parse_config({**base, "provider": {"type": "local"}}), **common)
    assert isinstance(local, LocalNodeProvider) and local.host == "127.0.0.1"
    hosts_cfg = {"type": "hosts", "head_ip": "10.0.0.1", "worker_ips": ["10.0.0.2", "10.0.0.3"]}
    hosts = get_provider(
        parse_config({**base, "provider": hosts_cfg}), **common, runner=RecordingRunner()
    )
    assert isinstance(hosts, HostsNodeProvider) and hosts.token == "t" * 64
    k8s = get_provider(
        parse_config({**base, "provider": {"type": "kubernetes", "namespace": "ml"}}),
        **common,
        core_api=_api(FakeApiServer()),
    )
    assert isinstance(k8s, KubernetesNodeProvider) and k8s.head_address == "demo-head.ml.svc:6380"


def test_kubernetes_provider_outside_a_cluster_says_what_is_missing(monkeypatch: Any) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with pytest.raises(
        ProviderError, match=r"^cannot load Kubernetes credentials from the pod's service account"
    ):
        KubernetesNodeProvider({"type": "kubernetes"}, "demo")


def test_a_slow_provider_returns_in_time() -> None:
    # The fake server answers at once; the provider adds no waiting of its own.
    t0 = time.monotonic()
    _k8s(FakeApiServer()).create_node(NODE_CONFIG, TAGS, 3)
    assert time.monotonic() - t0 < 30
