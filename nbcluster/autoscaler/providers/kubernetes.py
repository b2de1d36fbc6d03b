"""``kubernetes``: worker nodes are pods, created through the official ``kubernetes`` client.

The head runs in the cluster (``deploy/kubernetes``: a Deployment running ``nbcluster up
--block``, a Service, a Secret with the token, RBAC that lets it manage pods in its own
namespace only). For each worker it creates a pod from the node type's ``node_config``
(a pod template: ``{metadata: ..., spec: ...}``, optional) completed with what nbcluster
needs: labels carrying the tags, ``restartPolicy: Never``, a container whose arguments are
``nbcluster start --address <head service> --node-name $(POD_NAME) --host $(POD_IP) --block``
(run by the image's entrypoint) with the
token mounted from the Secret, ``/dev/shm`` as memory for the object store, and CPU, memory
and GPU requests from the node type's resources. The instance id is the pod name.
``tests/autoscaler/test_kubernetes_provider.py`` runs this against the real client
with an in-memory REST layer, and validates every pod against the Kubernetes schema.
"""

from __future__ import annotations

import contextlib
import copy
import os
import secrets
from collections.abc import Mapping
from typing import Any

from nbcluster.autoscaler.providers.base import (
    TAG_CLUSTER,
    NodeProvider,
    ProviderError,
)

__all__ = ["KubernetesNodeProvider", "worker_pod"]

TOKEN_MOUNT = "/etc/nbcluster/token"
#: Where a TLS Secret (ca.pem, cert.pem, key.pem from ``nbcluster tls-certs``) is mounted.
TLS_MOUNT = "/etc/nbcluster/tls"
#: The head's environment names the TLS Secret its worker pods mount (set by
#: deploy/kubernetes/components/tls); ``provider.tls_secret`` in the config does the same.
TLS_SECRET_ENV = "NBCLUSTER_TLS_SECRET"


def tls_env() -> list[dict[str, str]]:
    """The ``NBCLUSTER_TLS_*`` variables that point a container at the mounted Secret."""
    return [
        {"name": "NBCLUSTER_TLS_CA_CERT", "value": f"{TLS_MOUNT}/ca.pem"},
        {"name": "NBCLUSTER_TLS_CERT", "value": f"{TLS_MOUNT}/cert.pem"},
        {"name": "NBCLUSTER_TLS_KEY", "value": f"{TLS_MOUNT}/key.pem"},
    ]


CONTAINER = "nbcluster-node"
DEFAULT_IMAGE = "nbcluster:latest"
DEFAULT_PORT = 6380


def _quantity(name: str, amount: float) -> str:
    if name == "memory":
        return str(int(amount))
    return f"{amount:g}"


def worker_pod(
    name: str,
    namespace: str,
    node_config: Mapping[str, Any],
    tags: Mapping[str, str],
    *,
    head_address: str,
    token_secret: str,
    tls_secret: str = "",
    image: str = DEFAULT_IMAGE,
    service_account: str = "",
    owner_references: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """The pod manifest of one worker node (plain data, ready for the API or a validator).

    With ``tls_secret`` the pod mounts that Secret at :data:`TLS_MOUNT` and every
    connection of the node is mutual TLS (``NBCLUSTER_TLS_*``)."""
    template = copy.deepcopy(dict(node_config.get("pod", {})))
    resources = dict(node_config.get("resources", {}))
    meta = dict(template.get("metadata", {}))
    labels = {
        **dict(meta.get("labels", {})),
        "app.kubernetes.io/name": "nbcluster",
        "app.kubernetes.io/component": "worker",
        **dict(tags),
    }
    meta.update({"name": name, "namespace": namespace, "labels": labels})
    if owner_references:
        meta["ownerReferences"] = list(owner_references)
    spec = dict(template.get("spec", {}))
    spec["restartPolicy"] = "Never"
    if service_account and "serviceAccountName" not in spec:
        spec["serviceAccountName"] = service_account
    # The token Secret is mounted group-readable for this group (the image's user).
    spec.setdefault("securityContext", {}).setdefault("fsGroup", 1000)
    containers = [dict(c) for c in spec.get("containers", [])]
    main = next((c for c in containers if c.get("name") == CONTAINER), None)
    if main is None:
        main = {"name": CONTAINER}
        containers.insert(0, main)
    main.setdefault("image", image)
    num = [f"--num-cpus={resources.get('CPU', 0.0):g}"]
    if resources.get("GPU"):
        num.append(f"--num-gpus={resources['GPU']:g}")
    # ``args``: the image's entrypoint (tini in deploy/docker/Dockerfile) runs it.
    main.setdefault(
        "args",
        [
            "nbcluster",
            "start",
            "--address",
            head_address,
            "--node-name",
            "$(POD_NAME)",
            "--host",
            "$(POD_IP)",
            "--token-file",
            f"{TOKEN_MOUNT}/token",
            *num,
            "--block",
        ],
    )
    ours = {"POD_NAME", "POD_IP", *(e["name"] for e in tls_env())}
    env = [e for e in main.get("env", []) if e.get("name") not in ours]
    env += [
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
    ]
    if tls_secret:
        env += tls_env()
    main["env"] = env
    names = ("token", "dshm", "tls")
    mounts = [m for m in main.get("volumeMounts", []) if m.get("name") not in names]
    mounts += [
        {"name": "token", "mountPath": TOKEN_MOUNT, "readOnly": True},
        {"name": "dshm", "mountPath": "/dev/shm"},
    ]
    if tls_secret:
        mounts.append({"name": "tls", "mountPath": TLS_MOUNT, "readOnly": True})
    main["volumeMounts"] = mounts
    if "resources" not in main:
        req: dict[str, str] = {}
        if resources.get("CPU"):
            req["cpu"] = _quantity("CPU", resources["CPU"])
        if resources.get("memory"):
            req["memory"] = _quantity("memory", resources["memory"])
        limits = dict(req)
        if resources.get("GPU"):
            limits["nvidia.com/gpu"] = _quantity("GPU", resources["GPU"])
        main["resources"] = {"requests": req, "limits": limits}
    spec["containers"] = containers
    volumes = [v for v in spec.get("volumes", []) if v.get("name") not in names]
    volumes += [
        {"name": "token", "secret": {"secretName": token_secret, "defaultMode": 0o440}},
        {"name": "dshm", "emptyDir": {"medium": "Memory"}},
    ]
    if tls_secret:
        volumes.append({"name": "tls", "secret": {"secretName": tls_secret, "defaultMode": 0o440}})
    spec["volumes"] = volumes
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


class KubernetesNodeProvider(NodeProvider):
    """Worker nodes as pods in one namespace (see the module docstring).

    ``core_api``: a ``kubernetes.client.CoreV1Api``; by default one is built from the pod's
    service account (``provider.in_cluster``, the default) or from ``~/.kube/config``.
    """

    provider_type = "kubernetes"

    def __init__(
        self,
        provider_config: Mapping[str, Any],
        cluster_name: str,
        *,
        core_api: Any = None,
    ) -> None:
        super().__init__(provider_config, cluster_name)
        in_cluster = bool(provider_config.get("in_cluster", True))
        self.namespace = str(provider_config.get("namespace") or _own_namespace(in_cluster))
        service = str(provider_config.get("head_service", f"{cluster_name}-head"))
        port = int(provider_config.get("head_port", DEFAULT_PORT))
        self.head_address = f"{service}.{self.namespace}.svc:{port}"
        self.token_secret = str(provider_config.get("token_secret", f"{cluster_name}-token"))
        self.tls_secret = str(
            provider_config.get("tls_secret") or os.environ.get(TLS_SECRET_ENV, "")
        )
        self.image = str(provider_config.get("image", ""))
        self.service_account = str(provider_config.get("service_account", ""))
        if core_api is None:
            core_api = _default_api(in_cluster)
        self.api = core_api
        self.tags_cache: dict[str, dict[str, str]] = {}
        self._pod: Any = None

    def _api_error(self, err: Exception, what: str) -> ProviderError:
        status = getattr(err, "status", None)
        reason = getattr(err, "reason", "") or str(err)
        hint = ""
        if status == 403:
            hint = (
                f"; the autoscaler's service account needs pods get/list/create/delete/patch "
                f"in namespace {self.namespace} (deploy/kubernetes/rbac.yaml)"
            )
        return ProviderError(f"{what} failed (HTTP {status} {reason}){hint}")

    def create_node(
        self, node_config: Mapping[str, Any], tags: Mapping[str, str], count: int
    ) -> list[str]:
        kind = str(tags.get("nbcluster-node-type", "worker")).lower().replace("_", "-")
        kind = kind.replace(".", "-")
        ids: list[str] = []
        error: ProviderError | None = None
        for _ in range(count):
            name = f"{self.cluster_name}-{kind}"[:50].rstrip("-") + f"-{secrets.token_hex(3)}"
            body = worker_pod(
                name,
                self.namespace,
                node_config,
                {**tags, TAG_CLUSTER: self.cluster_name},
                head_address=self.head_address,
                token_secret=self.token_secret,
                tls_secret=self.tls_secret,
                image=self.worker_image(),
                service_account=self.service_account,
                owner_references=self.owner_references(),
            )
            try:
                # A plain manifest: every client version (old and pydantic-based) takes it.
                self.api.create_namespaced_pod(namespace=self.namespace, body=body)
            except Exception as err:  # noqa: BLE001 - ApiException, urllib3 errors: all reported
                error = self._api_error(err, f"creating pod {name}")
                break
            self.tags_cache[name] = dict(body["metadata"]["labels"])
            ids.append(name)
        if not ids and error is not None:
            raise error
        return ids

    def _own_pod(self) -> Any:
        """The head's own pod (``POD_NAME``, set in deploy/kubernetes/head.yaml), or None."""
        if self._pod is None:
            self._pod = False
            pod_name = os.environ.get("POD_NAME", "")
            if pod_name:
                with contextlib.suppress(Exception):  # run without what it would tell
                    self._pod = self.api.read_namespaced_pod(
                        name=pod_name, namespace=self.namespace
                    )
        return self._pod or None

    def worker_image(self) -> str:
        """``provider.image``, else the image of the head's own pod, else ``nbcluster:latest``."""
        if not self.image:
            pod = self._own_pod()
            self.image = (pod.spec.containers[0].image if pod is not None else "") or DEFAULT_IMAGE
        return self.image

    def owner_references(self) -> list[dict[str, Any]]:
        """Worker pods belong to the head's ReplicaSet: deleting the head's Deployment (or
        changing its config) removes them, a restart of the head pod does not."""
        pod = self._own_pod()
        refs = (pod.metadata.owner_references or []) if pod is not None else []
        return [
            {"apiVersion": r.api_version, "kind": r.kind, "name": r.name, "uid": r.uid}
            for r in refs
            if r.kind == "ReplicaSet"
        ]

    def terminate_node(self, instance_id: str) -> None:
        try:
            self.api.delete_namespaced_pod(
                name=instance_id, namespace=self.namespace, grace_period_seconds=10
            )
        except Exception as err:  # noqa: BLE001
            if getattr(err, "status", None) != 404:  # already gone
                raise self._api_error(err, f"deleting pod {instance_id}") from None
        self.tags_cache.pop(instance_id, None)

    def non_terminated_nodes(self, tag_filters: Mapping[str, str]) -> list[str]:
        selector = ",".join(
            f"{k}={v}" for k, v in sorted({**tag_filters, TAG_CLUSTER: self.cluster_name}.items())
        )
        try:
            pods = self.api.list_namespaced_pod(namespace=self.namespace, label_selector=selector)
        except Exception as err:  # noqa: BLE001
            raise self._api_error(err, "listing pods") from None
        out = []
        cache: dict[str, dict[str, str]] = {}
        for pod in pods.items:
            phase = getattr(pod.status, "phase", None) if pod.status is not None else None
            if pod.metadata.deletion_timestamp is not None or phase in ("Succeeded", "Failed"):
                continue
            out.append(pod.metadata.name)
            cache[pod.metadata.name] = dict(pod.metadata.labels or {})
        self.tags_cache = cache
        return sorted(out)

    def node_tags(self, instance_id: str) -> dict[str, str]:
        if instance_id in self.tags_cache:
            return dict(self.tags_cache[instance_id])
        try:
            pod = self.api.read_namespaced_pod(name=instance_id, namespace=self.namespace)
        except Exception as err:  # noqa: BLE001
            raise self._api_error(err, f"reading pod {instance_id}") from None
        return dict(pod.metadata.labels or {})

    def set_node_tags(self, instance_id: str, tags: Mapping[str, str]) -> None:
        try:
            self.api.patch_namespaced_pod(
                name=instance_id,
                namespace=self.namespace,
                body={"metadata": {"labels": dict(tags)}},
            )
        except Exception as err:  # noqa: BLE001
            raise self._api_error(err, f"labelling pod {instance_id}") from None
        self.tags_cache.setdefault(instance_id, {}).update(tags)


SA_NAMESPACE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"


def _own_namespace(in_cluster: bool) -> str:
    """The namespace this pod runs in (from its service account), else ``default``."""
    if in_cluster:
        try:
            with open(SA_NAMESPACE) as f:
                return f.read().strip() or "default"
        except OSError:
            pass
    return "default"


def _default_api(in_cluster: bool) -> Any:
    try:
        from kubernetes import client, config
    except ImportError:  # pragma: no cover - the k8s extra
        raise ProviderError(
            "the kubernetes provider needs the kubernetes client: pip install 'nbcluster[k8s]'"
        ) from None
    try:
        if in_cluster:
            config.load_incluster_config()
        else:
            config.load_kube_config()
    except config.ConfigException as err:
        where = "the pod's service account" if in_cluster else "~/.kube/config"
        raise ProviderError(
            f"cannot load Kubernetes credentials from {where}: {err}; run the autoscaler in "
            "the cluster (deploy/kubernetes) or set provider.in_cluster: false"
        ) from None
    return client.CoreV1Api()
