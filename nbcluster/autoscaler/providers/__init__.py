"""Node providers: ``local`` (processes on this host), ``hosts`` (machines over SSH) and
``kubernetes`` (pods), behind :class:`NodeProvider`. :func:`get_provider` builds the one a
cluster config names; the Kubernetes client is imported only when that provider is used."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from nbcluster.autoscaler.config import ClusterConfig
from nbcluster.autoscaler.providers.base import (
    TAG_CLUSTER,
    TAG_LAUNCH_TIME,
    TAG_NODE_KIND,
    TAG_NODE_TYPE,
    NodeProvider,
    ProviderError,
)

__all__ = [
    "TAG_CLUSTER",
    "TAG_LAUNCH_TIME",
    "TAG_NODE_KIND",
    "TAG_NODE_TYPE",
    "NodeProvider",
    "ProviderError",
    "get_provider",
]


def get_provider(
    config: ClusterConfig,
    *,
    session_dir: str | os.PathLike[str],
    token_file: str | os.PathLike[str],
    head_address: str,
    parent_fd: int = -1,
    env: Mapping[str, str] | None = None,
    runner: Any = None,
    core_api: Any = None,
) -> NodeProvider:
    """The node provider ``config.provider`` names, set up for the head at ``head_address``.

    ``runner`` (hosts) replaces SSH, e.g. with ``ip netns exec``; ``core_api`` (kubernetes)
    replaces the API client built from the service account.
    """
    ptype = config.provider_type
    setup = config.setup_commands + config.worker_setup_commands
    if ptype == "local":
        from nbcluster.autoscaler.providers.local import LocalNodeProvider

        return LocalNodeProvider(
            config.provider,
            config.cluster_name,
            session_dir=session_dir,
            token_file=token_file,
            head_address=head_address,
            host=head_address.rpartition(":")[0].strip("[]") or "127.0.0.1",
            parent_fd=parent_fd,
            env=env,
            setup_commands=setup,
        )
    if ptype == "hosts":
        from nbcluster._runtime import proc
        from nbcluster.autoscaler.providers.hosts import HostsNodeProvider

        return HostsNodeProvider(
            config.provider,
            config.cluster_name,
            session_dir=session_dir,
            token=proc.read_token(token_file),
            head_address=head_address,
            runner=runner,
            auth=config.auth,
            setup_commands=setup,
        )
    if ptype == "kubernetes":
        from nbcluster.autoscaler.providers.kubernetes import KubernetesNodeProvider

        return KubernetesNodeProvider(config.provider, config.cluster_name, core_api=core_api)
    raise ProviderError(f"unknown provider type {ptype!r}")  # config validation prevents it
