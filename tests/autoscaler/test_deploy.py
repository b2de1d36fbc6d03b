"""deploy/: every Kubernetes manifest validated against the Kubernetes schemas, the RBAC
limited to pods in one namespace, the pieces consistent with each other and with the
autoscaler's config; the Dockerfile checked statically (no Docker engine here)."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from nbcluster.autoscaler.config import parse_config
from nbcluster.autoscaler.providers.kubernetes import (
    CONTAINER,
    DEFAULT_PORT,
    TLS_MOUNT,
    TLS_SECRET_ENV,
    KubernetesNodeProvider,
    worker_pod,
)

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
K8S = DEPLOY / "kubernetes"
VERSIONS = ["1.28.0", "1.32.0", "1.37.0"]


def _docs(text: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(text) if d]


def _patches() -> set[Path]:
    """Files that components patch resources with (partial manifests, not resources)."""
    out = set()
    for kust in K8S.rglob("kustomization.yaml"):
        for patch in yaml.safe_load(kust.read_text()).get("patches", []):
            out.add((kust.parent / patch["path"]).resolve())
    return out


def _files() -> list[Path]:
    skip = _patches()
    return sorted(
        p
        for p in K8S.rglob("*.yaml")
        if p.name not in ("kustomization.yaml", "cluster.yaml") and p.resolve() not in skip
    )


def _render(path: Path) -> list[dict[str, Any]]:
    kubectl = shutil.which("kubectl")
    if kubectl is None:  # render by hand: the resources listed, no transformers
        kust = yaml.safe_load((path / "kustomization.yaml").read_text())
        return [d for r in kust.get("resources", []) for d in _docs((path / r).read_text())]
    out = subprocess.run(
        [kubectl, "kustomize", str(path)], capture_output=True, text=True, timeout=60, check=True
    )
    return _docs(out.stdout)


def _overlay(tmp_path: Path, name: str, base: Path, components: list[str]) -> Path:
    overlay = tmp_path / name
    overlay.mkdir()
    (overlay / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "kustomize.config.k8s.io/v1beta1",
                "kind": "Kustomization",
                "namespace": "ml",
                "resources": [os.path.relpath(base, overlay)],  # kustomize wants relative paths
                "components": [
                    os.path.relpath(K8S / "components" / c, overlay) for c in components
                ],
            }
        )
    )
    return overlay


def _overlay_with_notebook(tmp_path: Path) -> Path:
    return _overlay(tmp_path, "overlay", K8S, ["notebook"])


@pytest.mark.parametrize("path", _files(), ids=lambda p: str(p.relative_to(K8S)))
@pytest.mark.parametrize("version", VERSIONS)
def test_every_manifest_file_is_valid(path: Path, version: str) -> None:
    for doc in _docs(path.read_text()):
        kubernetes_validate.validate(doc, version, strict=True)


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[dict[str, Any]]]:
    tmp = tmp_path_factory.mktemp("kustomize")
    out = {"cluster": _render(K8S), "job": _render(K8S / "job")}
    if shutil.which("kubectl") is not None:
        out["notebook"] = _render(_overlay_with_notebook(tmp))
        out["tls"] = _render(_overlay(tmp, "tls", K8S, ["notebook", "tls"]))
        out["tls-only"] = _render(_overlay(tmp, "tls-only", K8S, ["tls"]))
        out["tls-job"] = _render(_overlay(tmp, "tls-job", K8S / "job", ["tls"]))
    return out


def _find(docs: list[dict[str, Any]], kind: str, name: str = "") -> dict[str, Any]:
    found = [
        d
        for d in docs
        if d["kind"] == kind and (not name or d["metadata"]["name"].startswith(name))
    ]
    assert len(found) == 1, f"{kind} {name}: {len(found)} found"
    return found[0]


def test_rendered_kustomizations_are_valid(rendered: dict[str, list[dict[str, Any]]]) -> None:
    kinds = sorted(d["kind"] for d in rendered["cluster"] if d["kind"] != "ConfigMap")
    assert kinds == [
        "Deployment",
        "Role",
        "RoleBinding",
        "Service",
        "ServiceAccount",
        "ServiceAccount",
    ]
    generated = ["ConfigMap"] if shutil.which("kubectl") else []  # configMapGenerator
    assert sorted(d["kind"] for d in rendered["job"]) == [*generated, "Job"]
    for docs in rendered.values():
        for doc in docs:
            for version in VERSIONS:
                kubernetes_validate.validate(doc, version, strict=True)


def test_rbac_is_limited_to_pods_in_its_namespace(rendered: dict[str, Any]) -> None:
    docs = rendered["cluster"]
    assert not [d for d in docs if d["kind"] in ("ClusterRole", "ClusterRoleBinding")]
    role = _find(docs, "Role")
    assert role["rules"] == [
        {
            "apiGroups": [""],
            "resources": ["pods"],
            "verbs": ["get", "list", "watch", "create", "delete", "patch"],
        }
    ]
    binding = _find(docs, "RoleBinding")
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": role["metadata"]["name"],
    }
    head = _find(docs, "Deployment")["spec"]["template"]["spec"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": head["serviceAccountName"]}]
    worker_sa = [
        d for d in docs if d["kind"] == "ServiceAccount" and "worker" in d["metadata"]["name"]
    ]
    assert worker_sa[0]["automountServiceAccountToken"] is False


def _cluster_config() -> Any:
    return parse_config(yaml.safe_load((K8S / "cluster.yaml").read_text()))


def test_head_service_exposes_only_the_head_port(rendered: dict[str, Any]) -> None:
    docs = rendered["cluster"]
    service = _find(docs, "Service")
    cfg = _cluster_config()
    assert service["metadata"]["name"] == f"{cfg.cluster_name}-head"  # the provider's default
    assert service["spec"]["type"] == "ClusterIP"
    assert [p["port"] for p in service["spec"]["ports"]] == [DEFAULT_PORT]
    head = _find(docs, "Deployment")
    pod = head["spec"]["template"]
    assert service["spec"]["selector"] == pod["metadata"]["labels"]
    container = pod["spec"]["containers"][0]
    assert [p["containerPort"] for p in container["ports"]] == [DEFAULT_PORT]
    args = container["args"]
    assert args[:4] == ["nbcluster", "up", "/etc/nbcluster/config/cluster.yaml", "--block"]
    assert args[args.index("--port") + 1] == str(DEFAULT_PORT)
    assert args[args.index("--host") + 1] == "$(POD_IP)"
    # The token comes from the Secret the provider mounts into workers too.
    token_file = args[args.index("--token-file") + 1]
    vols = {v["name"]: v for v in pod["spec"]["volumes"]}
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    assert vols[mounts[str(Path(token_file).parent)]]["secret"]["secretName"] == (
        f"{cfg.cluster_name}-token"
    )
    config_map = _find(docs, "ConfigMap")
    assert (
        vols[mounts["/etc/nbcluster/config"]]["configMap"]["name"]
        == (config_map["metadata"]["name"])
    )
    assert parse_config(yaml.safe_load(config_map["data"]["cluster.yaml"])) == cfg


def test_the_config_describes_kubernetes_workers_that_are_valid_pods() -> None:
    cfg = _cluster_config()
    assert cfg.provider_type == "kubernetes"
    provider = KubernetesNodeProvider(cfg.provider, cfg.cluster_name, core_api=object())
    for name, t in cfg.worker_types().items():
        pod = worker_pod(
            f"{cfg.cluster_name}-{name}-abc123",
            "ml",
            {**t.node_config, "resources": dict(t.resources)},
            {"nbcluster-node-type": name},
            head_address=provider.head_address,
            token_secret=provider.token_secret,
            service_account=str(cfg.provider["service_account"]),
        )
        for version in VERSIONS:
            kubernetes_validate.validate(pod, version, strict=True)
        assert pod["spec"]["serviceAccountName"] == "nbcluster-worker"


def test_the_job_runs_an_entrypoint_through_the_head(rendered: dict[str, Any]) -> None:
    job = _find(rendered["job"], "Job")
    spec = job["spec"]["template"]["spec"]
    env = {e["name"]: e.get("value") for e in spec["containers"][0]["env"]}
    assert env["NBCLUSTER_ADDRESS"] == f"nbcluster://nbcluster-head:{DEFAULT_PORT}"
    assert spec["restartPolicy"] == "Never" and job["spec"]["backoffLimit"] == 0
    wait = spec["initContainers"][0]["args"][-1]
    assert f'("nbcluster-head", {DEFAULT_PORT})' in wait
    compile((K8S / "job" / "entrypoint.py").read_text(), "entrypoint.py", "exec")


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl renders the overlay")
def test_the_notebook_component_joins_through_the_head(rendered: dict[str, Any]) -> None:
    docs = rendered["notebook"]
    assert {d["metadata"].get("namespace") for d in docs} == {"ml"}
    lab = _find(docs, "Deployment", "nbcluster-notebook")
    env = {e["name"]: e for e in lab["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["NBCLUSTER_ADDRESS"]["value"] == f"nbcluster://nbcluster-head:{DEFAULT_PORT}"
    assert env["JUPYTER_TOKEN"]["valueFrom"]["secretKeyRef"]["name"] == "nbcluster-notebook"


TLS_FILES = {
    "NBCLUSTER_TLS_CA_CERT": f"{TLS_MOUNT}/ca.pem",
    "NBCLUSTER_TLS_CERT": f"{TLS_MOUNT}/cert.pem",
    "NBCLUSTER_TLS_KEY": f"{TLS_MOUNT}/key.pem",
}


def _tls_of(spec: dict[str, Any], container: str) -> tuple[dict[str, Any], set[str]]:
    """(env name -> value, TLS mount paths) of one container; checks the Secret volume."""
    main = next(c for c in spec["containers"] if c["name"] == container)
    env = {e["name"]: e.get("value") for e in main.get("env", [])}
    volumes = {v["name"]: v for v in spec.get("volumes", [])}
    mounts = {m["mountPath"] for m in main.get("volumeMounts", []) if m["name"] == "tls"}
    if mounts:
        assert volumes["tls"]["secret"]["secretName"] == "nbcluster-tls"
    return env, mounts


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl renders the overlay")
def test_the_tls_component_encrypts_head_notebook_job_and_workers(
    rendered: dict[str, Any],
) -> None:
    head = _find(rendered["tls"], "Deployment", "nbcluster-head")["spec"]["template"]["spec"]
    env, mounts = _tls_of(head, "head")
    assert mounts == {TLS_MOUNT}
    assert {k: env[k] for k in TLS_FILES} == TLS_FILES
    assert env["NBCLUSTER_REQUIRE_ENCRYPTION"] == "1"  # fails closed
    assert env[TLS_SECRET_ENV] == "nbcluster-tls"  # the autoscaler's worker pods mount it too
    lab = _find(rendered["tls"], "Deployment", "nbcluster-notebook")["spec"]["template"]["spec"]
    env, mounts = _tls_of(lab, "lab")
    assert mounts == {TLS_MOUNT} and {k: env[k] for k in TLS_FILES} == TLS_FILES
    job = _find(rendered["tls-job"], "Job")["spec"]["template"]["spec"]
    env, mounts = _tls_of(job, "entrypoint")
    assert mounts == {TLS_MOUNT} and {k: env[k] for k in TLS_FILES} == TLS_FILES
    # Without the notebook component the component still renders (its patch finds nothing).
    assert [d for d in rendered["tls-only"] if "notebook" in d["metadata"]["name"]] == []
    # Without the component nothing mentions TLS.
    plain = _find(rendered["notebook"], "Deployment", "nbcluster-head")["spec"]["template"]
    env, mounts = _tls_of(plain["spec"], "head")
    assert mounts == set() and not any(k.startswith("NBCLUSTER_TLS") for k in env)


def test_worker_pods_mount_the_tls_secret_the_head_names(monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = _cluster_config()
    _, t = next(iter(cfg.worker_types().items()))
    node_config = {**t.node_config, "resources": dict(t.resources)}
    plain = KubernetesNodeProvider(cfg.provider, cfg.cluster_name, core_api=object())
    assert plain.tls_secret == ""
    monkeypatch.setenv(TLS_SECRET_ENV, "nbcluster-tls")
    provider = KubernetesNodeProvider(cfg.provider, cfg.cluster_name, core_api=object())
    assert provider.tls_secret == "nbcluster-tls"
    for secret in ("", provider.tls_secret):
        pod = worker_pod(
            "nbcluster-cpu2-abc123",
            "ml",
            node_config,
            {},
            head_address=provider.head_address,
            token_secret=provider.token_secret,
            tls_secret=secret,
        )
        for version in VERSIONS:
            kubernetes_validate.validate(pod, version, strict=True)
        env, mounts = _tls_of(pod["spec"], CONTAINER)
        if secret:
            assert mounts == {TLS_MOUNT} and {k: env[k] for k in TLS_FILES} == TLS_FILES
        else:
            assert mounts == set() and not any(k.startswith("NBCLUSTER_TLS") for k in env)
    # The config key wins over the head's environment.
    named = KubernetesNodeProvider(
        {**cfg.provider, "tls_secret": "other"}, cfg.cluster_name, core_api=object()
    )
    assert named.tls_secret == "other"


# -- the image --------------------------------------------------------------------------------------
INSTRUCTIONS = {
    "FROM", "RUN", "COPY", "ADD", "ENV", "ARG", "WORKDIR", "USER", "EXPOSE",
    "ENTRYPOINT", "CMD", "LABEL", "HEALTHCHECK", "SHELL", "VOLUME", "STOPSIGNAL", "ONBUILD",
}  # fmt: skip


def _dockerfile() -> list[tuple[str, str]]:
    """(instruction, arguments) per logical line, continuations joined, comments dropped."""
    out: list[tuple[str, str]] = []
    pending = ""
    for raw in (DEPLOY / "docker" / "Dockerfile").read_text().splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        full = pending + line
        pending = ""
        word, _, rest = full.partition(" ")
        out.append((word, rest.strip()))
    assert not pending, "the Dockerfile ends inside a continued line"
    return out


def test_dockerfile_parses_and_builds_like_the_project() -> None:
    steps = _dockerfile()
    assert all(word in INSTRUCTIONS for word, _ in steps), [w for w, _ in steps]
    stages = [rest.split()[-1] for word, rest in steps if word == "FROM" and " AS " in rest]
    assert stages == ["build"]
    for word, rest in steps:
        if word == "COPY" and rest.startswith("--from="):
            assert rest.split()[0].removeprefix("--from=") in stages
    runs = " ".join(rest for word, rest in steps if word == "RUN")
    # The wheel is built from pyproject.toml (hatchling + the lab extension's build hook,
    # which needs Node.js: the build stage is a node image) and installed with the k8s extra.
    assert steps[0][0] in ("ARG", "FROM") and any(
        w == "FROM" and r.startswith("node:") for w, r in steps
    )
    assert "python -m build --wheel" in runs
    assert re.search(
        r"pip install --no-cache-dir \"\$\(ls /dist/nbcluster-\*\.whl\)\[k8s\]\"", runs
    )
    users = [rest for word, rest in steps if word == "USER"]
    assert users and users[-1] not in ("root", "0")
    assert ("EXPOSE", str(DEFAULT_PORT)) in steps
    entry = next(rest for word, rest in steps if word == "ENTRYPOINT")
    assert entry == '["tini", "--"]'
    for word, rest in steps:
        if word == "RUN":
            shlex.split(rest)  # balanced quotes


def test_dockerignore_keeps_local_builds_out_of_the_context() -> None:
    ignored = (ROOT / ".dockerignore").read_text().split()
    for entry in (".venv", "labextension/node_modules", ".git"):
        assert entry in ignored


def test_deploy_readme_walks_through_every_step() -> None:
    text = (DEPLOY / "README.md").read_text()
    for needle in (
        "docker build -f deploy/docker/Dockerfile",
        "kubectl create secret generic nbcluster-token",
        "kubectl apply -k deploy/kubernetes",
        "kubectl apply -k deploy/kubernetes/job",
        "%cluster connect nbcluster://",
        "nbcluster up",
        "nbcluster down",
        "nbcluster attach",
        "nbcluster tls-certs",
        "kubectl create secret generic nbcluster-tls",
        "components/tls",
    ):
        assert needle in text, needle


def test_tls_certs_makes_the_files_the_secret_holds(tmp_path: Path) -> None:
    from nbcluster._runtime.protocol.tls import TlsSettings, ssl_context
    from nbcluster.cli import main

    out = tmp_path / "certs"
    assert main(["tls-certs", str(out), "--host", "nbcluster-head.ml.svc"]) == 0
    settings = TlsSettings.from_env({k: str(out / Path(v).name) for k, v in TLS_FILES.items()})
    assert settings is not None and settings.server_name == "nbcluster"
    assert (out / "key.pem").stat().st_mode & 0o077 == 0  # private
    ssl_context(settings, server=True)  # the files load as a certificate chain and key
    assert main(["tls-certs", str(out)]) == 1  # never overwrites
